"""``jax.grad`` of chunk_gated_delta_rule on the Triton path (NVIDIA GPU)
against ``jax.grad`` of the float64 per-token recurrence (on the CPU), gradient
by gradient, at docs/math.md's tolerances: every dtype, fixed length and
packed, GQA, with and without an initial state, the options, T not a multiple
of 64. ``dg`` in particular: flash-linear-attention refuses its gated backward
on Hopper with triton < 3.7.1, which miscompiled it. Skipped without a CUDA GPU."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from gdn_jax.backend import cuda_available
from gdn_jax.naive_recurrent import naive_recurrent_gated_delta_rule
from numpy_reference import rel_err, sequences

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU as JAX's default backend"),
]

TOL = {"float32": 5e-3, "float16": 1e-2, "bfloat16": 3e-2}  # docs/math.md, each gradient
DT = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}
ARGS = ("q", "k", "v", "g", "beta", "initial_state")


def draw(seed, B, T, Hg, H, K, V, N, dtype):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    x = dict(q=unit(rng.standard_normal((B, T, Hg, K))), k=unit(rng.standard_normal((B, T, Hg, K))),
             v=rng.standard_normal((B, T, H, V)), g=-np.logaddexp(0, -rng.standard_normal((B, T, H))),
             beta=1 / (1 + np.exp(-rng.standard_normal((B, T, H)))),
             initial_state=rng.standard_normal((N, H, K, V)))
    for a in "qkv":  # rounded to dtype: the reference sees what the kernels see
        x[a] = np.asarray(jnp.asarray(x[a], DT[dtype]).astype(jnp.float32), np.float64)
    do = np.asarray(jnp.asarray(rng.standard_normal((B, T, H, V)), DT[dtype]).astype(jnp.float32), np.float64)
    return x, do, rng.standard_normal((N, H, K, V))


def float64_grads(x, do, dht, cu, transform=lambda d: d):
    cpu = jax.devices("cpu")[0]
    with jax.enable_x64(True), jax.default_device(cpu):
        def loss(*args):
            o, f = naive_recurrent_gated_delta_rule(**transform(dict(zip(ARGS, args))),
                                                    output_final_state=True, cu_seqlens=cu)
            return jnp.sum(o * do) + jnp.sum(f * dht)
        return [np.asarray(g) for g in jax.jit(jax.grad(loss, argnums=range(6)))(
            *(jnp.asarray(x[a], jnp.float64) for a in ARGS))]


def check(dtype, B, T, Hg, H, K=128, V=128, cu=None, h0=True, seed=0, record=None, **opts):
    N = B if cu is None else len(cu) - 1
    x, do, dht = draw(seed, B, T, Hg, H, K, V, N, dtype)
    if not h0:
        x["initial_state"] = np.zeros_like(x["initial_state"])
    cu_j = None if cu is None else jnp.asarray(cu, jnp.int32)
    args = [jnp.asarray(x[a], DT[dtype] if a in "qkv" else jnp.float32) for a in ARGS]

    def loss(q, k, v, g, beta, h):
        o, f = gdn_jax.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h if h0 else None,
                                              output_final_state=True, cu_seqlens=cu_j, **opts)
        return jnp.sum(o.astype(jnp.float32) * jnp.asarray(do, jnp.float32)) + jnp.sum(f * dht)

    got = jax.jit(jax.grad(loss, argnums=range(6)))(*args)
    want = float64_grads(x, do, dht, cu_j)
    errs = {}
    for name, g, w in zip(ARGS, got, want):
        if name == "initial_state" and not h0:
            continue
        g = np.asarray(jnp.asarray(g, jnp.float32), np.float64)
        assert np.isfinite(g).all(), f"d{name} has non-finite values"
        if g.ndim == 4 and name != "initial_state":  # per sequence, as the forward's checks
            e = max((rel_err(g[b, s:t], w[b, s:t]) for b, s, t in sequences(B, T, cu)), default=0.0)
        else:
            e = rel_err(g, w)
        errs[name] = e
        assert e <= TOL[dtype], f"d{name}: {e:.3g} > {TOL[dtype]}"
    if record is not None:
        record("gpu grad", dtype, errs)
    return errs


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("T,Hg,H,h0", [(1, 2, 2, True), (63, 2, 4, False), (1000, 2, 8, True),
                                       (256, 4, 4, True)])
def test_fixed_length(dtype, T, Hg, H, h0, record_errors):
    check(dtype, 2, T, Hg, H, h0=h0, seed=T + H, record=record_errors)


@pytest.mark.parametrize("dtype", list(DT))
def test_packed(dtype, record_errors):
    check(dtype, 1, 1193, 2, 4, cu=np.array([0, 0, 1, 64, 65, 130, 193, 1193], np.int32), seed=7,
          record=record_errors)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("packed", [False, True])
def test_many_programs(dtype, packed, record_errors):
    """``N * H`` of 128 and more: the forward walk's fixed config switches to
    its transposed form there (``gdn_jax.autotune.UNTUNED_MANY_PROGRAMS``, not
    float32); packed: 33 sequences, empty and one-row ones among them."""
    if packed:
        lens = np.random.default_rng(40).integers(0, 90, 33)
        lens[:3] = (0, 1, 64)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        check(dtype, 1, int(cu[-1]), 2, 4, cu=cu, seed=41, record=record_errors)
    else:
        check(dtype, 32, 130, 2, 4, seed=42, record=record_errors)


@pytest.mark.parametrize("K,V", [(64, 64), (256, 256), (64, 128)])
def test_head_dims(K, V, record_errors):
    check("bfloat16", 1, 300, 2, 4, K, V, seed=K + V, record=record_errors)


@pytest.mark.parametrize("impl", ["triton", "split", "seed"])
def test_every_intra_path(impl):
    check("bfloat16", 1, 300, 2, 4, seed=11, impl=impl)


def test_options(record_errors):
    """The raw gate, A_log, dt_bias, the beta logits and q/k before the norm:
    each against the float64 recurrence of the transformed inputs."""
    B, T, Hg, H, K, V = 2, 200, 2, 4, 128, 128
    x, do, dht = draw(21, B, T, Hg, H, K, V, B, "bfloat16")
    rng = np.random.default_rng(22)
    A_log, dt_bias = np.log(rng.uniform(0.5, 2, H)), rng.standard_normal(H)
    raw, logits = rng.standard_normal((B, T, H)), rng.standard_normal((B, T, H))
    q_raw = np.asarray(jnp.asarray(3 * x["q"], jnp.bfloat16).astype(jnp.float32), np.float64)

    def loss(q, k, v, g, beta, h, A_log, dt_bias):
        o, f = gdn_jax.chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=h, output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)
        return jnp.sum(o.astype(jnp.float32) * jnp.asarray(do, jnp.float32)) + jnp.sum(f * dht)

    args = [jnp.asarray(q_raw, jnp.bfloat16), jnp.asarray(x["k"], jnp.bfloat16), jnp.asarray(x["v"], jnp.bfloat16),
            jnp.asarray(raw, jnp.float32), jnp.asarray(logits, jnp.float32),
            jnp.asarray(x["initial_state"], jnp.float32), jnp.asarray(A_log, jnp.float32),
            jnp.asarray(dt_bias, jnp.float32)]
    got = jax.jit(jax.grad(loss, argnums=range(8)))(*args)
    cpu = jax.devices("cpu")[0]
    with jax.enable_x64(True), jax.default_device(cpu):
        def ref(q, k, v, g, beta, h, A_log, dt_bias):
            l2 = lambda t: t / jnp.sqrt(jnp.sum(t * t, -1, keepdims=True) + 1e-6)  # noqa: E731
            o, f = naive_recurrent_gated_delta_rule(
                l2(q), l2(k), v, -jnp.exp(A_log) * jax.nn.softplus(g + dt_bias), jax.nn.sigmoid(beta),
                initial_state=h, output_final_state=True)
            return jnp.sum(o * do) + jnp.sum(f * dht)
        want = jax.grad(ref, argnums=range(8))(*(jnp.asarray(np.asarray(jnp.asarray(a, jnp.float32)), jnp.float64)
                                                 for a in args))
    errs = {}
    for name, g, w in zip(ARGS + ("A_log", "dt_bias"), got, want):
        errs[name] = rel_err(np.asarray(jnp.asarray(g, jnp.float32), np.float64), np.asarray(w))
        assert errs[name] <= TOL["bfloat16"], f"d{name}: {errs[name]:.3g}"
    record_errors("gpu grad options", "bfloat16", errs)


@pytest.mark.parametrize("cu", [None, [0, 70, 130, 200]])
def test_vmap_of_grad_equals_each(cu):
    """Fixed length and packed (the examples' sequences folded into one
    launch, forward and backward)."""
    cu_j = None if cu is None else jnp.asarray(cu, jnp.int32)

    def loss(q, k, v, g, beta):
        o = gdn_jax.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_j)[0]
        return jnp.sum(o.astype(jnp.float32))
    xs = [draw(30 + e, 1, 200, 2, 4, 128, 128, 1, "bfloat16")[0] for e in range(2)]
    stack = [jnp.stack([jnp.asarray(x[a], jnp.bfloat16 if a in "qkv" else jnp.float32) for x in xs])
             for a in ARGS[:5]]
    batched = jax.jit(jax.vmap(jax.grad(loss, argnums=range(5))))(*stack)
    for e in range(2):
        alone = jax.jit(jax.grad(loss, argnums=range(5)))(*(s[e] for s in stack))
        for b, a in zip(batched, alone):
            np.testing.assert_allclose(np.asarray(b[e], np.float32), np.asarray(a, np.float32), rtol=2e-2, atol=2e-3)


@pytest.mark.slow
def test_stored_states_past_2_31_elements():
    """One sequence of T = 2^18 + 64 rows (H = 32, K = V = 128, bf16) at fixed
    length, whose forward stores the chunk states for the backward ([4097, 32,
    128, 128]: the last chunk's row starts at 2^31 elements), against the same
    sequence as a packed batch, whose backward recomputes them: the gradients
    of the last chunks agree (a state written or read at a wrapped 32-bit
    offset would not)."""
    T, Hg, H = 2 ** 18 + 64, 16, 32
    key = jax.random.split(jax.random.key(3), 6)
    unit = lambda x: x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True))  # noqa: E731
    q = unit(jax.random.normal(key[0], (1, T, Hg, 128))).astype(jnp.bfloat16)
    k = unit(jax.random.normal(key[1], (1, T, Hg, 128))).astype(jnp.bfloat16)
    v = jax.random.normal(key[2], (1, T, H, 128), jnp.bfloat16)
    g = jax.nn.log_sigmoid(jax.random.normal(key[3], (1, T, H)))
    beta = jax.nn.sigmoid(jax.random.normal(key[4], (1, T, H)))
    do = jax.random.normal(key[5], (1, T, H, 128), jnp.bfloat16)

    def grads(cu):
        # do (2 GB) an argument, not a constant captured into the executable
        def loss(q, k, v, g, beta, do):
            o = gdn_jax.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)[0]
            return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32))
        return [np.asarray(x[:, -4096:].astype(jnp.float32), np.float64)
                for x in jax.jit(jax.grad(loss, argnums=range(5)))(q, k, v, g, beta, do)]

    stored = grads(None)
    recomputed = grads(jnp.asarray([0, T], jnp.int32))
    for name, a, b in zip(ARGS, stored, recomputed):
        assert np.isfinite(a).all(), name
        assert rel_err(a, b) <= 1e-2, f"d{name}: {rel_err(a, b):.3g}"
