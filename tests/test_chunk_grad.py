"""Gradients of chunk_gated_delta_rule on CPU against ``jax.grad`` of the
float64 per-token recurrence: the jnp path (differentiated by JAX), and the
GPU path's ``custom_vjp`` with its launches replaced by jnp stand-ins (the
wiring: residuals, options, GQA sums, packed sequences, states, vmap); the
backward kernels themselves run under the interpreter in
tests/test_chunk_bwd_kernels.py and on the GPU in tests/test_chunk_grad_gpu.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from gdn_jax.naive_recurrent import naive_recurrent_gated_delta_rule
from numpy_reference import rel_err

ARGS = ("q", "k", "v", "g", "beta", "initial_state")


def draw(seed, B, T, Hg, H, K, V, N, gate_scale=1.0):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    return dict(q=unit(rng.standard_normal((B, T, Hg, K))), k=unit(rng.standard_normal((B, T, Hg, K))),
                v=rng.standard_normal((B, T, H, V)),
                g=-gate_scale * np.logaddexp(0, -rng.standard_normal((B, T, H))),
                beta=1 / (1 + np.exp(-rng.standard_normal((B, T, H)))),
                initial_state=rng.standard_normal((N, H, K, V))), \
        (rng.standard_normal((B, T, H, V)), rng.standard_normal((N, H, K, V)))


def float64_grads(x, cot, cu, transform=lambda x: x):
    """``jax.grad`` of the float64 per-token recurrence of ``transform(x)``."""
    do, dht = cot
    with jax.enable_x64(True):
        def loss(*args):
            o, f = naive_recurrent_gated_delta_rule(**transform(dict(zip(ARGS, args))),
                                                    output_final_state=True, cu_seqlens=cu)
            return jnp.sum(o * do) + jnp.sum(f * dht)
        grads = jax.grad(loss, argnums=range(6))(*(jnp.asarray(x[a], jnp.float64) for a in ARGS))
        return [np.asarray(g) for g in grads]


def grads_of(x, cot, cu, impl, dtype=jnp.float32, **kwargs):
    do, dht = cot
    f32 = {a: jnp.asarray(x[a], dtype if a in ("q", "k", "v") else jnp.float32) for a in ARGS}

    def loss(*args):
        o, f = gdn_jax.chunk_gated_delta_rule(*args[:5], initial_state=args[5], output_final_state=True,
                                              cu_seqlens=cu, impl=impl, **kwargs)
        return jnp.sum(o * do) + jnp.sum(f * dht)
    return jax.jit(jax.grad(loss, argnums=range(6)))(*(f32[a] for a in ARGS))


def check(got, want, tol):
    for name, g, w in zip(ARGS, got, want):
        e = rel_err(np.asarray(g, np.float64), w)
        assert e < tol, f"d{name}: {e:.2e}"


CASES = [(2, 130, 2, 4, None), (1, 64, 1, 1, None), (1, 1, 1, 2, None), (1, 200, 2, 4, [0, 0, 1, 70, 200])]


@pytest.mark.parametrize("B,T,Hg,H,cu", CASES)
def test_jnp_path_gradients(B, T, Hg, H, cu):
    N = B if cu is None else len(cu) - 1
    x, cot = draw(T, B, T, Hg, H, 16, 8, N)
    cu = None if cu is None else jnp.asarray(cu, jnp.int32)
    check(grads_of(x, cot, cu, "reference"), float64_grads(x, cot, cu), 1e-4)


@pytest.mark.parametrize("B,T,Hg,H", [(2, 130, 2, 4), (1, 1, 1, 2)])
def test_gpu_path_bfloat16_keeps_the_chunk_states(gpu_path_as_reference, B, T, Hg, H):
    """bfloat16 q, k, v at fixed length: the forward's walk stores the chunk
    states and v' for the backward (the stand-ins check they are the ones of
    these inputs); against float64 on the inputs rounded to bfloat16."""
    x, cot = draw(T + 2, B, T, Hg, H, 16, 8, B)
    x = {a: np.asarray(jnp.asarray(v, jnp.bfloat16 if a in ("q", "k", "v") else jnp.float32), np.float64)
         for a, v in x.items()}
    check(grads_of(x, cot, None, "auto", dtype=jnp.bfloat16), float64_grads(x, cot, None), 2e-2)


@pytest.mark.parametrize("impl", ["triton", "auto"])  # auto: the walk from A, its block kept for the backward
@pytest.mark.parametrize("B,T,Hg,H,cu", CASES)
def test_gpu_path_custom_vjp(gpu_path_as_reference, B, T, Hg, H, cu, impl):
    N = B if cu is None else len(cu) - 1
    x, cot = draw(T + 1, B, T, Hg, H, 16, 8, N)
    cu = None if cu is None else jnp.asarray(cu, jnp.int32)
    check(grads_of(x, cot, cu, impl), float64_grads(x, cot, cu), 1e-4)


def test_gpu_path_options_and_v_first(gpu_path_as_reference):
    """The options' inputs (raw gate, A_log, dt_bias, beta logits, q/k before
    the norm) get their gradients through the jnp options around the custom_vjp."""
    B, T, Hg, H, K, V = 2, 90, 2, 4, 16, 8
    x, cot = draw(3, B, T, Hg, H, K, V, B)
    rng = np.random.default_rng(4)
    A_log, dt_bias = np.log(rng.uniform(0.5, 2, H)), rng.standard_normal(H)
    x["q"], x["k"] = 3 * x["q"], 0.5 * x["k"] + 0.1
    x["g"], x["beta"] = rng.standard_normal((B, T, H)), rng.standard_normal((B, T, H))
    x["initial_state"] = np.swapaxes(x["initial_state"], -1, -2)  # V-first
    cot = (cot[0], np.swapaxes(cot[1], -1, -2))
    opts = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log.astype(np.float32),
                dt_bias=dt_bias.astype(np.float32), use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                state_v_first=True)

    def transform(d):
        l2 = lambda t: t / jnp.sqrt(jnp.sum(t * t, -1, keepdims=True) + 1e-6)  # noqa: E731
        return dict(q=l2(d["q"]), k=l2(d["k"]), v=d["v"],
                    g=-jnp.exp(A_log) * jax.nn.softplus(d["g"] + dt_bias),
                    beta=2 * jax.nn.sigmoid(d["beta"]), initial_state=jnp.swapaxes(d["initial_state"], -1, -2))

    want = float64_grads(x, (cot[0], np.swapaxes(cot[1], -1, -2)), None, transform)
    check(grads_of(x, cot, None, "triton", **opts), want, 1e-4)


@pytest.mark.parametrize("impl", ["triton", "auto"])
def test_vmap_of_grad_on_the_gpu_path(gpu_path_as_reference, impl):
    draws = [draw(10 + e, 1, 100, 2, 4, 16, 8, 1) for e in range(2)]
    stack = lambda i: jnp.stack([jnp.asarray(d[0][ARGS[i]], jnp.float32) for d in draws])  # noqa: E731
    do = jnp.stack([jnp.asarray(d[1][0], jnp.float32) for d in draws])

    def loss(q, k, v, g, beta, h0, do):
        o, _ = gdn_jax.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, impl=impl)
        return jnp.sum(o * do)
    got = jax.vmap(jax.grad(loss, argnums=range(6)))(*(stack(i) for i in range(6)), do)
    for e, (x, cot) in enumerate(draws):
        want = float64_grads(x, (cot[0], np.zeros_like(cot[1])), None)
        check([g[e] for g in got], want, 1e-4)


def test_forward_mode_on_the_gpu_path_names_the_way_out(gpu_path_as_reference):
    x, _ = draw(5, 1, 70, 1, 2, 16, 8, 1)
    args = [jnp.asarray(x[a], jnp.float32) for a in ARGS[:5]]
    f = lambda q: gdn_jax.chunk_gated_delta_rule(q, *args[1:], impl="triton")[0]  # noqa: E731
    with pytest.raises(NotImplementedError, match="Use impl='reference'"):
        jax.jvp(f, (args[0],), (args[0],))
    with pytest.raises(NotImplementedError, match="forward-mode"):
        jax.jit(lambda q: jax.jvp(f, (q,), (q,)))(args[0])
    with pytest.raises(NotImplementedError, match="forward-mode"):
        jax.jacfwd(lambda q: f(q).sum())(args[0])
    g = lambda q: gdn_jax.chunk_gated_delta_rule(q, *args[1:], impl="reference")[0]  # noqa: E731
    jax.jvp(g, (args[0],), (args[0],))  # the jnp path has forward mode


@pytest.mark.parametrize("impl", ["reference", "triton", "auto"])
def test_strong_gates_in_a_partial_chunk(gpu_path_as_reference, impl):
    """Gates of -16 softplus per step (Qwen3-Next's A_log reaches log 16): a
    partial chunk's padding rows must not meet exp(0 - gc) (overflow: NaN
    gradients)."""
    x, cot = draw(30, 2, 48, 2, 4, 16, 8, 2, gate_scale=16.0)
    check(grads_of(x, cot, None, impl), float64_grads(x, cot, None), 1e-4)
