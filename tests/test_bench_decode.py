"""benchmarks/bench_decode.py's chart and table from rows of the shape a GPU
run writes (the timing itself needs a GPU), and its refusal without one."""
from __future__ import annotations

import pytest

from repo_files import ROOT, load_module, refuses_without_a_gpu

pytest.importorskip("matplotlib")

SCRIPT = ROOT / "benchmarks" / "bench_decode.py"


def test_chart_and_table(tmp_path, capsys):
    bench = load_module(SCRIPT)
    rows = [dict(B=B, T=T, state=s, floor_ms=0.001 * B, gdn_jax_ms=0.0012 * B + 0.01,
                 gdn_jax_pool_ms=0.0013 * B + 0.01, fla_ms=0.0015 * B + 0.1, gdn_jax_gpu_ms=0.0011 * B,
                 fla_gpu_ms=0.0014 * B, gdn_jax_gpu_over_floor=1.1, fla_over_gdn_jax=1.3,
                 fla_gpu_over_gdn_jax_gpu=1.2)
            for s in ("float32", "bfloat16") for T in (1, 4) for B in (1, 64, 256, 1024)]
    bench.plot(rows, tmp_path / "bench_decode.png")
    assert (tmp_path / "bench_decode.png").stat().st_size > 1000
    bench.print_table(rows, {"device": "test"})
    table = capsys.readouterr().out.splitlines()
    assert table[-1].startswith("| 1024 | 4 | bfloat16 |") and len(table) == 16 + 4


def test_needs_a_gpu():
    import gdn_jax

    if gdn_jax.backend.cuda_available():
        pytest.skip("checks the behaviour without a GPU")
    assert refuses_without_a_gpu(SCRIPT)
