"""One-kernel GDN intra-chunk forward: ``A = (I + L)^-1``, ``w`` and ``u`` in one pass.

The seed path (``kkt_solve.py`` then ``recompute_w_u.py``) writes ``A`` to
memory and reads it back, together with ``k`` a second time, in a second
kernel. Here one program per (chunk, value head) computes ``A`` and then
``u = A (beta v)`` and ``w = A (beta exp(g) k)`` while its ``A`` tile and ``k``
rows are still in cache: one launch, no second pass over HBM for ``A`` and ``k``.
The math is docs/math.md's, the block structure the seed's:

- ``L`` in 16x16 blocks from ``k k^T`` (all ten lower blocks at once, one pass
  over ``K``), gated by ``safe_exp(g_i - g_j)`` (as ``safe_exp2`` of ``g log2(e)``)
  and scaled by ``beta_i``;
- the four diagonal blocks inverted by recursive halving: 2x2 blocks, then
  three merges of two blocks into one (4x4, 8x8, 16x16), each two small dots
  (``unit_lower.unit_lower_inverse_by_halving``), where the seed runs 14
  dependent steps of forward substitution with row reductions (H200,
  triton 3.6, headline shape, split path, torch do_bench: 0.425 ms against
  0.463 with the substitution);
- the seed's block merge for the six blocks below the diagonal;
- the halving's and the merge's 16x16 dots with their inner index permuted
  (``unit_lower.block_dot``: fewer layout conversions; 0.412 against 0.429 ms,
  H200, triton 3.6);
- ``A`` stored whole (the six upper blocks as zeros, so the launcher need not
  zero-fill it), then read back as one 64x64 tile from L2 for ``u`` and ``w``.

Program ids: axis 0 runs over ``(chunk, value head)`` with the head fastest, so
the value heads that share one key head (GQA) run side by side and read the
same ``k`` rows through L2; axis 1 is the batch row. Parameter order follows
jax-triton: inputs, the scalar ``T``, the outputs ``w, u, A``, the constexprs.
"""
import triton
import triton.language as tl

from .chunk_qk import chunk_qk_product, store_gated_qk
from .safe_exp import LOG2E, safe_exp2
from .tiles import at_head, load_rows, load_tile, program_chunk, store_tile, store_w_u
from .unit_lower import block_dot, unit_lower_inverse_by_halving


@triton.jit
def gate(b_A, g_r, g_c, beta_r, USE_G: tl.constexpr):
    """``b_A[i, j] * safe_exp2(g_r[i] - g_c[j]) * beta_r[i]``, with ``g`` in
    base 2 (:func:`chunk_gates`)."""
    if USE_G:
        b_A *= safe_exp2(g_r[:, None] - g_c[None, :])
    return b_A * beta_r[:, None]


@triton.jit
def store_row_block(ptr, T, C: tl.constexpr, stride, r0, c0, b_0, b_1, b_2, b_3, BR: tl.constexpr,
                    BCOL: tl.constexpr):
    """Store four ``[BR, BCOL]`` tiles side by side from column ``c0`` of row block ``r0``."""
    store_tile(ptr, b_0, T, C, stride, r0, c0, BR, BCOL)
    store_tile(ptr, b_1, T, C, stride, r0, c0 + BCOL, BR, BCOL)
    store_tile(ptr, b_2, T, C, stride, r0, c0 + 2 * BCOL, BR, BCOL)
    store_tile(ptr, b_3, T, C, stride, r0, c0 + 3 * BCOL, BR, BCOL)


