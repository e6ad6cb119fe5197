"""Context parallelism's math on the Triton kernels (NVIDIA GPU), against the
float64 per-token recurrence: ``T`` cut into segments that run one after the
other through the widened walk and are composed (tests/segment_walks.py), the
gradients of that composition (the walk's custom_vjp at ``V + K`` columns),
and the op on a one-device mesh with ``T`` "sharded" (the whole context
parallel path, one shard_map). Tolerances of docs/math.md. Skipped without a
CUDA GPU."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import gdn_jax
from gdn_jax.backend import cuda_available
from gdn_jax.naive_recurrent import naive_recurrent_gated_delta_rule
from numpy_reference import gdn_recurrence_numpy, rel_err
from segment_walks import run_in_segments
from test_chunk_gpu import DT, TOL, draw, up
from test_chunk_grad_gpu import TOL as GRAD_TOL

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU as JAX's default backend"),
]


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("segments, T, Hg, H", [(2, 1024, 2, 4), (4, 1000, 1, 4), (8, 4096, 4, 8)])
def test_segments_on_the_kernels(dtype, segments, T, Hg, H, record_errors):
    """o and the final state of composed segments (T_local 512, 250 (partial
    chunks), 512) at K = V = 128, against float64."""
    q, k, v, a, beta, S0 = draw(T + segments, 2, T, Hg, H, 128, 128, dtype, 2)
    o, final = jax.jit(lambda *x: run_in_segments(*x, segments, triton=True))(
        q, k, v, jnp.asarray(a), jnp.asarray(beta), jnp.asarray(S0))
    assert o.dtype == q.dtype
    o_ref, f_ref = gdn_recurrence_numpy(*up(q, k, v), a, beta, h0=S0)
    o, final = up(o, final)
    errs = dict(o=max(rel_err(o[b], o_ref[b]) for b in range(2)),
                final=max(rel_err(final[b], f_ref[b]) for b in range(2)))
    record_errors("gpu cp segments", dtype, errs)
    for name, e in errs.items():
        assert e <= TOL[dtype], f"{name}: {e:.3g} > {TOL[dtype]:.3g}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_segment_gradients_on_the_kernels(dtype, record_errors):
    """jax.grad through composed segments (the backward kernels at V + K
    columns) against jax.grad of the float64 recurrence."""
    q, k, v, a, beta, S0 = draw(3, 1, 512, 2, 4, 128, 128, dtype, 1)
    rng = np.random.default_rng(4)
    do, dht = rng.standard_normal((1, 512, 4, 128)), rng.standard_normal((1, 4, 128, 128))

    def loss(run, *x):
        o, f = run(*x)
        return jnp.sum(o.astype(f.dtype) * do.astype(f.dtype)) + jnp.sum(f * dht.astype(f.dtype))

    args = (q, k, v, jnp.asarray(a), jnp.asarray(beta), jnp.asarray(S0))
    got = jax.jit(jax.grad(lambda *x: loss(lambda *y: run_in_segments(*y, 4, triton=True), *x),
                           argnums=range(6)))(*args)
    with jax.enable_x64(True):
        x64 = [jnp.asarray(np.asarray(jnp.asarray(x, jnp.float32)), jnp.float64) for x in args]
        want = jax.jit(jax.grad(lambda *x: loss(lambda *y: naive_recurrent_gated_delta_rule(
            *y[:5], initial_state=y[5], output_final_state=True), *x), argnums=range(6)))(*x64)
    errs = {name: rel_err(np.asarray(jnp.asarray(g, jnp.float32)), np.asarray(w))
            for name, g, w in zip(("q", "k", "v", "g", "beta", "h0"), got, want)}
    record_errors("gpu cp grads", dtype, errs)
    for name, e in errs.items():
        assert e <= GRAD_TOL[dtype], f"d{name}: {e:.3g} > {GRAD_TOL[dtype]:.3g}"


@pytest.mark.parametrize("cu", [None, np.asarray([0, 0, 1, 700, 2048], np.int32)])
def test_one_device_mesh_on_the_kernels(cu):
    """The context parallel path on a one-device mesh equals the plain run
    (bf16, forward and gradients)."""
    N = 2 if cu is None else len(cu) - 1
    B = 2 if cu is None else 1
    q, k, v, a, beta, S0 = draw(5, B, 2048, 2, 4, 128, 128, "bfloat16", N)
    args = (q, k, v, jnp.asarray(a), jnp.asarray(beta), jnp.asarray(S0))
    mesh = jax.make_mesh((1,), ("s",))
    sharded = [jax.device_put(x, NamedSharding(mesh, P(None, "s") if i < 5 else P()))
               for i, x in enumerate(args)]

    def step(*x):
        def loss(*x):
            o, f = gdn_jax.chunk_gated_delta_rule(*x[:5], initial_state=x[5],
                                                  output_final_state=True, cu_seqlens=cu)
            return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(f), (o, f)
        return jax.grad(loss, argnums=range(6), has_aux=True)(*x)

    got, want = jax.jit(step)(*sharded), jax.jit(step)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert rel_err(*up(g, w)) <= 2e-2
