"""The backward's reverse walk: the state gradient over chunks, last to first.

Written from docs/math.md ("Gradients"; ``gdn_jax/chunk_bwd_jnp.py`` is its jnp
reference). One program per (sequence, value head, block of ``BV`` value
columns) walks its sequence's chunks backwards with ``dS`` (the cotangent of
the state leaving the chunk, float32 ``[K, BV]``, from the final state's
cotangent) on chip, and per chunk (``e = exp(gc)``, ``gamma = exp(gl)``,
``E_ij = exp(gc_i - gc_j)`` for ``i >= j``)::

    dv' = scale (q k^T E)^T do + (k exp(gl - gc)) dS       stored: the cotangent of v' (and u)
    dh  = dS                                                stored: the chunk's leaving-state cotangent
    dS <- gamma dS + scale (e q)^T do - w^T dv'

and the initial state's cotangent last. Chunk rows past the sequence end
load as zeros.

Two inputs in place of products formed on the walk's chain, each a
constexpr switch (what they save: docs/performance.md):

- ``QK_IN``: ``qk`` holds the forward's output block ``M = tril(q k^T E)``
  (``kernels/chunk_qk.py``, laid out as ``A``), read as ``M^T`` for ``M^T do``
  instead of forming ``q k^T`` and its masked exponentials per chunk.
- ``FROM_A``: ``w`` holds ``A [B, T, H, 64]`` of ``fwd_intra`` and ``beta``
  is given: from ``w = A (beta e k)``, ``w^T dv' = k^T (beta e (A^T dv'))``,
  so ``w`` is never rebuilt for the backward.

The scaled copies are taken of ``[64, BV]`` tiles (``do`` by ``e``, ``k dS``
by ``exp(gl - gc)``) rather than of ``[64, K]`` copies of ``q`` and ``k``,
which keeps fewer registers live.

Two formulations of the same step, a config switch (``TRANSPOSED``), as in
``kernels/chunk_fwd.py``: the row form above, whose dots have the chunk's 64
rows as their M dimension, and the transposed form, which keeps ``dS^T [BV,
K]`` and computes::

    dv'^T = scale do^T M + (dS^T k^T) exp(gl - gc)
    dS^T <- gamma dS^T + scale (e do)^T q - (beta e (dv'^T A)) k

so that ``dS^T``, ``dv'^T`` and ``dv'^T A`` (the chain) are the dots'
register operands and only the loaded tiles (``k``, ``q``, ``A``, ``M``)
go through shared memory (Hopper's warpgroup MMA takes its first operand
from registers; needs ``BV >= 64``).

The program layout and conventions are those of ``kernels/chunk_fwd.py`` (V
block fastest, 64-bit row offsets, plain pointers, outputs last).
"""
import triton
import triton.language as tl

from .chunk_fwd import chunk_gates, chunk_state_rows, program_heads, state_tile, tile
from .safe_exp import causal_decay


