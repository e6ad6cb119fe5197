"""Context parallelism (``T`` sharded over a mesh axis) on CPU.

The segment math in this process against the float64 per-token recurrence
(tests/segment_walks.py), the op on a one-device mesh, and, in one
subprocess per device count (4 and 8 virtual devices,
tests/context_parallel_cases.py), sharded runs of the forward and its
gradients against the unsharded run, with every collective of the compiled
gradient step checked to be state-sized.
"""
from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import gdn_jax
from gdn_jax.naive_recurrent import naive_recurrent_gated_delta_rule
from numpy_reference import rel_err
from segment_walks import run_in_segments
from test_chunk_grad import draw as draw_inputs

HELPER = pathlib.Path(__file__).resolve().parent / "context_parallel_cases.py"
SEED = random.randrange(2 ** 20)
# case: (batch, sequence, heads) mesh axes of the inputs
MESHES = {
    4: {"seq_fixed_options_v_first": (None, "s", None),
        "seq_partial_chunks_no_states": (None, "s", None), "seq_varlen": (None, "s", None),
        "seq_x_heads_varlen": (None, "s", "h"), "gpu_path_seq_x_heads_varlen": (None, "s", "h")},
    8: {"seq8_varlen_numpy_cu": (None, "s", None), "seq_x_batch_x_heads": ("b", "s", "h"),
        "gpu_path_seq8_fixed": (None, "s", None)},
}
WITHOUT_FINAL = {"seq_partial_chunks_no_states"}
VARLEN = {"seq_varlen", "seq_x_heads_varlen", "gpu_path_seq_x_heads_varlen", "seq8_varlen_numpy_cu"}


def draw(seed, B, T, Hg, H, K, V, N=None):
    """``q, k, v, g, beta, initial_state`` (``N`` rows, default ``B``) as
    tests/test_chunk_grad.py draws them."""
    x, _ = draw_inputs(seed, B, T, Hg, H, K, V, B if N is None else N)
    return tuple(x.values())


@pytest.mark.parametrize("segments, T", [(4, 100)])
def test_segments_compose_to_the_recurrence(solve_by_matmuls, segments, T):
    """Widened walks of consecutive segments, composed, equal the per-token
    recurrence in float64: ``o``, the final state and the gradients (the
    chunked forward cumulates its gates in float32)."""
    with jax.enable_x64(True):
        x = [jnp.asarray(a) for a in draw(SEED, 2, T, 1, 2, 16, 8)]

        def loss(run, *a):
            o, f = run(*a)
            return jnp.sum(jnp.sin(o)) + jnp.sum(jnp.cos(f)), (o, f)

        segs = lambda *a: run_in_segments(*a, segments, triton=False)  # noqa: E731
        whole = lambda *a: naive_recurrent_gated_delta_rule(  # noqa: E731
            *a[:5], initial_state=a[5], output_final_state=True)
        got = jax.jit(jax.grad(lambda *a: loss(segs, *a), argnums=range(6), has_aux=True))(*x)
        want = jax.jit(jax.grad(lambda *a: loss(whole, *a), argnums=range(6), has_aux=True))(*x)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):  # gates cumulated in float32
            assert rel_err(np.asarray(a), np.asarray(b)) < 1e-5, SEED


def test_one_device_mesh(solve_by_matmuls):
    """T "sharded" over a mesh axis of one device: the context parallel path
    (one shard_map) gives the plain run's outputs and gradients (a packed row;
    fixed length runs on the meshes below)."""
    cu = np.asarray([0, 0, 1, 70, 200], np.int32)
    B, N = 1, 4
    q, k, v, g, beta, h0 = draw(SEED, B, 200, 2, 4, 16, 8, N)
    args = [jnp.asarray(a, jnp.float32) for a in (q, k, v, g, beta, h0)]
    mesh = jax.make_mesh((1,), ("s",))
    sharded = [jax.device_put(a, NamedSharding(mesh, P(None, "s") if a.ndim == 4 and i < 5
                                               else P(None, "s") if i < 5 else P()))
               for i, a in enumerate(args)]

    def step(*a):
        def loss(*a):
            o, f = gdn_jax.chunk_gated_delta_rule(*a[:5], initial_state=a[5],
                                                  output_final_state=True, cu_seqlens=cu)
            return jnp.sum(o * o) + jnp.sum(f), (o, f)
        return jax.grad(loss, argnums=range(6), has_aux=True)(*a)

    got, want = jax.jit(step)(*sharded), jax.jit(step)(*args)
    assert "shard_map" in str(jax.make_jaxpr(step)(*sharded))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


@pytest.fixture(scope="module")
def results():
    """``{device count: {case: result}}``, one subprocess per device count."""
    found = {}
    for n in MESHES:
        flags = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
        out = subprocess.run([sys.executable, str(HELPER), str(SEED)], capture_output=True,
                             text=True, timeout=600, env=env)
        lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        assert lines, f"{n} devices: no results (exit {out.returncode}):\n{out.stderr[-5000:]}"
        found[n] = {r["case"]: r for r in lines}
    return found


@pytest.mark.parametrize("n, case", [(n, c) for n in MESHES for c in MESHES[n]])
def test_sharded_over_sequence(results, n, case):
    """Equal to the unsharded run (outputs and every gradient; the float64
    recurrence too where computed), ``o`` split over T as the inputs, the
    final states replicated over the sequence axis, and only state-sized
    arrays moving: every collective of the compiled forward and backward is
    an all-gather / reduce-scatter of the segments' maps or an all-reduce of
    states, with no dimension of the segment's T_local tokens."""
    r = results[n]
    assert case in r, f"{case} did not run; got {sorted(r)}"
    r = r[case]
    assert "error" not in r, r["error"]
    assert r["err"] <= 1e-5, (SEED, r["err"])
    assert r.get("err64", 0) <= 1e-4, (SEED, r["err64"])
    b, s, h = MESHES[n][case]
    want = [[b, s, h, None]] + ([] if case in WITHOUT_FINAL else
                                [[None if case in VARLEN else b, h, None, None]])
    assert r["specs"] == want
    kinds = [c[0] for c in r["collectives"]]
    assert "all-gather" in kinds and "reduce-scatter" in kinds, r["collectives"]
    assert set(kinds) <= {"all-gather", "reduce-scatter", "all-reduce"}, r["collectives"]
    for kind, shape in r["collectives"]:
        assert r["T_local"] not in shape, (kind, shape)
        assert int(np.prod(shape)) <= r["state_elems"], (kind, shape)
