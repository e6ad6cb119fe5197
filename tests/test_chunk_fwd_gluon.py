"""The forward's storing walk in Gluon (``gdn_jax.chunk_fwd_gluon``): that it is
off unless asked for, where it runs, its offline compile, and on a Hopper GPU
its output, final state, chunk states and ``v'`` against the Triton walk's on
the same inputs. The gradients through it against float64 are
``test_chunk_grad_gpu.py``'s under ``GDN_JAX_GLUON_FWD_WALK=1``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax import chunk_fwd_gluon, chunk_launch
from gdn_jax.backend import cuda_available
from gluon_offline import TWO_PER_SM, compiled_in_fresh_process
from numpy_reference import rel_err


def test_off_unless_asked_for(monkeypatch):
    monkeypatch.delenv("GDN_JAX_GLUON_FWD_WALK", raising=False)
    assert not chunk_fwd_gluon.storing_walk_enabled()
    monkeypatch.setenv("GDN_JAX_GLUON_FWD_WALK", "1")
    assert chunk_fwd_gluon.storing_walk_enabled()


def test_storing_walk_missing_names_what_it_takes():
    missing = chunk_fwd_gluon.storing_walk_missing
    assert missing(jnp.float32, 128, 1000, False) == "it takes bfloat16 or float16 inputs, got float32"
    assert missing(jnp.bfloat16, 64, 1000, False) == "it takes K = 128, got K=64"
    assert missing(jnp.float16, 128, 1000, True).startswith("it takes fixed-length batches")
    assert missing(jnp.float16, 128, 1, False).startswith("it takes T > 1")
    if not cuda_available():
        assert missing(jnp.bfloat16, 128, 1000, False).startswith("it needs an NVIDIA GPU")


@pytest.mark.parametrize("final", [True, False])
def test_chunk_walk_takes_it_where_switched_on(monkeypatch, final):
    """``chunk_walk_triton``'s route to the Gluon walk, on any machine (the
    launch a stand-in): it passes its inputs and its own result types, and
    returns the final state only where asked for."""
    B, T, Hg, H = 2, 130, 2, 4
    x = walk_inputs(1, B, T, Hg, H, jnp.bfloat16)
    seen = {}

    def stand_in(q, k, A, v, a, beta, qk, h0, *, scale, out, store_final, state_v_first):
        seen.update(qk=qk, h0=h0, out=out, store_final=store_final)
        return tuple(jnp.zeros(t.shape, t.dtype) for t in out)

    monkeypatch.setattr(chunk_launch, "storing_walk_missing", lambda *a: None)
    monkeypatch.setattr(chunk_launch, "storing_walk_enabled", lambda: True)
    monkeypatch.setattr(chunk_launch, "storing_walk_gluon", stand_in)
    o, ht, h, v_new = chunk_launch.chunk_walk_triton(
        x["q"], x["k"], x["A"], x["v"], x["a"], x["h0"], scale=128 ** -0.5, store_final=final, store_h=True,
        store_v=True, beta=x["beta"], qk=x["qk"], sum_g=True)
    assert seen["qk"] is x["qk"] and seen["h0"] is x["h0"] and seen["store_final"] == final
    assert o.shape == v_new.shape == (B, T, H, 128)
    assert h.shape == (B * 3, H, 128, 128)
    assert (ht is not None) == final and (not final or ht.shape == (B, H, 128, 128))


@pytest.mark.parametrize("dtype,use_h0,v_first", [("bfloat16", True, False), ("float16", False, False),
                                                  ("bfloat16", True, True)])
def test_kernel_compiles_for_sm90_two_programs_an_sm(dtype, use_h0, v_first):
    """The Gluon source through the installed triton's compiler and ptxas
    (sm_90a, no GPU; ``gluon_offline.compiled_in_fresh_process``): 4 warps,
    no global scratch, and the shared memory of two programs an SM."""
    pytest.importorskip("triton.experimental.gluon")
    c = compiled_in_fresh_process("chunk_fwd_gluon", [dtype, 32, 16, 128, use_h0, v_first])
    assert c["num_warps"] == 4 and not c["scratch"]
    assert c["shared"] <= TWO_PER_SM, f"{c['shared']} bytes of shared memory: one program an SM"


def walk_inputs(seed, B, T, Hg, H, dtype):
    """Inputs of the forward's walk from ``A``: unit q, k rows; ``A`` and the
    output block ``M`` lower triangular within each chunk (``A`` with a unit
    diagonal; row t holds its chunk's columns, zero past the end); per-step
    log gates and betas; an initial state."""
    rng = np.random.default_rng(seed)
    K = V = 128
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    q, k = unit(rng.standard_normal((B, T, Hg, K))), unit(rng.standard_normal((B, T, Hg, K)))
    pos = np.arange(T) % 64
    blocks = []
    for scale, diag in ((0.2, 1.0), (0.3, 0.0)):
        x = scale * rng.standard_normal((B, T, H, 64)) * (np.arange(64)[None, :] <= pos[:, None])[None, :, None]
        x[:, np.arange(T), :, pos] += diag
        x *= ((np.arange(T) - pos)[:, None] + np.arange(64)[None, :] < T)[None, :, None]  # columns past the end
        blocks.append(x)
    cast = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return dict(q=cast(q), k=cast(k), A=cast(blocks[0]), v=cast(rng.standard_normal((B, T, H, V))),
                a=f32(-np.logaddexp(0, -rng.standard_normal((B, T, H))) * 0.1),
                beta=f32(rng.uniform(0.2, 1, (B, T, H))), qk=cast(blocks[1]),
                h0=f32(rng.standard_normal((B, H, K, V))))


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available()
                    or chunk_fwd_gluon.storing_walk_missing(jnp.bfloat16, 128, 1000, False) is not None,
                    reason="needs a Hopper GPU and jax-triton >= 0.4 (Gluon)")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("B,T,use_h0,final,v_first", [(2, 1000, True, True, False), (3, 63, False, False, False),
                                                       (1, 130, True, True, True)])
def test_gluon_walk_equals_the_triton_walk(monkeypatch, dtype, B, T, use_h0, final, v_first):
    x = walk_inputs(T + B, B, T, 2, 4, dtype)
    h0 = x.pop("h0")
    h0 = (jnp.swapaxes(h0, -1, -2) if v_first else h0) if use_h0 else None
    launched = []

    def gluon(*args, **kwargs):  # chunk_walk_triton's launch of the Gluon walk, seen
        launched.append(True)
        return chunk_fwd_gluon.storing_walk_gluon(*args, **kwargs)

    def walk():  # a new function each time: jax.jit would reuse the first one's trace
        return lambda q, k, A, v, a, beta, qk, h0: chunk_launch.chunk_walk_triton(
            q, k, A, v, a, h0, scale=128 ** -0.5, store_final=final, store_h=True, store_v=True,
            state_v_first=v_first, beta=beta, qk=qk, sum_g=True)

    monkeypatch.setattr(chunk_launch, "storing_walk_gluon", gluon)
    monkeypatch.setattr(chunk_launch, "storing_walk_enabled", lambda: True)
    got = jax.jit(walk())(*x.values(), h0)
    assert launched, "the Gluon walk did not run"
    monkeypatch.setattr(chunk_launch, "storing_walk_enabled", lambda: False)  # the Triton kernel
    want = jax.jit(walk())(*x.values(), h0)
    assert len(launched) == 1
    tol = 1e-2 if dtype == jnp.bfloat16 else 2e-3  # the state rounded to dtype for its products, in either
    for name, g, w in zip(("o", "final state", "h", "v'"), got, want):
        if w is None:
            assert g is None, name
            continue
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert g.shape == w.shape, name
        assert np.isfinite(g).all(), name
        assert rel_err(g, w) <= tol, f"{name}: {rel_err(g, w):.3g}"
