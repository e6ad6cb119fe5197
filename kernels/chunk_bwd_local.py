"""The backward's per-chunk gradients of the walk: ``dq``, ``dk``, ``dw`` and
the gates' part, once the reverse walk has given every chunk's ``dv'`` and
leaving-state cotangent ``dS'``.

Written from docs/math.md ("Gradients"; ``gdn_jax/chunk_bwd_jnp.py`` is its jnp
reference). One program per (chunk, value head, block of ``BK`` key columns),
on the head-fastest grid of the intra kernels (``tiles.program_chunk``) with
the K blocks fastest (the blocks of one chunk run side by side and read its
``v'``, ``do`` and ``dv'`` once from HBM, the second time from L2), with
the chunk's entering state ``S`` (a row of ``h``), ``dS'`` (a row of ``dh``),
``v'``, ``do``, ``dv'``; ``e = exp(gc)``, ``E_ij = exp(gc_i - gc_j)`` for
``i >= j``, ``D = scale (do v'^T) E``::

    dq = scale e (do S^T) + D k
    dk = D^T q + exp(gl - gc) (v' dS'^T)
    dw = -dv' S^T
    dgc = rowsum(P) - colsum(P) + scale e (do S^T . q) - c,  P = D (q k^T),  c_j = exp(gl - gc_j) k_j . (dS' v'_j)
    dgc[last] += gamma <dS', S> + sum(c)

Each K block writes its share of ``dgc`` (a row of ``dg [NK, B, T, H]``; the
launcher sums them). ``dq`` and ``dk`` are per value head (float32); the
launcher sums a key head's value heads. The sums over ``V`` run over blocks of
``BV`` columns.
"""
import triton
import triton.language as tl

from .safe_exp import causal_decay
from .tiles import program_chunk


@triton.jit
def value_block_sums(b_dov, b_dos, b_vds, b_dw, b_sds, k, v_new, do, dv, h, dh, bos, r, m_t, o_k, h_row,
                     i_h, i_v, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                     DOT_PRECISION: tl.constexpr):
    """The sums over V of one block of ``BV`` value columns added: ``do
    v'^T``, ``do S^T``, ``v' dS'^T``, ``-dv' S^T`` and the rows of ``<dS',
    S>`` (``S``, ``dS'`` the chunk's rows ``h_row`` of ``h``, ``dh``)."""
    o_v = i_v * BV + tl.arange(0, BV)
    m_tv = m_t[:, None] & (o_v < V)[None, :]
    m_s = (o_k < K)[:, None] & (o_v < V)[None, :]
    rows_v = (bos + r)[:, None] * (H * V) + i_h * V + o_v[None, :]
    s_offsets = (h_row * H + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :]
    b_vn = tl.load(v_new + rows_v, mask=m_tv, other=0)
    b_do = tl.load(do + rows_v, mask=m_tv, other=0)
    b_dv = tl.load(dv + rows_v, mask=m_tv, other=0).to(k.dtype.element_ty)
    b_s = tl.load(h + s_offsets, mask=m_s, other=0)  # S [BK, BV], k.dtype
    b_ds = tl.load(dh + s_offsets, mask=m_s, other=0)  # dS'
    b_dov += tl.dot(b_do, tl.trans(b_vn), input_precision=DOT_PRECISION)
    b_dos += tl.dot(b_do, tl.trans(b_s), input_precision=DOT_PRECISION)
    b_vds += tl.dot(b_vn, tl.trans(b_ds), input_precision=DOT_PRECISION)
    b_dw -= tl.dot(b_dv, tl.trans(b_s), input_precision=DOT_PRECISION)
    b_sds += tl.sum(b_ds.to(tl.float32) * b_s.to(tl.float32), axis=1)
    return b_dov, b_dos, b_vds, b_dw, b_sds