@triton.jit
def chunk_grams(k, T, i_tc0, Hg: tl.constexpr, K: tl.constexpr, BC: tl.constexpr,
                BK: tl.constexpr):
    """The ten lower 16x16 blocks of ``k k^T`` (float32) of the chunk from row
    ``i_tc0``; ``k`` points at the sequence's first row and the key head."""
    i_tc1 = i_tc0 + BC
    i_tc2 = i_tc0 + 2 * BC
    i_tc3 = i_tc0 + 3 * BC
    # k k^T in ten 16x16 blocks; rows past T load as zeros and give zero blocks.
    b_A00 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A10 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A11 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A20 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A21 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A22 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A30 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A31 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A32 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A33 = tl.zeros([BC, BC], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_k0 = load_tile(k, T, K, Hg * K, i_tc0, i_k * BK, BC, BK)
        b_k1 = load_tile(k, T, K, Hg * K, i_tc1, i_k * BK, BC, BK)
        b_k2 = load_tile(k, T, K, Hg * K, i_tc2, i_k * BK, BC, BK)
        b_k3 = load_tile(k, T, K, Hg * K, i_tc3, i_k * BK, BC, BK)
        b_A00 = tl.dot(b_k0, tl.trans(b_k0), b_A00)
        b_A10 = tl.dot(b_k1, tl.trans(b_k0), b_A10)
        b_A11 = tl.dot(b_k1, tl.trans(b_k1), b_A11)
        b_A20 = tl.dot(b_k2, tl.trans(b_k0), b_A20)
        b_A21 = tl.dot(b_k2, tl.trans(b_k1), b_A21)
        b_A22 = tl.dot(b_k2, tl.trans(b_k2), b_A22)
        b_A30 = tl.dot(b_k3, tl.trans(b_k0), b_A30)
        b_A31 = tl.dot(b_k3, tl.trans(b_k1), b_A31)
        b_A32 = tl.dot(b_k3, tl.trans(b_k2), b_A32)
        b_A33 = tl.dot(b_k3, tl.trans(b_k3), b_A33)
    return b_A00, b_A10, b_A11, b_A20, b_A21, b_A22, b_A30, b_A31, b_A32, b_A33


@triton.jit
def chunk_gates(g, beta, T, i_tc0, H: tl.constexpr, BC: tl.constexpr, USE_G: tl.constexpr,
                SUM_G: tl.constexpr):
    """``beta`` and ``g log2(e)`` (float32, zeros without ``USE_G``) of the
    chunk from row ``i_tc0`` in four 16-row pieces; ``g`` and ``beta`` point at
    the sequence's first row and one value head. ``g`` in base 2 makes each gate
    factor one ``ex2`` (:func:`gate`): the scaling is done once per row, not
    once per element (sm_90a, split's ``A`` kernel: 2752 instructions against
    3152; H200, triton 3.6, headline, torch do_bench: split 0.399 against
    0.409 ms, one kernel 0.465 against 0.497). It rounds ``g`` once more: an
    absolute error of about ``|g| 2^-24`` in the exponent, the size of ``g``'s own
    float32 rounding (and ``|g|`` past 2.3e38 overflows where it did not).

    ``SUM_G`` (with ``USE_G``): ``g`` holds the per-step log gates, not their
    chunk-local cumulative sums, and the sums are taken here, piece by piece
    with a running offset (rows past ``T`` load as 0: the sums stay flat there).
    The forward then needs no cumsum in XLA, whose two small fusions and
    launch gaps cost more than summing 64 values in the kernel. The pieces are
    summed after their scaling to base 2: the same sums up to float32 rounding."""
    i_tc1 = i_tc0 + BC
    i_tc2 = i_tc0 + 2 * BC
    i_tc3 = i_tc0 + 3 * BC
    b_b0 = load_rows(beta, T, H, i_tc0, BC)
    b_b1 = load_rows(beta, T, H, i_tc1, BC)
    b_b2 = load_rows(beta, T, H, i_tc2, BC)
    b_b3 = load_rows(beta, T, H, i_tc3, BC)
    if USE_G:
        b_g0 = load_rows(g, T, H, i_tc0, BC) * LOG2E
        b_g1 = load_rows(g, T, H, i_tc1, BC) * LOG2E
        b_g2 = load_rows(g, T, H, i_tc2, BC) * LOG2E
        b_g3 = load_rows(g, T, H, i_tc3, BC) * LOG2E
    else:
        b_g0 = tl.zeros([BC], dtype=tl.float32)
        b_g1 = b_g0
        b_g2 = b_g0
        b_g3 = b_g0
    if SUM_G:  # per-step gates: each piece's own running sums plus the sum of the pieces before it
        tl.static_assert(USE_G, "SUM_G sums the gates g: USE_G is needed")
        b_s0 = tl.sum(b_g0, 0)
        b_s1 = b_s0 + tl.sum(b_g1, 0)
        b_s2 = b_s1 + tl.sum(b_g2, 0)
        b_g0 = tl.cumsum(b_g0, 0)
        b_g1 = tl.cumsum(b_g1, 0) + b_s0
        b_g2 = tl.cumsum(b_g2, 0) + b_s1
        b_g3 = tl.cumsum(b_g3, 0) + b_s2
    return b_b0, b_b1, b_b2, b_b3, b_g0, b_g1, b_g2, b_g3


@triton.jit
def store_inverse(b_A00, b_A10, b_A11, b_A20, b_A21, b_A22, b_A30, b_A31, b_A32, b_A33,
                  b_b0, b_b1, b_b2, b_b3, b_g0, b_g1, b_g2, b_g3, A, T, i_tc0,
                  H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, USE_G: tl.constexpr,
                  DOT_PRECISION: tl.constexpr):
    """``(I + L)^-1`` of the chunk from row ``i_tc0``, with ``L`` the blocks of
    ``k k^T`` (:func:`chunk_grams`) gated by one value head's ``beta`` and
    ``g`` (:func:`chunk_gates`), stored whole (upper blocks as zeros) into
    ``A``, which points at the sequence's first row and that head."""
    i_tc1 = i_tc0 + BC
    i_tc2 = i_tc0 + 2 * BC
    i_tc3 = i_tc0 + 3 * BC

    # L = beta_i <k_i, k_j> safe_exp(g_i - g_j), strictly lower on the diagonal blocks.
    o_i = tl.arange(0, BC)
    m_d = o_i[:, None] > o_i[None, :]
    b_A00 = tl.where(m_d, gate(b_A00, b_g0, b_g0, b_b0, USE_G), 0.0)
    b_A11 = tl.where(m_d, gate(b_A11, b_g1, b_g1, b_b1, USE_G), 0.0)
    b_A22 = tl.where(m_d, gate(b_A22, b_g2, b_g2, b_b2, USE_G), 0.0)
    b_A33 = tl.where(m_d, gate(b_A33, b_g3, b_g3, b_b3, USE_G), 0.0)
    b_A10 = gate(b_A10, b_g1, b_g0, b_b1, USE_G)
    b_A20 = gate(b_A20, b_g2, b_g0, b_b2, USE_G)
    b_A21 = gate(b_A21, b_g2, b_g1, b_b2, USE_G)
    b_A30 = gate(b_A30, b_g3, b_g0, b_b3, USE_G)
    b_A31 = gate(b_A31, b_g3, b_g1, b_b3, USE_G)
    b_A32 = gate(b_A32, b_g3, b_g2, b_b3, USE_G)

    # Diagonal blocks of (I + L)^-1, then the seed's block merge below them
    # (its dots with the inner index permuted: unit_lower.block_dot).
    b_Ai00 = unit_lower_inverse_by_halving(b_A00, BC, DOT_PRECISION)
    b_Ai11 = unit_lower_inverse_by_halving(b_A11, BC, DOT_PRECISION)
    b_Ai22 = unit_lower_inverse_by_halving(b_A22, BC, DOT_PRECISION)
    b_Ai33 = unit_lower_inverse_by_halving(b_A33, BC, DOT_PRECISION)
    b_Ai10 = -block_dot(block_dot(b_Ai11, b_A10, DOT_PRECISION), b_Ai00, DOT_PRECISION)
    b_Ai21 = -block_dot(block_dot(b_Ai22, b_A21, DOT_PRECISION), b_Ai11, DOT_PRECISION)
    b_Ai32 = -block_dot(block_dot(b_Ai33, b_A32, DOT_PRECISION), b_Ai22, DOT_PRECISION)
    b_Ai20 = -block_dot(
        b_Ai22,
        block_dot(b_A20, b_Ai00, DOT_PRECISION) + block_dot(b_A21, b_Ai10, DOT_PRECISION),
        DOT_PRECISION,
    )
    b_Ai31 = -block_dot(
        b_Ai33,
        block_dot(b_A31, b_Ai11, DOT_PRECISION) + block_dot(b_A32, b_Ai21, DOT_PRECISION),
        DOT_PRECISION,
    )
    b_Ai30 = -block_dot(
        b_Ai33,
        block_dot(b_A30, b_Ai00, DOT_PRECISION)
        + block_dot(b_A31, b_Ai10, DOT_PRECISION)
        + block_dot(b_A32, b_Ai20, DOT_PRECISION),
        DOT_PRECISION,
    )

    b_0 = tl.zeros([BC, BC], dtype=tl.float32)
    store_row_block(A, T, BT, H * BT, i_tc0, 0, b_Ai00, b_0, b_0, b_0, BC, BC)
    store_row_block(A, T, BT, H * BT, i_tc1, 0, b_Ai10, b_Ai11, b_0, b_0, BC, BC)
    store_row_block(A, T, BT, H * BT, i_tc2, 0, b_Ai20, b_Ai21, b_Ai22, b_0, BC, BC)
    store_row_block(A, T, BT, H * BT, i_tc3, 0, b_Ai30, b_Ai31, b_Ai32, b_Ai33, BC, BC)


@triton.jit
def store_chunk_A(k, g, beta, A, bos, i_h, T, i_tc0, H: tl.constexpr, Hg: tl.constexpr,
                  K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                  USE_G: tl.constexpr, DOT_PRECISION: tl.constexpr, SUM_G: tl.constexpr):
    """``(I + L)^-1`` of the chunk from row ``i_tc0`` of value head ``i_h`` of
    the sequence from row ``bos`` (``T`` rows) stored into ``A``; ``k``, ``g``,
    ``beta`` and ``A`` point at the tensors' first elements (value head ``i_h``
    reads key head ``i_h // (H // Hg)``). ``beta`` and ``g`` are loaded before the ``k k^T`` loop:
    their latency hides behind it (loaded after it, ptxas needs 185 registers
    instead of 234 at BK=64, 1 warp, but the split path took 0.498 ms instead
    of 0.481 at the headline shape, H200, triton 3.6). ``SUM_G``: ``g`` holds
    the per-step log gates, summed within the chunk here (:func:`chunk_gates`)."""
    k, g, beta, A = at_head(k, g, beta, A, bos, i_h, H, Hg, K, BT)
    b_b0, b_b1, b_b2, b_b3, b_g0, b_g1, b_g2, b_g3 = chunk_gates(g, beta, T, i_tc0, H, BC, USE_G, SUM_G)
    b_A00, b_A10, b_A11, b_A20, b_A21, b_A22, b_A30, b_A31, b_A32, b_A33 = chunk_grams(
        k, T, i_tc0, Hg, K, BC, BK)
    store_inverse(b_A00, b_A10, b_A11, b_A20, b_A21, b_A22, b_A30, b_A31, b_A32, b_A33,
                  b_b0, b_b1, b_b2, b_b3, b_g0, b_g1, b_g2, b_g3, A, T, i_tc0, H, BT, BC, USE_G, DOT_PRECISION)


@triton.autotune(
    configs=[
        # BK=64 has won at every benchmarked shape (2 warps); BK=32 stays a
        # candidate for other head dims.
        # One num_stages: nothing here is software-pipelined, and stages 2 and 3
        # compile to the same PTX (triton 3.6 and 3.8, K=128 and 256); each
        # extra config only adds compile time and, under jax-triton 0.3, bytes
        # to the custom call's opaque string, which is hashed on every call.
        triton.Config({"BK": BK}, num_warps=num_warps, num_stages=3)
        for BK in [32, 64]
        for num_warps in [2, 4, 8]
    ],
    key=["H", "Hg", "K", "V", "BT", "BV"],
)
@triton.jit(do_not_specialize=["T"])
def gdn_fwd_intra_fused_kernel(
    k,
    v,
    g,
    beta,
    cu_seqlens,
    chunk_indices,
    T,
    w,
    u,
    A,
    H: tl.constexpr,
    Hg: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_G: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    i_t, i_h, bos, T = program_chunk(cu_seqlens, chunk_indices, T, H, IS_VARLEN)
    if i_t * BT >= T:
        return
    i_tc0 = i_t * BT
    store_chunk_A(k, g, beta, A, bos, i_h, T, i_tc0, H, Hg, K, BT, BC, BK, USE_G, DOT_PRECISION, False)

    # u = A (beta v), w = A (beta exp(g) k) as in recompute_w_u.py, with A read
    # back whole as the [64, 64] tile this program just wrote: after the
    # barrier the CTA's own stores are visible, and the tile (8 KB in bf16)
    # comes from L2, not HBM. It is the stored A, rounded to k's dtype, so both
    # Triton paths compute w and u from the same A.
    tl.debug_barrier()
    store_w_u(A, k, v, g, beta, w, u, bos, i_h, T, i_tc0, H, Hg, K, V, BT, BK, BV, USE_G,
              DOT_PRECISION)

# The A kernels' configs (below): K blocks of the k k^T pass and warps
A_CONFIGS = [triton.Config({"BK": BK}, num_warps=num_warps) for BK in [32, 64] for num_warps in [1, 2, 4]]


# The A part alone, on the same head-fastest grid: with recompute_w_u.py after
# it, the split path (``impl="split"``), where each kernel runs at its own best
# occupancy: the A builder at 1 warp, w/u at 4 (0.548 ms at the headline shape
# against the seed's 0.661 and the one kernel's 0.697, H200, torch do_bench).
# SUM_G (last, default False): g holds the per-step log gates and the kernel
# sums them within the chunk (chunk_gates), for the whole forward, whose
# other kernels (chunk_qk.py, chunk_fwd.py) do the same: no cumsum in XLA.
@triton.autotune(configs=A_CONFIGS, key=["H", "Hg", "K", "BC"])
@triton.jit(do_not_specialize=["T"])
def gdn_fwd_intra_A_kernel(
    k,
    g,
    beta,
    cu_seqlens,
    chunk_indices,
    T,
    A,
    H: tl.constexpr,
    Hg: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    USE_G: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SUM_G: tl.constexpr = False,
):
    i_t, i_h, bos, T = program_chunk(cu_seqlens, chunk_indices, T, H, IS_VARLEN)
    if i_t * BT >= T:
        return
    store_chunk_A(k, g, beta, A, bos, i_h, T, i_t * BT, H, Hg, K, BT, BC, BK, USE_G, DOT_PRECISION, SUM_G)


# The A kernel with the output's attention block of kernels/chunk_qk.py
# written beside A (per value head, after A, whose registers are free by
# then): the block's q k^T reads k again from L1/L2 instead of in a second
# launch, for the walk from A (``kernels/chunk_fwd.py``, ``FROM_A``). An
# experiment against the A kernel and chunk_qk in turn
# (``benchmarks/chunk_fwd_probe.py``); the package does not launch it.
@triton.autotune(configs=A_CONFIGS, key=["H", "Hg", "K", "BC"])
@triton.jit(do_not_specialize=["T"])
def gdn_fwd_intra_A_qk_kernel(
    q,
    k,
    g,
    beta,
    cu_seqlens,
    chunk_indices,
    T,
    A,
    Aqk,
    H: tl.constexpr,
    Hg: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    USE_G: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tl.static_assert(USE_G, "the output block is gated: g is needed")
    i_t, i_h, bos, T = program_chunk(cu_seqlens, chunk_indices, T, H, IS_VARLEN)
    if i_t * BT >= T:
        return
    store_chunk_A(k, g, beta, A, bos, i_h, T, i_t * BT, H, Hg, K, BT, BC, BK, USE_G, DOT_PRECISION, False)
    o_t = tl.arange(0, BT)
    rows = bos + i_t * BT + o_t  # 64-bit: bos is
    m_t = i_t * BT + o_t < T
    b_a = chunk_qk_product(q, k, rows, m_t, i_h // (H // Hg), Hg, K, BT, BK, DOT_PRECISION)
    store_gated_qk(Aqk, b_a, g, rows, m_t, i_h, H, BT, False)
