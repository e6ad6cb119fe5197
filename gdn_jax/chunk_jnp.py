"""The chunk form of the GDN forward in plain jnp (docs/math.md, "Chunk form").

- :func:`chunk_local_cumsum`: ``gc``, the per-step log gates summed inside
  each 64-chunk (per chunk, not as differences of one global cumsum, which
  loses precision on long sequences).
- :func:`chunk_walk_jnp`: given ``w, u`` of :func:`gdn_jax.fwd_intra`, the
  inter-chunk state recurrence (a ``lax.scan`` over chunks) and the output of
  every chunk. For a chunk with rows ``i, j < n``, entering state ``S [K,
  V]``, ``gl = gc[n - 1]``, keys ``kk`` and scaled queries ``qq`` of the
  value head's key head::

      v'     = u - w @ S
      S_next = exp(gl) S + (kk * exp(gl - gc)[:, None])^T @ v'
      o      = (qq * exp(gc)[:, None]) @ S + tril(qq kk^T * exp(gc_i - gc_j)) @ v'

Derivation: inside a chunk the state just before token ``i`` writes is
``exp(gc_i) S + sum_{j<i} exp(gc_i - gc_j) kk_j v'_j^T``, so the recurrence's
``v'_i = beta_i (v_i - that^T kk_i)`` is the triangular system
``(I + L) v' = beta v - beta exp(gc) kk S`` with ``L`` of ``fwd_intra``; its
solution is ``A beta v - A (beta exp(gc) kk) S = u - w S``. ``o`` and
``S_next`` follow by summing the same decayed outer products.

This is the reference of the Triton walk (``kernels/chunk_fwd.py``) and the
CPU path of :func:`gdn_jax.chunk_gated_delta_rule`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .chunk_indices import cdiv
from .naive_recurrent import repeat_heads
from .precision import HIGHEST, compute_dtype

BT = 64


def chunk_layout(B, T, cu_seqlens, chunk_indices):
    """Chunks as ``[L, M, BT]`` grids: ``(gather, scatter, valid, seq)``.

    Fixed length: ``L = cdiv(T, 64)`` steps of ``M = B`` lanes (one sequence
    per lane, advanced together); ``gather`` pads ``T`` and reshapes, so the
    batch and head dims are never mixed with ``T`` (a sharding over them
    stays); ``seq`` is None (lane ``m`` is state ``m``). Packed:
    ``L = len(chunk_indices)`` steps of one lane, rows gathered by index;
    ``seq [L, 1]`` is each chunk's sequence, and the padding rows of
    :func:`gdn_jax.chunk_indices.chunk_indices_in_graph` have no valid row.

    ``gather``: ``[B, T, ...] -> [L, M, BT, ...]``, rows outside the chunk 0.
    ``scatter``: the inverse, ``[L, M, BT, ...] -> [B, T, ...]`` (rows of no
    chunk 0).
    """
    if cu_seqlens is None:
        NT = cdiv(T, BT)
        valid = jnp.broadcast_to((jnp.arange(NT * BT) < T).reshape(NT, 1, BT), (NT, B, BT))

        def gather(x):
            x = jnp.pad(x, [(0, 0), (0, NT * BT - T)] + [(0, 0)] * (x.ndim - 2))
            return jnp.swapaxes(x.reshape(B, NT, BT, *x.shape[2:]), 0, 1)

        def scatter(y):
            return jnp.swapaxes(y, 0, 1).reshape(B, NT * BT, *y.shape[3:])[:, :T]

        return gather, scatter, valid, None

    seq, c = chunk_indices[:, 0], chunk_indices[:, 1]
    pos = (cu_seqlens[seq] + c * BT)[:, None, None] + jnp.arange(BT, dtype=jnp.int32)  # [L, 1, BT]
    valid = pos < cu_seqlens[seq + 1][:, None, None]
    src = jnp.where(valid, pos, 0)
    dst = jnp.where(valid, pos, T).reshape(-1)  # rows of no chunk are dropped

    def gather(x):
        y = jnp.asarray(x)[0][src]
        return jnp.where(valid.reshape(valid.shape + (1,) * (y.ndim - 3)), y, 0)

    def scatter(y):
        flat = jnp.zeros((T, *y.shape[3:]), y.dtype)
        return flat.at[dst].set(y.reshape(-1, *y.shape[3:]), mode="drop")[None]

    return gather, scatter, valid, seq[:, None]


def chunk_local_cumsum(a, cu_seqlens=None, chunk_indices=None):
    """``gc [B, T, H]``: the per-step log gates ``a [B, T, H]`` summed inside
    each 64-chunk of each sequence (float32, float64 for float64 ``a``);
    packed batches need both ``cu_seqlens`` and ``chunk_indices`` (int32)."""
    B, T = a.shape[:2]
    ct = compute_dtype(a.dtype)
    gather, scatter, _, _ = chunk_layout(B, T, cu_seqlens, chunk_indices)
    return scatter(jnp.cumsum(gather(a.astype(ct)), axis=2))


def chunk_states_jnp(kk, w, u, gc, valid, seq, states):
    """The state walk over chunks in the ``[L, M, BT, ...]`` layout of
    :func:`chunk_layout` (keys ``kk`` repeated to the value heads, the compute
    dtype): ``(S_in [L, M, H, K, V], v_new [L, M, BT, H, V], final states)``,
    the state entering each chunk and ``v' = u - w S``."""
    last = jnp.maximum(valid.sum(-1) - 1, 0)  # [L, M]: each chunk's last row
    gl = jnp.take_along_axis(gc, last[:, :, None, None], axis=2)[:, :, 0]  # [L, M, H]

    def step(states, x):
        kk_c, w_c, u_c, gc_c, gl_c, s, live = x  # lanes M: [M, BT, H, .], [M, H], [M]
        S = states if s is None else states[s]  # [M, H, K, V], the states entering these chunks
        v_new = u_c - jnp.einsum("mihk,mhkv->mihv", w_c, S, precision=HIGHEST)
        kd = kk_c * jnp.exp(gl_c[:, None] - gc_c)[..., None]  # rows past the end: k is 0
        S_next = jnp.exp(gl_c)[..., None, None] * S + jnp.einsum(
            "mihk,mihv->mhkv", kd, v_new, precision=HIGHEST)
        S_next = jnp.where(live[:, None, None, None], S_next, S)  # padding chunks: unchanged
        return (S_next if s is None else states.at[s].set(S_next)), (S, v_new)

    states, (S_in, v_new) = jax.lax.scan(step, states, (kk, w, u, gc, gl, seq, valid[..., 0]))
    return S_in, v_new, states


