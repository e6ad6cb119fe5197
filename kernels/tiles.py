"""``@triton.jit`` helpers shared by ``recompute_w_u.py`` and ``fused_intra.py``: tiles
of rows, and the program's chunk on the head-fastest grid.

Rows are tokens of one sequence (``T`` of them, row stride ``H * dim`` in the
packed ``[B, T, H, dim]`` layout). The row and tile helpers take pointers
already at the sequence's first row and a head; ``store_w_u`` takes the
tensors' base pointers and offsets them itself.

Plain pointers with masks (triton 3.9 removed block pointers): a tile's
first row ``r0`` is offset in 64 bits (``r0 * stride`` passes 2^31 elements
in a long sequence), the rows and columns inside it in 32 bits (at most
``BR * stride``). Rows past ``T`` read as zeros and are not written.
"""
import triton
import triton.language as tl


@triton.jit
def load_rows(ptr, T, stride, r0, BR: tl.constexpr):
    """``BR`` float32 values ``ptr[r * stride]`` for rows ``r0 .. r0 + BR``, zero past ``T``."""
    r = tl.arange(0, BR)
    p = ptr + r0.to(tl.int64) * stride + r * stride
    return tl.load(p, mask=r0 + r < T, other=0).to(tl.float32)


@triton.jit
def tile_at(ptr, T, C: tl.constexpr, stride, r0, c0, BR: tl.constexpr, BCOL: tl.constexpr):
    """``(pointers, mask)`` of rows ``r0 .. r0 + BR`` and columns ``c0 .. c0 +
    BCOL`` of a ``[T, C]`` row-major matrix with row stride ``stride``; ``c0``
    is a multiple of ``BCOL`` below ``C``. The mask is rows below ``T`` and
    columns below ``C``; where ``BCOL`` divides ``C`` every column is in and
    the mask is the rows' alone (``[BR, 1]``, broadcast by the load or store)."""
    r = tl.arange(0, BR)
    c = c0 + tl.arange(0, BCOL)
    p = ptr + r0.to(tl.int64) * stride + (r[:, None] * stride + c[None, :])
    mask = (r0 + r < T)[:, None]
    if C % BCOL != 0:
        mask = mask & (c < C)[None, :]
    return p, mask


@triton.jit
def load_tile(ptr, T, C: tl.constexpr, stride, r0, c0, BR: tl.constexpr, BCOL: tl.constexpr):
    """The ``[BR, BCOL]`` tile of :func:`tile_at`, zero outside the matrix."""
    p, mask = tile_at(ptr, T, C, stride, r0, c0, BR, BCOL)
    return tl.load(p, mask=mask, other=0)


@triton.jit
def store_tile(ptr, b, T, C: tl.constexpr, stride, r0, c0, BR: tl.constexpr, BCOL: tl.constexpr):
    """``b`` (``[BR, BCOL]``, cast to ``ptr``'s dtype) stored into the tile of
    :func:`tile_at`, its part inside the matrix."""
    p, mask = tile_at(ptr, T, C, stride, r0, c0, BR, BCOL)
    tl.store(p, b.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_A_times(b_A, x, y, scale, T, C: tl.constexpr, x_stride, y_stride, r0, BT: tl.constexpr,
                  BX: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``y = A (scale * x)`` for the ``BT`` rows of one chunk from row ``r0``:
    ``b_A`` is the chunk's ``[BT, BT]`` tile, ``scale`` a ``[BT]`` row factor,
    ``x`` and ``y`` ``[T, C]`` matrices, done in ``BX``-wide column tiles.
    ``scale * x`` is rounded to ``b_A``'s dtype before the dot."""
    for i_x in range(tl.cdiv(C, BX)):
        b_x = (load_tile(x, T, C, x_stride, r0, i_x * BX, BT, BX) * scale[:, None]).to(b_A.dtype)
        b_y = tl.dot(b_A, b_x, input_precision=DOT_PRECISION)
        store_tile(y, b_y, T, C, y_stride, r0, i_x * BX, BT, BX)


@triton.jit
def at_head(k, g, beta, A, bos, i_h, H: tl.constexpr, Hg: tl.constexpr, K: tl.constexpr,
            BT: tl.constexpr):
    """``k``, ``g``, ``beta`` and ``A`` (the tensors' first elements) moved to row
    ``bos`` and value head ``i_h``: ``k`` to its key head ``i_h // (H // Hg)``."""
    k += (bos * Hg + i_h // (H // Hg)) * K
    g += bos * H + i_h
    beta += bos * H + i_h
    A += (bos * H + i_h) * BT
    return k, g, beta, A


@triton.jit
def store_w_u(A, k, v, g, beta, w, u, bos, i_h, T, i_tc0, H: tl.constexpr, Hg: tl.constexpr,
              K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
              BV: tl.constexpr, USE_G: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``u = A (beta v)`` and ``w = A (beta exp(g) k)`` for the chunk from row
    ``i_tc0`` of value head ``i_h`` of the sequence from row ``bos`` (``T``
    rows), with ``A`` the chunk's stored ``(I + L)^-1`` (rows past the
    sequence end read as zero). The pointers point at the tensors' first
    elements; value head ``i_h`` reads key head ``i_h // (H // Hg)``."""
    k, g, beta, A = at_head(k, g, beta, A, bos, i_h, H, Hg, K, BT)
    v += (bos * H + i_h) * V
    w += (bos * H + i_h) * K
    u += (bos * H + i_h) * V
    # Per-row factors of this chunk: beta, and beta * exp(g) for the keys.
    b_beta = load_rows(beta, T, H, i_tc0, BT)
    b_kscale = b_beta
    if USE_G:
        b_kscale = b_beta * tl.exp(load_rows(g, T, H, i_tc0, BT))
    b_A = load_tile(A, T, BT, H * BT, i_tc0, 0, BT, BT)
    store_A_times(b_A, v, u, b_beta, T, V, H * V, H * V, i_tc0, BT, BV, DOT_PRECISION)
    store_A_times(b_A, k, w, b_kscale, T, K, Hg * K, H * K, i_tc0, BT, BK, DOT_PRECISION)


@triton.jit
def program_chunk(cu_seqlens, chunk_indices, T, H: tl.constexpr, IS_VARLEN: tl.constexpr,
                  INNER: tl.constexpr = 1):
    """``(i_t, i_h, bos, T)`` of this program on the head-fastest grid: the
    chunk's index inside its sequence, the value head, the sequence's first row
    (64-bit, so that offsets stay right past 2^31 elements) and its length.
    ``INNER``: programs per (chunk, head) on axis 0, fastest of all (a
    kernel's blocks of one chunk; ``tl.program_id(0) % INNER`` is the block)."""
    i_th, i_b = tl.program_id(0) // INNER, tl.program_id(1)
    i_t, i_h = i_th // H, i_th % H
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_t * 2).to(tl.int32)
        i_t = tl.load(chunk_indices + i_t * 2 + 1).to(tl.int32)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
    else:
        bos = i_b.to(tl.int64) * T
    return i_t, i_h, bos, T
