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

One program per (chunk, value head) on the head-fastest grid of the intra
kernels (``tiles.program_chunk``), the whole ``K`` as one tile, ``V`` in
blocks of ``BV`` columns;
``A`` is the stored ``[T, H, 64]`` of ``fwd_intra``. ``DA_IN``: ``dA`` holds a cotangent of
``A`` itself (laid out as ``A``), added to the one above (``fwd_intra``'s
own backward, whose ``A`` is an output). ``dk`` is per value head
(float32; the launcher sums a key head's value heads and adds the walk's part).

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
def value_block(b_db, b_duv, b_A, b_beta, v, du, dv, rows, m_t, i_v, V: tl.constexpr, BV: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """One block of ``BV`` value columns: ``dv = beta (A^T du)`` stored, and
    ``rowsum((A^T du) v)``, ``du v^T`` added to ``b_db``, ``b_duv``."""
    o_v = i_v * BV + tl.arange(0, BV)
    m_tv = m_t[:, None] & (o_v < V)[None, :]
    rows_hv = rows[:, None] * V + o_v[None, :]
    b_v = tl.load(v + rows_hv, mask=m_tv, other=0).to(b_A.dtype)
    b_du = tl.load(du + rows_hv, mask=m_tv, other=0).to(b_A.dtype)
    b_Atdu = tl.dot(tl.trans(b_A), b_du, input_precision=DOT_PRECISION)  # [BT, BV]
    tl.store(dv + rows_hv, (b_beta[:, None] * b_Atdu).to(dv.dtype.element_ty), mask=m_tv)
    b_db += tl.sum(b_Atdu * b_v.to(tl.float32), axis=1)
    b_duv += tl.dot(b_du, tl.trans(b_v), input_precision=DOT_PRECISION)
    return b_db, b_duv


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
):
    i_t, i_h, bos, seq_len = program_chunk(cu_seqlens, chunk_indices, T, H, IS_VARLEN)
    if i_t * BT >= seq_len:
        return
    i_hk = i_h // (H // Hg)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    r = (i_t * BT + o_t).to(tl.int64)
    m_t = r < seq_len
    m_tk = m_t[:, None] & (o_k < K)[None, :]
    rows = (bos + r) * H + i_h  # [BT]: row and value head of beta, gc
    rows_hk = rows[:, None] * K + o_k[None, :]

    b_beta = tl.load(beta + rows, mask=m_t, other=0).to(tl.float32)
    b_g = tl.load(gc + rows, mask=m_t, other=0).to(tl.float32)
    b_e = tl.where(m_t, tl.exp(b_g), 0)
    b_A = tl.load(A + rows[:, None] * BT + o_t[None, :], mask=m_t[:, None] & m_t[None, :], other=0)

    # The V side first, a block of BV columns at a time (the width measured
    # fastest that fits shared memory: chunk_bwd_launch.value_blocks);
    # dA = du (beta v)^T + dw (beta e k)^T with the betas as column scales of
    # the [BT, BT] products (no scaled copies of v and k), and A^T dw last:
    # fewer tiles live at once.
    # (V_STAGES > 1: a loop Triton software-pipelines, else unrolled.)
    b_db = tl.zeros([BT], dtype=tl.float32)
    b_duv = tl.zeros([BT, BT], dtype=tl.float32)
    NV: tl.constexpr = (V + BV - 1) // BV
    if V_STAGES > 1:
        for i_v in tl.range(0, NV, num_stages=V_STAGES):
            b_db, b_duv = value_block(b_db, b_duv, b_A, b_beta, v, du, dv, rows, m_t, i_v, V, BV,
                                      DOT_PRECISION)
    else:
        for i_v in tl.static_range(NV):
            b_db, b_duv = value_block(b_db, b_duv, b_A, b_beta, v, du, dv, rows, m_t, i_v, V, BV,
                                      DOT_PRECISION)
    b_k = tl.load(k + (bos + r)[:, None] * (Hg * K) + i_hk * K + o_k[None, :], mask=m_tk, other=0)
    b_dw = tl.load(dw + rows_hk, mask=m_tk, other=0).to(b_A.dtype)
    b_dA = b_duv * b_beta[None, :] + tl.dot(b_dw, tl.trans(b_k.to(b_A.dtype)),
                                            input_precision=DOT_PRECISION) * (b_beta * b_e)[None, :]
    if DA_IN:  # fwd_intra's own backward: the cotangent of its output A adds to the one through w, u
        b_dA += tl.load(dA + rows[:, None] * BT + o_t[None, :], mask=m_t[:, None] & m_t[None, :],
                        other=0).to(tl.float32)
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
    tl.store(dk + rows_hk, b_dk.to(dk.dtype.element_ty), mask=m_tk)
    tl.store(dbeta + rows, b_db, mask=m_t)
    for i in tl.static_range(NK_IN):  # the per-chunk kernel's shares: [NK_IN, B, T, H]
        b_dg += tl.load(dg_in + i * (tl.num_programs(1).to(tl.int64) * T * H) + rows, mask=m_t, other=0)
    if REV_CUMSUM:  # rows past the end hold 0: the chunk's total is over its rows
        b_dg = tl.sum(b_dg, axis=0) - tl.cumsum(b_dg, axis=0) + b_dg
    tl.store(dg + rows, b_dg, mask=m_t)
