"""The GDN intra-chunk forward as one warp-specialized Gluon kernel (sm_90).

Gluon (``triton.experimental.gluon``) is Triton's lower-level language: the
kernel chooses its layouts, shared memory, barriers and warp partitions. This
one is the split path's math (``fused_intra.gdn_fwd_intra_A_kernel``, then
``recompute_w_u.recompute_w_u_fwd_kernel``) with both stages running at once
on every SM, so that the ``A`` build (latency-bound, one warp per chunk) hides
under the ``w``/``u`` traffic (bandwidth-bound). Written from the probe of
``benchmarks/gluon_ws_probe.py`` (benchmarks/NOTES.md), which keeps the
ablations. Timings below: H200, triton 3.6, torch do_bench at the headline
shape unless named.

One persistent CTA per SM (grid = min(tasks, SMs)), 12 warps; a *task* is
one (64-row chunk, value head, batch row), value head fastest:

- one *builder* partition of 4 warps builds ``A = (I + L)^-1`` for four tasks
  at a time, one task per warp (every tensor has a leading dimension of 4 laid
  out on the warps; batched ``mma_v2``): ten 16x16 blocks of ``k k^T`` from
  key tiles copied by cp.async a group ahead, the gates (loaded a group
  ahead), the diagonal blocks by recursive halving (``unit_lower.py``), the
  seed's block merge. It stores ``A`` to HBM, then into a ring of four
  shared-memory slots once the w/u partitions have freed them;
- two *w/u* partitions of 4 warps each take alternate tasks: TMA loads of
  the task's ``k`` and ``v`` tiles (two slots each), ``beta``/``g`` by
  cp.async one task ahead, ``A`` from its slot with ``beta`` (and ``beta
  exp(g)``) folded into its columns, four warpgroup MMAs, the results
  written over the tiles just read and stored by TMA.

``A`` is not read back from HBM, and ``k`` comes from L2 the second time.
Folding ``beta`` into ``A`` rounds as ``bf16(bf16(A) beta) v``, the split
path as ``bf16(A) bf16(beta v)``.

Scope (``gdn_jax/gluon_launch.py`` checks it): bfloat16 ``k``, ``v``;
float32 ``g``, ``beta``; ``K = V = 128``; fixed length. With TMA, ``T %
64 == 0``: the kernel would store a partial last chunk by masked stores
through the ``w``, ``u`` pointers (which the JAX launch fills with
placeholders, its ``w``, ``u`` going through the descriptors), and its TMA
loads of such a chunk read the next batch row's first rows, which meet only
zero columns of ``A``, so a NaN or Inf there would leak through ``0 * NaN``
(the ``TMA=False`` variant zero-fills those rows and takes any ``T``).

Parameter order as jax-triton passes them: inputs, the four TMA
descriptors (made by the launcher: kernel parameters, which jaxlib encodes
per launch from jax-triton's ``TensorDescriptor``, with the shared-memory
layout ``TILE``), scalars, outputs, constexprs. ``TMA=False`` is a variant without descriptors
(cp.async loads, stores staged in shared memory: any ``T``, but 0.41
against 0.38 ms at the headline).

Triton 3.6 (the GPU machine's, the only one it has run on) to 3.9 compile it
for sm_90a (docs/triton_versions.md): 3.7 renamed ``gl.thread_barrier`` to
``gl.barrier`` (``partition_barrier`` below), 3.9 removed the copies' old
names and ``_reinterpret`` (``cp_async_load``, ``tma_load``, ``tma_store``,
``PUBLIC_REINTERPRET``). ``TRITON_INTERPRET=1`` does not run Gluon kernels.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma)

BT = gl.constexpr(64)
LOG2E = gl.constexpr(1.4426950408889634)
BK = gl.constexpr(32)  # the builders' k k^T steps (columns per ldmatrix)
BX = gl.constexpr(64)  # the w/u output tiles' columns (two per matrix at K = V = 128)
# the k/v slots' and the TMA descriptors' shared-memory layout (the launcher makes
# the descriptors with it)
TILE = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))

# The asynchronous copies' new names (same arguments), from triton 3.8: cp.async
# ``async_copy_global_to_shared`` is ``async_load``, the TMA copies
# ``async_copy_global_to_shared`` and ``async_copy_shared_to_global`` are
# ``tma.async_load`` and ``tma.async_store``; 3.9 made the old names raise,
# 3.6 and 3.7 have only those.
cp_async_load = getattr(async_copy, "async_load", async_copy.async_copy_global_to_shared)
tma_load = getattr(tma, "async_load", tma.async_copy_global_to_shared)
tma_store = getattr(tma, "async_store", tma.async_copy_shared_to_global)
# triton 3.9 renamed shared_memory_descriptor._reinterpret to reinterpret
PUBLIC_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))

if hasattr(gl, "thread_barrier"):  # triton 3.6
    @gluon.jit
    def partition_barrier():
        """Barrier of the calling partition's warps."""
        gl.thread_barrier()
