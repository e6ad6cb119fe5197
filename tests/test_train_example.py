"""examples/train_gdn.py on CPU: the small language model learns the copy task
(the example exits non-zero where its loss does not fall below 0.8x its start)."""
import os
import subprocess
import sys

import pytest

from repo_files import ROOT

pytest.importorskip("flax")
pytest.importorskip("optax")


def test_loss_falls_on_cpu():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "train_gdn.py"), "--log-every", "100"],
                         capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    losses = [float(line.split()[3]) for line in out.stdout.splitlines() if line.startswith("step ")]
    assert losses[-1] < 0.5 * losses[0], losses
