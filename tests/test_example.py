"""examples/flax_gdn_layer.py runs on CPU, its layer is causal, and its cache continues a sequence."""
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
    fwd = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0])
    x = jax.random.normal(jax.random.key(1), (2, 80, 32))
    y = fwd(state, x)
    assert y.shape == (2, 80, 32) and bool(jnp.isfinite(y).all())
    y2 = fwd(state, x.at[:, 50:].set(7.0))  # change the future only
    np.testing.assert_allclose(np.asarray(y2[:, :50]), np.asarray(y[:, :50]), rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(y2[:, 50:]), np.asarray(y[:, 50:]))


@pytest.mark.parametrize("state_dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 1e-2)])
def test_layer_cache_continues_the_sequence(state_dtype, tol):
    """A prefill, then decode steps of 1 and 3 tokens (recurrent path) and one
    of 20 (chunked path, past decode_max_tokens), each from the last call's
    cache: one forward's outputs."""
    from flax import nnx

    mod = load_module(EXAMPLE)
    layer = mod.GatedDeltaNet(32, 2, 4, 8, impl="reference", state_dtype=state_dtype,
                              rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(layer)
    fwd = jax.jit(lambda s, x, cache: nnx.merge(graphdef, s)(x, cache))
    x = jax.random.normal(jax.random.key(2), (2, 94, 32))
    full, _ = fwd(state, x, None)
    y, cache = fwd(state, x[:, :70], None)
    assert cache.conv.shape == (2, 3, (2 * 2 + 4) * 8) and cache.state.shape == (2, 4, 8, 8)
    assert cache.state.dtype == state_dtype
    ys = [y]
    for s, e in [(70, 71), (71, 74), (74, 94)]:
        y, cache = fwd(state, x[:, s:e], cache)
        ys.append(y)
    got = jnp.concatenate(ys, axis=1)
    err = float(jnp.linalg.norm(got - full) / jnp.linalg.norm(full))
    assert err < tol, err
