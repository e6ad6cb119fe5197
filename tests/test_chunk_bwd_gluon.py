"""The backward's reverse walk in Gluon (``gdn_jax.chunk_bwd_gluon``): where it
runs, and on a Hopper GPU its ``dv'``, ``dh`` and ``dh0`` against the Triton
walk's on the same inputs (fixed length and packed, with and without the final
state's cotangent). The gradients through it against float64 are
``test_chunk_grad_gpu.py``'s."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax import chunk_bwd_gluon
from gdn_jax.backend import cuda_available
from gdn_jax.chunk_bwd_launch import reverse_walk_triton
from gdn_jax.chunk_indices import cdiv, chunk_offsets
from gluon_offline import TWO_PER_SM, compiled_in_fresh_process
from numpy_reference import rel_err


def test_walk_missing_names_what_it_takes():
    assert chunk_bwd_gluon.walk_missing(jnp.float32, 128) == "it takes bfloat16 or float16 inputs, got float32"
    assert chunk_bwd_gluon.walk_missing(jnp.bfloat16, 64) == "it takes K = 128, got K=64"
    assert chunk_bwd_gluon.walk_missing(jnp.float16, 128, T=1).startswith("it takes T > 1 at fixed length, got T=1")
    assert chunk_bwd_gluon.walk_missing(jnp.float16, 128, T=1, packed=True) \
        == chunk_bwd_gluon.walk_missing(jnp.float16, 128, T=1000)
    if not cuda_available():
        assert chunk_bwd_gluon.walk_missing(jnp.bfloat16, 128).startswith("it needs an NVIDIA GPU")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("varlen", [False, True])
def test_kernel_compiles_for_sm90_two_programs_an_sm(dtype, varlen):
    """The Gluon source through the installed triton's compiler and ptxas
    (sm_90a, no GPU; ``gluon_offline.compiled_in_fresh_process``): 4 warps,
    no global scratch, and the shared memory of two programs an SM."""
    pytest.importorskip("triton.experimental.gluon")
    c = compiled_in_fresh_process("chunk_bwd_gluon", [dtype, varlen])
    assert c["num_warps"] == 4 and not c["scratch"]
    assert c["shared"] <= TWO_PER_SM, f"{c['shared']} bytes of shared memory: one program an SM"


def walk_inputs(seed, B, T, Hg, H, dtype, cu=None):
    """Inputs of the reverse walk: unit q, k rows; ``A`` and the output block
    ``M`` lower triangular (``A`` with a unit diagonal), zero past each
    sequence's end as the forward leaves them; chunk-local cumulative gates."""
    rng = np.random.default_rng(seed)
    K = V = 128
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    q, k = unit(rng.standard_normal((B, T, Hg, K))), unit(rng.standard_normal((B, T, Hg, K)))
    starts = np.zeros(T, np.int64) if cu is None else np.repeat(cu[:-1], np.diff(cu))
    pos = np.arange(T) - starts  # row within its sequence
    tril = (pos[:, None] // 64 == pos[None, :] // 64) & (pos[None, :] <= pos[:, None]) \
        & (starts[:, None] == starts[None, :])
    blocks = []
    for scale, diag in ((0.2, 1.0), (0.3, 0.0)):  # A, then M: [B, T, H, 64], row t holds its chunk's columns
        x = np.zeros((B, T, H, 64))
        full = scale * rng.standard_normal((B, H, T, T)) * tril + diag * np.eye(T)
        for t in range(T):
            c0 = t - pos[t] % 64
            n = min(64, T - c0)
            x[:, t, :, :n] = full[:, :, t, c0:c0 + n]
        blocks.append(x)
    g = -np.logaddexp(0, -rng.standard_normal((B, T, H))) * 0.1
    gc = np.zeros_like(g)
    for t in range(T):  # cumulative within each 64-row chunk of its sequence
        gc[:, t] = g[:, t] + (gc[:, t - 1] if pos[t] % 64 else 0)
    cast = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    N = B if cu is None else len(cu) - 1
    return dict(q=cast(q), k=cast(k), A=cast(blocks[0]), beta=f32(rng.uniform(0.2, 1, (B, T, H))), gc=f32(gc),
                do=cast(rng.standard_normal((B, T, H, V))), qk=cast(blocks[1]),
                dht=f32(rng.standard_normal((N, H, K, V))))


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available() or chunk_bwd_gluon.walk_missing(jnp.bfloat16, 128) is not None,
                    reason="needs a Hopper GPU and jax-triton >= 0.4 (Gluon)")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("B,T,cu,with_dht", [(2, 1000, None, True), (3, 63, None, False),
                                              (1, 1193, [0, 0, 1, 64, 65, 130, 193, 1193], True)])
def test_gluon_walk_equals_the_triton_walk(dtype, B, T, cu, with_dht):
    cu_np = None if cu is None else np.asarray(cu, np.int32)
    x = walk_inputs(T + B, B, T, 2, 4, dtype, cu_np)
    dht = x.pop("dht")
    dht = dht if with_dht else None
    N = B if cu is None else len(cu) - 1
    if cu is None:
        cu_j, offsets, chunks = None, None, B * cdiv(T, 64)
    else:
        cu_j = jnp.asarray(cu_np)
        offsets = chunk_offsets(cu_j)
        chunks = int(offsets[-1])
    kw = dict(scale=128 ** -0.5, N=N, chunks=chunks)
    got = jax.jit(lambda *a: chunk_bwd_gluon.reverse_walk_gluon(*a, cu_j, offsets, **kw))(*x.values(), dht)
    want = jax.jit(lambda *a: reverse_walk_triton(*a, cu_j, offsets, **kw))(*x.values(), dht)
    tol = 1e-2 if dtype == jnp.bfloat16 else 2e-3  # dS rounded to dtype for its products, in either
    for name, g, w in zip(("dv'", "dh", "dh0"), got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert np.isfinite(g).all(), name
        assert rel_err(g, w) <= tol, f"{name}: {rel_err(g, w):.3g}"
