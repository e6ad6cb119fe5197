"""``@triton.jit`` inverses of unit lower-triangular ``[16, 16]`` float32 blocks
``I + N`` (``N`` strictly lower triangular): the diagonal blocks of ``A``.

The kernels use :func:`unit_lower_inverse_by_halving` and do its dots and the
block merge's with :func:`block_dot`; the other inverses are the forms
measured before it, kept for the benchmark variants."""
import triton
import triton.language as tl


@triton.jit
def block_dot(a, b, P: tl.constexpr):
    """``tl.dot(a, b, input_precision=P)`` of two ``[16, 16]`` float32 blocks,
    with the inner index ``k = 8a + 2t + j`` read as ``8a + 4j + t`` in both
    operands (a reshape and a permute each): the same sum in another order.

    Why: at 1 warp a tf32 mma's A operand holds columns ``(t, t + 4)`` of a
    row where its accumulator holds ``(2t, 2t + 1)``, so a product fed to the
    next dot as A needs shuffles and selects; with the permuted index it is
    already in place (two register moves per four registers). B's rows take
    the same permutation and its conversion stays in shuffles. sm_90a SASS of
    the split's ``A`` kernel (triton 3.8, BK=64, 1 warp): 3152 instructions
    and 216 shuffles against 3752 and 480 with plain ``tl.dot``. H200,
    triton 3.6, headline shape, torch do_bench: split path 0.412 ms against
    0.429, one kernel 0.502 against 0.544. The same B permutation written as
    ``trans(permute(trans(b)))`` went through shared memory and lost
    (0.454). The result does not depend on the layout: at other warp
    counts or with ``P="ieee"`` it is the same product, summed in another
    order."""
    tl.static_assert((a.shape[0] == 16) & (a.shape[1] == 16) & (b.shape[0] == 16) & (b.shape[1] == 16))
    a = tl.reshape(tl.permute(tl.reshape(a, [16, 2, 4, 2]), (0, 1, 3, 2)), [16, 16])
    b = tl.reshape(tl.permute(tl.reshape(b, [2, 4, 2, 16]), (0, 2, 1, 3)), [16, 16])
    return tl.dot(a, b, input_precision=P)


@triton.jit
def unit_lower_inverse(b_N, BC: tl.constexpr):
    """``(I + N)^-1`` of a strictly lower triangular ``[16, 16]`` float32 block.

    ``N`` is nilpotent (``N^16 = 0``), so ``(I + N)^-1 = (I - N)(I + N^2)(I +
    N^4)(I + N^8)``: six small dots instead of the seed's 14 dependent steps of
    forward substitution (measured on the H200 inside the one-kernel path:
    0.76 ms against 1.05 ms at the headline shape). The dots are float32
    ("ieee"): with tf32 the inverse lost up to 4e-3 on correlated keys, in
    float32 it matches the substitution's error against float64 (checked in NumPy).
    """
    o_i = tl.arange(0, BC)
    m_I = (o_i[:, None] == o_i[None, :]).to(tl.float32)
    b_N2 = tl.dot(b_N, b_N, input_precision="ieee")
    b_N4 = tl.dot(b_N2, b_N2, input_precision="ieee")
    b_N8 = tl.dot(b_N4, b_N4, input_precision="ieee")
    b_P = tl.dot(m_I - b_N, m_I + b_N2, input_precision="ieee")
    b_P = tl.dot(b_P, m_I + b_N4, input_precision="ieee")
    b_Ai = b_P + tl.dot(b_P, b_N8, input_precision="ieee")
    return b_Ai


@triton.jit
def substitute_row(b_Ai, o_i, i):
    """Step ``i`` of the seed's forward substitution on ``b_Ai``, which holds
    ``(I + N)^-1 - I`` in its rows above ``i`` and ``-N`` from row ``i`` on:
    row ``i`` becomes ``a + a @ b_Ai`` with ``a = -N[i]`` (zero from column ``i``)."""
    b_a = tl.sum(tl.where((o_i == i)[:, None], b_Ai, 0.0), 0)
    b_a = b_a + tl.sum(b_a[:, None] * b_Ai, 0)
    return tl.where((o_i == i)[:, None], b_a, b_Ai)


@triton.jit
def unit_lower_inverses(b_N0, b_N1, b_N2, b_N3, BC: tl.constexpr):
    """``(I + N)^-1`` of four strictly lower triangular ``[16, 16]`` float32
    blocks, by the seed's forward substitution (exact float32 arithmetic, no
    dots) with the four blocks' steps in one loop: four independent chains
    that the compiler can interleave, where the seed runs four loops one
    after the other (14 dependent steps each, latency-bound at 1 warp). Row
    ``i`` of ``-N`` is read from the row of the result it becomes, so the
    ``N`` blocks need not stay alive. Slower than
    :func:`unit_lower_inverses_from_transposes`; kept for
    the benchmark variants (``seed_interleaved``, ``split_rows``,
    ``fused_rows``)."""
    o_i = tl.arange(0, BC)
    b_Ai0 = -b_N0
    b_Ai1 = -b_N1
    b_Ai2 = -b_N2
    b_Ai3 = -b_N3
    for i in range(2, BC):
        b_Ai0 = substitute_row(b_Ai0, o_i, i)
        b_Ai1 = substitute_row(b_Ai1, o_i, i)
        b_Ai2 = substitute_row(b_Ai2, o_i, i)
        b_Ai3 = substitute_row(b_Ai3, o_i, i)
    m_I = (o_i[:, None] == o_i[None, :]).to(tl.float32)
    return b_Ai0 + m_I, b_Ai1 + m_I, b_Ai2 + m_I, b_Ai3 + m_I


