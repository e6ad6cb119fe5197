"""The backward through the WY representation of ``fwd_intra``.

Written from docs/math.md ("Gradients"; ``gdn_jax/chunk_bwd_jnp.py`` is its jnp
reference). Given the cotangents of ``u = A (beta v)`` and ``w = A (beta e
k)`` (``du``, ``dw``; ``e = exp(gc)``, ``A = (I + L)^-1``, ``L =
strict_tril(beta k k^T E)``, ``E_ij = exp(gc_i - gc_j)``), per chunk and value
head::

    dv     = beta (A^T du)
    dbeta  = rowsum((A^T du) v) + rowsum((A^T dw) e k) + rowsum(dL G)
    dk     = beta e (A^T dw) + (dL beta E) k + (dL beta E)^T k
    dgc    = beta e rowsum((A^T dw) k) + rowsum(dL L) - colsum(dL L)
    dL     = strict_tril(-A^T (du (beta v)^T + dw (beta e k)^T) A^T),  G = (k k^T) E

One program per (chunk, key head) on the head-fastest grid of the intra
kernels (``tiles.program_chunk`` over the ``Hg`` key heads), the whole ``K``
as one tile, ``V`` in blocks of ``BV`` columns; it takes the key head's
``H / Hg`` value heads (GQA) one after the other and writes ``dk`` once per
key head (``[B, T, Hg, K]``), each value head after the first adding its
tile to what the previous one stored in this program's own tile of ``dk``:
no per-value-head partials go through HBM. ``A`` is the stored ``[T, H,
64]`` of ``fwd_intra``. ``DA_IN``: ``dA`` holds a cotangent of ``A`` itself
(laid out as ``A``), added to the one above (``fwd_intra``'s own backward,
whose ``A`` is an output). ``DK_IN``: ``dk_in`` (``[B, T, Hg, K]``) holds
more of ``dk`` (the per-chunk kernel's), added.

``NK_IN``: ``dg_in`` holds that many ``[B, T, H]`` rows of ``dgc`` shares
(the per-chunk kernel's, one per K block), added to this kernel's.
``REV_CUMSUM``: ``dg`` receives the cotangent of the per-step gates ``a``
(``gc`` being their cumsum within the chunk), the reverse cumsum of ``dgc``
within the chunk, ``sum(dgc) - cumsum(dgc) + dgc``: with both, the chunk
backward ends in this kernel, with no XLA sums or cumsum of the gates after it.
"""
import triton
import triton.language as tl

from .tiles import program_chunk


