"""Launch of ``kernels/chunk_fwd.py`` (the state walk with the output) through jax-triton."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .autotune import autotune_enabled, timing_allowed
from .chunk_fwd_gluon import storing_walk_enabled, storing_walk_gluon, storing_walk_missing
from .chunk_indices import cdiv, padded_chunk_rows
from .triton_launch import GRID_LIMITS, TIMING_ROWS, check_grid, dot_precision, head_fastest_grid, launch
from .validate import check_kernel_dtypes

BT = 64


def chunk_fwd_grid(N: int, H: int, V: int, BV: int) -> tuple[int]:
    """One program per (V block, value head, sequence), on axis 0."""
    return (cdiv(V, BV) * H * N,)


def programs_bucket(N: int, H: int) -> int:
    """``N * H`` rounded down to a power of two, at most 1024: the walk's
    parallelism, which decides its best V block (many sequences and heads: wide
    blocks and few programs; one long sequence: narrow blocks, more programs),
    so the configs are chosen per bucket (a part of the autotuning key)."""
    return min(1024, 1 << max(0, (N * H).bit_length() - 1))


def walk_kernel_fits(dtype, K: int) -> bool:
    """Whether the walk kernel's tiles fit a Hopper SM's shared memory: rows of
    at most 512 bytes (bfloat16 and float16 up to K = 256, float32 up to K =
    128; float32 with K = 256 needs 282 KB at the smallest config, against
    227 KB). Past that the walk runs in jnp."""
    return jnp.dtype(dtype).itemsize * K <= 512


def chunk_fwd_constexprs(Hg, H, K, V, use_h0, store_final, varlen, v_first, precision) -> dict:
    """The kernel's constexprs (shared by the JAX and the torch launch)."""
    return dict(H=H, Hg=Hg, K=K, V=V, BT=BT, BK=max(16, 1 << (K - 1).bit_length()),
                USE_H0=bool(use_h0), STORE_FINAL=bool(store_final), IS_VARLEN=bool(varlen),
                STATE_V_FIRST=bool(v_first), DOT_PRECISION=precision)


def check_chunk_grid(N: int, H: int, V: int) -> None:
    programs = chunk_fwd_grid(N, H, V, 32)[0]  # the narrowest V block of the configs
    if programs > GRID_LIMITS[0]:
        raise ValueError(
            f"chunk_gated_delta_rule: {N} sequences x {H} value heads x {cdiv(V, 32)} V blocks "
            f"= {programs} programs, over CUDA's grid limit of {GRID_LIMITS[0]}; split the call")


