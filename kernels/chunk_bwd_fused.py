"""The backward's per-chunk gradients of the walk and the backward through the
WY representation in one program per (chunk, value head): what
``chunk_bwd_local.py`` and ``wy_bwd.py`` compute, without ``dw`` and a second
``dk`` partial going through HBM between them.

Written from docs/math.md ("Gradients"; ``gdn_jax/chunk_bwd_jnp.py`` is its jnp
reference). Given the reverse walk's ``dv'`` (``du``, the cotangent of ``u =
A (beta v)``) and ``dS'`` per chunk, the chunk's entering state ``S`` and
``v'``; ``e = exp(gc)``, ``E_ij = exp(gc_i - gc_j)`` for ``i >= j``, ``D =
scale (do v'^T) E``, ``A = (I + L)^-1``::

    dq     = scale e (do S^T) + D k
    dw     = -du S^T                          (never stored)
    dA     = du (beta v)^T + dw (beta e k)^T
    dL     = strict_tril(-A^T dA A^T),  G = (k k^T) E
    dk     = D^T q + exp(gl - gc) (v' dS'^T) + beta e (A^T dw) + (dL beta E) k + (dL beta E)^T k
    dv     = beta (A^T du)
    dbeta  = rowsum((A^T du) v) + e rowsum((A^T dw) k) + rowsum(dL G)
    dgc    = rowsum(P) - colsum(P) + scale e rowsum((do S^T) q) - c + beta e rowsum((A^T dw) k)
             + rowsum(dL beta G) - colsum(dL beta G),
             P = D (q k^T),  c_j = exp(gl - gc_j) k_j . (dS' v'_j)
    dgc[last] += exp(gl) <dS', S> + sum(c)

Everything over ``K`` is a sum over blocks of ``BK`` key columns, taken in
turn: per block, the sums over ``V`` (``do S^T``, ``v' dS'^T``, ``dw``, a
block of ``BV`` value columns at a time), then its ``dq`` stored, its ``dk``
less the ``dL`` terms stored, and its share of ``dA`` and the gate sums
added. After the blocks, ``q k^T``, ``k k^T`` and ``dL``; then each block's ``dk`` read back (this
program's own store, in L2), its ``dL`` terms added, stored again. ``dq``
and ``dk`` are per value head (the launcher sums a key head's value heads);
``dgc`` and ``dbeta`` are whole.
"""
import triton
import triton.language as tl

from .safe_exp import causal_decay
from .tiles import program_chunk


