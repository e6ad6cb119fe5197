"""fwd_intra, chunk_gated_delta_rule, fused_recurrent_gated_delta_rule and the Flax layer on
sharded arrays (4 virtual CPU devices).

The device count is fixed when JAX starts, and this pytest process has
started it, so tests/sharding_cases.py runs every case once in a subprocess
and prints one JSON line per case. Each case compares the sharded run with
the unsharded one, and reports the output shardings, the collectives in the
compiled HLO and the (batch, heads) mesh axes fwd_intra was partitioned over.
The reference's triangular solve runs there as a custom call XLA cannot
partition (as the Triton kernels), so a gather around the kernels would show.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("flax")

HELPER = pathlib.Path(__file__).resolve().parent / "sharding_cases.py"
NONE = {"all-gather": 0, "all-to-all": 0, "collective-permute": 0, "all-reduce": 0,
        "reduce-scatter": 0}
W = lambda b, h: [b, None, h, None]  # noqa: E731  w, u, A and o: [B, T, H, .]
S = lambda b, h: [b, h, None, None]  # noqa: E731  final state: [N, H, K, V]

# case: (output specs, (batch, heads) axes of fwd_intra)
EXPECTED = {
    "intra_batch": ([W("x", None)] * 3, ["x", None]),
    "intra_heads_gqa": ([W(None, "x")] * 3, [None, "x"]),
    "intra_2x2": ([W("data", "model")] * 3, ["data", "model"]),
    "intra_2x2_auto": ([W("data", "model")] * 3, ["data", "model"]),
    "intra_varlen_heads": ([W(None, "x")] * 3, [None, "x"]),
    "chunk_batch": ([W("x", None), S("x", None)], ["x", None]),
    "chunk_heads": ([W(None, "x"), S(None, "x")], [None, "x"]),
    "chunk_2x2_auto": ([W("data", "model"), S("data", "model")], ["data", "model"]),
    "chunk_varlen_heads": ([W(None, "x"), S(None, "x")], [None, "x"]),
    "recurrent_batch": ([W("x", None), S("x", None)], ["x", None]),
    "recurrent_heads": ([W(None, "x"), S(None, "x")], [None, "x"]),
    "recurrent_pool_heads": ([W(None, "x"), S(None, "x")], [None, "x"]),
    "recurrent_options_2x2": ([W("data", "model"), S("data", "model")], ["data", "model"]),
    "triton_branch": ([W("data", "model")] * 3, ["data", "model"]),
    # dq, dk, dv [B, T, heads, .], dg, dbeta [B, T, H], dh0 [N, H, K, V]
    "chunk_grad_gpu_path_2x2": ([W("data", "model")] * 3 + [["data", None, "model"]] * 2
                                + [S("data", "model")], ["data", "model"]),
    "chunk_grad_gpu_path_2x2_from_A": ([W("data", "model")] * 3 + [["data", None, "model"]] * 2
                                       + [S("data", "model")], ["data", "model"]),
    "chunk_grad_gpu_path_2x2_bf16_states": ([W("data", "model")] * 3 + [["data", None, "model"]] * 2
                                            + [S("data", "model")], ["data", "model"]),
    # dk, dv [B, T, heads, .], dg, dbeta [B, T, H]
    "intra_grad_gpu_path_2x2": ([W("data", "model")] * 2 + [["data", None, "model"]] * 2, ["data", "model"]),
    "layer_data_parallel": ([["data", None, None]], ["data", None]),
}


@pytest.fixture(scope="module")
def results():
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    out = subprocess.run([sys.executable, str(HELPER)], capture_output=True, text=True,
                         timeout=600, env=env)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no results (exit {out.returncode}):\n{out.stderr[-5000:]}"
    return {r["case"]: r for r in lines}


def get(results, case):
    assert case in results, f"{case} did not run; got {sorted(results)}"
    r = results[case]
    assert "error" not in r, r["error"]
    return r


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_sharded_without_collectives(results, case):
    r = get(results, case)
    specs, plan = EXPECTED[case]
    assert r["err"] <= 1e-5
    assert r["specs"] == specs
    assert r["collectives"] == NONE
    assert r["plans"] and all(p == plan for p in r["plans"])


def test_no_config_timing_while_partitioning(results):
    """The partitioned op's traces (global shapes, then per-device lowering
    inside XLA's partitioner) never time Triton configs (gdn_jax.autotune)."""
    seen = get(results, "triton_branch")["config_timing_allowed"]
    assert seen and not any(seen)