@triton.jit
def substitute_column(b_X, b_NT, o_i, i):
    """Step ``i`` of forward substitution on ``b_X``, which holds ``(I + N)^-1``
    in its rows above ``i`` and identity rows from row ``i`` on: row ``i``
    becomes ``e_i - sum_m N[i, m] X[m]``. ``N[i, :]`` is read as column ``i``
    of ``b_NT = N^T``: a reduction along the other axis than the update's, so
    it lands in the layout the update needs (no layout conversion on the
    dependent chain) and does not depend on ``b_X`` (off the chain)."""
    b_n = tl.sum(tl.where((o_i == i)[None, :], b_NT, 0.0), 1)
    b_x = tl.sum(b_n[:, None] * b_X, 0)
    return tl.where((o_i == i)[:, None], b_X - b_x[None, :], b_X)


@triton.jit
def unit_lower_inverses_from_transposes(b_NT0, b_NT1, b_NT2, b_NT3, BC: tl.constexpr):
    """``(I + N)^-1`` of four strictly lower triangular ``[16, 16]`` float32
    blocks given as their transposes ``N^T``: the seed's forward substitution
    (the same float32 sums), the four blocks' steps side by side and unrolled.
    Each step has one reduction on its dependent chain, where
    ``unit_lower_inverses`` has two and a layout conversion (it reads row ``i``
    back out of the result); unrolled, the column reads of later steps can run
    ahead. H200, triton 3.6, headline shape, split path (torch ``do_bench``):
    0.551 ms with ``unit_lower_inverses``, 0.509 with this loop, 0.497
    unrolled. :func:`unit_lower_inverse_by_halving` is faster (0.425 against
    0.463 ms); kept for the benchmark variant ``split_substitution``."""
    o_i = tl.arange(0, BC)
    m_I = (o_i[:, None] == o_i[None, :]).to(tl.float32)
    b_X0 = m_I
    b_X1 = m_I
    b_X2 = m_I
    b_X3 = m_I
    for i in tl.static_range(1, BC):
        b_X0 = substitute_column(b_X0, b_NT0, o_i, i)
        b_X1 = substitute_column(b_X1, b_NT1, o_i, i)
        b_X2 = substitute_column(b_X2, b_NT2, o_i, i)
        b_X3 = substitute_column(b_X3, b_NT3, o_i, i)
    return b_X0, b_X1, b_X2, b_X3


@triton.jit
def halving_step(b_Y, b_N, r, c, S: tl.constexpr, P: tl.constexpr):
    """``b_Y`` holds ``(I + N)^-1`` of the ``S x S`` diagonal blocks (zeros
    elsewhere); returns that of the ``2S x 2S`` diagonal blocks, as
    ``[[P, 0], [C, Q]]^-1 = [[P^-1, 0], [-Q^-1 C P^-1, Q^-1]]``: ``b_Y - b_Y C b_Y``
    with ``C`` the lower left ``S x S`` block of each ``2S`` block of ``N``.
    ``P``: the dots' ``input_precision``."""
    # Y C is Y N on C's blocks (Y is block diagonal) and zero elsewhere: masked
    # after the product, the three steps share N's operand conversion (sm_90a:
    # 2664 instructions against 2752 with the mask on N)
    b_YC = tl.where(((r // (2 * S)) == (c // (2 * S))) & ((r // S) != (c // S)),
                    block_dot(b_Y, b_N, P), 0.0)
    return b_Y - block_dot(b_YC, b_Y, P)


@triton.jit
def unit_lower_inverse_by_halving(b_N, BC: tl.constexpr, P: tl.constexpr):
    """``(I + N)^-1`` of a strictly lower triangular ``[16, 16]`` float32 block
    by recursive halving: ``I - N`` on the 2x2 diagonal blocks, then three
    :func:`halving_step` s (4x4, 8x8, 16x16): six small dots and no
    dependent chain of row reductions. It is the seed's block merge carried
    down to 2x2 blocks, so with tf32 dots its error is that of the merge
    (NumPy against float64, 40 chunks: A 1.2e-4 against the seed's 9e-5 on
    random unit keys, 8.2e-4 against 7.0e-4 on correlated ones; on the H200,
    bf16 B=2 T=1000: 1.4e-4 against 1.3e-4, and 7.8e-4 against 7.5e-4).
    sm_90a SASS of the split's ``A`` kernel (triton 3.8, BK=64, 1 warp):
    3752 instructions against 5096 with the substitution, 600 shuffles
    fewer, 230 registers against 234 (before :func:`block_dot`).
    H200, headline shape, split path, torch do_bench: 0.425 ms against 0.463."""
    tl.static_assert(BC == 16)
    o_i = tl.arange(0, BC)
    r = o_i[:, None]
    c = o_i[None, :]
    b_Y = (r == c).to(tl.float32) - tl.where((r // 2) == (c // 2), b_N, 0.0)
    b_Y = halving_step(b_Y, b_N, r, c, 2, P)
    b_Y = halving_step(b_Y, b_N, r, c, 4, P)
    return halving_step(b_Y, b_N, r, c, 8, P)
