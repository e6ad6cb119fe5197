"""Per-token Gated DeltaNet recurrence in plain jnp: the semantic ground truth.

One ``lax.scan`` step per token, float32 math (float64 where the inputs are
float64 and x64 is on). Slow by design; :func:`gdn_jax.chunk.chunk_gated_delta_rule`
computes the same thing chunk by chunk and is tested against this.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .precision import HIGHEST, compute_dtype
from .validate import as_array, check_gdn_args


def prepare_gdn_args(op, q, k, v, g, beta, scale, initial_state, cu_seqlens, *, same_dtype,
                     state_v_first=False):
    """Shared front of the GDN forwards: arrays, checks, default scale.

    Returns ``(q, k, v, g, beta, initial_state, cu_seqlens, dims, scale)`` with
    ``dims`` a :class:`gdn_jax.validate.GdnDims` and ``scale`` defaulted to
    ``K ** -0.5``.
    """
    q, k, v, g, beta, initial_state, cu_seqlens = map(
        as_array, (q, k, v, g, beta, initial_state, cu_seqlens))
    dims = check_gdn_args(op, q, k, v, g, beta, scale, initial_state, cu_seqlens,
                          same_dtype=same_dtype, state_v_first=state_v_first)
    if scale is None:
        scale = dims.K ** -0.5
    return q, k, v, g, beta, initial_state, cu_seqlens, dims, scale


def repeat_heads(x, H: int):
    """GQA: ``[..., Hg, D]`` -> ``[..., H, D]``; value head ``h`` reads head ``h // (H // Hg)``."""
    return jnp.repeat(x, H // x.shape[-2], axis=-2)


def naive_recurrent_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                                     output_final_state=False, cu_seqlens=None):
    """The Gated DeltaNet forward, one token at a time (docs/math.md).

    Per sequence and value head ``h`` (``k_t``, ``q_t`` from key head
    ``h // (H // Hg)``), with state ``S [K, V]`` starting at ``initial_state``
    (zeros when None)::

        S    = exp(g_t) * S
        v'_t = beta_t * (v_t - S^T k_t)
        S    = S + outer(k_t, v'_t)
        o_t  = S^T (scale * q_t)

    Args:
      q: ``[B, T, Hg, K]`` queries, float.
      k: ``[B, T, Hg, K]`` keys (usually L2-normalised), float.
      v: ``[B, T, H, V]`` values, float, ``H % Hg == 0``.
      g: ``[B, T, H]`` per-step log forget gate (natural log, ``<= 0``); not cumulated.
      beta: ``[B, T, H]`` write strengths.
      scale: query scale, default ``K ** -0.5``.
      initial_state: ``[N, H, K, V]`` float (N = B, or the number of packed
        sequences), or None for zeros.
      output_final_state: also return the state after each sequence's last token.
      cu_seqlens: ``[N + 1]`` int32 offsets of a packed batch (``B == 1``); the
        state restarts at every sequence start. May be traced under ``jax.jit``.

    Returns:
      ``(o, final_state)``: ``o [B, T, H, V]`` in v's dtype; ``final_state
      [N, H, K, V]`` float32 (float64 for float64 inputs), or None unless
      ``output_final_state``. An empty sequence's final state is its initial state.
    """
    op = "naive_recurrent_gated_delta_rule"
    q, k, v, g, beta, initial_state, cu_seqlens, dims, scale = prepare_gdn_args(
        op, q, k, v, g, beta, scale, initial_state, cu_seqlens, same_dtype=False)
    B, T, Hg, H, K, V, N = dims
    ct = compute_dtype(q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype)
    qq = repeat_heads(q.astype(ct), H) * jnp.asarray(scale, ct)
    kk = repeat_heads(k.astype(ct), H)
    xs = [x.astype(ct) for x in (qq, kk, v, g, beta)]
    if cu_seqlens is None:
        # B lanes side by side, one sequence each.
        xs = [jnp.swapaxes(x, 0, 1) for x in xs]  # [T, B, ...]
        seq = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32), (T, B))
    else:
        # One lane walks the packed tokens; each token updates its own sequence's state.
        cu = jnp.asarray(cu_seqlens, jnp.int32)
        owner = jnp.searchsorted(cu, jnp.arange(T, dtype=jnp.int32), side="right") - 1
        seq = jnp.clip(owner, 0, N - 1).astype(jnp.int32)[:, None]  # [T, 1]
        xs = [jnp.swapaxes(x, 0, 1) for x in xs]  # [T, 1, ...]
    states = (jnp.zeros((N, H, K, V), ct) if initial_state is None
              else initial_state.astype(ct))

    def step(states, x):
        q_t, k_t, v_t, a_t, b_t, s = x  # [M, H, K], [M, H, K], [M, H, V], [M, H], [M, H], [M]
        S = jnp.exp(a_t)[..., None, None] * states[s]  # [M, H, K, V]
        v_new = b_t[..., None] * (v_t - jnp.einsum("mhk,mhkv->mhv", k_t, S, precision=HIGHEST))
        S = S + k_t[..., :, None] * v_new[..., None, :]
        o_t = jnp.einsum("mhk,mhkv->mhv", q_t, S, precision=HIGHEST)
        return states.at[s].set(S), o_t

    states, o = jax.lax.scan(step, states, (*xs, seq))
    o = jnp.swapaxes(o, 0, 1).astype(v.dtype)  # [B, T, H, V]
    return o, (states if output_final_state else None)