def test_unpartitioned_kernel_is_gathered(results):
    """The per-device function under plain jit: XLA gathers around the opaque call."""
    assert get(results, "triton_branch")["collectives_unpartitioned"]["all-gather"] > 0


def test_unsplittable_heads_fall_back_to_replicated(results):
    """Hg = 2 key heads over 4 head shards: heads are gathered, the result still equal."""
    r = get(results, "intra_fallback")
    assert r["err"] <= 1e-5
    assert r["plans"] and all(p == [None, None] for p in r["plans"])
    assert r["collectives"]["all-gather"] > 0


def test_state_pool_splits_over_heads_only(results):
    """A pool's rows are named by any sequence: with the inputs split over
    batch too, the batch is gathered and the op runs on head blocks."""
    r = get(results, "recurrent_pool_batch")
    assert r["err"] <= 1e-5
    assert r["plans"] and all(p == [None, "model"] for p in r["plans"])
    assert r["specs"] == [W(None, "model"), S(None, "model")]


def test_layer_head_parallel(results):
    """Tensor-parallel layer: equal to the unsharded run, and fwd_intra ran on
    (batch, head) blocks, so its inputs were not gathered (the projections
    and conv around it do move data: XLA's choice, outside the GDN ops)."""
    r = get(results, "layer_head_parallel")
    assert r["err"] <= 1e-5
    assert r["specs"] == [["data", None, None]]
    assert r["plans"] and all(p == ["data", "model"] for p in r["plans"])


def test_reference_stays_differentiable_and_vmappable():
    """custom_partitioning has no jvp or vmap rule; fwd_intra falls back to the
    plain per-device function under both (one device, in this process)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from inputs import make_inputs

    import gdn_jax
    from gdn_jax.reference import fwd_intra_reference

    k, v, g, beta = make_inputs(0, 1, 70, 1, 2, 16, 8)

    def loss(fwd, v, g, **kw):
        return sum(o.sum() for o in fwd(k, v, g, beta, **kw))

    for kw in ({}, {"cu_seqlens": np.asarray([0, 30, 70], np.int32)}):
        got = jax.jit(jax.grad(functools.partial(loss, gdn_jax.fwd_intra, **kw), (0, 1)))(v, g)
        want = jax.jit(jax.grad(functools.partial(loss, fwd_intra_reference, **kw), (0, 1)))(v, g)
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    fwd = jax.jit(lambda v: gdn_jax.fwd_intra(k, v, g, beta))
    batched = jax.vmap(fwd)(jnp.stack([v, 2 * v]))
    for i in range(2):
        for a, b in zip(batched, fwd((i + 1) * v)):
            np.testing.assert_allclose(np.asarray(a[i]), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_varying_like_gives_a_cotangent_its_primals_manual_axes():
    """Inside a shard_map body a value made there (as a Triton launch's
    result) varies over no manual axis; ``varying_like`` makes it vary as the
    primal does, which a custom_vjp backward must return."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from gdn_jax.sharding import varying_like

    def body(x):
        fresh = jnp.zeros(x.shape, x.dtype)
        assert jax.typeof(fresh).manual_axis_type.varying == frozenset()
        assert jax.typeof(varying_like(fresh, x)).manual_axis_type.varying == frozenset({"s"})
        assert varying_like(None, x) is None and varying_like(x, None) is x
        return varying_like(fresh, x) + x

    mesh = jax.make_mesh((1,), ("s",))
    x = jax.device_put(jnp.ones(4), NamedSharding(mesh, P("s")))
    out = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("s"), out_specs=P("s")))(x)
    assert (out == 1).all()
