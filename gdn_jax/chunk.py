"""The whole Gated DeltaNet chunked forward on top of :func:`gdn_jax.fwd_intra`.

Steps (chunks of 64 tokens that never cross a sequence boundary):

1. ``gc``: chunk-local cumulative sum of the per-step log gates, computed per
   chunk (not as differences of one global cumsum, which loses precision on
   long sequences).
2. ``w, u = fwd_intra(k, v, gc, beta)``: the fused Triton path on an NVIDIA
   GPU, the jnp reference elsewhere.
3. The inter-chunk state recurrence, a ``lax.scan`` over chunks. For a chunk
   with rows ``i, j < n``, entering state ``S [K, V]``, ``gl = gc[n - 1]``,
   GQA-repeated keys ``kk`` and scaled queries ``qq``::

       v_new  = u - w @ S
       S_next = exp(gl) S + (kk * exp(gl - gc)[:, None])^T @ v_new

4. The output of every chunk, in parallel once the entering states are known::

       o = (qq * exp(gc)[:, None]) @ S + tril(qq kk^T * exp(gc_i - gc_j)) @ v_new

Derivation: inside a chunk the state just before token ``i`` writes is
``exp(gc_i) S + sum_{j<i} exp(gc_i - gc_j) kk_j v'_j^T``, so the recurrence's
``v'_i = beta_i (v_i - that^T kk_i)`` is the triangular system
``(I + L) v' = beta v - beta exp(gc) kk S`` with SPEC.md's ``L``; its solution
is ``A beta v - A (beta exp(gc) kk) S = u - w S``. ``o`` and ``S_next`` follow
by summing the same decayed outer products.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .chunk_indices import cdiv, varlen_work_list
from .intra import fwd_intra
from .naive_recurrent import prepare_gdn_args, repeat_heads
from .precision import HIGHEST, compute_dtype
from .sharding import call_with_auto_axes
from .validate import check_impl

BT = 64


def _chunk_layout(B, T, cu_seqlens, chunk_indices):
    """Chunks as ``[L, M, BT]`` grids: ``(gather, scatter, valid, seq)``.

    Fixed length: ``L = cdiv(T, 64)`` steps of ``M = B`` lanes (one sequence
    per lane, advanced together); ``gather`` pads ``T`` and reshapes, so the
    batch and head dims are never mixed with ``T`` (a sharding over them
    stays); ``seq`` is None (lane ``m`` is state ``m``). Packed:
    ``L = len(chunk_indices)`` steps of one lane, rows gathered by index;
    ``seq [L, 1]`` is each chunk's sequence, and padding rows of
    :func:`chunk_indices_in_graph` have no valid row.

    ``gather``: ``[B, T, ...] -> [L, M, BT, ...]``, rows outside the chunk 0.
    ``scatter``: the inverse, ``[L, M, BT, ...] -> [B, T, ...]``.
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
        y = x[0][src]
        return jnp.where(valid.reshape(valid.shape + (1,) * (y.ndim - 3)), y, 0)

    def scatter(y):
        flat = jnp.zeros((T, *y.shape[3:]), y.dtype)
        return flat.at[dst].set(y.reshape(-1, *y.shape[3:]), mode="drop")[None]

    return gather, scatter, valid, seq[:, None]


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                           output_final_state=False, cu_seqlens=None, impl="auto"):
    """Gated DeltaNet forward, chunked; equals :func:`gdn_jax.naive_recurrent.naive_recurrent_gated_delta_rule`.

    Args:
      q: ``[B, T, Hg, K]`` queries; bfloat16, float16 or float32 (dtype of ``k``).
      k: ``[B, T, Hg, K]`` keys (usually L2-normalised).
      v: ``[B, T, H, V]`` values, dtype of ``k``, ``H % Hg == 0`` (GQA: value
        head ``h`` reads q/k head ``h // (H // Hg)``).
      g: ``[B, T, H]`` per-step log forget gate (natural log, ``<= 0``), not
        cumulated; float, used in float32.
      beta: ``[B, T, H]`` write strengths (usually ``sigmoid``), float.
      scale: query scale, default ``K ** -0.5``.
      initial_state: ``[N, H, K, V]`` float (``N = B``, or ``len(cu_seqlens) - 1``),
        or None for zeros.
      output_final_state: also return the state after each sequence.
      cu_seqlens: ``[N + 1]`` int32 offsets of a packed batch (``B == 1``,
        ``cu[0] == 0``, non-decreasing, ``cu[-1] == T``); may be traced under
        ``jax.jit`` (its values are then not checked).
      impl: how ``fwd_intra`` runs: ``"auto"`` (the fastest Triton path on
        an NVIDIA GPU, else jnp), ``"gluon"``, ``"triton"``, ``"split"``,
        ``"seed"`` or ``"reference"`` (see :func:`gdn_jax.fwd_intra`); static
        under ``jax.jit``.

    Returns:
      ``(o, final_state)``: ``o [B, T, H, V]`` in v's dtype; ``final_state
      [N, H, K, V]`` float32 (an empty sequence keeps its initial state), or
      None unless ``output_final_state``.

    Under ``jax.jit``, inputs sharded over batch and/or heads stay sharded:
    every step is per batch row and head, and ``fwd_intra`` is partitioned
    (:mod:`gdn_jax.sharding`); ``o`` and ``final_state`` come out split the same way.
    """
    op = "chunk_gated_delta_rule"
    check_impl(op, impl)
    q, k, v, g, beta, initial_state, cu_seqlens, dims, scale = prepare_gdn_args(
        op, q, k, v, g, beta, scale, initial_state, cu_seqlens, same_dtype=True)
    # Arrays go through call_with_auto_axes; a NumPy cu_seqlens stays a constant (exact chunk list).
    cu_array = cu_seqlens if isinstance(cu_seqlens, jax.Array) else None
    forward = functools.partial(_forward, dims=dims, scale=scale, impl=impl,
                                output_final_state=output_final_state,
                                cu_const=None if cu_array is not None else cu_seqlens)
    return call_with_auto_axes(  # sharded over batch / heads as o [B, T, H, V], state [N, H, K, V]
        forward, (q, k, v, g, beta, initial_state, cu_array), k, v, cu_seqlens is not None,
        lambda b, h: (P(b, None, h, None), P(b, h, None, None) if output_final_state else None))


