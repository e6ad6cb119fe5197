"""The backward's per-chunk and WY kernels in Gluon (``gdn_jax.chunk_bwd_local_gluon``):
that they are off unless asked for, where they run, their launches against the
kernels' signatures and their offline compiles (any machine), and on a Hopper
GPU the chunk backward through them against the same backward through the
Triton kernels. The gradients through them against float64 are
``test_chunk_grad_gpu.py``'s under ``GDN_JAX_GLUON_BWD_LOCAL=1`` and
``GDN_JAX_GLUON_WY=1``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax import chunk_bwd_launch, chunk_bwd_local_gluon, triton_launch
from gdn_jax.backend import cuda_available
from gdn_jax.chunk_indices import varlen_work_list
from gluon_offline import ONE_PER_SM, compiled_in_fresh_process
from numpy_reference import rel_err
from test_chunk_bwd_gluon import walk_inputs
from test_launch_contract import checked_call


@pytest.mark.parametrize("switch,enabled", [("GDN_JAX_GLUON_BWD_LOCAL", "local_enabled"),
                                            ("GDN_JAX_GLUON_WY", "wy_enabled")])
def test_off_unless_asked_for(monkeypatch, switch, enabled):
    monkeypatch.delenv(switch, raising=False)
    assert not getattr(chunk_bwd_local_gluon, enabled)()
    monkeypatch.setenv(switch, "1")
    assert getattr(chunk_bwd_local_gluon, enabled)()


def test_local_missing_names_what_it_takes():
    missing = chunk_bwd_local_gluon.local_missing
    assert missing(jnp.float32, 128, 128, 1000, False) == "it takes bfloat16 or float16 inputs, got float32"
    assert missing(jnp.bfloat16, 64, 128, 1000, False) == "it takes K = V = 128, got K=64, V=128"
    assert missing(jnp.bfloat16, 128, 256, 1000, False) == "it takes K = V = 128, got K=128, V=256"
    assert missing(jnp.float16, 128, 128, 1, False).startswith("it takes T > 1 at fixed length")
    assert missing(jnp.float16, 128, 128, 1, True) == missing(jnp.float16, 128, 128, 1000, False)
    if not cuda_available():
        assert missing(jnp.bfloat16, 128, 128, 1000, False).startswith("it needs an NVIDIA GPU")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("cu", [None, [0, 5, 200]])
def test_chunk_backward_takes_them_where_switched_on(monkeypatch, dtype, cu):
    """``chunk_bwd_triton``'s routes to the Gluon kernels, on any machine: every
    launch checked against its kernel's signature and returning zeros
    (``test_launch_contract.checked_call``), the Gluon launches among them,
    with the Triton launches' result types and at most one program an SM."""
    monkeypatch.setenv("GDN_JAX_AUTOTUNE", "0")
    monkeypatch.setattr(triton_launch, "triton_call", checked_call)
    monkeypatch.setattr(triton_launch, "compute_capability_major", lambda: 9)
    triton_launch.dot_precision.cache_clear()
    seen = []

    def gluon_call(*operands, kernel, out, grid, **constexprs):
        seen.append((kernel.fn.__name__, grid, [(o.shape, o.dtype) for o in out]))
        return checked_call(*operands, kernel=kernel, out=out, grid=grid, **constexprs)

    monkeypatch.setattr(chunk_bwd_local_gluon, "triton_call", gluon_call)
    monkeypatch.setattr(chunk_bwd_local_gluon, "compile_gluon_as_triton_does", lambda: None)
    monkeypatch.setattr(chunk_bwd_launch, "local_enabled", lambda: True)
    monkeypatch.setattr(chunk_bwd_launch, "wy_enabled", lambda: True)
    monkeypatch.setattr(chunk_bwd_launch, "local_missing", lambda *a: None)
    B, T, Hg, H, K = (2, 200, 2, 4, 128) if cu is None else (1, 200, 2, 4, 128)
    ones = lambda *s, d=dtype: jnp.ones(s, d)  # noqa: E731
    q, v = ones(B, T, Hg, K), ones(B, T, H, K)
    g, beta = ones(B, T, H, d=jnp.float32), ones(B, T, H, d=jnp.float32)
    cu_j, ci = varlen_work_list(None if cu is None else jnp.asarray(cu, jnp.int32), None, T, 64)
    N = B if cu is None else len(cu) - 1
    h0 = jnp.zeros((N, H, K, K), jnp.float32)
    grads = chunk_bwd_launch.chunk_bwd_triton(q, q, v, g, beta, ones(B, T, H, 64), h0, v, h0, cu_j, ci,
                                              scale=K ** -0.5)
    triton_launch.dot_precision.cache_clear()
    assert [x.shape for x in grads] == [q.shape, q.shape, v.shape, (B, T, H), (B, T, H), h0.shape]
    part = jnp.bfloat16 if dtype == jnp.bfloat16 else jnp.float32
    chunks = 4 if cu is None else 5
    f32 = jnp.float32
    assert seen == [("gdn_chunk_bwd_local_gluon_kernel", (min(132, chunks * H * 2 * B),),
                     [((B, T, H, K), part), ((B, T, H, K), part), ((B, T, H, K), dtype), ((2, B, T, H), f32)]),
                    ("gdn_wy_bwd_gluon_kernel", (chunks * H * B,),
                     [((B, T, H, K), part), ((B, T, H, K), dtype), ((B, T, H), f32), ((B, T, H), f32)])]


