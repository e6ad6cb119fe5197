"""The jax-triton launches without a GPU: ``triton_call`` replaced
by a check of each launch against its kernel's signature (as many array and
scalar operands plus outputs as the kernel has runtime parameters, outputs
last; every constexpr without a default given, no unknown one) that returns
zeros of the declared outputs, so that the launch code of ``fwd_intra``'s
Triton paths and of the chunked forward and backward (their derivatives
included) runs on CPU. Not the decode launch, whose outputs alias operands
(their parameters differ between jax-triton 0.3 and 0.4). The kernels'
results are tested under the interpreter and on the GPU."""
import inspect

import jax
import jax.numpy as jnp
import pytest

import gdn_jax
from gdn_jax import chunk_bwd_launch, intra_bwd, triton_launch
from gdn_jax.chunk_indices import varlen_work_list
from gdn_jax.kernels.wy_bwd import gdn_wy_bwd_kernel

LAUNCH_OPTIONS = {"num_warps", "num_stages", "maxnreg"}


def checked_call(*operands, kernel, out, grid, **constexprs):
    single = not isinstance(out, (list, tuple))  # jax-triton then returns one array
    out = [out] if single else out
    fn = kernel
    while hasattr(fn, "fn"):  # the Python function (under the interpreter, wrapped once more)
        fn = fn.fn
    params = inspect.signature(fn).parameters.values()
    is_constexpr = lambda p: "constexpr" in str(p.annotation)  # noqa: E731
    runtime = [p.name for p in params if not is_constexpr(p)]
    assert len(operands) + len(out) == len(runtime), (fn.__name__, len(operands), len(out), runtime)
    given = set(constexprs) - LAUNCH_OPTIONS
    assert given <= {p.name for p in params if is_constexpr(p)}, (fn.__name__, given)
    missing = {p.name for p in params if is_constexpr(p) and p.default is inspect.Parameter.empty} - given
    assert not missing, (fn.__name__, missing)
    grid = grid(constexprs) if callable(grid) else grid
    assert all(0 < g < 2 ** 31 for g in grid), grid
    results = tuple(jnp.zeros(o.shape, o.dtype) for o in out)
    return results[0] if single else results


@pytest.fixture
def launches_checked(monkeypatch):
    monkeypatch.setenv("GDN_JAX_AUTOTUNE", "0")
    monkeypatch.setattr(triton_launch, "triton_call", checked_call)
    monkeypatch.setattr(triton_launch, "compute_capability_major", lambda: 9)  # no GPU to ask: sm_90
    triton_launch.dot_precision.cache_clear()
    yield
    triton_launch.dot_precision.cache_clear()


def inputs(B, T, Hg, H, K, V, dtype=jnp.bfloat16):
    z = lambda *s, d=dtype: jnp.ones(s, d)  # noqa: E731
    return dict(k=z(B, T, Hg, K), v=z(B, T, H, V), g=z(B, T, H, d=jnp.float32), beta=z(B, T, H, d=jnp.float32),
                A=z(B, T, H, 64), dw=z(B, T, H, K), du=z(B, T, H, V), dA=z(B, T, H, 64))


@pytest.mark.parametrize("cu", [None, [0, 5, 200]])
def test_fwd_intra_backward_launch(launches_checked, cu):
    B, T = (2, 200) if cu is None else (1, 200)
    x = inputs(B, T, 2, 4, 128, 128)
    cu_j, ci = varlen_work_list(None if cu is None else jnp.asarray(cu, jnp.int32), None, T, 64)
    dk, dv, dg, dbeta = intra_bwd.intra_bwd_triton(*x.values(), cu_j, ci)
    assert (dk.shape, dk.dtype) == ((B, T, 2, 128), jnp.bfloat16)
    assert (dv.shape, dg.shape, dbeta.shape) == ((B, T, 4, 128), (B, T, 4), (B, T, 4))


