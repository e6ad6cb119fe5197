"""The backward's per-chunk gradients of the walk: ``dq``, ``dk``, ``dw`` and
the gates' part, once the reverse walk has given every chunk's ``dv'`` and
leaving-state cotangent ``dS'``.

Written from docs/math.md ("Gradients"; ``gdn_jax/chunk_bwd_jnp.py`` is its jnp
reference). One program per (chunk, key head, block of ``BK`` key columns),
on the head-fastest grid of the intra kernels (``tiles.program_chunk`` over
the ``Hg`` key heads) with the K blocks fastest (the blocks of one chunk run
side by side and read its ``v'``, ``do`` and ``dv'`` once from HBM, the
second time from L2); per value head of the key head, with
the chunk's entering state ``S`` (a row of ``h``), ``dS'`` (a row of ``dh``),
``v'``, ``do``, ``dv'``; ``e = exp(gc)``, ``E_ij = exp(gc_i - gc_j)`` for
``i >= j``, ``D = scale (do v'^T) E``::

    dq = scale e (do S^T) + D k
    dk = D^T q + exp(gl - gc) (v' dS'^T)
    dw = -dv' S^T
    dgc = rowsum(P) - colsum(P) + scale e (do S^T . q) - c,  P = D (q k^T),  c_j = exp(gl - gc_j) k_j . (dS' v'_j)
    dgc[last] += gamma <dS', S> + sum(c)

Each K block writes its share of ``dgc`` (a row of ``dg [NK, B, T, H]``; the
WY kernel adds them). One program takes a key head's ``H / Hg`` value heads
(GQA) one after the other and writes their sums of ``dq`` and ``dk`` once per
key head (``[B, T, Hg, K]``; ``dk`` without the WY kernel's part, which that
kernel adds): each value head after the first adds its tiles to what the
previous one stored, in this program's own tile of the output, so no
per-value-head partials go through HBM and no XLA sum follows. The sums
over ``V`` run over blocks of ``BV`` columns.
"""
import triton
import triton.language as tl

from .safe_exp import causal_decay
from .tiles import program_chunk


@triton.jit
def value_block_sums(b_dov, b_dos, b_vds, b_dw, b_sds, b_k, v_new, do, dv, h, dh, m_t, o_t, o_k, i_v,
                     H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                     DOT_PRECISION: tl.constexpr):
    """The sums over V of one block of ``BV`` value columns added: ``do
    v'^T``, ``do S^T``, ``v' dS'^T``, ``-dv' S^T`` and the rows of ``<dS',
    S>`` (``v_new``, ``do``, ``dv`` at the chunk's first row and the value
    head, ``h``, ``dh`` at its state ``S``, ``dS'``)."""
    o_v = i_v * BV + tl.arange(0, BV)
    m_tv = m_t[:, None] & (o_v < V)[None, :]
    m_s = (o_k < K)[:, None] & (o_v < V)[None, :]
    rows_v = o_t[:, None] * (H * V) + o_v[None, :]
    s_offsets = o_k[:, None] * V + o_v[None, :]
    b_vn = tl.load(v_new + rows_v, mask=m_tv, other=0)
    b_do = tl.load(do + rows_v, mask=m_tv, other=0)
    b_dv = tl.load(dv + rows_v, mask=m_tv, other=0).to(b_k.dtype)
    b_s = tl.load(h + s_offsets, mask=m_s, other=0)  # S [BK, BV], k.dtype
    b_ds = tl.load(dh + s_offsets, mask=m_s, other=0)  # dS'
    b_dov += tl.dot(b_do, tl.trans(b_vn), input_precision=DOT_PRECISION)
    b_dos += tl.dot(b_do, tl.trans(b_s), input_precision=DOT_PRECISION)
    b_vds += tl.dot(b_vn, tl.trans(b_ds), input_precision=DOT_PRECISION)
    b_dw -= tl.dot(b_dv, tl.trans(b_s), input_precision=DOT_PRECISION)
    b_sds += tl.sum(b_ds.to(tl.float32) * b_s.to(tl.float32), axis=1)
    return b_dov, b_dos, b_vds, b_dw, b_sds