@triton.jit
def value_side(b_dov, b_duv, b_db, b_A, b_beta, v, v_new, do, du, dv, rows, m_t, i_v, V: tl.constexpr,
               BV: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One block of ``BV`` value columns of the sums that need no key column:
    ``do v'^T``, ``du v^T`` and ``rowsum((A^T du) v)`` added, ``dv = beta (A^T du)`` stored."""
    o_v = i_v * BV + tl.arange(0, BV)
    m_tv = m_t[:, None] & (o_v < V)[None, :]
    rows_hv = rows[:, None] * V + o_v[None, :]
    b_v = tl.load(v + rows_hv, mask=m_tv, other=0).to(b_A.dtype)
    b_vn = tl.load(v_new + rows_hv, mask=m_tv, other=0)
    b_do = tl.load(do + rows_hv, mask=m_tv, other=0)
    b_du = tl.load(du + rows_hv, mask=m_tv, other=0).to(b_A.dtype)
    b_dov += tl.dot(b_do, tl.trans(b_vn), input_precision=DOT_PRECISION)
    b_duv += tl.dot(b_du, tl.trans(b_v), input_precision=DOT_PRECISION)
    b_Atdu = tl.dot(tl.trans(b_A), b_du, input_precision=DOT_PRECISION)  # [BT, BV]
    tl.store(dv + rows_hv, (b_beta[:, None] * b_Atdu).to(dv.dtype.element_ty), mask=m_tv)
    b_db += tl.sum(b_Atdu * b_v.to(tl.float32), axis=1)
    return b_dov, b_duv, b_db


@triton.jit
def key_block_sums(b_dos, b_vds, b_dw, b_sds, k, v_new, do, du, h, dh, rows, m_t, o_k, h_row, i_h, i_v,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    """One block of ``BV`` value columns of the sums over V of one block of
    key columns ``o_k``: ``do S^T``, ``v' dS'^T``, ``-du S^T`` and the rows
    of ``<dS', S>`` added (``S``, ``dS'`` the chunk's rows ``h_row`` of
    ``h``, ``dh``)."""
    o_v = i_v * BV + tl.arange(0, BV)
    m_tv = m_t[:, None] & (o_v < V)[None, :]
    m_s = (o_k < K)[:, None] & (o_v < V)[None, :]
    rows_hv = rows[:, None] * V + o_v[None, :]
    s_offsets = (h_row * H + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :]
    b_vn = tl.load(v_new + rows_hv, mask=m_tv, other=0)
    b_do = tl.load(do + rows_hv, mask=m_tv, other=0)
    b_du = tl.load(du + rows_hv, mask=m_tv, other=0).to(k.dtype.element_ty)
    b_s = tl.load(h + s_offsets, mask=m_s, other=0)  # S [BK, BV], k.dtype
    b_ds = tl.load(dh + s_offsets, mask=m_s, other=0)  # dS'
    b_dos += tl.dot(b_do, tl.trans(b_s), input_precision=DOT_PRECISION)
    b_vds += tl.dot(b_vn, tl.trans(b_ds), input_precision=DOT_PRECISION)
    b_dw -= tl.dot(b_du, tl.trans(b_s), input_precision=DOT_PRECISION)
    b_sds += tl.sum(b_ds.to(tl.float32) * b_s.to(tl.float32), axis=1)
    return b_dos, b_vds, b_dw, b_sds


@triton.autotune(
    configs=[triton.Config({}, num_warps=num_warps, num_stages=2) for num_warps in [4, 8]],
    key=["H", "Hg", "K", "V", "BK", "BV", "IS_VARLEN"],
)
@triton.jit(do_not_specialize=["T"])
def gdn_chunk_bwd_fused_kernel(
    q,
    k,
    v,
    v_new,
    beta,
    gc,
    A,
    do,
    du,
    h,
    dh,
    cu_seqlens,
    chunk_indices,
    scale,
    T,
    dq,
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
):
    i_t, i_h, bos, seq_len = program_chunk(cu_seqlens, chunk_indices, T, H, IS_VARLEN)
    if i_t * BT >= seq_len:
        return
    if IS_VARLEN:  # the chunk's row in h and dh: its place in the chunk list
        h_row = (tl.program_id(0) // H).to(tl.int64)
    else:
        h_row = tl.program_id(1).to(tl.int64) * ((T + BT - 1) // BT) + i_t
    i_hk = i_h // (H // Hg)
    scale = tl.cast(scale, tl.float32)
    o_t = tl.arange(0, BT)
    r = (i_t * BT + o_t).to(tl.int64)
    m_t = r < seq_len
    rows = (bos + r) * H + i_h  # [BT]: row and value head of beta, gc, v, v', do, du, dv
    b_beta = tl.load(beta + rows, mask=m_t, other=0).to(tl.float32)
    b_g = tl.load(gc + rows, mask=m_t, other=0).to(tl.float32)
    last = (tl.minimum(i_t * BT + BT, seq_len) - 1).to(tl.int64)
    g_last = tl.load(gc + (bos + last) * H + i_h).to(tl.float32)
    b_e = tl.where(m_t, tl.exp(b_g), 0)
    b_decay = tl.where(m_t, tl.exp(g_last - b_g), 0)
    b_A = tl.load(A + rows[:, None] * BT + o_t[None, :], mask=m_t[:, None] & m_t[None, :], other=0)

    # The value side, a block of BV columns at a time (V_STAGES > 1: a loop
    # Triton software-pipelines, else unrolled)
    b_dov = tl.zeros([BT, BT], dtype=tl.float32)  # do v'^T
    b_duv = tl.zeros([BT, BT], dtype=tl.float32)  # du v^T
    b_db = tl.zeros([BT], dtype=tl.float32)
    NV: tl.constexpr = (V + BV - 1) // BV
    if V_STAGES > 1:
        for i_v in tl.range(0, NV, num_stages=V_STAGES):
            b_dov, b_duv, b_db = value_side(b_dov, b_duv, b_db, b_A, b_beta, v, v_new, do, du, dv, rows, m_t,
                                            i_v, V, BV, DOT_PRECISION)
    else:
        for i_v in tl.static_range(NV):
            b_dov, b_duv, b_db = value_side(b_dov, b_duv, b_db, b_A, b_beta, v, v_new, do, du, dv, rows, m_t,
                                            i_v, V, BV, DOT_PRECISION)
    # D in k's dtype for its dots and for P (fewer tiles live through the key
    # blocks: E is formed again after them)
    b_Dx = (scale * b_dov * causal_decay(b_g, m_t, BT)).to(k.dtype.element_ty)  # [i, j]
    b_dA = b_duv * b_beta[None, :]  # du (beta v)^T; the key blocks add dw (beta e k)^T
    b_be = b_beta * b_e

    # The key side, a block of BK columns at a time
    b_dgq = tl.zeros([BT], dtype=tl.float32)  # scale e rowsum((do S^T) q)
    b_c = tl.zeros([BT], dtype=tl.float32)
    b_kdw = tl.zeros([BT], dtype=tl.float32)  # rowsum((A^T dw) k)
    b_sds = tl.zeros([BK], dtype=tl.float32)  # rows of <dS', S>, over the key blocks
    NK: tl.constexpr = (K + BK - 1) // BK
    for i_k in range(NK):
        o_k = i_k * BK + tl.arange(0, BK)
        m_tk = m_t[:, None] & (o_k < K)[None, :]
        b_dos = tl.zeros([BT, BK], dtype=tl.float32)  # do S^T
        b_vds = tl.zeros([BT, BK], dtype=tl.float32)  # v' dS'^T
        b_dw = tl.zeros([BT, BK], dtype=tl.float32)  # -du S^T
        if V_STAGES > 1:
            for i_v in tl.range(0, NV, num_stages=V_STAGES):
                b_dos, b_vds, b_dw, b_sds = key_block_sums(b_dos, b_vds, b_dw, b_sds, k, v_new, do, du, h, dh,
                                                           rows, m_t, o_k, h_row, i_h, i_v, H, K, V, BV,
                                                           DOT_PRECISION)
        else:
            for i_v in tl.static_range(NV):
                b_dos, b_vds, b_dw, b_sds = key_block_sums(b_dos, b_vds, b_dw, b_sds, k, v_new, do, du, h, dh,
                                                           rows, m_t, o_k, h_row, i_h, i_v, H, K, V, BV,
                                                           DOT_PRECISION)
        rows_k = (bos + r)[:, None] * (Hg * K) + i_hk * K + o_k[None, :]  # q, k
        rows_hk = rows[:, None] * K + o_k[None, :]  # dq, dk
        b_q = tl.load(q + rows_k, mask=m_tk, other=0)
        b_k = tl.load(k + rows_k, mask=m_tk, other=0)
        b_dq = scale * b_e[:, None] * b_dos + tl.dot(b_Dx, b_k, input_precision=DOT_PRECISION)
        tl.store(dq + rows_hk, b_dq.to(dq.dtype.element_ty), mask=m_tk)
        b_dwx = b_dw.to(b_A.dtype)
        b_Atdw = tl.dot(tl.trans(b_A), b_dwx, input_precision=DOT_PRECISION)  # [BT, BK]
        b_dk = tl.dot(tl.trans(b_Dx), b_q, input_precision=DOT_PRECISION) + b_decay[:, None] * b_vds \
            + b_be[:, None] * b_Atdw
        # dk less its dL terms, read back after dL (float32 partials keep the sum exact
        # where dk is float32; else in dk's dtype, as the separate kernels stored it)
        tl.store(dk + rows_hk, b_dk.to(dk.dtype.element_ty), mask=m_tk)
        b_dA += tl.dot(b_dwx, tl.trans(b_k.to(b_A.dtype)), input_precision=DOT_PRECISION) * b_be[None, :]
        b_kf = b_k.to(tl.float32)
        b_kdw += tl.sum(b_Atdw * b_kf, axis=1)
        b_dgq += tl.sum(b_dos * b_q.to(tl.float32), axis=1)
        b_c += tl.sum(b_kf * b_vds, axis=1)

    # q k^T and k k^T over the key blocks (q, k read again, from L2)
    b_qk = tl.zeros([BT, BT], dtype=tl.float32)
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(NK):
        o_k = i_k * BK + tl.arange(0, BK)
        m_tk = m_t[:, None] & (o_k < K)[None, :]
        rows_k = (bos + r)[:, None] * (Hg * K) + i_hk * K + o_k[None, :]
        b_q = tl.load(q + rows_k, mask=m_tk, other=0)
        b_k = tl.load(k + rows_k, mask=m_tk, other=0)
        b_qk += tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION)
        b_kk += tl.dot(b_k, tl.trans(b_k), input_precision=DOT_PRECISION)
    b_P = b_Dx.to(tl.float32) * b_qk
    b_E = causal_decay(b_g, m_t, BT)
    strict = o_t[:, None] > o_t[None, :]
    b_G = b_kk * tl.where(strict, b_E, 0)
    b_dL = tl.dot(b_dA.to(b_A.dtype), tl.trans(b_A), input_precision=DOT_PRECISION)
    b_dL = -tl.dot(tl.trans(b_A), b_dL.to(b_A.dtype), input_precision=DOT_PRECISION)
    b_dL = tl.where(strict & m_t[:, None], b_dL, 0)
    b_db += b_e * b_kdw + tl.sum(b_dL * b_G, axis=1)
    b_LdL = b_dL * b_beta[:, None] * b_G
    b_c = b_decay * b_c
    b_dg = tl.sum(b_P, axis=1) - tl.sum(b_P, axis=0) + scale * b_e * b_dgq - b_c + b_be * b_kdw \
        + tl.sum(b_LdL, axis=1) - tl.sum(b_LdL, axis=0)
    b_dgl = tl.exp(g_last) * tl.sum(b_sds, axis=0) + tl.sum(b_c, axis=0)
    b_dg += tl.where(r == last, b_dgl, 0)
    tl.store(dg + rows, b_dg, mask=m_t)
    tl.store(dbeta + rows, b_db, mask=m_t)

    # dk's dL terms: (dL beta E) k + (dL beta E)^T k over the key blocks
    b_dLb = (b_dL * b_beta[:, None] * b_E).to(k.dtype.element_ty)
    tl.debug_barrier()  # this program's dk stores above are visible to all its threads
    for i_k in range(NK):
        o_k = i_k * BK + tl.arange(0, BK)
        m_tk = m_t[:, None] & (o_k < K)[None, :]
        rows_k = (bos + r)[:, None] * (Hg * K) + i_hk * K + o_k[None, :]
        rows_hk = rows[:, None] * K + o_k[None, :]
        b_kb = tl.load(k + rows_k, mask=m_tk, other=0)
        b_dk = tl.load(dk + rows_hk, mask=m_tk, other=0).to(tl.float32)
        b_dk += tl.dot(b_dLb, b_kb, input_precision=DOT_PRECISION) + tl.dot(
            tl.trans(b_dLb), b_kb, input_precision=DOT_PRECISION)
        tl.store(dk + rows_hk, b_dk.to(dk.dtype.element_ty), mask=m_tk)
