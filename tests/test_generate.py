"""examples/generate.py: on CPU, a prefill and decode steps with the layer's
cache equal one forward, and the script says so by its exit status."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from repo_files import ROOT, load_module

pytest.importorskip("flax")

SCRIPT = ROOT / "examples" / "generate.py"


def test_generate_runs_and_matches():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK" in out.stdout and "ms; through the chunked forward" in out.stdout


def test_generate_exits_non_zero_on_a_mismatch(monkeypatch):
    mod = load_module(SCRIPT)
    monkeypatch.setitem(mod.TOLERANCE, "float32", 0.0)
    args = ["--batch", "1", "--prompt-len", "5", "--decode-steps", "2", "--hidden", "16",
            "--qk-heads", "1", "--v-heads", "2", "--head-dim", "8", "--impl", "reference"]
    assert mod.main(args) == 1