@triton.autotune(
    configs=[
        triton.Config({"BV": BV, "TRANSPOSED": BV >= 64}, num_warps=num_warps, num_stages=2)
        for BV in [16, 32, 64]
        for num_warps in [4, 8]
    ],
    key=["H", "Hg", "K", "V", "BK", "USE_DHT", "IS_VARLEN"],
)
@triton.jit(do_not_specialize=["T"])
def gdn_chunk_bwd_walk_kernel(
    q,
    k,
    w,
    beta,
    gc,
    do,
    qk,
    dht,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    dv,
    dh,
    dh0,
    H: tl.constexpr,
    Hg: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_DHT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    QK_IN: tl.constexpr = False,
    FROM_A: tl.constexpr = False,
    TRANSPOSED: tl.constexpr = False,
):
    i_v, i_h, i_n, i_hk, bos, seq_len = program_heads(cu_seqlens, T, H, Hg, V, BV, IS_VARLEN)
    scale = tl.cast(scale, tl.float32)

    s_offsets, s_mask = state_tile(i_n, i_h, i_v, H, K, V, BK, BV, False)
    b_ds = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_ds = tl.load(dht + s_offsets, mask=s_mask, other=0).to(tl.float32)
    if TRANSPOSED:
        b_ds = tl.trans(b_ds)  # dS^T [BV, BK]
    h_offsets = chunk_state_rows(i_n, i_h, i_v, chunk_offsets, T, H, K, V, BT, BK, BV, IS_VARLEN)

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    q += (bos * Hg + i_hk) * K
    k += (bos * Hg + i_hk) * K
    if FROM_A:  # w holds A [B, T, H, BT]
        w += (bos * H + i_h) * BT
        beta += bos * H + i_h
    else:
        w += (bos * H + i_h) * K
    if QK_IN:
        qk += (bos * H + i_h) * BT
    do += (bos * H + i_h) * V
    dv += (bos * H + i_h) * V
    gc += bos * H + i_h

    n_chunks = (seq_len + BT - 1) // BT  # not tl.cdiv: see kernels/chunk_fwd.py's loop
    for j in range(n_chunks):
        i_c = n_chunks - 1 - j
        r = (i_c * BT + o_t).to(tl.int64)
        m_t = r < seq_len
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        if TRANSPOSED:
            m_tt = m_t[:, None] & (o_t < BT)[None, :]
            b_q = tile(q, r, o_k, Hg * K, m_tk, False)
            b_k = tile(k, r, o_k, Hg * K, m_tk, False)
            if FROM_A:  # A [BT, BT]: row c0 + i holds A[i, 0:n], zeros past n
                b_w = tile(w, r, o_t, H * BT, m_tt, False)
                b_beta = tl.load(beta + r * H, mask=m_t, other=0).to(tl.float32)
            else:
                b_w = tile(w, r, o_k, H * K, m_tk, False)
            b_do = tile(do, r, o_v, H * V, m_tv, True)  # do^T [BV, BT]
            b_g, g_last = chunk_gates(gc, r, m_t, i_c, seq_len, BT, H, False)

            b_dsx = b_ds.to(b_k.dtype)  # dS^T
            tl.store(dh + h_offsets + tl.cast(i_c, tl.int64) * (H * K * V), tl.trans(b_dsx), mask=s_mask)
            if QK_IN:  # M [BT, BT], read as stored
                b_a = tile(qk, r, o_t, H * BT, m_tt, False)
            else:
                b_a = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION) * causal_decay(b_g, m_t, BT)
            # dv'^T = scale do^T M + (dS^T k^T) exp(gl - gc)  [BV, BT]
            b_dv = scale * tl.dot(b_do, b_a.to(b_k.dtype), input_precision=DOT_PRECISION)
            b_dv += tl.dot(b_dsx, tl.trans(b_k), input_precision=DOT_PRECISION) * tl.exp(g_last - b_g)[None, :]
            b_dvx = b_dv.to(b_k.dtype)
            tl.store(dv + r[None, :] * (H * V) + o_v[:, None], b_dvx.to(dv.dtype.element_ty), mask=tl.trans(m_tv))

            # both products accumulate into dS^T in place (the dots' acc): a
            # [BV, K] float32 temporary each would spill at 4 warps
            b_doe = (b_do * (scale * tl.exp(b_g))[None, :]).to(b_do.dtype)  # scale (e do)^T
            b_ds = tl.dot(b_doe, b_q, b_ds * tl.exp(g_last), input_precision=DOT_PRECISION)
            if FROM_A:  # (w^T dv')^T = ((dv'^T A) beta e) k
                b_adv = tl.dot(b_dvx, b_w, input_precision=DOT_PRECISION)
                b_adv = (b_adv * (-b_beta * tl.exp(b_g))[None, :]).to(b_k.dtype)
                b_ds = tl.dot(b_adv, b_k, b_ds, input_precision=DOT_PRECISION)
            else:
                b_ds = tl.dot((-b_dv).to(b_k.dtype), b_w, b_ds, input_precision=DOT_PRECISION)
        else:
            b_q = tl.load(q + r[:, None] * (Hg * K) + o_k[None, :], mask=m_tk, other=0)
            b_k = tl.load(k + r[:, None] * (Hg * K) + o_k[None, :], mask=m_tk, other=0)
            if FROM_A:  # A's rows of this chunk; columns past n hold zeros
                b_w = tl.load(w + r[:, None] * (H * BT) + o_t[None, :], mask=m_t[:, None], other=0)
                b_beta = tl.load(beta + r * H, mask=m_t, other=0).to(tl.float32)
            else:
                b_w = tl.load(w + r[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0)
            b_do = tl.load(do + r[:, None] * (H * V) + o_v[None, :], mask=m_tv, other=0)
            b_g, g_last = chunk_gates(gc, r, m_t, i_c, seq_len, BT, H, False)

            b_dsx = b_ds.to(b_k.dtype)
            tl.store(dh + h_offsets + tl.cast(i_c, tl.int64) * (H * K * V), b_dsx, mask=s_mask)
            # (q k^T E)^T do: [j, i] = <k_j, q_i> exp(gc_i - gc_j) for i >= j
            if QK_IN:  # M^T: row c0 + i of qk holds M[i, 0:n], read transposed
                b_a = tl.load(qk + r[None, :] * (H * BT) + o_t[:, None], mask=m_t[None, :], other=0)
            else:
                b_a = tl.dot(b_k, tl.trans(b_q), input_precision=DOT_PRECISION)
                b_a = b_a * tl.exp(tl.where((o_t[:, None] <= o_t[None, :]) & m_t[None, :],  # i in the chunk
                                            b_g[None, :] - b_g[:, None], float("-inf")))
            b_dv = scale * tl.dot(b_a.to(b_k.dtype), b_do, input_precision=DOT_PRECISION)
            # (k exp(gl - gc)) dS with the decay on the [BT, BV] product (rows past the end: k is 0)
            b_dv += tl.exp(g_last - b_g)[:, None] * tl.dot(b_k, b_dsx, input_precision=DOT_PRECISION)
            b_dvx = b_dv.to(b_k.dtype)
            tl.store(dv + r[:, None] * (H * V) + o_v[None, :], b_dvx.to(dv.dtype.element_ty), mask=m_tv)

            b_doe = (b_do * tl.exp(b_g)[:, None]).to(b_do.dtype)  # (e q)^T do = q^T (e do)
            b_ds = b_ds * tl.exp(g_last) + scale * tl.dot(tl.trans(b_q), b_doe, input_precision=DOT_PRECISION)
            if FROM_A:  # w^T dv' = k^T (beta e (A^T dv'))
                b_adv = tl.dot(tl.trans(b_w), b_dvx, input_precision=DOT_PRECISION)
                b_adv = (b_adv * (b_beta * tl.exp(b_g))[:, None]).to(b_k.dtype)
                b_ds -= tl.dot(tl.trans(b_k), b_adv, input_precision=DOT_PRECISION)
            else:
                b_ds -= tl.dot(tl.trans(b_w), b_dvx, input_precision=DOT_PRECISION)

    if TRANSPOSED:
        b_ds = tl.trans(b_ds)
    tl.store(dh0 + s_offsets, b_ds, mask=s_mask)
