"""Sharded runs on 4 virtual CPU devices; tests/test_sharding.py runs this in a subprocess.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/sharding_cases.py [CASE ...]

Each case runs an op under ``jax.jit`` on sharded inputs and prints one JSON
line: ``{"case", "err" (max abs difference to the unsharded run), "specs"
(output PartitionSpecs), "collectives" (counts in the compiled HLO), "plans"
(the (batch, heads) axes fwd_intra ran with)}``, or ``{"case", "error"}``.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jaxlib.cpu import _lapack
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import gdn_jax  # noqa: E402
import gdn_jax.autotune  # noqa: E402
import gdn_jax.reference  # noqa: E402
import gdn_jax.sharding  # noqa: E402
from gdn_jax.chunk import chunk_gated_delta_rule  # noqa: E402
from inputs import make_inputs  # noqa: E402
from repo_files import load_module  # noqa: E402
from sharding_specs import spec_of  # noqa: E402

hlo_collectives = load_module("benchmarks/hlo_collectives.py")


_lapack.initialize()
jax.ffi.register_ffi_target("gdn_test_opaque_strsm", _lapack.registrations()["lapack_strsm_ffi"],
                           platform="cpu", api_version=1)


def _opaque_solve(a, b, *, lower=True, unit_diagonal=True):
    """``solve_triangular(a, b, lower=True, unit_diagonal=True)`` for ``[..., n, n]``
    float32, as the reference calls it, through jaxlib's LAPACK handler under a
    name XLA has no sharding rule for: like the Triton custom call, XLA cannot
    partition it, so these tests see any gather around the kernels.

    One matrix per call: jaxlib's LAPACK kernels fan a batch out onto the
    intra-op thread pool and block in it, and with as many virtual devices as
    pool threads all can block at once (a deadlock). Same math as the batched call.
    """
    assert lower and unit_diagonal and a.dtype == b.dtype == jnp.float32
    n = a.shape[-1]
    call = jax.ffi.ffi_call("gdn_test_opaque_strsm", jax.ShapeDtypeStruct((n, n), b.dtype),
                            input_layouts=[(1, 0), (1, 0)], output_layouts=(1, 0),  # column-major
                            input_output_aliases={1: 0})
    attrs = {name: np.uint8(ord(c)) for name, c in
             (("side", "L"), ("uplo", "L"), ("trans_x", "N"), ("diag", "U"))}
    flat = (a.reshape(-1, n, n), b.reshape(-1, n, n))
    return jax.lax.map(lambda ab: call(*ab, **attrs), flat).reshape(b.shape)


gdn_jax.reference.solve_triangular = _opaque_solve

PLANS = []  # every (batch, heads) answer of batch_head_axes: the blocks fwd_intra ran on
_batch_head_axes = gdn_jax.sharding.batch_head_axes


def _logged_batch_head_axes(mesh, k, v, varlen):
    plan = _batch_head_axes(mesh, k, v, varlen)
    PLANS.append(plan)
    return plan


gdn_jax.sharding.batch_head_axes = _logged_batch_head_axes


def mesh(shape, names, axis_type=AxisType.Explicit):
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))


def put(m, x, *spec):
    return None if x is None else jax.device_put(x, NamedSharding(m, P(*spec)))


def scaled_err(o, r) -> float:
    """max |o - r| over max(1, max |r|): float32 rounding at any magnitude
    (gradients of a sum over many outputs reach tens); infinite where either
    holds a non-finite value (the stand-ins' NaN for misplaced residuals
    reach both runs)."""
    o, r = jnp.asarray(o, jnp.float32), jnp.asarray(r, jnp.float32)
    if not (jnp.isfinite(o).all() and jnp.isfinite(r).all()):
        return float("inf")
    return float(jnp.max(jnp.abs(o - r)) / jnp.maximum(1.0, jnp.max(jnp.abs(r))))


def run(f, args, sharded):
    """``f(*sharded)`` under jit against ``f(*args)`` on one device."""
    PLANS.clear()
    fj = jax.jit(f)
    hlo = fj.lower(*sharded).compile().as_text()
    plans = [list(p) for p in PLANS]
    out = fj(*sharded)
    ref = jax.jit(f)(*args)
    err = max(scaled_err(o, r) for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)))
    return dict(err=err, specs=[spec_of(o) for o in jax.tree.leaves(out)],
                collectives=hlo_collectives.counts(hlo), plans=plans)


def intra_case(m, B, T, Hg, H, bspec, kspec, hspec, cu=None):
    k, v, g, beta = make_inputs(0, B, T, Hg, H, 32, 16, cu_seqlens=cu)
    cu = None if cu is None else jnp.asarray(cu, jnp.int32)
    f = lambda k, v, g, beta, cu: gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu)  # noqa: E731
    sharded = (put(m, k, bspec, None, kspec), put(m, v, bspec, None, hspec),
               put(m, g, bspec, None, hspec), put(m, beta, bspec, None, hspec), put(m, cu, None))
    return run(f, (k, v, g, beta, cu), sharded)


def gdn_inputs(B, T, Hg, H, K=16, V=8, N=None):
    rng = np.random.default_rng(1)
    q, k = (rng.standard_normal((B, T, Hg, K)).astype(np.float32) for _ in range(2))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, T, H, V)).astype(np.float32)
    g = (-0.1 * np.logaddexp(0, rng.standard_normal((B, T, H)))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((B, T, H))))).astype(np.float32)
    h0 = rng.standard_normal((N or B, H, K, V)).astype(np.float32)
    return q, k, v, g, beta, h0


def chunk_case(m, B, T, Hg, H, bspec, hspec, cu=None):
    args = gdn_inputs(B, T, Hg, H, N=None if cu is None else len(cu) - 1)
    cu = None if cu is None else jnp.asarray(cu, jnp.int32)

    def f(q, k, v, g, beta, h0, cu):
        return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                      cu_seqlens=cu)

    q, k, v, g, beta, h0 = args
    sharded = (put(m, q, bspec, None, hspec), put(m, k, bspec, None, hspec),
               put(m, v, bspec, None, hspec), put(m, g, bspec, None, hspec),
               put(m, beta, bspec, None, hspec), put(m, h0, bspec, hspec), put(m, cu, None))
    return run(f, (*args, cu), sharded)


def recurrent_case(m, B, Hg, H, bspec, hspec, pool=None, T=3, options=False):
    """Decode (the jnp path) on sharded inputs; with ``pool`` rows, a state pool
    (heads only: its rows stay whole, ``state_indices`` replicated); with
    ``options``, the gate from its raw input (``A_log``, ``dt_bias`` [H]
    replicated), q/k L2 norm and beta from logits."""
    q, k, v, g, beta, h0 = gdn_inputs(B, T, Hg, H, N=pool)
    idx = None if pool is None else jnp.asarray((np.arange(B) * 3 + 1) % pool, jnp.int32)
    A_log, dt_bias = (np.linspace(lo, hi, H).astype(np.float32) for lo, hi in ((0, 2), (-1, 1)))
    gate = dict(use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True,
                use_beta_sigmoid_in_kernel=True) if options else {}

    def f(q, k, v, g, beta, h0, idx, A_log, dt_bias):
        return gdn_jax.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, initial_state=h0, state_indices=idx, output_final_state=True,
            **gate, **(dict(A_log=A_log, dt_bias=dt_bias) if options else {}))

    sharded = (put(m, q, bspec, None, hspec), put(m, k, bspec, None, hspec),
               put(m, v, bspec, None, hspec), put(m, g, bspec, None, hspec),
               put(m, beta, bspec, None, hspec),
               put(m, h0, None if pool else bspec, hspec), put(m, idx, None), put(m, A_log, None),
               put(m, dt_bias, None))
    return run(f, (q, k, v, g, beta, h0, idx, A_log, dt_bias), sharded)


def triton_branch_case():
    """impl="triton", with the jnp reference (its solve opaque to XLA) standing
    in for the kernels, on a 2 x 2 mesh (batch x heads); and the same
    per-device function under plain jit, which XLA can only run whole."""
    from gdn_jax.reference import fwd_intra_jnp

    timing = []

    def stand_in(*args, path, sum_g, **kwargs):
        assert path == "triton" and not sum_g  # the impl, passed on as the launch path
        timing.append(gdn_jax.autotune.timing_allowed())
        return fwd_intra_jnp(*args, **kwargs)

    gdn_jax.sharding.fwd_intra_triton = stand_in
    m = mesh((2, 2), ("data", "model"), AxisType.Auto)
    k, v, g, beta = make_inputs(0, 2, 100, 2, 4, 32, 16)
    sharded = (put(m, k, "data", None, "model"), put(m, v, "data", None, "model"),
               put(m, g, "data", None, "model"), put(m, beta, "data", None, "model"))
    partitioned = lambda *a: gdn_jax.sharding.fwd_intra_sharded(*a, impl="triton")  # noqa: E731
    result = run(partitioned, (k, v, g, beta), sharded)
    result["config_timing_allowed"] = timing
    result["collectives_unpartitioned"] = hlo_collectives.counts(
        jax.jit(fwd_intra_jnp).lower(*sharded).compile().as_text())
    return result


def layer_case(head_parallel: bool):
    """The Flax layer, replicated parameters, x [B, T, hidden] sharded over
    batch; head-parallel: q, k, v, g, beta constrained to split over heads too."""
    from flax import nnx

    mod = load_module("examples/flax_gdn_layer.py")
    m = mesh((2, 2) if head_parallel else (4,), ("data", "model") if head_parallel else ("data",),
             AxisType.Auto)
    heads_over = (m, "model") if head_parallel else None
    layer = mod.GatedDeltaNet(32, 2, 4, 8, impl="reference", heads_over=heads_over,
                              rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(layer)
    x = jax.random.normal(jax.random.key(1), (4, 80, 32))
    f = lambda state, x: nnx.merge(graphdef, state)(x)[0]  # noqa: E731
    state_rep = jax.device_put(state, NamedSharding(m, P()))
    return run(f, (state, x), (state_rep, put(m, x, "data")))


def chunk_grad_gpu_path_case(m, impl="triton", dtype=jnp.float32):
    """A sharded training step of the GPU path (its custom_vjp), with the
    launches replaced by their jnp references (no GPU here), on a 2 x 2 mesh:
    the forward ops and the backward op run on the devices' blocks (``impl``
    "auto": the walk from A, whose output block the backward reads; with
    bfloat16 ``q, k, v`` also the chunk states and ``v'`` it stores)."""
    from stand_ins import gpu_path_on_this_cpu

    gpu_path_on_this_cpu()
    q, k, v, g, beta, h0 = gdn_inputs(2, 130, 2, 4)
    q, k, v = (x.astype(dtype) for x in (q, k, v))

    def step(q, k, v, g, beta, h0):
        def loss(*a):
            o, f = chunk_gated_delta_rule(*a[:5], initial_state=a[5], output_final_state=True, impl=impl)
            return jnp.sum(o * o) + jnp.sum(f)
        return jax.grad(loss, argnums=range(6))(q, k, v, g, beta, h0)

    sharded = (put(m, q, "data", None, "model"), put(m, k, "data", None, "model"),
               put(m, v, "data", None, "model"), put(m, g, "data", None, "model"),
               put(m, beta, "data", None, "model"), put(m, h0, "data", "model"))
    return run(step, (q, k, v, g, beta, h0), sharded)


