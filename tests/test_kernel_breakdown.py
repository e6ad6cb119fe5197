"""benchmarks/kernel_breakdown.py's table, and its refusal without a GPU (the profiling needs one)."""
from __future__ import annotations

import pytest

from repo_files import ROOT, load_module, refuses_without_a_gpu

SCRIPT = ROOT / "benchmarks" / "kernel_breakdown.py"


def test_table_sorted_with_shares(capsys):
    bench = load_module(SCRIPT)
    bench.print_table("step", {"small": 0.25, "large": 0.75})
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "step: 1.000 ms per call"
    assert lines[4:] == ["| `large` | 0.7500 | 75.0% |", "| `small` | 0.2500 | 25.0% |"]


def test_needs_a_gpu():
    import gdn_jax

    if gdn_jax.backend.cuda_available():
        pytest.skip("checks the behaviour without a GPU")
    assert refuses_without_a_gpu(SCRIPT)
