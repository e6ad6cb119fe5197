"""The backward's per-chunk gradients of the walk: ``dq``, ``dk``, ``dw`` and
the gates' part, once the reverse walk has given every chunk's ``dv'`` and
leaving-state cotangent ``dS'``.

Written from docs/math.md ("Gradients"; ``gdn_jax/chunk_bwd_jnp.py`` is its jnp
reference). One program per (chunk, key head, block of ``BK`` key columns),
on the head-fastest grid of the intra kernels (``tiles.program_chunk``, over
key heads) with the K blocks fastest (the blocks of one chunk run side by
side and read its ``v'``, ``do`` and ``dv'`` once from HBM, the second time
from L2). It takes the key head's value heads in turn (GQA), each with the
chunk's entering state ``S`` (a row of ``h``), ``dS'`` (a row of ``dh``),
``v'``, ``do``, ``dv'``; ``e = exp(gc)``, ``E_ij = exp(gc_i - gc_j)`` for
``i >= j``, ``D = scale (do v'^T) E``, per value head::

    dq = scale e (do S^T) + D k
    dk = D^T q + exp(gl - gc) (v' dS'^T)
    dw = -dv' S^T
    dgc = rowsum(P) - colsum(P) + scale e (do S^T . q) - c,  P = D (q k^T),  c_j = exp(gl - gc_j) k_j . (dS' v'_j)
    dgc[last] += gamma <dS', S> + sum(c)

``dq`` and ``dk`` are the key head's, summed over its value heads on chip
(float32): no per-value-head partials go through HBM. Their accumulators
take the row scalings before the dots (``(scale e do) S^T``, ``(exp(gl -
gc) v') dS'^T``, the ``[64, BV]`` tiles scaled and rounded to the inputs'
dtype, as the reverse walk scales ``do``), so that the value heads share
them; a value head's ``dgc`` terms ``scale e (do S^T . q)`` and ``c`` are
the rows of ``accumulator . q`` (``. k``) after its sums over V less
before: no per-head accumulators. ``dw`` and ``dgc`` are per value head;
each K block writes its share of ``dgc`` (a row of ``dg [NK, B, T, H]``;
the launcher sums them). The sums over ``V`` run over blocks of ``BV``
columns.
"""
import triton
import triton.language as tl

from .safe_exp import causal_decay
from .tiles import program_chunk