@pytest.mark.parametrize("kernel,slot", [("per-chunk", 96 * 1024), ("WY", 72 * 1024)])
@pytest.mark.parametrize("dtype,varlen", [("bfloat16", False), ("float16", False), ("bfloat16", True)])
def test_kernels_compile_for_sm90_one_program_an_sm(kernel, slot, dtype, varlen):
    """The Gluon sources through the installed triton's compiler and ptxas
    (sm_90a, no GPU; ``gluon_offline.compiled_in_fresh_process``): 4 warps,
    no global scratch, two slots of tiles (``slot`` bytes each) within one
    SM's shared memory."""
    pytest.importorskip("triton.experimental.gluon")
    c = compiled_in_fresh_process("chunk_bwd_local_gluon", [dtype, varlen],
                                  "compile_offline" if kernel == "per-chunk" else "compile_offline_wy")
    assert c["num_warps"] == 4 and not c["scratch"]
    assert 2 * slot < c["shared"] <= ONE_PER_SM, c["shared"]


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available()
                    or chunk_bwd_local_gluon.local_missing(jnp.bfloat16, 128, 128, 1000, False) is not None,
                    reason="needs a Hopper GPU and jax-triton >= 0.4 (Gluon)")
@pytest.mark.parametrize("local,wy", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("B,T,cu", [(2, 1000, None), (3, 63, None), (1, 1193, [0, 0, 1, 64, 65, 130, 193, 1193])])
def test_chunk_backward_through_them_equals_the_triton_kernels(monkeypatch, local, wy, dtype, B, T, cu):
    """``chunk_bwd_triton`` with the Gluon per-chunk kernel, WY kernel or both
    against the same with the Triton ones, fixed length (T not a multiple of
    64, one partial chunk) and packed (empty and one-row sequences, padding
    work items), GQA 2."""
    cu_np = None if cu is None else np.asarray(cu, np.int32)
    x = walk_inputs(T + B + 7, B, T, 2, 4, dtype, cu_np)
    rng = np.random.default_rng(T)
    N = B if cu is None else len(cu) - 1
    v = jnp.asarray(rng.standard_normal((B, T, 4, 128)), dtype)
    h0 = jnp.asarray(rng.standard_normal((N, 4, 128, 128)), jnp.float32)
    cu_j, ci = varlen_work_list(None if cu is None else jnp.asarray(cu_np), None, T, 64)
    launched = []

    def seen(name):  # chunk_bwd_triton's launch of a Gluon kernel, seen
        def launch(*args, **kwargs):
            launched.append(name)
            return getattr(chunk_bwd_local_gluon, name)(*args, **kwargs)
        return launch

    def backward():  # a new function each time: jax.jit would reuse the first one's trace
        return lambda q, k, v, gc, beta, A, h0, do, dht: chunk_bwd_launch.chunk_bwd_triton(
            q, k, v, gc, beta, A, h0, do, dht, cu_j, ci, scale=128 ** -0.5)

    args = (x["q"], x["k"], v, x["gc"], x["beta"], x["A"], h0, x["do"], x["dht"])
    for name in ("per_chunk_gluon", "wy_gluon"):
        monkeypatch.setattr(chunk_bwd_launch, name, seen(name))
    monkeypatch.setattr(chunk_bwd_launch, "local_enabled", lambda: local)
    monkeypatch.setattr(chunk_bwd_launch, "wy_enabled", lambda: wy)
    got = jax.jit(backward())(*args)
    expected = ["per_chunk_gluon"] * local + ["wy_gluon"] * wy
    assert launched == expected, launched
    monkeypatch.setattr(chunk_bwd_launch, "local_enabled", lambda: False)  # the Triton kernels
    monkeypatch.setattr(chunk_bwd_launch, "wy_enabled", lambda: False)
    want = jax.jit(backward())(*args)
    assert launched == expected
    tol = 1e-2 if dtype == jnp.bfloat16 else 2e-3  # D and the partials rounded to dtype, in either
    for name, g, w in zip(("dq", "dk", "dv", "da", "dbeta", "dh0"), got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert g.shape == w.shape, name
        assert np.isfinite(g).all(), name
        assert rel_err(g, w) <= tol, f"{name}: {rel_err(g, w):.3g}"
