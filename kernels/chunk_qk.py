"""The output's attention block inside each chunk, for the walk from ``A``.

Written from docs/math.md's chunk form: per (chunk, value head), with rows
``i, j < n`` of the chunk and ``gc`` the chunk-local cumulative log gates::

    Aqk[i, j] = (q_i . k_j) exp(gc_i - gc_j)    for j <= i, else 0

``o = scale (exp(gc) (q S) + Aqk v')`` is the chunk's output. The walk
(``chunk_fwd.py``, ``FROM_A``) reads this block instead of forming it on its
chain of state-dependent steps: it does not depend on the state, and the
product ``q k^T`` with its masked exponentials took a third of the walk's
time (H200, triton 3.6, B=8 T=4096, torch do_bench: the walk reading this
block 0.525 ms, this kernel 0.156, against 0.762 for the walk forming it).

Stored as ``A`` is (``[B, T, H, 64]``: row ``c0 + i`` holds ``Aqk[i, 0:n]``,
zeros in the rest; rows past a sequence's end are not written) in ``q``'s
dtype, the dtype the walk rounds it to for its dot with ``v'``. Padding rows
stay out of the exponent (``safe_exp.causal_decay``). With ``SUM_G`` the gate
operand holds the per-step log gates instead, and each program sums them
within its chunk (``tl.cumsum``): the forward then needs no cumsum in XLA.

One program per (chunk, key head, batch row) on the head-fastest grid
(``tiles.program_chunk`` over the ``Hg`` key heads): ``q k^T`` is the same
for the value heads that share a key head (GQA), so each program forms it
once and stores it gated by each of those value heads' gates in turn; 64-bit
row offsets; plain pointer arithmetic. Parameter order follows jax-triton:
inputs, the scalar ``T``, the output, the constexprs.
"""
import triton
import triton.language as tl

from .safe_exp import causal_decay
from .tiles import program_chunk


@triton.jit
def chunk_qk_product(q, k, rows, m_t, i_hk, Hg: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                     BK: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``[BT, BT]`` float32 ``q k^T`` of key head ``i_hk`` over the chunk's
    ``rows`` (64-bit, from the tensors' first row; zeros where ``m_t`` is False)."""
    NK: tl.constexpr = (K + BK - 1) // BK  # constexpr arithmetic: triton 3.6's tl.cdiv is not
    b_a = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(NK):
        o_k = i_k * BK + tl.arange(0, BK)
        m_tk = m_t[:, None] & (o_k < K)[None, :]
        offsets = (rows * Hg + i_hk)[:, None] * K + o_k[None, :]
        b_q = tl.load(q + offsets, mask=m_tk, other=0)
        b_k = tl.load(k + offsets, mask=m_tk, other=0)
        b_a += tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION)
    return b_a


@triton.jit
def store_gated_qk(Aqk, b_a, gc, rows, m_t, i_h, H: tl.constexpr, BT: tl.constexpr, SUM_G: tl.constexpr):
    """``b_a`` gated by value head ``i_h``'s ``exp(gc_i - gc_j)``, ``j <= i``,
    stored as that head's rows of ``Aqk`` (rows past the end not written).
    ``SUM_G``: ``gc`` holds the per-step log gates, summed here (rows past
    the end load as 0 and stay out of the exponent, as before)."""
    o_t = tl.arange(0, BT)
    b_g = tl.load(gc + rows * H + i_h, mask=m_t, other=0).to(tl.float32)
    if SUM_G:  # the chunk-local cumulative gates from the per-step ones: no cumsum in XLA
        b_g = tl.cumsum(b_g, 0)
    tl.store(Aqk + (rows * H + i_h)[:, None] * BT + o_t[None, :],
             (b_a * causal_decay(b_g, m_t, BT)).to(Aqk.dtype.element_ty), mask=m_t[:, None])


@triton.autotune(
    configs=[triton.Config({}, num_warps=num_warps, num_stages=2) for num_warps in [2, 4, 8]],
    key=["H", "Hg", "K", "BK"],
)
@triton.jit(do_not_specialize=["T"])
def gdn_chunk_qk_kernel(
    q,
    k,
    gc,
    cu_seqlens,
    chunk_indices,
    T,
    Aqk,
    H: tl.constexpr,
    Hg: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SUM_G: tl.constexpr = False,
):
    i_t, i_hk, bos, T = program_chunk(cu_seqlens, chunk_indices, T, Hg, IS_VARLEN)
    if i_t * BT >= T:
        return
    o_t = tl.arange(0, BT)
    rows = bos + i_t * BT + o_t  # 64-bit: bos is
    m_t = i_t * BT + o_t < T
    b_a = chunk_qk_product(q, k, rows, m_t, i_hk, Hg, K, BT, BK, DOT_PRECISION)
    for i_r in tl.static_range(H // Hg):  # the value heads that read key head i_hk
        store_gated_qk(Aqk, b_a, gc, rows, m_t, i_hk * (H // Hg) + i_r, H, BT, SUM_G)