def intra_grad_gpu_path_case(m):
    """``jax.grad`` of ``fwd_intra`` on its Triton path (the custom_vjp, both
    launches replaced by their jnp forms: no GPU here), sharded over batch and
    heads on a 2 x 2 mesh: the forward and the WY backward run on the devices' blocks."""
    from stand_ins import gpu_path_on_this_cpu

    gpu_path_on_this_cpu()
    k, v, g, beta = make_inputs(0, 2, 130, 2, 4, 32, 16)
    ct = [jax.random.normal(jax.random.key(i), s) for i, s in enumerate(((2, 130, 4, 32), (2, 130, 4, 16),
                                                                         (2, 130, 4, 64)))]

    def step(k, v, g, beta):
        def loss(*a):
            return sum(jnp.sum(o.astype(jnp.float32) * c) for o, c in zip(gdn_jax.fwd_intra(*a, impl="split"), ct))
        return jax.grad(loss, argnums=range(4))(k, v, g, beta)

    sharded = (put(m, k, "data", None, "model"), put(m, v, "data", None, "model"),
               put(m, g, "data", None, "model"), put(m, beta, "data", None, "model"))
    return run(step, (k, v, g, beta), sharded)


def cases():
    m4 = mesh((4,), ("x",))
    m22 = mesh((2, 2), ("data", "model"))
    m22_auto = mesh((2, 2), ("data", "model"), AxisType.Auto)
    cu = [0, 0, 70, 130, 200]  # an empty sequence, then 70, 60, 70 tokens
    return {
        "intra_batch": lambda: intra_case(m4, 4, 100, 2, 4, "x", None, None),
        "intra_heads_gqa": lambda: intra_case(m4, 1, 100, 4, 8, None, "x", "x"),
        "intra_2x2": lambda: intra_case(m22, 2, 100, 2, 4, "data", "model", "model"),
        "intra_2x2_auto": lambda: intra_case(m22_auto, 2, 100, 2, 4, "data", "model", "model"),
        "intra_varlen_heads": lambda: intra_case(m4, 1, 200, 4, 8, None, "x", "x", cu=cu),
        # Hg = 2 key heads cannot split 4 ways: heads are gathered (correct, not split).
        "intra_fallback": lambda: intra_case(m4, 1, 100, 2, 8, None, None, "x"),
        "chunk_batch": lambda: chunk_case(m4, 4, 130, 2, 4, "x", None),
        "chunk_heads": lambda: chunk_case(m4, 2, 130, 4, 8, None, "x"),
        "chunk_2x2_auto": lambda: chunk_case(m22_auto, 2, 130, 2, 4, "data", "model"),
        "chunk_varlen_heads": lambda: chunk_case(m4, 1, 200, 4, 8, None, "x", cu=cu),
        "recurrent_batch": lambda: recurrent_case(m4, 4, 2, 4, "x", None),
        "recurrent_heads": lambda: recurrent_case(m4, 2, 4, 8, None, "x"),
        "recurrent_pool_heads": lambda: recurrent_case(m4, 3, 4, 8, None, "x", pool=7),
        "recurrent_options_2x2": lambda: recurrent_case(m22, 2, 2, 4, "data", "model",
                                                        options=True),
        # a pool with the inputs split over batch: the batch is gathered (heads only)
        "recurrent_pool_batch": lambda: recurrent_case(m22, 2, 2, 4, "data", "model", pool=5),
        "triton_branch": triton_branch_case,
        "chunk_grad_gpu_path_2x2": lambda: chunk_grad_gpu_path_case(mesh((2, 2), ("data", "model"),
                                                                         AxisType.Auto)),
        "chunk_grad_gpu_path_2x2_from_A": lambda: chunk_grad_gpu_path_case(
            mesh((2, 2), ("data", "model"), AxisType.Auto), "auto"),
        "chunk_grad_gpu_path_2x2_bf16_states": lambda: chunk_grad_gpu_path_case(
            mesh((2, 2), ("data", "model"), AxisType.Auto), "auto", jnp.bfloat16),
        "intra_grad_gpu_path_2x2": lambda: intra_grad_gpu_path_case(mesh((2, 2), ("data", "model"),
                                                                         AxisType.Auto)),
        "layer_data_parallel": lambda: layer_case(False),
        "layer_head_parallel": lambda: layer_case(True),
    }


def main(names):
    table = cases()
    for name in names or list(table):
        try:
            result = table[name]()
        except Exception as e:  # noqa: BLE001 - reported to the test
            result = dict(error=f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        print(json.dumps(dict(case=name, **result)), flush=True)


if __name__ == "__main__":
    assert jax.device_count() >= 4, os.environ.get("XLA_FLAGS")
    main(sys.argv[1:])
