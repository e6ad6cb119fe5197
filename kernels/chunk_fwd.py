"""The GDN forward after ``fwd_intra``: the state walk over chunks with the output.

Written from docs/math.md's chunk form. One program per (sequence, value head,
block of ``BV`` value columns) walks its sequence's 64-row chunks in order
with the state ``S [K, BV]`` on chip (float32, in registers) and, per chunk
with rows ``i, j < n`` (``w, u`` of ``fwd_intra``, ``gc`` the chunk-local
cumulative log gates, ``gl = gc[n - 1]``)::

    v'     = u - w S
    o      = scale (exp(gc) * (q S) + tril(q k^T * exp(gc_i - gc_j)) v')
    S_next = exp(gl) S + (k * exp(gl - gc))^T v'

so neither the states entering each chunk nor ``v'`` go through HBM: the
kernel reads ``q, k, w, u, gc`` once (q and k once per value head and V
block; neighbouring programs share them through L2) and writes ``o`` and the
final state. The state is rounded to the inputs' dtype for the tensor-core
dots (float32 inputs: tf32), as flash-linear-attention does.

Two formulations of the same step, a config switch (``TRANSPOSED``), each
the faster one somewhere (H200, triton 3.6, torch do_bench, bf16, Hg=16,
H=32, K=V=128): the row form above, whose dots all have the chunk's 64 rows
as their M dimension; and the transposed form, which keeps ``S^T [BV, K]``
and computes ``v'^T = u^T - S^T w^T``, ``o^T = S^T q^T + v'^T (k q^T)``,
``S^T += v'^T k``, so the state and ``v'`` are the dots' register operands
and only the loaded tiles go through shared memory (needs ``BV >= 64`` for
Hopper's warpgroup MMA). At B=8 T=4096 the transposed form with BV=64 took
0.576 ms against the row form's best 0.787 (BV=32); at one sequence of 32768
the row form with BV=16 (256 programs) took 1.42 ms against 1.68.

``FROM_A``: the kernel takes ``A`` (``[B, T, H, 64]``, ``fwd_intra``'s), ``v``
and ``beta`` in place of ``w`` and ``u`` and forms ``v'`` itself, from the
definitions ``u = A (beta v)``, ``w = A (beta exp(gc) k)``::

    v' = u - w S = A (beta (v - exp(gc) (k S)))

``k S`` is the dot ``w S`` was (k is loaded anyway), and the product with
``A`` one more (64 x 64 by 64 x BV): so ``w`` and ``u`` never go through HBM,
and ``fwd_intra`` needs to build only ``A``. The difference ``v - exp(gc) k S``
is taken in float32 before its one rounding (the ``u - w S`` form rounds ``u``
and ``w`` first). The output's attention block ``tril(q k^T * exp(gc_i -
gc_j))`` comes from ``qk`` (``chunk_qk.py``, laid out as ``A``) instead of
being formed here: it does not depend on the state, and forming it took a
third of this walk's time.

``SUM_G``: ``gc`` holds the per-step log gates ``a`` instead, and the walk
sums them within each chunk itself (``tl.cumsum``; ``gl`` from those sums),
so that the whole forward computes no cumsum in XLA.

The backward runs the same walk to recompute what it needs (``STORE_H``: the
state entering each chunk, rounded to the inputs' dtype, as rows of ``h
[chunks, H, K, V]``; ``STORE_V``: ``v'``), without the output (``WRITE_O``).

Program ids: axis 0 only, the V block fastest, then the value head, then the
sequence, so that programs reading the same q/k rows (V blocks, the GQA heads
of one key head) run side by side. Offsets of rows are 64-bit. Plain pointer
arithmetic with masks (no block pointers: triton 3.9 removed them). Parameter
order follows jax-triton: inputs, the scalars, the outputs, the constexprs.
"""
import triton
import triton.language as tl

from .safe_exp import causal_decay