@triton.jit
def value_block(b_db, b_duv, b_A, b_beta, v, du, dv, m_t, i_v, H: tl.constexpr, V: tl.constexpr,
                BT: tl.constexpr, BV: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One block of ``BV`` value columns (``v``, ``du``, ``dv`` at the chunk's
    first row and the value head): ``dv = beta (A^T du)`` stored, and
    ``rowsum((A^T du) v)``, ``du v^T`` added to ``b_db``, ``b_duv``."""
    o_v = i_v * BV + tl.arange(0, BV)
    m_tv = m_t[:, None] & (o_v < V)[None, :]
    rows_hv = tl.arange(0, BT)[:, None] * (H * V) + o_v[None, :]
    b_v = tl.load(v + rows_hv, mask=m_tv, other=0).to(b_A.dtype)
    b_du = tl.load(du + rows_hv, mask=m_tv, other=0).to(b_A.dtype)
    b_Atdu = tl.dot(tl.trans(b_A), b_du, input_precision=DOT_PRECISION)  # [BT, BV]
    tl.store(dv + rows_hv, (b_beta[:, None] * b_Atdu).to(dv.dtype.element_ty), mask=m_tv)
    b_db += tl.sum(b_Atdu * b_v.to(tl.float32), axis=1)
    b_duv += tl.dot(b_du, tl.trans(b_v), input_precision=DOT_PRECISION)
    return b_db, b_duv


@triton.jit
def value_head_grads(k, v, beta, gc, A, dw, du, dA, dg_in, dk_in, dk, dv, dbeta, dg, row0, n_t, i_hk, i_h, i_r,
                     shares, H: tl.constexpr, Hg: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT_PRECISION: tl.constexpr,
                     V_STAGES: tl.constexpr, DA_IN: tl.constexpr, NK_IN: tl.constexpr,
                     REV_CUMSUM: tl.constexpr, DK_IN: tl.constexpr):
    """Value head ``i_h`` (the ``i_r``-th of key head ``i_hk``) of the chunk
    of ``n_t`` rows from row ``row0`` (64-bit; the offsets inside the chunk
    are 32-bit): ``dv``, ``dbeta`` and ``dg`` stored, ``dk`` added to the key
    head's (``shares``: elements between two rows of ``dg_in``)."""
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_t = o_t < n_t
    m_tk = m_t[:, None] & (o_k < K)[None, :]
    rows_k = o_t[:, None] * (Hg * K) + o_k[None, :]  # k, dk_in, dk
    key_row = row0 * (Hg * K) + i_hk * K
    # read again for each value head (from L2 after the first): a tile read
    # before the loop would be held in registers across it
    b_k = tl.load(k + key_row + rows_k, mask=m_tk, other=0)
    gate_row = row0 * H + i_h  # beta, gc, dbeta, dg

    b_beta = tl.load(beta + gate_row + o_t * H, mask=m_t, other=0).to(tl.float32)
    b_g = tl.load(gc + gate_row + o_t * H, mask=m_t, other=0).to(tl.float32)
    b_e = tl.where(m_t, tl.exp(b_g), 0)
    rows_a = o_t[:, None] * (H * BT) + o_t[None, :]  # A, dA
    b_A = tl.load(A + gate_row * BT + rows_a, mask=m_t[:, None] & m_t[None, :], other=0)
    # The V side first, a block of BV columns at a time (the width measured
    # fastest that fits shared memory: chunk_bwd_launch.value_blocks);
    # dA = du (beta v)^T + dw (beta e k)^T with the betas as column scales of
    # the [BT, BT] products (no scaled copies of v and k), and A^T dw last:
    # fewer tiles live at once.
    # (V_STAGES > 1: a loop Triton software-pipelines, else unrolled.)
    b_db = tl.zeros([BT], dtype=tl.float32)
    b_duv = tl.zeros([BT, BT], dtype=tl.float32)
    NV: tl.constexpr = (V + BV - 1) // BV
    value_row = row0 * (H * V) + i_h * V
    if V_STAGES > 1:
        for i_v in tl.range(0, NV, num_stages=V_STAGES):
            b_db, b_duv = value_block(b_db, b_duv, b_A, b_beta, v + value_row, du + value_row, dv + value_row,
                                      m_t, i_v, H, V, BT, BV, DOT_PRECISION)
    else:
        for i_v in tl.static_range(NV):
            b_db, b_duv = value_block(b_db, b_duv, b_A, b_beta, v + value_row, du + value_row, dv + value_row,
                                      m_t, i_v, H, V, BT, BV, DOT_PRECISION)
    rows_hk = o_t[:, None] * (H * K) + o_k[None, :]
    b_dw = tl.load(dw + (row0 * H + i_h) * K + rows_hk, mask=m_tk, other=0).to(b_A.dtype)
    b_dA = b_duv * b_beta[None, :] + tl.dot(b_dw, tl.trans(b_k.to(b_A.dtype)),
                                            input_precision=DOT_PRECISION) * (b_beta * b_e)[None, :]
    if DA_IN:  # fwd_intra's own backward: the cotangent of its output A adds to the one through w, u
        b_dA += tl.load(dA + gate_row * BT + rows_a, mask=m_t[:, None] & m_t[None, :], other=0).to(tl.float32)
    b_dL = tl.dot(b_dA.to(b_A.dtype), tl.trans(b_A), input_precision=DOT_PRECISION)
    b_dL = -tl.dot(tl.trans(b_A), b_dL.to(b_A.dtype), input_precision=DOT_PRECISION)
    strict = (o_t[:, None] > o_t[None, :]) & m_t[:, None] & m_t[None, :]
    b_E = tl.exp(tl.where(strict, b_g[:, None] - b_g[None, :], float("-inf")))
    b_dL = tl.where(strict, b_dL, 0)
    b_G = tl.dot(b_k, tl.trans(b_k), input_precision=DOT_PRECISION) * b_E
    b_db += tl.sum(b_dL * b_G, axis=1)
    b_dLb = (b_dL * b_beta[:, None] * b_E).to(b_k.dtype)
    b_dk = tl.dot(b_dLb, b_k, input_precision=DOT_PRECISION) + tl.dot(
        tl.trans(b_dLb), b_k, input_precision=DOT_PRECISION)
    b_LdL = b_dL * b_beta[:, None] * b_G
    b_dg = tl.sum(b_LdL, axis=1) - tl.sum(b_LdL, axis=0)
    b_Atdw = tl.dot(tl.trans(b_A), b_dw, input_precision=DOT_PRECISION)  # [BT, BK]
    b_kdw = tl.sum(b_Atdw * b_k.to(tl.float32), axis=1)
    b_db += b_e * b_kdw
    b_dg += b_beta * b_e * b_kdw
    b_dk += (b_beta * b_e)[:, None] * b_Atdw
    if i_r > 0:  # add the heads before (this program's stores: a barrier makes them seen by every thread)
        tl.debug_barrier()
        b_dk += tl.load(dk + key_row + rows_k, mask=m_tk, other=0).to(tl.float32)
    elif DK_IN:  # the per-chunk kernel's part of dk, summed over the key head's value heads
        b_dk += tl.load(dk_in + key_row + rows_k, mask=m_tk, other=0).to(tl.float32)
    tl.store(dk + key_row + rows_k, b_dk.to(dk.dtype.element_ty), mask=m_tk)
    tl.store(dbeta + gate_row + o_t * H, b_db, mask=m_t)
    for i in tl.static_range(NK_IN):  # the per-chunk kernel's shares: [NK_IN, B, T, H]
        b_dg += tl.load(dg_in + i * shares + gate_row + o_t * H, mask=m_t, other=0)
    if REV_CUMSUM:  # rows past the end hold 0: the chunk's total is over its rows
        b_dg = tl.sum(b_dg, axis=0) - tl.cumsum(b_dg, axis=0) + b_dg
    tl.store(dg + gate_row + o_t * H, b_dg, mask=m_t)


@triton.autotune(
    configs=[triton.Config({}, num_warps=num_warps, num_stages=2) for num_warps in [4, 8]],
    key=["H", "Hg", "K", "V", "BK", "BV", "IS_VARLEN"],
)
@triton.jit(do_not_specialize=["T"])
def gdn_wy_bwd_kernel(
    k,
    v,
    beta,
    gc,
    A,
    dw,
    du,
    dA,
    dg_in,
    dk_in,
    cu_seqlens,
    chunk_indices,
    T,
    dk,
    dv,
    dbeta,
    dg,
    H: tl.constexpr,
    Hg: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    V_STAGES: tl.constexpr,
    DA_IN: tl.constexpr = False,
    NK_IN: tl.constexpr = 0,
    REV_CUMSUM: tl.constexpr = False,
    DK_IN: tl.constexpr = False,
):
    i_t, i_hk, bos, seq_len = program_chunk(cu_seqlens, chunk_indices, T, Hg, IS_VARLEN)
    if i_t * BT >= seq_len:
        return
    row0 = bos + i_t * BT  # the chunk's first row, 64-bit
    n_t = tl.minimum(seq_len - i_t * BT, BT).to(tl.int32)  # its rows
    shares = tl.num_programs(1).to(tl.int64) * T * H  # B x T x H
    # the key head's value heads in turn (a loop, not unrolled: one head's
    # tiles live at a time)
    for i_r in tl.range(0, H // Hg, num_stages=1):
        i_h = i_hk * (H // Hg) + i_r
        # n_t plus a zero the compiler cannot see (i_r < H / Hg): the masks
        # built from it stay in the loop, where Triton would hoist them out
        # of it and hold them in registers across it
        n_t_h = n_t + (i_h // (H // Hg) - i_hk)
        value_head_grads(k, v, beta, gc, A, dw, du, dA, dg_in, dk_in, dk, dv, dbeta, dg, row0, n_t_h, i_hk,
                         i_h, i_r, shares, H, Hg, K, V, BT, BK, BV, DOT_PRECISION, V_STAGES,
                         DA_IN, NK_IN, REV_CUMSUM, DK_IN)