@pytest.mark.parametrize("cu", [None, [0, 5, 200]])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_chunk_backward_launches(launches_checked, cu, dtype):
    B, T, Hg, H, K, V = (2, 200, 2, 4, 128, 128) if cu is None else (1, 200, 2, 4, 128, 128)
    x = inputs(B, T, Hg, H, K, V, dtype)
    q = x["k"]
    cu_j, ci = varlen_work_list(None if cu is None else jnp.asarray(cu, jnp.int32), None, T, 64)
    N = B if cu is None else len(cu) - 1
    h0 = jnp.zeros((N, H, K, V), jnp.float32)
    do = jnp.ones((B, T, H, V), dtype)
    grads = chunk_bwd_launch.chunk_bwd_triton(q, x["k"], x["v"], x["g"], x["beta"], x["A"], h0, do, h0, cu_j, ci,
                                              scale=K ** -0.5)
    assert [g.shape for g in grads] == [q.shape, q.shape, x["v"].shape, (B, T, H), (B, T, H), h0.shape]


def test_the_check_catches_an_operand_too_many(launches_checked):
    x = inputs(1, 64, 1, 1, 32, 32)
    operands = [x[a] for a in ("k", "v", "beta", "g", "A", "dw", "du", "dA", "g")] + [x["A"], x["A"]]  # dg_in, cu, ci
    out = [jax.ShapeDtypeStruct((1,), jnp.float32)] * 4
    constexprs = dict(H=1, Hg=1, K=32, V=32, BT=64, BK=32, BV=32, IS_VARLEN=False, DOT_PRECISION="tf32",
                      V_STAGES=1)
    triton_launch.triton_call(*operands, 64, kernel=gdn_wy_bwd_kernel, out=out, grid=(1, 1), **constexprs)
    with pytest.raises(AssertionError, match="gdn_wy_bwd_kernel"):
        triton_launch.triton_call(*operands, x["A"], 64, kernel=gdn_wy_bwd_kernel, out=out, grid=(1, 1),
                                  **constexprs)
    with pytest.raises(AssertionError, match="gdn_wy_bwd_kernel"):
        triton_launch.triton_call(*operands, 64, kernel=gdn_wy_bwd_kernel, out=out, grid=(1, 1),
                                  **{**constexprs, "NOT_A_PARAMETER": 1})


@pytest.fixture
def gpu_reported(launches_checked, monkeypatch):
    """The public ops take their GPU paths here, every launch checked as above:
    the Triton kernels' (the Gluon kernels' launchers hold jax-triton's own
    ``triton_call``, and asking whether a Gluon kernel can run would ask the
    CPU for a compute capability)."""
    from gdn_jax import backend, chunk_bwd_gluon, chunk_bwd_local_gluon, chunk_fwd_gluon, chunk_walk, sharding

    monkeypatch.setattr(backend, "cuda_available", lambda: True)
    for module in (chunk_bwd_gluon, chunk_fwd_gluon, chunk_bwd_local_gluon):
        monkeypatch.setattr(module, "gluon_environment_missing", lambda *a: "no Gluon in this test")
    for module in (sharding, chunk_walk, intra_bwd):
        module._triton_op.cache_clear()
    yield
    for module in (sharding, chunk_walk, intra_bwd):
        module._triton_op.cache_clear()


@pytest.mark.parametrize("impl", ["split", "triton"])  # "seed" needs triton < 3.9
@pytest.mark.parametrize("cu", [None, [0, 5, 200]])
def test_fwd_intra_launches(gpu_reported, impl, cu):
    B = 2 if cu is None else 1
    x = inputs(B, 200, 2, 4, 128, 128)
    cu = None if cu is None else jnp.asarray(cu, jnp.int32)
    w, u, A = jax.jit(lambda *a: gdn_jax.fwd_intra(*a, cu_seqlens=cu, impl=impl))(x["k"], x["v"], x["g"], x["beta"])
    assert (w.shape, u.shape, A.shape) == ((B, 200, 4, 128), (B, 200, 4, 128), (B, 200, 4, 64))


@pytest.mark.parametrize("cu", [None, [0, 5, 200]])
def test_chunk_forward_and_backward_launches(gpu_reported, cu):
    B = 2 if cu is None else 1
    x = inputs(B, 200, 2, 4, 128, 128)
    cu = None if cu is None else jnp.asarray(cu, jnp.int32)

    def loss(q, k, v, g, beta):
        o, f = gdn_jax.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
        return jnp.sum(o.astype(jnp.float32)) + jnp.sum(f)

    grads = jax.jit(jax.grad(loss, argnums=range(5)))(x["k"], x["k"], x["v"], x["g"], x["beta"])
    assert [g.shape for g in grads] == [x[a].shape for a in ("k", "k", "v", "g", "beta")]