def _time_on_fewer_rows(q, k, w, u, gc, h0, cu_seqlens, chunk_offsets, beta=None, chunk_indices=None,
                        **kwargs):
    """Past :data:`gdn_jax.triton_launch.TIMING_ROWS` rows, choose the configs
    on an abstract launch of at most that many rows (same heads, dims, dtypes
    and flags, so the same config key): the real launch then finds them chosen."""
    B, T = u.shape[:2]
    if B * T <= TIMING_ROWS or not (autotune_enabled() and timing_allowed()):
        return
    rows = (max(1, min(B, TIMING_ROWS // T)), min(T, TIMING_ROWS))
    fewer = lambda x: jax.ShapeDtypeStruct(rows + x.shape[2:], x.dtype)  # noqa: E731
    n = rows[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    state = None if h0 is None else jax.ShapeDtypeStruct((n,) + h0.shape[1:], h0.dtype)
    ci = None if chunk_indices is None else jax.ShapeDtypeStruct((padded_chunk_rows(rows[1], n, BT), 2),
                                                                  jnp.int32)
    jax.eval_shape(functools.partial(chunk_walk_triton, **kwargs), *map(fewer, (q, k, w, u, gc)),
                   state, cu_seqlens, chunk_offsets, beta=None if beta is None else fewer(beta),
                   chunk_indices=ci)


def state_rows(B: int, T: int, N: int, varlen: bool) -> int:
    """Rows of the per-chunk states ``h [rows, H, K, V]``: every chunk of the
    batch (fixed length), or the bound ``cdiv(T, 64) + N`` of a packed batch
    (rows past its chunks are not written)."""
    return padded_chunk_rows(T, N, BT) if varlen else B * cdiv(T, BT)


def chunk_qk_block(K: int) -> int:
    """``BK`` of ``kernels/chunk_qk.py``: ``K`` rounded up to a power of two
    (at least 16), at most 128 (two blocks at K = 256)."""
    return min(128, max(16, 1 << (K - 1).bit_length()))


def chunk_qk_triton(q, k, gc, cu_seqlens=None, chunk_indices=None, *, sum_g=False):
    """``Aqk [B, T, H, 64]`` in q's dtype (``kernels/chunk_qk.py``): per chunk
    and value head the output's masked, gated ``q k^T``, laid out as
    ``fwd_intra``'s ``A``. ``q, k [B, T, Hg, K]``, ``gc [B, T, H]`` float32
    chunk-local cumulative log gates, or with ``sum_g`` the per-step log
    gates ``[B, T, H]`` float32, which the kernel sums within each chunk
    (``SUM_G``); a packed batch (``B == 1``) gives ``cu_seqlens`` and its
    ``chunk_indices``."""
    from .kernels.chunk_qk import gdn_chunk_qk_kernel

    B, T, Hg, K = k.shape
    H = gc.shape[2]
    if B * T * H == 0:  # no program to launch
        return jnp.zeros((B, T, H, BT), q.dtype)
    varlen = cu_seqlens is not None
    grid = head_fastest_grid(chunk_indices.shape[0] if varlen else cdiv(T, BT), Hg, B)  # per key head
    check_grid("chunk_gated_delta_rule", grid, ("chunks * key heads (NT * Hg)", "batch rows B"))
    dummy = jnp.zeros((1,), jnp.int32)
    return launch("chunk_qk", gdn_chunk_qk_kernel,
                  (q, k, gc, cu_seqlens if varlen else dummy, chunk_indices if varlen else dummy, T),
                  out=jax.ShapeDtypeStruct((B, T, H, BT), q.dtype), grid=grid, H=H, Hg=Hg, K=K, BT=BT,
                  BK=chunk_qk_block(K), IS_VARLEN=varlen,
                  DOT_PRECISION=dot_precision(), SUM_G=bool(sum_g))


def chunk_walk_triton(q, k, w, u, gc, initial_state=None, cu_seqlens=None, chunk_offsets=None, *,
                      scale, write_o=True, store_final=True, store_h=False, store_v=False,
                      state_v_first=False, beta=None, chunk_indices=None, qk=None, sum_g=False):
    """``(o, final_state, h, v_new)`` of the chunk walk (``kernels/chunk_fwd.py``),
    each None where not asked for.

    Args (already checked, shapes as :func:`gdn_jax.chunk_gated_delta_rule`):
      q, k: ``[B, T, Hg, K]``; w: ``[B, T, H, K]``; u: ``[B, T, H, V]``, all of
        one dtype (bfloat16, float16 or float32); ``q`` is not read without ``write_o``.
        With ``beta`` given: ``A [B, T, H, 64]`` (``fwd_intra``'s) in place of
        ``w`` and ``v [B, T, H, V]`` in place of ``u``, and the kernel forms
        ``v' = A (beta (v - exp(gc) k S))`` itself (``FROM_A``), after
        :func:`chunk_qk_triton` (with ``write_o``).
      beta: ``[B, T, H]`` float32, or None (``w`` and ``u`` given).
      chunk_indices: with ``beta``, ``write_o`` and ``cu_seqlens``, the
        packed batch's chunk list (:func:`gdn_jax.prepare_chunk_indices`).
      qk: with ``beta`` and ``write_o``, the output's block of
        :func:`chunk_qk_triton` on these ``q, k, gc``, or None (computed here).
      gc: ``[B, T, H]`` float32 chunk-local cumulative log gates, or with
        ``sum_g`` the per-step log gates ``[B, T, H]`` float32, which the
        kernels sum within each chunk themselves (``SUM_G``; a given ``qk``
        is then the block of these gates' sums).
      initial_state: ``[N, H, K, V]`` float32 (``[N, H, V, K]`` with
        ``state_v_first``), or None for zeros.
      cu_seqlens: ``[N + 1]`` int32 of a packed batch (``B == 1``), or None;
        with ``store_h`` its ``chunk_offsets [N + 1]``
        (:func:`gdn_jax.chunk_indices.chunk_offsets`).
      scale: the query scale, a Python number.

    Returns:
      ``o [B, T, H, V]`` in u's dtype (``write_o``); the final states (float32,
      the layout of ``initial_state``; ``store_final``); the state entering
      every chunk, ``h [rows, H, K, V]`` in u's dtype (:func:`state_rows`;
      ``store_h``); ``v' [B, T, H, V]`` in u's dtype (``store_v``).
    """
    check_kernel_dtypes("chunk_gated_delta_rule", q=q, k=k, w=w, u=u)
    B, T, Hg, K = k.shape
    H, V = u.shape[2], u.shape[3]
    varlen = cu_seqlens is not None
    N = B if not varlen else cu_seqlens.shape[0] - 1
    state_shape = (N, H, V, K) if state_v_first else (N, H, K, V)
    one = (1,)
    types = (jax.ShapeDtypeStruct((B, T, H, V) if write_o else one, u.dtype),
             jax.ShapeDtypeStruct(state_shape if store_final else one, jnp.float32),
             jax.ShapeDtypeStruct((state_rows(B, T, N, varlen), H, K, V) if store_h else one, u.dtype),
             jax.ShapeDtypeStruct((B, T, H, V) if store_v else one, u.dtype))
    wanted = (write_o, store_final, store_h, store_v)
    if N * H == 0 or B * T == 0:
        outs = [jnp.zeros(t.shape, t.dtype) for t in types]
        if store_final and initial_state is not None:
            outs[1] = initial_state.astype(jnp.float32)
        return tuple(x if want else None for x, want in zip(outs, wanted))
    check_chunk_grid(N, H, V)
    kwargs = dict(scale=scale, write_o=write_o, store_final=store_final, store_h=store_h,
                  store_v=store_v, state_v_first=state_v_first, sum_g=sum_g)
    # the forward of jax.grad, in Gluon where it is switched on and can run
    gluon = beta is not None and write_o and store_h and store_v and sum_g and storing_walk_enabled() \
        and storing_walk_missing(u.dtype, K, T, varlen) is None
    if not gluon:
        _time_on_fewer_rows(q, k, w, u, gc, initial_state, cu_seqlens, chunk_offsets, beta=beta,
                            chunk_indices=chunk_indices, **kwargs)
    from .kernels.chunk_fwd import gdn_chunk_fwd_kernel

    # jax-triton 0.3 takes no None operand: 1-element dummies, flagged unused.
    dummy = jnp.zeros((1,), jnp.int32)
    if beta is None or not write_o:
        qk = dummy
    elif qk is None:
        qk = chunk_qk_triton(q, k, gc, cu_seqlens, chunk_indices, sum_g=sum_g)
    if gluon:
        outs = storing_walk_gluon(q, k, w, u, gc, beta, qk, initial_state, scale=scale, out=types,
                                  store_final=store_final, state_v_first=state_v_first)
    else:
        operands = (q, k, w, u, gc, dummy if beta is None else beta, qk,
                    dummy if initial_state is None else initial_state,
                    dummy if cu_seqlens is None else cu_seqlens,
                    dummy if chunk_offsets is None else chunk_offsets, float(scale), T)
        outs = launch("chunk_fwd", gdn_chunk_fwd_kernel, operands, out=types,
                      grid=lambda meta: chunk_fwd_grid(N, H, V, meta["BV"]),
                      tune_key=("programs", programs_bucket(N, H)),
                      **chunk_fwd_constexprs(Hg, H, K, V, initial_state is not None, store_final,
                                             varlen, state_v_first, dot_precision()),
                      WRITE_O=write_o, STORE_H=store_h, STORE_V=store_v, FROM_A=beta is not None,
                      SUM_G=bool(sum_g))
    return tuple(x if want else None for x, want in zip(outs, wanted))


def chunk_fwd_triton(q, k, w, u, gc, initial_state=None, cu_seqlens=None, *, scale,
                     output_final_state=True, state_v_first=False, beta=None, chunk_indices=None,
                     return_qk=False, return_states=False, sum_g=False):
    """``(o, final_state or None)``: :func:`chunk_walk_triton` writing the output
    (from ``w, u``, or from ``A, v`` with ``beta``); with ``return_qk`` (and
    ``beta``) ``qk`` after them, the output's block the walk read
    (:func:`chunk_qk_triton`, ``[B, T, H, 64]`` in q's dtype); with
    ``return_states`` (fixed length) ``h, v_new`` last, the state entering
    every chunk ``[B, cdiv(T, 64), H, K, V]`` and ``v' [B, T, H, V]``, in u's
    dtype. The backward reads both again. ``sum_g``: ``gc`` holds the
    per-step log gates ``[B, T, H]`` float32, summed within each chunk by
    both kernels (``SUM_G``)."""
    assert not (return_states and cu_seqlens is not None), "packed batches' states are recomputed"
    qk = chunk_qk_triton(q, k, gc, cu_seqlens, chunk_indices, sum_g=sum_g) if return_qk else None
    o, final, h, v_new = chunk_walk_triton(q, k, w, u, gc, initial_state, cu_seqlens, scale=scale,
                                           store_final=output_final_state, store_h=return_states,
                                           store_v=return_states, state_v_first=state_v_first,
                                           beta=beta, chunk_indices=chunk_indices, qk=qk, sum_g=sum_g)
    out = (o, final) + ((qk,) if return_qk else ())
    if return_states:
        B, T = u.shape[:2]
        out += (h.reshape((B, cdiv(T, BT)) + h.shape[1:]), v_new)
    return out