@triton.jit
def sequence_rows(i_n, cu_seqlens, T, IS_VARLEN: tl.constexpr):
    """``(bos, length)`` of sequence ``i_n``: its first row (64-bit) and its
    number of rows (each batch row is one sequence of ``T`` without ``IS_VARLEN``)."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        return bos, tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
    else:
        return i_n.to(tl.int64) * T, T


@triton.jit
def program_heads(cu_seqlens, T, H: tl.constexpr, Hg: tl.constexpr, V: tl.constexpr,
                  BV: tl.constexpr, IS_VARLEN: tl.constexpr):
    """``(i_v, i_h, i_n, i_hk, bos, seq_len)`` of a program on axis 0 (the V
    block fastest, then the value head, then the sequence): its V block,
    value head, sequence, the key head it reads (GQA) and the sequence's rows
    (:func:`sequence_rows`)."""
    NV: tl.constexpr = (V + BV - 1) // BV  # constexpr arithmetic: triton 3.6's tl.cdiv is not
    pid = tl.program_id(0)
    i_v = pid % NV
    i_h = (pid // NV) % H
    i_n = pid // (NV * H)
    bos, seq_len = sequence_rows(i_n, cu_seqlens, T, IS_VARLEN)
    return i_v, i_h, i_n, i_h // (H // Hg), bos, seq_len


@triton.jit
def state_tile(i_n, i_h, i_v, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BK: tl.constexpr, BV: tl.constexpr, STATE_V_FIRST: tl.constexpr):
    """Offsets ``[BK, BV]`` of state ``(i_n, i_h)``'s columns ``i_v * BV ..``
    in an ``[N, H, K, V]`` tensor (``[N, H, V, K]`` with ``STATE_V_FIRST``),
    and their mask."""
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    base = (i_n.to(tl.int64) * H + i_h) * (K * V)
    if STATE_V_FIRST:
        offsets = base + o_v[None, :] * K + o_k[:, None]
    else:
        offsets = base + o_k[:, None] * V + o_v[None, :]
    return offsets, (o_k < K)[:, None] & (o_v < V)[None, :]


@triton.jit
def chunk_state_rows(i_n, i_h, i_v, chunk_offsets, T, H: tl.constexpr, K: tl.constexpr,
                     V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     IS_VARLEN: tl.constexpr):
    """Offsets ``[BK, BV]`` of sequence ``i_n``'s first chunk in the per-chunk
    states ``h [chunks, H, K, V]`` (add ``i_c * H * K * V`` for chunk ``i_c``):
    the chunk's place in the list of all chunks."""
    if IS_VARLEN:
        first_chunk = tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        first_chunk = i_n.to(tl.int64) * ((T + BT - 1) // BT)
    offsets, _ = state_tile(first_chunk, i_h, i_v, H, K, V, BK, BV, False)
    return offsets


@triton.jit
def chunk_gates(gc, r, m_t, i_c, seq_len, BT: tl.constexpr, H: tl.constexpr, SUM_G: tl.constexpr):
    """The chunk's cumulative gates ``[BT]`` (0 past the end; ``gc`` at the
    sequence's first row and the head) and its last row's. ``SUM_G``: ``gc``
    holds the per-step log gates, summed here (past the end the sums stay
    flat, at the last row's), and the last row's is taken from those sums, so
    that ``exp(g_last - b_g)`` is exactly 1 there."""
    b_g = tl.load(gc + r * H, mask=m_t, other=0).to(tl.float32)
    if SUM_G:  # no cumsum in XLA: summing 64 values here costs less than its launches
        b_g = tl.cumsum(b_g, 0)
        n = tl.minimum(BT, seq_len - i_c * BT)  # the chunk's rows
        return b_g, tl.sum(tl.where(tl.arange(0, BT) == n - 1, b_g, 0), 0)
    last = (tl.minimum(i_c * BT + BT, seq_len) - 1).to(tl.int64)
    return b_g, tl.load(gc + last * H).to(tl.float32)


@triton.jit
def tile(ptr, rows, cols, stride, mask, TRANSPOSED: tl.constexpr):
    """``ptr[rows[i] * stride + cols[j]]`` as ``[rows, cols]``, or its
    transpose ``[cols, rows]`` loaded as such; zero where ``mask`` (of the
    untransposed tile) is False."""
    if TRANSPOSED:
        return tl.load(ptr + rows[None, :] * stride + cols[:, None], mask=tl.trans(mask), other=0)
    else:
        return tl.load(ptr + rows[:, None] * stride + cols[None, :], mask=mask, other=0)


@triton.autotune(
    configs=[
        triton.Config({"BV": BV, "TRANSPOSED": BV >= 64}, num_warps=num_warps, num_stages=2)
        for BV in [16, 32, 64, 128]
        for num_warps in [4, 8]
    ],
    key=["H", "Hg", "K", "V", "BK", "USE_H0", "STORE_FINAL", "IS_VARLEN", "STATE_V_FIRST"],
)
@triton.jit(do_not_specialize=["T"])
def gdn_chunk_fwd_kernel(
    q,
    k,
    w,
    u,
    gc,
    beta,
    qk,
    h0,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    o,
    ht,
    h,
    v_new,
    H: tl.constexpr,
    Hg: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    USE_H0: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    STATE_V_FIRST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    WRITE_O: tl.constexpr = True,
    STORE_H: tl.constexpr = False,
    STORE_V: tl.constexpr = False,
    FROM_A: tl.constexpr = False,
    SUM_G: tl.constexpr = False,
):
    i_v, i_h, i_n, i_hk, bos, seq_len = program_heads(cu_seqlens, T, H, Hg, V, BV, IS_VARLEN)
    scale = tl.cast(scale, tl.float32)  # jax-triton 0.3 passes a Python float as fp64

    s_offsets, s_mask = state_tile(i_n, i_h, i_v, H, K, V, BK, BV, STATE_V_FIRST)
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_s = tl.load(h0 + s_offsets, mask=s_mask, other=0).to(tl.float32)
    if TRANSPOSED:
        b_s = tl.trans(b_s)  # S^T [BV, BK]

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    # The sequence's first row, at this program's heads.
    q += (bos * Hg + i_hk) * K
    k += (bos * Hg + i_hk) * K
    if FROM_A:  # w holds A [B, T, H, BT], u holds v; qk the output's masked q k^T, laid out as A
        w += (bos * H + i_h) * BT
        qk += (bos * H + i_h) * BT
        beta += bos * H + i_h
    else:
        w += (bos * H + i_h) * K
    u += (bos * H + i_h) * V
    o += (bos * H + i_h) * V
    v_new += (bos * H + i_h) * V
    gc += bos * H + i_h
    if STORE_H:  # the states entering each chunk, as rows of h [chunks, H, K, V]
        h_offsets = chunk_state_rows(i_n, i_h, i_v, chunk_offsets, T, H, K, V, BT, BK, BV, IS_VARLEN)

    # chunks by arithmetic: triton 3.6's interpreter cannot range() over tl.cdiv's result
    for i_c in range((seq_len + BT - 1) // BT):
        r = (i_c * BT + o_t).to(tl.int64)  # rows of this chunk, from the sequence start
        m_t = r < seq_len
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        if WRITE_O:
            b_q = tile(q, r, o_k, Hg * K, m_tk, TRANSPOSED)
        b_k = tile(k, r, o_k, Hg * K, m_tk, False)
        if FROM_A:  # A's rows of this chunk [BT, BT] (A^T when TRANSPOSED); columns past n are zeros
            m_tt = m_t[:, None] & (o_t < BT)[None, :]
            b_w = tile(w, r, o_t, H * BT, m_tt, TRANSPOSED)
            if WRITE_O:  # [i, j] = <q_i, k_j> exp(gc_i - gc_j), j <= i ([j, i] when TRANSPOSED)
                b_qk = tile(qk, r, o_t, H * BT, m_tt, TRANSPOSED)
            b_beta = tl.load(beta + r * H, mask=m_t, other=0).to(tl.float32)
        else:
            b_w = tile(w, r, o_k, H * K, m_tk, TRANSPOSED)
        b_u = tile(u, r, o_v, H * V, m_tv, TRANSPOSED).to(tl.float32)
        b_g, g_last = chunk_gates(gc, r, m_t, i_c, seq_len, BT, H, SUM_G)
        b_sx = b_s.to(b_w.dtype)
        if STORE_H:
            tl.store(h + h_offsets + tl.cast(i_c, tl.int64) * (H * K * V), tl.trans(b_sx) if TRANSPOSED else b_sx,
                     mask=s_mask)
        if TRANSPOSED:  # b_q, b_w, b_u are q^T, w^T, u^T; b_s is S^T
            if FROM_A:  # b_u is v^T, b_w is A^T: v'^T = (beta (v^T - (S^T k^T) exp(gc))) A^T
                b_x = b_u - tl.dot(b_sx, tl.trans(b_k), input_precision=DOT_PRECISION) * tl.exp(b_g)[None, :]
                b_v = tl.dot((b_x * b_beta[None, :]).to(b_w.dtype), b_w, input_precision=DOT_PRECISION)
            else:
                b_v = b_u - tl.dot(b_sx, b_w, input_precision=DOT_PRECISION)  # v'^T [BV, BT]
            if STORE_V:
                tl.store(v_new + r[None, :] * (H * V) + o_v[:, None], b_v.to(v_new.dtype.element_ty),
                         mask=tl.trans(m_tv))
            if WRITE_O:
                b_o = tl.dot(b_sx, b_q, input_precision=DOT_PRECISION) * tl.exp(b_g)[None, :]
                if FROM_A:
                    b_a = b_qk
                else:
                    b_a = tl.dot(b_k, b_q, input_precision=DOT_PRECISION)  # [j, i] = <k_j, q_i>
                    b_a = b_a * tl.exp(tl.where((o_t[:, None] <= o_t[None, :]) & m_t[None, :],
                                                b_g[None, :] - b_g[:, None], float("-inf")))
                b_o += tl.dot(b_v.to(b_w.dtype), b_a.to(b_w.dtype), input_precision=DOT_PRECISION)
                tl.store(o + r[None, :] * (H * V) + o_v[:, None], (b_o * scale).to(o.dtype.element_ty),
                         mask=tl.trans(m_tv))
            b_vd = (b_v * tl.exp(g_last - b_g)[None, :]).to(b_k.dtype)
            b_s = b_s * tl.exp(g_last) + tl.dot(b_vd, b_k, input_precision=DOT_PRECISION)
        else:
            if FROM_A:  # b_u is v, b_w is A: v' = A (beta (v - exp(gc) (k S)))
                b_x = b_u - tl.dot(b_k, b_sx, input_precision=DOT_PRECISION) * tl.exp(b_g)[:, None]
                b_v = tl.dot(b_w, (b_x * b_beta[:, None]).to(b_w.dtype), input_precision=DOT_PRECISION)
            else:
                b_v = b_u - tl.dot(b_w, b_sx, input_precision=DOT_PRECISION)  # v' [BT, BV]
            if STORE_V:
                tl.store(v_new + r[:, None] * (H * V) + o_v[None, :], b_v.to(v_new.dtype.element_ty),
                         mask=m_tv)
            if WRITE_O:
                b_o = tl.dot(b_q, b_sx, input_precision=DOT_PRECISION) * tl.exp(b_g)[:, None]
                if FROM_A:
                    b_a = b_qk
                else:
                    b_a = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION)
                    b_a = b_a * causal_decay(b_g, m_t, BT)
                b_o += tl.dot(b_a.to(b_w.dtype), b_v.to(b_w.dtype), input_precision=DOT_PRECISION)
                tl.store(o + r[:, None] * (H * V) + o_v[None, :], (b_o * scale).to(o.dtype.element_ty),
                         mask=m_tv)
            b_vd = (b_v * tl.exp(g_last - b_g)[:, None]).to(b_k.dtype)
            b_s = b_s * tl.exp(g_last) + tl.dot(tl.trans(b_k), b_vd, input_precision=DOT_PRECISION)

    if STORE_FINAL:
        if TRANSPOSED:
            b_s = tl.trans(b_s)
        tl.store(ht + s_offsets, b_s, mask=s_mask)