@triton.jit
def value_head_grads(q, k, v_new, gc, do, dv, h, dh, dq, dk, dw, dg, scale, row0, o_k, h_row, i_hk, i_h,
                     i_r, n_t, H: tl.constexpr, Hg: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT_PRECISION: tl.constexpr,
                     V_STAGES: tl.constexpr):
    """Value head ``i_h`` (the ``i_r``-th of key head ``i_hk``) of the chunk
    of ``n_t`` rows from row ``row0`` (64-bit; the offsets inside the chunk
    are 32-bit), this program's K block (``o_k``): its ``dw`` and share of
    ``dgc`` (``dg`` at its K block's rows) stored, its ``dq`` and ``dk``
    added to the key head's."""
    o_t = tl.arange(0, BT)
    m_t = o_t < n_t
    m_tk = m_t[:, None] & (o_k < K)[None, :]
    rows_k = o_t[:, None] * (Hg * K) + o_k[None, :]  # q, k, dq, dk
    key_row = row0 * (Hg * K) + i_hk * K
    # read again for each value head (from L2 after the first): tiles read
    # before the loop would be held in registers across it
    b_q = tl.load(q + key_row + rows_k, mask=m_tk, other=0)
    b_k = tl.load(k + key_row + rows_k, mask=m_tk, other=0)
    value_row = row0 * (H * V) + i_h * V
    state = (h_row * H + i_h) * (K * V)

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
                b_dov, b_dos, b_vds, b_dw, b_sds, b_k, v_new + value_row, do + value_row, dv + value_row,
                h + state, dh + state, m_t, o_t, o_k, i_v, H, K, V, BV, DOT_PRECISION)
    else:
        for i_v in tl.static_range(NV):
            b_dov, b_dos, b_vds, b_dw, b_sds = value_block_sums(
                b_dov, b_dos, b_vds, b_dw, b_sds, b_k, v_new + value_row, do + value_row, dv + value_row,
                h + state, dh + state, m_t, o_t, o_k, i_v, H, K, V, BV, DOT_PRECISION)
    gate_row = row0 * H + i_h
    b_g = tl.load(gc + gate_row + o_t * H, mask=m_t, other=0).to(tl.float32)
    g_last = tl.load(gc + gate_row + (n_t - 1) * H).to(tl.float32)
    b_e = tl.where(m_t, tl.exp(b_g), 0)
    b_decay = tl.where(m_t, tl.exp(g_last - b_g), 0)

    b_E = causal_decay(b_g, m_t, BT)
    b_D = scale * b_dov * b_E  # [i, j]
    b_Dx = b_D.to(b_k.dtype)
    b_dq = scale * b_e[:, None] * b_dos + tl.dot(b_Dx, b_k, input_precision=DOT_PRECISION)
    b_dk = tl.dot(tl.trans(b_Dx), b_q, input_precision=DOT_PRECISION) + b_decay[:, None] * b_vds
    if i_r > 0:  # add the heads before (this program's stores: a barrier makes them seen by every thread)
        tl.debug_barrier()
        b_dq += tl.load(dq + key_row + rows_k, mask=m_tk, other=0).to(tl.float32)
        b_dk += tl.load(dk + key_row + rows_k, mask=m_tk, other=0).to(tl.float32)
    # stored before the gates' part below: fewer tiles live at once
    tl.store(dq + key_row + rows_k, b_dq.to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + key_row + rows_k, b_dk.to(dk.dtype.element_ty), mask=m_tk)
    tl.store(dw + row0 * (H * K) + i_h * K + o_t[:, None] * (H * K) + o_k[None, :],
             b_dw.to(dw.dtype.element_ty), mask=m_tk)

    b_P = b_D * tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION)
    b_c = b_decay * tl.sum(b_k.to(tl.float32) * b_vds, axis=1)
    b_dg = tl.sum(b_P, axis=1) - tl.sum(b_P, axis=0) + scale * b_e * tl.sum(
        b_dos * b_q.to(tl.float32), axis=1) - b_c
    b_dgl = tl.exp(g_last) * tl.sum(b_sds, axis=0) + tl.sum(b_c, axis=0)
    b_dg += tl.where(o_t == n_t - 1, b_dgl, 0)
    tl.store(dg + gate_row + o_t * H, b_dg, mask=m_t)


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
    scale = tl.cast(scale, tl.float32)
    o_k = i_k * BK + tl.arange(0, BK)
    row0 = bos + i_t * BT  # the chunk's first row, 64-bit
    n_t = tl.minimum(seq_len - i_t * BT, BT).to(tl.int32)  # its rows
    dg += i_k.to(tl.int64) * tl.num_programs(1) * T * H  # this K block's share of dgc: B x T x H
    # the key head's value heads in turn (a loop, not unrolled: one head's
    # tiles live at a time)
    for i_r in tl.range(0, H // Hg, num_stages=1):
        i_h = i_hk * (H // Hg) + i_r
        # n_t plus a zero the compiler cannot see (i_r < H / Hg): the masks
        # built from it stay in the loop, where Triton would hoist them out
        # of it and hold them in registers across it
        n_t_h = n_t + (i_h // (H // Hg) - i_hk)
        value_head_grads(q, k, v_new, gc, do, dv, h, dh, dq, dk, dw, dg, scale, row0, o_k, h_row, i_hk, i_h,
                         i_r, n_t_h, H, Hg, K, V, BT, BK, BV, DOT_PRECISION, V_STAGES)
