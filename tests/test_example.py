"""examples/flax_gdn_layer.py runs on CPU, and its layer is causal."""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repo_files import ROOT, load_module

pytest.importorskip("flax")

EXAMPLE = ROOT / "examples" / "flax_gdn_layer.py"


def test_example_script_runs():
    args = ["--batch", "1", "--seq-len", "70", "--hidden", "32", "--qk-heads", "2",
            "--v-heads", "4", "--head-dim", "8", "--repeats", "1", "--impl", "reference"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True,
                         timeout=120, env=env, cwd=EXAMPLE.parents[1])
    assert out.returncode == 0, out.stderr
    assert "output shape (1, 70, 32)" in out.stdout
    assert "path: reference" in out.stdout
    assert "finite: True" in out.stdout
    assert "median jitted forward" in out.stdout


def test_layer_is_causal():
    from flax import nnx

    mod = load_module(EXAMPLE)
    layer = mod.GatedDeltaNet(32, 2, 4, 8, impl="reference", rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(layer)
    fwd = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    x = jax.random.normal(jax.random.key(1), (2, 80, 32))
    y = fwd(state, x)
    assert y.shape == (2, 80, 32) and bool(jnp.isfinite(y).all())
    y2 = fwd(state, x.at[:, 50:].set(7.0))  # change the future only
    np.testing.assert_allclose(np.asarray(y2[:, :50]), np.asarray(y[:, :50]), rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(y2[:, 50:]), np.asarray(y[:, 50:]))