else:  # triton >= 3.7
    @gluon.jit
    def partition_barrier():
        """Barrier of the calling partition's warps."""
        gl.barrier()


@gluon.jit
def task_at(t, T, NTC, H: gl.constexpr):
    """``(i_h, i_tc0, bos)`` of task ``t`` (value head fastest, then the chunk,
    then the batch row): its value head, its chunk's first row in the
    sequence, and the sequence's first row in the flattened ``B T`` rows (int64)."""
    return t % H, ((t // H) % NTC) * BT, (t // (H * NTC)).to(gl.int64) * T


# ---------------------------------------------------------------- builders (4 warps, one task each)
#
# One partition of 4 warps; every tensor has a leading dimension of 4, laid
# out one index per warp, so each warp builds its own task's A as a one-warp
# program would. One code copy for the four: four one-warp partitions compiled
# to four copies of the builder, and Nsight Compute put 44% of the stall
# samples on instruction fetch (H200, triton 3.6).

@gluon.jit
def dot32(a, b):
    """Batched ``a @ b`` of ``[4, 16, 16]`` float32 blocks in the builders' mma
    layout (tf32), the inner index ``k = 8a + 2t + j`` read as ``8a + 4j + t``
    in both operands as ``unit_lower.block_dot`` does (the same sum in another
    order; half the operand shuffles: 216 SHFL against 432, sm_90a, triton 3.6)."""
    mma: gl.constexpr = a.type.layout
    acc = gl.zeros([4, 16, 16], gl.float32, mma)
    a = gl.reshape(gl.permute(gl.reshape(a, [4, 16, 2, 4, 2]), (0, 1, 2, 4, 3)), [4, 16, 16])
    b = gl.reshape(gl.permute(gl.reshape(b, [4, 2, 4, 2, 16]), (0, 1, 3, 2, 4)), [4, 16, 16])
    return mma_v2(gl.convert_layout(a, gl.DotOperandLayout(0, mma, 1)),
                  gl.convert_layout(b, gl.DotOperandLayout(1, mma, 1)), acc, input_precision="tf32")


@gluon.jit
def halving_step(Y, N, r, c, S: gl.constexpr):
    YC = gl.where(((r // (2 * S)) == (c // (2 * S))) & ((r // S) != (c // S)), dot32(Y, N), 0.0)
    return Y - dot32(YC, Y)


@gluon.jit
def inverse_by_halving(N, r, c):
    """``(I + N)^-1`` of strictly lower ``[16, 16]`` blocks (``unit_lower.py``)."""
    Y = (r == c).to(gl.float32) - gl.where((r // 2) == (c // 2), N, 0.0)
    Y = halving_step(Y, N, r, c, 2)
    Y = halving_step(Y, N, r, c, 4)
    return halving_step(Y, N, r, c, 8)


@gluon.jit
def gate(b, g_r, g_c, beta_r):
    """``beta_i b[i, j] exp(g_i - g_j)`` where ``g_i <= g_j``, else 0 (``g`` in base 2)."""
    d = g_r[:, :, None] - g_c[:, None, :]
    return b * gl.exp2(gl.where(d <= 0, d, float("-inf"))) * beta_r[:, :, None]


@gluon.jit
def load_vec(x, rows0, i_h, T, valid, blk: gl.constexpr, H: gl.constexpr, layout: gl.constexpr):
    """``[4, 16]`` float32 values ``x[row, head]`` of the four tasks' 16-row block
    (rows and their end ``T`` as absolute row indices, ``[4]`` each)."""
    o = gl.arange(0, 16, layout=gl.SliceLayout(0, layout))
    rows = rows0[:, None] + blk * 16 + o[None, :]
    m = (rows < T[:, None]) & valid[:, None]
    return gl.load(x + rows * H + i_h[:, None], mask=m, other=0.0)


@gluon.jit
def load_gates(g, beta, q, pid, nprog, n_local, T, NTC, H: gl.constexpr, layout: gl.constexpr):
    """Group ``q``'s ``g`` and ``beta`` (eight ``[4, 16]`` float32 blocks: ``g``
    rows 0-15 .. 48-63, then ``beta``'s; zeros past ``T`` or past the CTA's tasks)."""
    j = 4 * q + gl.arange(0, 4, layout=gl.SliceLayout(1, layout))
    valid = j < n_local
    i_h, i_tc0, bos = task_at(pid + j * nprog, T, NTC, H)
    rows0 = bos + i_tc0
    Tb = bos + T
    return (load_vec(g, rows0, i_h, Tb, valid, 0, H, layout), load_vec(g, rows0, i_h, Tb, valid, 1, H, layout),
            load_vec(g, rows0, i_h, Tb, valid, 2, H, layout), load_vec(g, rows0, i_h, Tb, valid, 3, H, layout),
            load_vec(beta, rows0, i_h, Tb, valid, 0, H, layout),
            load_vec(beta, rows0, i_h, Tb, valid, 1, H, layout),
            load_vec(beta, rows0, i_h, Tb, valid, 2, H, layout),
            load_vec(beta, rows0, i_h, Tb, valid, 3, H, layout))


@gluon.jit
def issue_k(k, kb, q, pid, nprog, n_local, T, NTC, H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr,
            ld: gl.constexpr):
    """cp.async of group ``q``'s four ``[64, K]`` key tiles into ``kb``
    (``[4, 64, K]``; rows past ``T`` and missing tasks as zeros)."""
    wl: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, ld))
    j = 4 * q + gl.arange(0, 4, layout=wl)
    i_h, i_tc0, bos = task_at(pid + j * nprog, T, NTC, H)
    row0 = bos + i_tc0
    n = gl.minimum(T - i_tc0, BT)
    o1 = gl.arange(0, BT, layout=gl.SliceLayout(0, gl.SliceLayout(2, ld)))
    o2 = gl.arange(0, K, layout=gl.SliceLayout(0, gl.SliceLayout(1, ld)))
    ptr = k + ((row0[:, None, None] + o1[None, :, None]) * Hg + (i_h // (H // Hg))[:, None, None]) * K \
        + o2[None, None, :]
    m = (o1[None, :, None] < n[:, None, None]) & (j < n_local)[:, None, None]
    cp_async_load(kb, ptr, mask=m)
    async_copy.commit_group()


@gluon.jit
def store_block(A, rows0, i_h, T, valid, rb: gl.constexpr, cb: gl.constexpr, blk, r, c,
                H: gl.constexpr):
    """Block ``(rb, cb)`` of the four tasks' ``A`` to HBM (rows < T), as bfloat16."""
    val = blk.to(gl.bfloat16)
    rows = rows0[:, None, None] + rb * 16 + r
    ptr = A + (rows * H + i_h[:, None, None]) * BT + cb * 16 + c
    gl.store(ptr, val, mask=(rows < T[:, None, None]) & valid[:, None, None] & (c >= 0))
    return val


@gluon.jit
def slot_block(slot, rb: gl.constexpr, cb: gl.constexpr, val):
    """Block ``(rb, cb)`` (bfloat16) of the four tasks' ``A`` into their ring slots."""
    slot.slice(rb * 16, 16, 1).slice(cb * 16, 16, 2).store(val)


@gluon.jit
def builder_partition(k, g, beta, A, kb, a_ring, ready, empty, T, n_tasks, NTC, H: gl.constexpr,
                      Hg: gl.constexpr, K: gl.constexpr, MODE: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1],
                                                  instr_shape=[1, 16, 8])
    opA: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    opB: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    ld: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 2, 16], [4, 1, 1], [2, 1, 0])
    rowL: gl.constexpr = gl.SliceLayout(2, mma)
    colL: gl.constexpr = gl.SliceLayout(1, mma)
    wl: gl.constexpr = gl.SliceLayout(1, rowL)
    r = gl.arange(0, 16, layout=gl.SliceLayout(0, rowL))[None, :, None]
    c = gl.arange(0, 16, layout=gl.SliceLayout(0, colL))[None, None, :]
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    n_local = gl.cdiv(n_tasks - pid, nprog)
    n_groups = gl.cdiv(n_local, 4)
    # the four [64, 64] A slots as one [4, 64, 64] view, one slot per warp
    if PUBLIC_REINTERPRET:
        slots = a_ring.reinterpret(gl.bfloat16, [4, BT, BT], gl.SwizzledSharedLayout(8, 1, 8, [2, 1, 0]))
    else:
        slots = a_ring._reinterpret(gl.bfloat16, [4, BT, BT], gl.SwizzledSharedLayout(8, 1, 8, [2, 1, 0]))
    if MODE != 2:
        issue_k(k, kb, 0, pid, nprog, n_local, T, NTC, H, Hg, K, ld)
        gb_next = load_gates(g, beta, 0, pid, nprog, n_local, T, NTC, H, rowL)
        # the slots' upper blocks stay zero: written once (the ready barrier's
        # first arrival publishes them with the first group)
        for rb in gl.static_range(3):
            for cb in gl.static_range(rb + 1, 4):
                slot_block(slots, rb, cb, gl.zeros([4, 16, 16], gl.bfloat16, mma))
    for q in range(0, n_groups):
        if MODE == 2:  # ablation: the w/u partitions alone (A slots as they are)
            mbarrier.wait(empty.index(0), (q & 1) ^ 1)
            mbarrier.arrive(ready.index(0))
        else:
            j = 4 * q + gl.arange(0, 4, layout=wl)
            valid = j < n_local
            i_h, i_tc0, bos = task_at(pid + j * nprog, T, NTC, H)
            rows0 = bos + i_tc0
            Tb = bos + T  # the batch row's end, as a row index
            # this group's gates, loaded a group ahead (loaded here, their latency
            # under the w/u traffic stalled the builders: 0.253 against 0.274 ms
            # for the builders alone); [4, 16] per 16-row block
            gb = gb_next
            gb_next = load_gates(g, beta, q + 1, pid, nprog, n_local, T, NTC, H, rowL)
            g_r0 = gb[0] * LOG2E  # g in base 2
            g_r1 = gb[1] * LOG2E
            g_r2 = gb[2] * LOG2E
            g_r3 = gb[3] * LOG2E
            g_c0 = gl.convert_layout(g_r0, colL)
            g_c1 = gl.convert_layout(g_r1, colL)
            g_c2 = gl.convert_layout(g_r2, colL)
            g_c3 = gl.convert_layout(g_r3, colL)
            b_r0 = gb[4]
            b_r1 = gb[5]
            b_r2 = gb[6]
            b_r3 = gb[7]
            # k k^T in ten 16x16 blocks per task, operands from the copied tiles
            A00 = gl.zeros([4, 16, 16], gl.float32, mma)
            A10 = gl.zeros([4, 16, 16], gl.float32, mma)
            A11 = gl.zeros([4, 16, 16], gl.float32, mma)
            A20 = gl.zeros([4, 16, 16], gl.float32, mma)
            A21 = gl.zeros([4, 16, 16], gl.float32, mma)
            A22 = gl.zeros([4, 16, 16], gl.float32, mma)
            A30 = gl.zeros([4, 16, 16], gl.float32, mma)
            A31 = gl.zeros([4, 16, 16], gl.float32, mma)
            A32 = gl.zeros([4, 16, 16], gl.float32, mma)
            A33 = gl.zeros([4, 16, 16], gl.float32, mma)
            async_copy.wait_group(0)
            partition_barrier()
            for i_k in gl.static_range(K // BK):
                s0 = kb.slice(0, 16, 1).slice(i_k * BK, BK, 2)
                s1 = kb.slice(16, 16, 1).slice(i_k * BK, BK, 2)
                s2 = kb.slice(32, 16, 1).slice(i_k * BK, BK, 2)
                s3 = kb.slice(48, 16, 1).slice(i_k * BK, BK, 2)
                a0 = s0.load(opA)
                a1 = s1.load(opA)
                a2 = s2.load(opA)
                a3 = s3.load(opA)
                t0 = s0.permute([0, 2, 1]).load(opB)
                t1 = s1.permute([0, 2, 1]).load(opB)
                t2 = s2.permute([0, 2, 1]).load(opB)
                A00 = mma_v2(a0, t0, A00)
                A10 = mma_v2(a1, t0, A10)
                A11 = mma_v2(a1, t1, A11)
                A20 = mma_v2(a2, t0, A20)
                A21 = mma_v2(a2, t1, A21)
                A22 = mma_v2(a2, t2, A22)
                A30 = mma_v2(a3, t0, A30)
                A31 = mma_v2(a3, t1, A31)
                A32 = mma_v2(a3, t2, A32)
                A33 = mma_v2(a3, s3.permute([0, 2, 1]).load(opB), A33)
            partition_barrier()
            if q + 1 < n_groups:  # the next group's key tiles while this group's A is built
                issue_k(k, kb, q + 1, pid, nprog, n_local, T, NTC, H, Hg, K, ld)

            # Every block is computed and stored to HBM before the ring slots are
            # awaited, so only the shared-memory stores wait for the w/u partitions
            # (waiting first made the two take turns: 0.416 ms against 0.396).
            m_d = r > c
            Ai00 = inverse_by_halving(gl.where(m_d, gate(A00, g_r0, g_c0, b_r0), 0.0), r, c)
            h00 = store_block(A, rows0, i_h, Tb, valid, 0, 0, Ai00, r, c, H)
            Ai11 = inverse_by_halving(gl.where(m_d, gate(A11, g_r1, g_c1, b_r1), 0.0), r, c)
            h11 = store_block(A, rows0, i_h, Tb, valid, 1, 1, Ai11, r, c, H)
            Ai10 = -dot32(dot32(Ai11, gate(A10, g_r1, g_c0, b_r1)), Ai00)
            h10 = store_block(A, rows0, i_h, Tb, valid, 1, 0, Ai10, r, c, H)
            Ai22 = inverse_by_halving(gl.where(m_d, gate(A22, g_r2, g_c2, b_r2), 0.0), r, c)
            h22 = store_block(A, rows0, i_h, Tb, valid, 2, 2, Ai22, r, c, H)
            L21 = gate(A21, g_r2, g_c1, b_r2)
            Ai21 = -dot32(dot32(Ai22, L21), Ai11)
            h21 = store_block(A, rows0, i_h, Tb, valid, 2, 1, Ai21, r, c, H)
            Ai20 = -dot32(Ai22, dot32(gate(A20, g_r2, g_c0, b_r2), Ai00) + dot32(L21, Ai10))
            h20 = store_block(A, rows0, i_h, Tb, valid, 2, 0, Ai20, r, c, H)
            Ai33 = inverse_by_halving(gl.where(m_d, gate(A33, g_r3, g_c3, b_r3), 0.0), r, c)
            h33 = store_block(A, rows0, i_h, Tb, valid, 3, 3, Ai33, r, c, H)
            L32 = gate(A32, g_r3, g_c2, b_r3)
            Ai32 = -dot32(dot32(Ai33, L32), Ai22)
            h32 = store_block(A, rows0, i_h, Tb, valid, 3, 2, Ai32, r, c, H)
            L31 = gate(A31, g_r3, g_c1, b_r3)
            Ai31 = -dot32(Ai33, dot32(L31, Ai11) + dot32(L32, Ai21))
            h31 = store_block(A, rows0, i_h, Tb, valid, 3, 1, Ai31, r, c, H)
            Ai30 = -dot32(Ai33, dot32(gate(A30, g_r3, g_c0, b_r3), Ai00) + dot32(L31, Ai10) + dot32(L32, Ai20))
            h30 = store_block(A, rows0, i_h, Tb, valid, 3, 0, Ai30, r, c, H)
            zero = store_block(A, rows0, i_h, Tb, valid, 0, 1, gl.zeros([4, 16, 16], gl.float32, mma),
                               r, c, H)
            store_block(A, rows0, i_h, Tb, valid, 0, 2, zero, r, c, H)
            store_block(A, rows0, i_h, Tb, valid, 0, 3, zero, r, c, H)
            store_block(A, rows0, i_h, Tb, valid, 1, 2, zero, r, c, H)
            store_block(A, rows0, i_h, Tb, valid, 1, 3, zero, r, c, H)
            store_block(A, rows0, i_h, Tb, valid, 2, 3, zero, r, c, H)

            mbarrier.wait(empty.index(0), (q & 1) ^ 1)
            slot_block(slots, 0, 0, h00)
            slot_block(slots, 1, 0, h10)
            slot_block(slots, 1, 1, h11)
            slot_block(slots, 2, 0, h20)
            slot_block(slots, 2, 1, h21)
            slot_block(slots, 2, 2, h22)
            slot_block(slots, 3, 0, h30)
            slot_block(slots, 3, 1, h31)
            slot_block(slots, 3, 2, h32)
            slot_block(slots, 3, 3, h33)
            partition_barrier()
            mbarrier.arrive(ready.index(0))


# ---------------------------------------------------------------- w/u (2 x 4 warps)

@gluon.jit
def store_tile(y, val, T, bos, head, n_heads: gl.constexpr, D: gl.constexpr, i_tc0, col0):
    """Masked store of a ``[64, BX]`` result tile (rows < ``T``) from its own
    layout (a conversion would take ~8 KB of shared memory per partition)."""
    lay: gl.constexpr = val.type.layout
    rows = i_tc0 + gl.arange(0, BT, layout=gl.SliceLayout(1, lay))
    cols = col0 + gl.arange(0, BX, layout=gl.SliceLayout(0, lay))
    ptr = y + ((bos + rows[:, None]) * n_heads + head) * D + cols[None, :]
    gl.store(ptr, val, mask=rows[:, None] < T)


@gluon.jit
def store_staged(y, tile, T, bos, head, n_heads: gl.constexpr, D: gl.constexpr, i_tc0, col0):
    """Masked store of a ``[64, BX]`` result tile held in shared memory, read
    back as 16-byte vectors (eight threads per 128-byte row piece)."""
    lay: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = i_tc0 + gl.arange(0, BT, layout=gl.SliceLayout(1, lay))
    cols = col0 + gl.arange(0, BX, layout=gl.SliceLayout(0, lay))
    ptr = y + ((bos + rows[:, None]) * n_heads + head) * D + cols[None, :]
    gl.store(ptr, tile.load(lay), mask=rows[:, None] < T)


@gluon.jit
def issue_kv(k_desc, v_desc, bar, k_buf, v_buf, t, T, NTC, H: gl.constexpr, Hg: gl.constexpr,
             K: gl.constexpr, V: gl.constexpr):
    """TMA loads of task ``t``'s ``[64, K]`` key tile and ``[64, V]`` value tile
    (rows of the flattened ``[B T, heads dim]`` tensors; a last chunk past ``T``
    reads the next batch row's first rows, which only meet zero columns of
    ``A`` and masked output rows)."""
    i_h, i_tc0, bos = task_at(t, T, NTC, H)
    row = (bos + i_tc0).to(gl.int32)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [row, (i_h // (H // Hg)) * K], bar, k_buf)
    tma_load(v_desc, [row, i_h * V], bar, v_buf)


@gluon.jit
def copy_kv(k, v, k_buf, v_buf, t, T, NTC, H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr,
            V: gl.constexpr):
    """cp.async of task ``t``'s ``[64, K]`` key tile and ``[64, V]`` value tile
    into the swizzled slots (16 bytes per copy; rows past ``T`` as zeros), the
    copy path without TMA descriptors (``TMA=False``)."""
    lay: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    i_h, i_tc0, bos = task_at(t, T, NTC, H)
    r = gl.arange(0, BT, layout=gl.SliceLayout(1, lay))
    c = gl.arange(0, K, layout=gl.SliceLayout(0, lay))
    rows = (bos + i_tc0 + r)[:, None]
    m = (i_tc0 + r < T)[:, None] & (c < K)[None, :]
    cp_async_load(k_buf, k + (rows * Hg + i_h // (H // Hg)) * K + c[None, :], mask=m)
    cp_async_load(v_buf, v + (rows * H + i_h) * V + c[None, :], mask=m)
    async_copy.commit_group()


@gluon.jit
def copy_gates(g, beta, b_buf, g_buf, t, T, NTC, H: gl.constexpr, valid):
    """cp.async of task ``t``'s 64 ``beta`` and ``g`` values into ``b_buf``,
    ``g_buf`` (``[64]`` float32 each; zeros past ``T`` or where not
    ``valid``). Loaded one task ahead: as register loads their latency showed
    up as long-scoreboard stalls, and a fence (MEMBAR.ALL.CTA) waits for them."""
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    i_h, i_tc0, bos = task_at(t, T, NTC, H)
    o = gl.arange(0, BT, layout=lay)
    off = (bos + i_tc0 + o) * H + i_h
    m = (i_tc0 + o < T) & valid
    cp_async_load(b_buf, beta + off, mask=m)
    cp_async_load(g_buf, g + off, mask=m)
    async_copy.commit_group()


@gluon.jit
def wu_partition(k_desc, v_desc, w_desc, u_desc, k, v, g, beta, w, u, a_ring, ready, empty, k_ring, v_ring,
                 kv_ready, betas, gs_, T, n_tasks, NTC, H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr,
                 V: gl.constexpr, MODE: gl.constexpr, CID: gl.constexpr, TMA: gl.constexpr):
    """w/u partition ``CID`` of 2: the CTA's tasks ``j = CID, CID + 2, ...``,
    with its own two k/v slots and gates buffers.

    ``TMA``: the k/v tiles by TMA loads (``k_desc``, ``v_desc``), the results
    of whole chunks written over the slot just read and stored by TMA
    (``w_desc``, ``u_desc``). Else (no descriptors) the tiles by cp.async
    (``copy_kv``), awaited and fenced for the warpgroup MMAs at the start of
    the iteration, before the next task's copies are issued, and the results
    of whole chunks written over the slot and stored from it as 16-byte
    vectors (0.415 to 0.423 ms against TMA's 0.381 at the
    headline; awaiting the copies after loading ``A`` or after the MMAs,
    and storing from the accumulators, were slower: NOTES). A partial last
    chunk: masked stores from the accumulators."""
    # Hopper warpgroup MMA: B straight from the swizzled tiles, one instruction per 64x64x16
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    opA: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    colL: gl.constexpr = gl.SliceLayout(0, opA)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    n_local = gl.cdiv(n_tasks - pid, nprog)
    copy_gates(g, beta, betas.index(2 * CID), gs_.index(2 * CID), pid + CID * nprog, T, NTC, H, CID < n_local)
    if MODE != 1:
        if CID < n_local:
            if TMA:
                issue_kv(k_desc, v_desc, kv_ready.index(2 * CID), k_ring.index(2 * CID), v_ring.index(2 * CID),
                         pid + CID * nprog, T, NTC, H, Hg, K, V)
            else:
                copy_kv(k, v, k_ring.index(2 * CID), v_ring.index(2 * CID), pid + CID * nprog, T, NTC, H, Hg, K, V)
    for j in range(CID, n_local, 2):
        i = (j - CID) // 2  # this partition's iteration count
        t = pid + j * nprog
        s = j % 4  # A slot; the builders fill the four together
        last_of_group = j % 4 == CID + 2  # the partition's second task of the group frees the slots
        if MODE == 1:  # ablation: the builders alone
            mbarrier.wait(ready.index(0), (j // 4) & 1)
            mbarrier.arrive(empty.index(0), pred=last_of_group)
        else:
            if not TMA:  # this task's copies: landed and fenced before the next ones fly
                async_copy.wait_group(0)
                fence_async_shared()
            if j + 2 < n_local:
                # refill the slot of iteration i - 1 (and its gates buffer)
                sn = 2 * CID + (i + 1) % 2
                if TMA:
                    # once its TMA stores have read it (its generic accesses were fenced
                    # before those stores, or after the masked stores of a partial
                    # chunk): no fence here, as a fence (MEMBAR.ALL.CTA) also waits
                    # for the gates' loads in flight
                    tma.store_wait(0)
                    issue_kv(k_desc, v_desc, kv_ready.index(sn), k_ring.index(sn), v_ring.index(sn),
                             pid + (j + 2) * nprog, T, NTC, H, Hg, K, V)
                else:  # every warp is past iteration i - 1's reads of the slot and gates buffer
                    partition_barrier()
                    copy_kv(k, v, k_ring.index(sn), v_ring.index(sn), pid + (j + 2) * nprog, T, NTC, H, Hg, K, V)
                    copy_gates(g, beta, betas.index(sn), gs_.index(sn), t + 2 * nprog, T, NTC, H, True)
            i_h, i_tc0, bos = task_at(t, T, NTC, H)
            s2 = 2 * CID + i % 2
            mbarrier.wait(ready.index(0), (j // 4) & 1)
            a_op = a_ring.index(s).load(opA).to(gl.float32)
            if TMA:
                async_copy.wait_group(0)  # this task's gates
            partition_barrier()
            mbarrier.arrive(empty.index(0), pred=last_of_group)
            b_beta = betas.index(2 * CID + i % 2).load(colL)
            b_g = gs_.index(2 * CID + i % 2).load(colL)
            # beta (and beta exp(g)) folded into A's columns: the v and k tiles
            # go from shared memory to the MMA as loaded
            a_u = (a_op * b_beta[None, :]).to(gl.bfloat16)
            a_w = (a_op * (b_beta * gl.exp(b_g))[None, :]).to(gl.bfloat16)
            if TMA:
                mbarrier.wait(kv_ready.index(s2), (i // 2) & 1)
            v0s = v_ring.index(s2).slice(0, BX, 1)
            v1s = v_ring.index(s2).slice(BX, BX, 1)
            k0s = k_ring.index(s2).slice(0, BX, 1)
            k1s = k_ring.index(s2).slice(BX, BX, 1)
            zero = gl.zeros([BT, BX], gl.float32, mma)
            u0 = warpgroup_mma(a_u, v0s, zero, use_acc=False).to(gl.bfloat16)
            u1 = warpgroup_mma(a_u, v1s, zero, use_acc=False).to(gl.bfloat16)
            w0 = warpgroup_mma(a_w, k0s, zero, use_acc=False).to(gl.bfloat16)
            w1 = warpgroup_mma(a_w, k1s, zero, use_acc=False).to(gl.bfloat16)
            if i_tc0 + BT <= T:  # whole chunk: the results into the slot just read
                partition_barrier()
                v0s.store(u0)
                v1s.store(u1)
                k0s.store(w0)
                k1s.store(w1)
                if TMA:
                    fence_async_shared()
                    partition_barrier()
                    row = (bos + i_tc0).to(gl.int32)
                    tma_store(u_desc, [row, i_h * V], v0s)
                    tma_store(u_desc, [row, i_h * V + BX], v1s)
                    tma_store(w_desc, [row, i_h * K], k0s)
                    tma_store(w_desc, [row, i_h * K + BX], k1s)
                else:
                    partition_barrier()
                    store_staged(u, v0s, T, bos, i_h, H, V, i_tc0, 0)
                    store_staged(u, v1s, T, bos, i_h, H, V, i_tc0, BX)
                    store_staged(w, k0s, T, bos, i_h, H, K, i_tc0, 0)
                    store_staged(w, k1s, T, bos, i_h, H, K, i_tc0, BX)
            else:  # the sequence's last, partial chunk: masked stores from the accumulators
                store_tile(u, u0, T, bos, i_h, H, V, i_tc0, 0)
                store_tile(u, u1, T, bos, i_h, H, V, i_tc0, BX)
                store_tile(w, w0, T, bos, i_h, H, K, i_tc0, 0)
                store_tile(w, w1, T, bos, i_h, H, K, i_tc0, BX)
                if TMA:
                    partition_barrier()  # every warp is done with the k/v slot before it is refilled
                    fence_async_shared()
            if TMA:  # the next task's gates (its buffer was read in iteration i - 1)
                copy_gates(g, beta, betas.index(2 * CID + (i + 1) % 2), gs_.index(2 * CID + (i + 1) % 2),
                           t + 2 * nprog, T, NTC, H, j + 2 < n_local)
    if TMA:
        tma.store_wait(0)

# ---------------------------------------------------------------- kernel

@gluon.jit
def gdn_fwd_intra_gluon_kernel(k, v, g, beta, k_desc, v_desc, w_desc, u_desc, T, n_tasks, NTC, w, u, A,
                               H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                               BUILDER_REGS: gl.constexpr, WU_REGS: gl.constexpr, MODE: gl.constexpr,
                               TMA: gl.constexpr):
    """``w [B, T, H, K]``, ``u [B, T, H, V]``, ``A [B, T, H, 64]`` (bfloat16) of
    ``k [B, T, Hg, K]``, ``v [B, T, H, V]`` (bfloat16), ``g``, ``beta [B, T, H]``
    (float32); ``n_tasks = B NTC H``, ``NTC = cdiv(T, 64)``.
    ``BUILDER_REGS``, ``WU_REGS``: registers per thread of the builder and of
    the second w/u partition (the first gets what is left of the launch's
    ``maxnreg`` times three). ``MODE``: 0; 1 and 2 are ablations (the builders
    alone, the w/u partitions alone; outputs not valid). ``TMA``: the w/u
    partitions copy by TMA, through ``k_desc`` .. ``u_desc``, the TMA
    descriptors of the flattened ``[B T, heads dim]`` tensors (blocks ``[64,
    128]`` for ``k``, ``v``; ``[64, 64]`` for ``w``, ``u``) made by the
    launcher (kernel parameters); ``w`` and ``u`` are then written through
    their pointers only in a partial last chunk, which such launches
    exclude. Without ``TMA`` the ``*_desc`` arguments are unused pointers.
    (Descriptors made here, on the device, lived in
    global scratch, which jaxlib allocates on every launch and XLA's CUDA
    graphs refuse.)"""
    gl.static_assert((K == 128) & (V == 128))
    if TMA:
        # T % 64 == 0 with TMA: said to the compiler as Triton's launcher says it
        # (a scalar divisible by 16 is specialized so), which jax-triton does not:
        # 5824 SASS instructions from either launcher, against 6120 from JAX
        # before; 0.377 against 0.380 ms under torch
        T = (T // 16) * 16
    # shared memory: 32 KB of A slots, 64 KB of key tiles, 4 x 32 KB of k/v slots,
    # gates and barriers: 226 of the H200's 227 KB
    a_ring = gl.allocate_shared_memory(gl.bfloat16, [4, BT, BT], gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
    kb = gl.allocate_shared_memory(gl.bfloat16, [4, BT, K], gl.SwizzledSharedLayout(8, 1, 8, [2, 1, 0]))
    k_ring = gl.allocate_shared_memory(gl.bfloat16, [4, BT, K], TILE)
    v_ring = gl.allocate_shared_memory(gl.bfloat16, [4, BT, V], TILE)
    ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    betas = gl.allocate_shared_memory(gl.float32, [4, BT], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    gs_ = gl.allocate_shared_memory(gl.float32, [4, BT], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    mbarrier.init(ready.index(0), count=1)
    mbarrier.init(empty.index(0), count=2)
    for i in gl.static_range(4):
        mbarrier.init(kv_ready.index(i), count=1)
    # (the argument tuples are written out in place: a tuple held in a variable
    # or built with + loses its constexprs)
    gl.warp_specialize([
        (wu_partition, (k_desc, v_desc, w_desc, u_desc, k, v, g, beta, w, u, a_ring, ready, empty, k_ring,
                        v_ring, kv_ready, betas, gs_, T, n_tasks, NTC, H, Hg, K, V, MODE, 0, TMA)),
        (builder_partition, (k, g, beta, A, kb, a_ring, ready, empty, T, n_tasks, NTC, H, Hg, K, MODE)),
        (wu_partition, (k_desc, v_desc, w_desc, u_desc, k, v, g, beta, w, u, a_ring, ready, empty, k_ring,
                        v_ring, kv_ready, betas, gs_, T, n_tasks, NTC, H, Hg, K, V, MODE, 1, TMA)),
    ], [4, 4], [BUILDER_REGS, WU_REGS])
