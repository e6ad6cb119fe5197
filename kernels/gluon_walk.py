"""What the Gluon walks share (``gluon_bwd_walk.py``, the backward's reverse
walk, and ``gluon_fwd_walk.py``, the forward's storing walk): one program of 4
warps per (sequence, value head, block of ``BV = 32`` value columns) on axis 0,
the V block fastest, then the value head, then the sequence; the layouts of
its tiles; the offsets of a chunk's tiles from its first row."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

BT = gl.constexpr(64)
BV = gl.constexpr(32)
_MMA = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 32, 16])
MMA = gl.constexpr(_MMA)  # the accumulators: [64, BV] and the state [K, BV]
ROWS = gl.constexpr(gl.SliceLayout(1, _MMA))
COLS = gl.constexpr(gl.SliceLayout(0, _MMA))
LV = gl.constexpr(gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0]))  # [*, BV] tiles in 16-byte pieces
LK = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0]))  # [64, K] copies
LA = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))  # [64, 64] copies
L1 = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))  # [64] copies
S128 = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
S64 = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2))
S1 = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))


@gluon.jit
def add(a, b):
    """The sum, as ``gl.associative_scan`` takes it (a cumulative sum)."""
    return a + b


@gluon.jit
def walk_program(H: gl.constexpr, Hg: gl.constexpr, V: gl.constexpr):
    """``(i_v, i_h, i_n, i_hk)``: this program's V block, value head,
    sequence and the key head it reads (GQA)."""
    NV: gl.constexpr = (V + BV - 1) // BV
    pid = gl.program_id(0)
    i_v = pid % NV
    i_h = (pid // NV) % H
    i_n = pid // (NV * H)
    return i_v, i_h, i_n, i_h // (H // Hg)


@gluon.jit
def tile_offsets(cols: gl.constexpr, stride, col0, layout: gl.constexpr):
    """``[64, cols]`` int32 offsets ``row * stride + col0 + col`` of a chunk's
    rows from its first (in ``layout``), and the row index ``[64]``."""
    r = gl.arange(0, BT, layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, cols, layout=gl.SliceLayout(0, layout))
    return r[:, None] * stride + col0 + c[None, :], r


@gluon.jit
def state_tile(i_n, i_h, o_v, H: gl.constexpr, K: gl.constexpr, V: gl.constexpr, V_FIRST: gl.constexpr):
    """``(base, offsets, mask)`` of state ``(i_n, i_h)``'s ``[K, BV]`` columns
    from ``o_v`` in an ``[N, H, K, V]`` tensor (``[N, H, V, K]`` with
    ``V_FIRST``): the state's first element, the tile's offsets from it in
    the accumulator's layout :data:`MMA` (int64), their mask; an initial or
    final state, or its cotangent."""
    o_k = gl.arange(0, K, layout=ROWS)
    o_c = o_v + gl.arange(0, BV, layout=COLS)
    if V_FIRST:
        offsets = o_c.to(gl.int64)[None, :] * K + o_k[:, None]
    else:
        offsets = o_k.to(gl.int64)[:, None] * V + o_c[None, :]
    return (i_n.to(gl.int64) * H + i_h) * (K * V), offsets, (o_k < K)[:, None] & (o_c < V)[None, :]


@gluon.jit
def state_rows_tile(o_v, K: gl.constexpr, V: gl.constexpr):
    """``(offsets, mask)`` of a state's ``[K, BV]`` columns from ``o_v`` in a
    ``[K, V]`` row of the per-chunk states (int64, in :data:`LV`: 16-byte
    stores from a shared-memory copy)."""
    o_k = gl.arange(0, K, layout=gl.SliceLayout(1, LV))
    o_c = o_v + gl.arange(0, BV, layout=gl.SliceLayout(0, LV))
    return o_k.to(gl.int64)[:, None] * V + o_c[None, :], (o_k < K)[:, None] & (o_c < V)[None, :]


@gluon.jit
def walk_offsets(H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr, V: gl.constexpr, i_h, i_hk, o_v):
    """The loop-invariant int32 offsets of a chunk's tiles from its first row
    (:func:`tile_offsets`, with their row indices): ``[64, K]`` of the key
    head's ``q``/``k`` rows, ``[64, 64]`` of ``A`` and the output block,
    ``[64, BV]`` of the program's value columns (their mask ``m_cv [BV]``),
    the ``[64]`` rows of ``beta`` and the gates (``r_1``), then
    :func:`state_rows_tile`'s state tile."""
    off_k, r_k = tile_offsets(K, Hg * K, i_hk * K, LK)
    off_a, r_a = tile_offsets(BT, H * BT, i_h * BT, LA)
    off_v, r_v = tile_offsets(BV, H * V, i_h * V + o_v, LV)
    m_cv = o_v + gl.arange(0, BV, layout=gl.SliceLayout(0, LV)) < V
    r_1 = gl.arange(0, BT, layout=L1)
    s_tile, s_mask = state_rows_tile(o_v, K, V)
    return off_k, r_k, off_a, r_a, off_v, r_v, m_cv, r_1, s_tile, s_mask