@triton.autotune(
    configs=[triton.Config({}, num_warps=num_warps, num_stages=2) for num_warps in [4, 8]],
    key=["H", "Hg", "K", "V", "BK", "BV", "IS_VARLEN"],
)
@triton.jit(do_not_specialize=["T"])
def gdn_chunk_bwd_local_kernel(
    q,
    k,
    v_new,
    gc,
    do,
    dv,
    h,
    dh,
    cu_seqlens,
    chunk_indices,
    scale,
    T,
    dq,
    dk,
    dw,
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
    NK: tl.constexpr = (K + BK - 1) // BK
    i_t, i_h, bos, seq_len = program_chunk(cu_seqlens, chunk_indices, T, H, IS_VARLEN, NK)
    if i_t * BT >= seq_len:
        return
    i_k = tl.program_id(0) % NK
    if IS_VARLEN:  # the chunk's row in h and dh: its place in the chunk list
        h_row = (tl.program_id(0) // (NK * H)).to(tl.int64)
    else:
        h_row = tl.program_id(1).to(tl.int64) * ((T + BT - 1) // BT) + i_t
    i_hk = i_h // (H // Hg)
    scale = tl.cast(scale, tl.float32)

    o_t = tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    r = (i_t * BT + o_t).to(tl.int64)
    m_t = r < seq_len
    m_tk = m_t[:, None] & (o_k < K)[None, :]
    rows_k = (bos + r)[:, None] * (Hg * K) + i_hk * K + o_k[None, :]  # q, k
    rows_hk = (bos + r)[:, None] * (H * K) + i_h * K + o_k[None, :]  # dq, dk, dw
    b_q = tl.load(q + rows_k, mask=m_tk, other=0)
    b_k = tl.load(k + rows_k, mask=m_tk, other=0)

    # The sums over V, a block of BV columns at a time (the width measured
    # fastest that fits shared memory: chunk_bwd_launch.value_blocks);
    # V_STAGES > 1: a loop Triton software-pipelines (the next block's loads
    # in flight during this block's dots), else unrolled
    b_dov = tl.zeros([BT, BT], dtype=tl.float32)  # do v'^T
    b_dos = tl.zeros([BT, BK], dtype=tl.float32)  # do S^T
    b_vds = tl.zeros([BT, BK], dtype=tl.float32)  # v' dS'^T
    b_dw = tl.zeros([BT, BK], dtype=tl.float32)  # -dv' S^T
    b_sds = tl.zeros([BK], dtype=tl.float32)  # rows of <dS', S>
    NV: tl.constexpr = (V + BV - 1) // BV
    if V_STAGES > 1:
        for i_v in tl.range(0, NV, num_stages=V_STAGES):
            b_dov, b_dos, b_vds, b_dw, b_sds = value_block_sums(
                b_dov, b_dos, b_vds, b_dw, b_sds, k, v_new, do, dv, h, dh, bos, r, m_t, o_k, h_row, i_h,
                i_v, H, K, V, BV, DOT_PRECISION)
    else:
        for i_v in tl.static_range(NV):
            b_dov, b_dos, b_vds, b_dw, b_sds = value_block_sums(
                b_dov, b_dos, b_vds, b_dw, b_sds, k, v_new, do, dv, h, dh, bos, r, m_t, o_k, h_row, i_h,
                i_v, H, K, V, BV, DOT_PRECISION)
    b_g = tl.load(gc + (bos + r) * H + i_h, mask=m_t, other=0).to(tl.float32)
    last = (tl.minimum(i_t * BT + BT, seq_len) - 1).to(tl.int64)
    g_last = tl.load(gc + (bos + last) * H + i_h).to(tl.float32)
    b_e = tl.where(m_t, tl.exp(b_g), 0)
    b_decay = tl.where(m_t, tl.exp(g_last - b_g), 0)

    b_E = causal_decay(b_g, m_t, BT)
    b_D = scale * b_dov * b_E  # [i, j]
    b_Dx = b_D.to(b_k.dtype)
    b_dq = scale * b_e[:, None] * b_dos + tl.dot(b_Dx, b_k, input_precision=DOT_PRECISION)
    b_dk = tl.dot(tl.trans(b_Dx), b_q, input_precision=DOT_PRECISION) + b_decay[:, None] * b_vds
    tl.store(dq + rows_hk, b_dq.to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + rows_hk, b_dk.to(dk.dtype.element_ty), mask=m_tk)
    tl.store(dw + rows_hk, b_dw.to(dw.dtype.element_ty), mask=m_tk)

    b_P = b_D * tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION)
    b_c = b_decay * tl.sum(b_k.to(tl.float32) * b_vds, axis=1)
    b_dg = tl.sum(b_P, axis=1) - tl.sum(b_P, axis=0) + scale * b_e * tl.sum(
        b_dos * b_q.to(tl.float32), axis=1) - b_c
    b_dgl = tl.exp(g_last) * tl.sum(b_sds, axis=0) + tl.sum(b_c, axis=0)
    b_dg += tl.where(r == last, b_dgl, 0)
    dg_rows = i_k.to(tl.int64) * tl.num_programs(1) * T * H  # this K block's share: B x T x H
    tl.store(dg + dg_rows + (bos + r) * H + i_h, b_dg, mask=m_t)
