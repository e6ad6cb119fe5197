"""naive_recurrent_gated_delta_rule against a float64 NumPy loop written from docs/math.md."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax.naive_recurrent import naive_recurrent_gated_delta_rule
from numpy_reference import rel_err as rel

naive_jit = jax.jit(naive_recurrent_gated_delta_rule, static_argnames=("output_final_state",))


def gdn_numpy(q, k, v, g, beta, scale=None, h0=None, cu_seqlens=None):
    """docs/math.md's per-token recurrence, float64, loops over sequences, heads, tokens."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    B, T, Hg, K = k.shape
    H, V = v.shape[2:]
    scale = K ** -0.5 if scale is None else scale
    seqs = ([(b, 0, T) for b in range(B)] if cu_seqlens is None else
            [(0, int(a), int(e)) for a, e in zip(cu_seqlens[:-1], cu_seqlens[1:])])
    o = np.zeros((B, T, H, V))
    final = np.zeros((len(seqs), H, K, V))
    for n, (b, bos, eos) in enumerate(seqs):
        for h in range(H):
            S = np.zeros((K, V)) if h0 is None else np.array(h0[n, h], np.float64)
            hk = h // (H // Hg)
            for t in range(bos, eos):
                S = np.exp(g[b, t, h]) * S
                v_new = beta[b, t, h] * (v[b, t, h] - S.T @ k[b, t, hk])
                S = S + np.outer(k[b, t, hk], v_new)
                o[b, t, h] = S.T @ (scale * q[b, t, hk])
            final[n, h] = S
    return o, final


def make_inputs(rng, B, T, Hg, H, K, V, dtype=np.float32):
    """Realistic random inputs: unit keys, beta = sigmoid(randn), g = -0.1 softplus(randn)."""
    q = rng.standard_normal((B, T, Hg, K))
    k = rng.standard_normal((B, T, Hg, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, T, H, V))
    g = -0.1 * np.logaddexp(0.0, rng.standard_normal((B, T, H)))
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((B, T, H))))
    return tuple(x.astype(dtype) for x in (q, k, v)) + (g.astype(np.float32), beta.astype(np.float32))


@pytest.mark.parametrize("Hg,H,with_h0", [(2, 2, False), (2, 4, True)])
def test_matches_numpy_fixed_length(Hg, H, with_h0):
    rng = np.random.default_rng(1)
    B, T, K, V = 2, 37, 16, 8
    args = make_inputs(rng, B, T, Hg, H, K, V)
    h0 = rng.standard_normal((B, H, K, V)).astype(np.float32) if with_h0 else None
    o, final = naive_jit(*args, initial_state=h0, output_final_state=True)
    o_ref, final_ref = gdn_numpy(*args, h0=h0)
    assert o.shape == (B, T, H, V) and o.dtype == jnp.float32
    assert final.shape == (B, H, K, V) and final.dtype == jnp.float32
    assert rel(o, o_ref) < 1e-5
    assert rel(final, final_ref) < 1e-5


def test_scale_and_no_final_state():
    rng = np.random.default_rng(2)
    args = make_inputs(rng, 1, 9, 1, 2, 8, 4)
    o, final = naive_recurrent_gated_delta_rule(*args, scale=0.3)
    assert final is None
    assert rel(o, gdn_numpy(*args, scale=0.3)[0]) < 1e-5


@pytest.mark.parametrize("traced", [False, True])
def test_varlen_matches_numpy(traced):
    rng = np.random.default_rng(3)
    cu = np.array([0, 5, 5, 6, 20], np.int32)  # an empty and a length-1 sequence
    Hg, H, K, V = 1, 2, 8, 4
    args = make_inputs(rng, 1, int(cu[-1]), Hg, H, K, V)
    h0 = rng.standard_normal((len(cu) - 1, H, K, V)).astype(np.float32)
    if traced:
        o, final = naive_jit(*args, initial_state=h0, output_final_state=True,
                             cu_seqlens=jnp.asarray(cu))
    else:
        o, final = naive_recurrent_gated_delta_rule(*args, initial_state=h0,
                                                    output_final_state=True, cu_seqlens=cu)
    o_ref, final_ref = gdn_numpy(*args, h0=h0, cu_seqlens=cu)
    assert rel(o, o_ref) < 1e-5
    assert rel(final, final_ref) < 1e-5
    np.testing.assert_array_equal(final[1], h0[1])  # the empty sequence keeps its state


def test_output_dtype_follows_v():
    rng = np.random.default_rng(4)
    args = make_inputs(rng, 1, 5, 1, 1, 8, 4, dtype=jnp.bfloat16)
    o, _ = naive_recurrent_gated_delta_rule(*args)
    assert o.dtype == jnp.bfloat16


@pytest.mark.parametrize("change,exc,needle", [
    (lambda a: {**a, "q": a["q"][0]}, ValueError, "`q`"),
    (lambda a: {**a, "v": a["v"][:, :, :3]}, ValueError, "multiple of the key heads"),
    (lambda a: {**a, "g": a["g"][:, :-1]}, ValueError, "`g`"),
    (lambda a: {**a, "beta": None}, TypeError, "`beta`"),
    (lambda a: {**a, "k": a["k"].astype(np.int32)}, TypeError, "`k`"),
    (lambda a: {**a, "initial_state": np.zeros((3, 4, 8, 4), np.float32)}, ValueError,
     "`initial_state`"),
])
def test_bad_inputs(change, exc, needle):
    rng = np.random.default_rng(5)
    q, k, v, g, beta = make_inputs(rng, 2, 4, 2, 4, 8, 4)
    kwargs = change(dict(q=q, k=k, v=v, g=g, beta=beta))
    with pytest.raises(exc, match=needle):
        naive_recurrent_gated_delta_rule(**kwargs)