@triton.jit
def value_block_sums(b_dov, b_dq, b_dk, b_dw, b_sds, k, v_new, do, dv, h, dh, bos, r, m_t, o_k, h_row,
                     i_h, i_v, b_doe, b_decay, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BV: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The sums over V of one block of ``BV`` value columns of value head
    ``i_h`` added: ``do v'^T``, ``(b_doe do) S^T`` into ``b_dq``, ``(b_decay
    v') dS'^T`` into ``b_dk`` (``b_doe = scale e``, ``b_decay = exp(gl - gc)``
    per row), ``-dv' S^T`` and the rows of ``<dS', S>`` (``S``, ``dS'`` the
    chunk's rows ``h_row`` of ``h``, ``dh``)."""
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
    b_dq = tl.dot((b_do * b_doe[:, None]).to(b_do.dtype), tl.trans(b_s), b_dq, input_precision=DOT_PRECISION)
    b_dk = tl.dot((b_vn * b_decay[:, None]).to(b_vn.dtype), tl.trans(b_ds), b_dk, input_precision=DOT_PRECISION)
    b_dw -= tl.dot(b_dv, tl.trans(b_s), input_precision=DOT_PRECISION)
    b_sds += tl.sum(b_ds.to(tl.float32) * b_s.to(tl.float32), axis=1)
    return b_dov, b_dq, b_dk, b_dw, b_sds


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
    i_t, i_hk, bos, seq_len = program_chunk(cu_seqlens, chunk_indices, T, Hg, IS_VARLEN, NK)
    if i_t * BT >= seq_len:
        return
    i_k = tl.program_id(0) % NK
    if IS_VARLEN:  # the chunk's row in h and dh: its place in the chunk list
        h_row = (tl.program_id(0) // (NK * Hg)).to(tl.int64)
    else:
        h_row = tl.program_id(1).to(tl.int64) * ((T + BT - 1) // BT) + i_t
    R: tl.constexpr = H // Hg  # value heads per key head
    scale = tl.cast(scale, tl.float32)

    o_t = tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    r = (i_t * BT + o_t).to(tl.int64)
    m_t = r < seq_len
    m_tk = m_t[:, None] & (o_k < K)[None, :]
    rows_k = (bos + r)[:, None] * (Hg * K) + i_hk * K + o_k[None, :]  # q, k, dq, dk
    b_q = tl.load(q + rows_k, mask=m_tk, other=0)
    b_k = tl.load(k + rows_k, mask=m_tk, other=0)
    last = (tl.minimum(i_t * BT + BT, seq_len) - 1).to(tl.int64)

    b_dq = tl.zeros([BT, BK], dtype=tl.float32)  # the key head's dq, summed over its value heads
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    r_st = r
    NV: tl.constexpr = (V + BV - 1) // BV
    for i_r in range(R):
        i_h = i_hk * R + i_r
        g_last = tl.load(gc + (bos + last) * H + i_h).to(tl.float32)
        # The chunk's rows again, plus a zero the compiler cannot fold (this
        # head's last gate compared with itself): what is formed from them
        # (addresses, masks) stays inside the loop over heads instead of
        # being hoisted out of it and held in registers through the sums over V.
        r_h = r + (g_last != g_last).to(tl.int64)
        r_st = r_h
        m_th = (r_h < seq_len) & (r_h < i_t * BT + BT)  # (a NaN gate shifts r_h: kept in the chunk)
        m_tkh = m_th[:, None] & (o_k < K)[None, :]
        rows_kh = (bos + r_h)[:, None] * (Hg * K) + i_hk * K + o_k[None, :]
        b_g = tl.load(gc + (bos + r_h) * H + i_h, mask=m_th, other=0).to(tl.float32)
        b_e = tl.where(m_th, tl.exp(b_g), 0)
        b_decay = tl.where(m_th, tl.exp(g_last - b_g), 0)
        # this value head's rows of dq . q and dk . k come as the difference of these after its sums over V
        b_qf = tl.load(q + rows_kh, mask=m_tkh, other=0).to(tl.float32)
        b_kf = tl.load(k + rows_kh, mask=m_tkh, other=0).to(tl.float32)
        b_dq_q = tl.sum(b_dq * b_qf, axis=1)
        b_dk_k = tl.sum(b_dk * b_kf, axis=1)

        # The sums over V, a block of BV columns at a time (the width measured
        # fastest that fits shared memory: chunk_bwd_launch.value_blocks);
        # V_STAGES > 1: a loop Triton software-pipelines (the next block's loads
        # in flight during this block's dots), else unrolled
        b_dov = tl.zeros([BT, BT], dtype=tl.float32)  # do v'^T
        b_dw = tl.zeros([BT, BK], dtype=tl.float32)  # -dv' S^T
        b_sds = tl.zeros([BK], dtype=tl.float32)  # rows of <dS', S>
        if V_STAGES > 1:
            for i_v in tl.range(0, NV, num_stages=V_STAGES):
                b_dov, b_dq, b_dk, b_dw, b_sds = value_block_sums(
                    b_dov, b_dq, b_dk, b_dw, b_sds, k, v_new, do, dv, h, dh, bos, r_h, m_th, o_k, h_row, i_h,
                    i_v, scale * b_e, b_decay, H, K, V, BV, DOT_PRECISION)
        else:
            for i_v in tl.static_range(NV):
                b_dov, b_dq, b_dk, b_dw, b_sds = value_block_sums(
                    b_dov, b_dq, b_dk, b_dw, b_sds, k, v_new, do, dv, h, dh, bos, r_h, m_th, o_k, h_row, i_h,
                    i_v, scale * b_e, b_decay, H, K, V, BV, DOT_PRECISION)
        # q, k loaded again (L2) at an address the compiler cannot prove the
        # same (columns shifted by a zero it cannot fold, masked at K), so that
        # their float32 copies are not held in registers through the sums over V
        z = tl.sum(b_sds, axis=0)
        o_kz = o_k + (z != z).to(tl.int32)
        rows_kz = (bos + r_h)[:, None] * (Hg * K) + i_hk * K + o_kz[None, :]
        m_tkz = m_th[:, None] & (o_kz < K)[None, :]
        b_qf = tl.load(q + rows_kz, mask=m_tkz, other=0).to(tl.float32)
        b_kf = tl.load(k + rows_kz, mask=m_tkz, other=0).to(tl.float32)
        b_dos_q = tl.sum(b_dq * b_qf, axis=1) - b_dq_q  # scale e (do S^T . q)
        b_c = tl.sum(b_dk * b_kf, axis=1) - b_dk_k  # exp(gl - gc) k . (dS' v')

        b_D = scale * b_dov * causal_decay(b_g, m_th, BT)  # [i, j]
        b_Dx = b_D.to(b_k.dtype)
        b_dq = tl.dot(b_Dx, b_k, b_dq, input_precision=DOT_PRECISION)
        b_dk = tl.dot(tl.trans(b_Dx), b_q, b_dk, input_precision=DOT_PRECISION)
        rows_hk = (bos + r_h)[:, None] * (H * K) + i_h * K + o_k[None, :]  # dw, per value head
        tl.store(dw + rows_hk, b_dw.to(dw.dtype.element_ty), mask=m_tkh)

        b_P = b_D * tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION)
        b_dg = tl.sum(b_P, axis=1) - tl.sum(b_P, axis=0) + b_dos_q - b_c
        b_dgl = tl.exp(g_last) * tl.sum(b_sds, axis=0) + tl.sum(b_c, axis=0)
        b_dg += tl.where(r_h == last, b_dgl, 0)
        dg_rows = i_k.to(tl.int64) * tl.num_programs(1) * T * H  # this K block's share: B x T x H
        tl.store(dg + dg_rows + (bos + r_h) * H + i_h, b_dg, mask=m_th)
    m_tks = ((r_st < seq_len) & (r_st < i_t * BT + BT))[:, None] & (o_k < K)[None, :]
    rows_ks = (bos + r_st)[:, None] * (Hg * K) + i_hk * K + o_k[None, :]
    tl.store(dq + rows_ks, b_dq.to(dq.dtype.element_ty), mask=m_tks)
    tl.store(dk + rows_ks, b_dk.to(dk.dtype.element_ty), mask=m_tks)