def _forward(q, k, v, g, beta, initial_state, cu_seqlens, *, dims, scale, output_final_state,
             impl, cu_const):
    """:func:`chunk_gated_delta_rule` on checked arguments (``cu_const``: a
    NumPy ``cu_seqlens``, passed apart)."""
    cu_seqlens = cu_const if cu_seqlens is None else cu_seqlens
    B, T, Hg, H, K, V, N = dims
    ct = compute_dtype(q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype)
    states = jnp.zeros((N, H, K, V), ct) if initial_state is None else initial_state.astype(ct)
    if B * T == 0:
        return jnp.zeros((B, T, H, V), v.dtype), (states if output_final_state else None)

    cu_seqlens, chunk_indices = varlen_work_list(cu_seqlens, None, T, BT)
    chunks, unchunk, valid, seq = _chunk_layout(B, T, cu_seqlens, chunk_indices)

    def gather(x):  # [B, T, ...] -> [L, M, BT, ...] in ct
        return chunks(x.astype(ct))

    def scatter(y, dtype):  # [L, M, BT, ...] -> [B, T, ...]
        return unchunk(y.astype(dtype))

    gc = jnp.cumsum(gather(g), axis=2)  # [L, M, BT, H], chunk-local
    w, u, _ = fwd_intra(k, v, scatter(gc, ct), beta, cu_seqlens=cu_seqlens,
                        chunk_indices=chunk_indices, impl=impl)
    qq = repeat_heads(gather(q), H) * jnp.asarray(scale, ct)
    kk = repeat_heads(gather(k), H)
    gl = gc[:, :, -1]  # [L, M, H]: rows past the last valid one add 0 to the cumsum

    def step(states, x):
        kk_c, w_c, u_c, gc_c, gl_c, s, live = x  # lanes M: [M, BT, H, .], [M, H], [M]
        S = states if s is None else states[s]  # [M, H, K, V], the states entering these chunks
        v_new = u_c - jnp.einsum("mihk,mhkv->mihv", w_c, S, precision=HIGHEST)
        kd = kk_c * jnp.exp(gl_c[:, None] - gc_c)[..., None]
        S_next = jnp.exp(gl_c)[..., None, None] * S + jnp.einsum(
            "mihk,mihv->mhkv", kd, v_new, precision=HIGHEST)
        S_next = jnp.where(live[:, None, None, None], S_next, S)  # padding chunks: unchanged
        return (S_next if s is None else states.at[s].set(S_next)), (S, v_new)

    states, (S_in, v_new) = jax.lax.scan(
        step, states, (kk, gather(w), gather(u), gc, gl, seq, valid[..., 0]))

    o = jnp.einsum("lmihk,lmhkv->lmihv", qq * jnp.exp(gc)[..., None], S_in, precision=HIGHEST)
    gt = jnp.swapaxes(gc, -1, -2)  # [L, M, H, BT]
    causal = jnp.tril(jnp.ones((BT, BT), bool))
    diff = jnp.where(causal, gt[..., :, None] - gt[..., None, :], 0)
    attn = jnp.einsum("lmihk,lmjhk->lmhij", qq, kk, precision=HIGHEST)
    attn = jnp.where(causal, attn * jnp.exp(diff), 0)
    o = o + jnp.einsum("lmhij,lmjhv->lmihv", attn, v_new, precision=HIGHEST)
    return scatter(o, v.dtype), (states if output_final_state else None)