def chunk_walk_jnp(q, k, w, u, gc, initial_state, cu_seqlens=None, chunk_indices=None, *,
                   scale):
    """The state walk and the outputs (module docstring), in jnp.

    Args:
      q, k: ``[B, T, Hg, K]``; ``w [B, T, H, K]``, ``u [B, T, H, V]`` of
        :func:`gdn_jax.fwd_intra` on these ``k`` and ``gc``.
      gc: ``[B, T, H]`` chunk-local cumulative log gates.
      initial_state: ``[N, H, K, V]`` float.
      cu_seqlens, chunk_indices: int32, a packed batch (``B == 1``), or None.
      scale: the query scale (a scalar).

    Returns:
      ``o [B, T, H, V]`` in ``u``'s dtype and the final states ``[N, H, K,
      V]`` in the compute dtype (float32, float64 for float64 inputs).
    """
    B, T, H = u.shape[:3]
    ct = compute_dtype(q.dtype, k.dtype, w.dtype, u.dtype, gc.dtype)
    chunks, unchunk, valid, seq = chunk_layout(B, T, cu_seqlens, chunk_indices)

    def gather(x):  # [B, T, ...] -> [L, M, BT, ...] in ct
        return chunks(jnp.asarray(x).astype(ct))

    gc = gather(gc)  # [L, M, BT, H]
    qq = repeat_heads(gather(q), H) * jnp.asarray(scale, ct)
    kk = repeat_heads(gather(k), H)
    S_in, v_new, states = chunk_states_jnp(kk, gather(w), gather(u), gc, valid, seq,
                                           initial_state.astype(ct))
    o = jnp.einsum("lmihk,lmhkv->lmihv", qq * jnp.exp(gc)[..., None], S_in, precision=HIGHEST)
    gt = jnp.swapaxes(gc, -1, -2)  # [L, M, H, BT]
    # j <= i, both rows in the chunk: a padded row's gate is 0, and exp(0 - gc_j)
    # overflows on strong gates (the 0 * inf would reach the gradients as NaN)
    causal = jnp.tril(jnp.ones((BT, BT), bool)) & valid[:, :, None, :, None] & valid[:, :, None, None, :]
    diff = jnp.where(causal, gt[..., :, None] - gt[..., None, :], 0)
    attn = jnp.einsum("lmihk,lmjhk->lmhij", qq, kk, precision=HIGHEST)
    attn = jnp.where(causal, attn * jnp.exp(diff), 0)
    o = o + jnp.einsum("lmhij,lmjhv->lmihv", attn, v_new, precision=HIGHEST)
    return unchunk(o.astype(u.dtype)), states
