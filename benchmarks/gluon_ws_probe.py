"""Probe (GPU machine, torch launch): the one-kernel path as a warp-specialized
Gluon kernel (``triton.experimental.gluon``), fixed-length bf16 inputs, K = V = 128.

    python3 benchmarks/gluon_ws_probe.py [--out DIR] [--configs a,b] [--profile CONFIG] [--jax]
    python3 benchmarks/gluon_ws_probe.py --offline CONFIG   # no GPU: resources and SASS counts

Why: the split path is 1.58x the floor at the headline shape. Its `A` kernel
is latency-bound at one warp per program (~0.12 ms) and its w/u kernel
bandwidth-bound (~0.28 ms); a plain Triton launch has one warp count, so the
two run one after the other (NOTES, sessions 8, 10, 14). Here one persistent
CTA per SM (12 warps) runs both at once with ``gl.warp_specialize``:

- one *builder* partition of 4 warps builds ``A = (I + L)^-1`` for four tasks
  at a time, one task per warp (every tensor has a leading dimension of 4 laid
  out on the warps; batched ``mma_v2``): the split `A` kernel's math (ten
  16x16 blocks of ``k k^T`` from key tiles copied by cp.async, gates, the
  diagonal blocks by recursive halving, the seed's block merge; plain tf32
  dots, without ``block_dot``'s index permutation). It stores ``A`` to HBM,
  then, once the consumers have freed them, to four ring slots in shared memory;
- two *w/u* partitions of 4 warps each take alternate tasks: TMA loads of the
  task's ``k`` and ``v`` tiles two tasks ahead, ``beta``/``g`` by cp.async one
  task ahead, ``A`` from its slot with ``beta`` (``beta exp(g)``) folded into
  its columns, four warpgroup MMAs, the results written over the tiles just
  read and stored by TMA (masked register stores for a partial last chunk).

`A` is not read back from HBM and `k` comes from L2 the second time, so the
kernel moves the floor's bytes (1.07 GB at the headline) where the split path
moves 1.36 GB. Folding ``beta`` into ``A`` rounds differently from the split
path (``bf16(bf16(A) beta) v`` against ``bf16(A) bf16(beta v)``): the largest
difference to its outputs is 6e-3 of the largest value; against float64
(NumPy, bf16 rounding emulated, 200 chunks) the relative Frobenius errors are
2.3e-3 (u) and 2.4e-3 (w) against the split path's 2.3e-3 and 2.2e-3.

H200, headline shape, torch ``do_bench`` (session 15; NOTES has every step):
the best config ``g1_nc2_kv2_wgmma`` 0.396 ms against the split path's
0.399 in the same call, 1.55x the floor (the kernel of commit f5ba1ea, with
TMA descriptors made on the host); its builders alone 0.235, its w/u
partitions alone 0.271. Not shipped: 1.5x needs ~0.383, and a Gluon kernel
needs jax-triton 0.4 and cannot run under ``TRITON_INTERPRET=1``. Written for
triton 3.6's Gluon (the GPU machine's); triton 3.8's does not compile it
(``gl.thread_barrier`` is gone there).

Prints ms per config beside the shipped split path (fixed configs), and the
largest difference of ``w``, ``u``, ``A`` to the split path's outputs
(B=2 T=1000 H=4 Hg=2, and the headline). ``--jax`` also launches the first
config from JAX (``ws_forward_jax``, jax-triton 0.4.1) and compares outputs
and time per call with the torch launch. The kernel makes its TMA
descriptors on the device for that (both launchers pass plain buffers).
This was written after session 15's device time: the device-side descriptors
compile offline, but neither they nor ``--jax`` have run on the GPU yet. ``--profile CONFIG`` runs one config
three times for Nsight Compute (``scripts/device_run.sh 03 profile-ws``).
"""
from __future__ import annotations

import argparse
import json
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

BT = gl.constexpr(64)
LOG2E = gl.constexpr(1.4426950408889634)


# ---------------------------------------------------------------- builders (4 warps, one task each)
#
# One partition of 4 warps; every tensor has a leading dimension of 4, laid
# out one index per warp, so each warp builds its own task's A as a one-warp
# program would (batched mma_v2 keeps the batch index on the warp). One code
# copy for the four: four one-warp partitions compiled to four copies of the
# builder (~14 K SASS instructions), and Nsight Compute put 44% of the stall
# samples on instruction fetch ("no instruction").

@gluon.jit
def task_at(t, T, NTC, H: gl.constexpr):
    """``(i_h, i_tc0, bos)`` of task ``t`` (value head fastest, then the chunk,
    then the batch row): its value head, its chunk's first row in the
    sequence, and the sequence's first row in the flattened ``B T`` rows (int64)."""
    return t % H, ((t // H) % NTC) * BT, (t // (H * NTC)).to(gl.int64) * T


@gluon.jit
def dot32(a, b, PERM: gl.constexpr):
    """Batched ``a @ b`` of ``[4, 16, 16]`` float32 blocks in the builders' mma
    layout (tf32). ``PERM``: the inner index ``k = 8a + 2t + j`` read as ``8a +
    4j + t`` in both operands, as ``kernels/unit_lower.block_dot`` does (the
    same sum in another order; fewer operand shuffles). Offline, sm_90a,
    builders-only kernel: 3928 SASS instructions against 4504, 216 SHFL
    against 432; not yet run on the GPU."""
    mma: gl.constexpr = a.type.layout
    acc = gl.zeros([4, 16, 16], gl.float32, mma)
    if PERM:
        a = gl.reshape(gl.permute(gl.reshape(a, [4, 16, 2, 4, 2]), (0, 1, 2, 4, 3)), [4, 16, 16])
        b = gl.reshape(gl.permute(gl.reshape(b, [4, 2, 4, 2, 16]), (0, 1, 3, 2, 4)), [4, 16, 16])
    return mma_v2(gl.convert_layout(a, gl.DotOperandLayout(0, mma, 1)),
                  gl.convert_layout(b, gl.DotOperandLayout(1, mma, 1)), acc, input_precision="tf32")


@gluon.jit
def halving_step(Y, N, r, c, S: gl.constexpr, PERM: gl.constexpr):
    YC = gl.where(((r // (2 * S)) == (c // (2 * S))) & ((r // S) != (c // S)), dot32(Y, N, PERM), 0.0)
    return Y - dot32(YC, Y, PERM)


@gluon.jit
def inverse_by_halving(N, r, c, PERM: gl.constexpr):
    """``(I + N)^-1`` of strictly lower ``[16, 16]`` blocks (kernels/unit_lower.py)."""
    Y = (r == c).to(gl.float32) - gl.where((r // 2) == (c // 2), N, 0.0)
    Y = halving_step(Y, N, r, c, 2, PERM)
    Y = halving_step(Y, N, r, c, 4, PERM)
    return halving_step(Y, N, r, c, 8, PERM)


@gluon.jit
def gate(b, g_r, g_c, beta_r):
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
def issue_k(k, kb, q, col0, pid, nprog, n_local, T, NTC, H: gl.constexpr, Hg: gl.constexpr,
            K: gl.constexpr, KH: gl.constexpr, ld: gl.constexpr):
    """cp.async of columns ``col0 .. col0 + KH`` of the ``[64, K]`` key tiles
    of group ``q``'s four tasks into ``kb`` (``[4, 64, KH]``; rows past ``T``
    and missing tasks as zeros)."""
    wl: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, ld))
    j = 4 * q + gl.arange(0, 4, layout=wl)
    i_h, i_tc0, bos = task_at(pid + j * nprog, T, NTC, H)
    row0 = bos + i_tc0
    n = gl.minimum(T - i_tc0, BT)
    o1 = gl.arange(0, BT, layout=gl.SliceLayout(0, gl.SliceLayout(2, ld)))
    o2 = col0 + gl.arange(0, KH, layout=gl.SliceLayout(0, gl.SliceLayout(1, ld)))
    ptr = k + ((row0[:, None, None] + o1[None, :, None]) * Hg + (i_h // (H // Hg))[:, None, None]) * K \
        + o2[None, None, :]
    m = (o1[None, :, None] < n[:, None, None]) & (j < n_local)[:, None, None]
    async_copy.async_copy_global_to_shared(kb, ptr, mask=m)
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
def builder_partition(k, g, beta, A, kb, a_ring, ready, empty, T, n_tasks, NTC,
                      G: gl.constexpr, H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr,
                      BK: gl.constexpr, MODE: gl.constexpr, KH: gl.constexpr, PERM: gl.constexpr,
                      GPRE: gl.constexpr, ZINIT: gl.constexpr):
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
    if MODE != 2:
        issue_k(k, kb, 0, 0, pid, nprog, n_local, T, NTC, H, Hg, K, KH, ld)
        if GPRE:
            gb_next = load_gates(g, beta, 0, pid, nprog, n_local, T, NTC, H, rowL)
        if ZINIT:  # the slots' upper blocks stay zero: written once here
            for s in gl.static_range(4 * G):
                zs = a_ring.index(s)
                for rb in gl.static_range(3):
                    for cb in gl.static_range(rb + 1, 4):
                        zs.slice(rb * 16, 16, 0).slice(cb * 16, 16, 1).store(
                            gl.zeros([16, 16], gl.bfloat16, gl.BlockedLayout([1, 2], [4, 8], [4, 1], [1, 0])))
    for q in range(0, n_groups):
        gs = q % G
        if MODE == 2:  # ablation: the w/u partition alone (A slots as they are)
            mbarrier.wait(empty.index(gs), ((q // G) & 1) ^ 1)
            mbarrier.arrive(ready.index(gs))
        else:
            j = 4 * q + gl.arange(0, 4, layout=wl)
            valid = j < n_local
            i_h, i_tc0, bos = task_at(pid + j * nprog, T, NTC, H)
            rows0 = bos + i_tc0
            Tb = bos + T  # the batch row's end, as a row index
            # gates, [4, 16] per 16-row block: this group's, loaded a group ahead
            # (GPRE) or now
            if GPRE:
                gb = gb_next
                gb_next = load_gates(g, beta, q + 1, pid, nprog, n_local, T, NTC, H, rowL)
            else:
                gb = load_gates(g, beta, q, pid, nprog, n_local, T, NTC, H, rowL)
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
            # K in pieces of KH columns (KH < K: a smaller buffer, the later pieces' loads
            # not hidden)
            for half in gl.static_range(K // KH):
                async_copy.wait_group(0)
                gl.thread_barrier()
                for i_k in gl.static_range(KH // BK):
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
                gl.thread_barrier()
                if half + 1 < K // KH:
                    issue_k(k, kb, q, (half + 1) * KH, pid, nprog, n_local, T, NTC, H, Hg, K, KH, ld)
                elif q + 1 < n_groups:  # the next group's key tiles while this group's A is built
                    issue_k(k, kb, q + 1, 0, pid, nprog, n_local, T, NTC, H, Hg, K, KH, ld)

            # Every block is computed and stored to HBM before the ring slots are
            # awaited, so only the shared-memory stores wait for the w/u partition
            # (waiting first made the two partitions take turns with one group of
            # slots: 0.416 ms where the builders alone take 0.235, w/u alone 0.271).
            m_d = r > c
            Ai00 = inverse_by_halving(gl.where(m_d, gate(A00, g_r0, g_c0, b_r0), 0.0), r, c, PERM)
            h00 = store_block(A, rows0, i_h, Tb, valid, 0, 0, Ai00, r, c, H)
            Ai11 = inverse_by_halving(gl.where(m_d, gate(A11, g_r1, g_c1, b_r1), 0.0), r, c, PERM)
            h11 = store_block(A, rows0, i_h, Tb, valid, 1, 1, Ai11, r, c, H)
            Ai10 = -dot32(dot32(Ai11, gate(A10, g_r1, g_c0, b_r1), PERM), Ai00, PERM)
            h10 = store_block(A, rows0, i_h, Tb, valid, 1, 0, Ai10, r, c, H)
            Ai22 = inverse_by_halving(gl.where(m_d, gate(A22, g_r2, g_c2, b_r2), 0.0), r, c, PERM)
            h22 = store_block(A, rows0, i_h, Tb, valid, 2, 2, Ai22, r, c, H)
            L21 = gate(A21, g_r2, g_c1, b_r2)
            Ai21 = -dot32(dot32(Ai22, L21, PERM), Ai11, PERM)
            h21 = store_block(A, rows0, i_h, Tb, valid, 2, 1, Ai21, r, c, H)
            Ai20 = -dot32(Ai22, dot32(gate(A20, g_r2, g_c0, b_r2), Ai00, PERM) + dot32(L21, Ai10, PERM),
                          PERM)
            h20 = store_block(A, rows0, i_h, Tb, valid, 2, 0, Ai20, r, c, H)
            Ai33 = inverse_by_halving(gl.where(m_d, gate(A33, g_r3, g_c3, b_r3), 0.0), r, c, PERM)
            h33 = store_block(A, rows0, i_h, Tb, valid, 3, 3, Ai33, r, c, H)
            L32 = gate(A32, g_r3, g_c2, b_r3)
            Ai32 = -dot32(dot32(Ai33, L32, PERM), Ai22, PERM)
            h32 = store_block(A, rows0, i_h, Tb, valid, 3, 2, Ai32, r, c, H)
            L31 = gate(A31, g_r3, g_c1, b_r3)
            Ai31 = -dot32(Ai33, dot32(L31, Ai11, PERM) + dot32(L32, Ai21, PERM), PERM)
            h31 = store_block(A, rows0, i_h, Tb, valid, 3, 1, Ai31, r, c, H)
            Ai30 = -dot32(Ai33, dot32(gate(A30, g_r3, g_c0, b_r3), Ai00, PERM) + dot32(L31, Ai10, PERM)
                          + dot32(L32, Ai20, PERM), PERM)
            h30 = store_block(A, rows0, i_h, Tb, valid, 3, 0, Ai30, r, c, H)
            zero = store_block(A, rows0, i_h, Tb, valid, 0, 1, gl.zeros([4, 16, 16], gl.float32, mma),
                               r, c, H)
            store_block(A, rows0, i_h, Tb, valid, 0, 2, zero, r, c, H)
            store_block(A, rows0, i_h, Tb, valid, 0, 3, zero, r, c, H)
            store_block(A, rows0, i_h, Tb, valid, 1, 2, zero, r, c, H)
            store_block(A, rows0, i_h, Tb, valid, 1, 3, zero, r, c, H)
            store_block(A, rows0, i_h, Tb, valid, 2, 3, zero, r, c, H)

            mbarrier.wait(empty.index(gs), ((q // G) & 1) ^ 1)
            # the group's four consecutive [64, 64] slots as one [4, 64, 64] view
            slot = a_ring.index(4 * gs)._reinterpret(
                gl.bfloat16, [4, BT, BT], gl.SwizzledSharedLayout(8, 1, 8, [2, 1, 0]))
            slot_block(slot, 0, 0, h00)
            if not ZINIT:
                slot_block(slot, 0, 1, zero)
            if not ZINIT:
                slot_block(slot, 0, 2, zero)
            if not ZINIT:
                slot_block(slot, 0, 3, zero)
            slot_block(slot, 1, 0, h10)
            slot_block(slot, 1, 1, h11)
            if not ZINIT:
                slot_block(slot, 1, 2, zero)
            if not ZINIT:
                slot_block(slot, 1, 3, zero)
            slot_block(slot, 2, 0, h20)
            slot_block(slot, 2, 1, h21)
            slot_block(slot, 2, 2, h22)
            if not ZINIT:
                slot_block(slot, 2, 3, zero)
            slot_block(slot, 3, 0, h30)
            slot_block(slot, 3, 1, h31)
            slot_block(slot, 3, 2, h32)
            slot_block(slot, 3, 3, h33)
            gl.thread_barrier()
            mbarrier.arrive(ready.index(gs))


# ---------------------------------------------------------------- w/u (default, 4 warps)

@gluon.jit
def store_tile(y, val, T, bos, head, n_heads: gl.constexpr, D: gl.constexpr, i_tc0, col0,
               BX: gl.constexpr):
    """Masked store of a ``[64, BX]`` result tile (rows < ``T``) from its own
    layout (a conversion would take ~8 KB of shared memory per consumer)."""
    lay: gl.constexpr = val.type.layout
    rows = i_tc0 + gl.arange(0, BT, layout=gl.SliceLayout(1, lay))
    cols = col0 + gl.arange(0, BX, layout=gl.SliceLayout(0, lay))
    ptr = y + ((bos + rows[:, None]) * n_heads + head) * D + cols[None, :]
    gl.store(ptr, val, mask=rows[:, None] < T)


@gluon.jit
def tma_store_tiles(u_desc, w_desc, v0s, v1s, k0s, k1s, row, i_h, K: gl.constexpr, V: gl.constexpr,
                    BX: gl.constexpr):
    """TMA stores of a whole chunk's results, written over the k/v tiles they were computed from."""
    fence_async_shared()
    gl.thread_barrier()
    row = row.to(gl.int32)
    tma.async_copy_shared_to_global(u_desc, [row, i_h * V], v0s)
    tma.async_copy_shared_to_global(u_desc, [row, i_h * V + BX], v1s)
    tma.async_copy_shared_to_global(w_desc, [row, i_h * K], k0s)
    tma.async_copy_shared_to_global(w_desc, [row, i_h * K + BX], k1s)


@gluon.jit
def masked_store_tiles(u, w, u0, u1, w0, w1, T, bos, i_h, H: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                       i_tc0, BX: gl.constexpr):
    """The sequence's last, partial chunk: masked stores from registers."""
    store_tile(u, u0, T, bos, i_h, H, V, i_tc0, 0, BX)
    store_tile(u, u1, T, bos, i_h, H, V, i_tc0, BX, BX)
    store_tile(w, w0, T, bos, i_h, H, K, i_tc0, 0, BX)
    store_tile(w, w1, T, bos, i_h, H, K, i_tc0, BX, BX)
    gl.thread_barrier()  # every warp is done with the k/v slot before it is refilled
    fence_async_shared()


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
    tma.async_copy_global_to_shared(k_desc, [row, (i_h // (H // Hg)) * K], bar, k_buf)
    tma.async_copy_global_to_shared(v_desc, [row, i_h * V], bar, v_buf)


@gluon.jit
def copy_gates(g, beta, b_buf, g_buf, t, T, NTC, H: gl.constexpr, valid):
    """cp.async of task ``t``'s 64 ``beta`` and ``g`` values into ``b_buf``,
    ``g_buf`` (``[64]`` float32 each; zeros past ``T`` or where not
    ``valid``). Loaded one task ahead: as register loads (32 scattered loads a
    thread, in the dot operand's slice layout) their latency showed up as
    long-scoreboard stalls, and a fence (MEMBAR.ALL.CTA) waits for them."""
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    i_h, i_tc0, bos = task_at(t, T, NTC, H)
    o = gl.arange(0, BT, layout=lay)
    off = (bos + i_tc0 + o) * H + i_h
    m = (i_tc0 + o < T) & valid
    async_copy.async_copy_global_to_shared(b_buf, beta + off, mask=m)
    async_copy.async_copy_global_to_shared(g_buf, g + off, mask=m)
    async_copy.commit_group()


@gluon.jit
def wu_partition(k_desc, v_desc, w_desc, u_desc, g, beta, w, u, a_ring, ready, empty, k_ring, v_ring,
                 kv_ready, betas, gs_, T, n_tasks, NTC, G: gl.constexpr, S2: gl.constexpr, H: gl.constexpr,
                 Hg: gl.constexpr, K: gl.constexpr, V: gl.constexpr, MODE: gl.constexpr,
                 CID: gl.constexpr, NC: gl.constexpr, WGMMA: gl.constexpr):
    """w/u consumer ``CID`` of ``NC``: the CTA's tasks ``j = CID, CID + NC, ...``,
    with its own ``S2`` k/v ring slots and gates buffers."""
    if WGMMA:  # Hopper warpgroup MMA: B straight from the swizzled tiles, one instruction per 64x64x16
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, 64, 16])
    else:
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, 8])
    opA: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    opB: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    BX: gl.constexpr = 64
    gl.static_assert((K == 128) & (V == 128))
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    n_local = gl.cdiv(n_tasks - pid, nprog)
    colL: gl.constexpr = gl.SliceLayout(0, opA)
    copy_gates(g, beta, betas.index(2 * CID), gs_.index(2 * CID), pid + CID * nprog, T, NTC, H,
               CID < n_local)
    if MODE != 1:
        for p in gl.static_range(S2 - 1):
            if CID + p * NC < n_local:
                issue_kv(k_desc, v_desc, kv_ready.index(CID * S2 + p), k_ring.index(CID * S2 + p),
                         v_ring.index(CID * S2 + p), pid + (CID + p * NC) * nprog, T, NTC, H, Hg, K, V)
    for j in range(CID, n_local, NC):
        i = (j - CID) // NC  # this consumer's iteration count
        t = pid + j * nprog
        s = j % (4 * G)  # A slot; the builders fill them in groups of four (barrier gs)
        gs = (j // 4) % G
        if MODE == 1:  # ablation: builders alone
            mbarrier.wait(ready.index(gs), ((j // 4) // G) & 1)
            mbarrier.arrive(empty.index(gs), pred=(j % 4 == CID + 4 - NC))
        else:
            jn = j + (S2 - 1) * NC
            if jn < n_local:
                # refill the slot of iteration j - 1 once its TMA stores have read
                # it (its generic accesses were fenced before those stores, or
                # after the masked stores of a partial chunk): no fence here, as
                # a fence (MEMBAR.ALL.CTA) also waits for the gates' loads in flight
                tma.store_wait(0)
                sn = CID * S2 + (i + S2 - 1) % S2
                issue_kv(k_desc, v_desc, kv_ready.index(sn), k_ring.index(sn), v_ring.index(sn),
                         pid + jn * nprog, T, NTC, H, Hg, K, V)
            i_h, i_tc0, bos = task_at(t, T, NTC, H)
            s2 = CID * S2 + i % S2
            mbarrier.wait(ready.index(gs), ((j // 4) // G) & 1)
            a_op = a_ring.index(s).load(opA).to(gl.float32)
            async_copy.wait_group(0)
            gl.thread_barrier()
            mbarrier.arrive(empty.index(gs), pred=(j % 4 == CID + 4 - NC))
            b_beta = betas.index(2 * CID + i % 2).load(colL)
            b_g = gs_.index(2 * CID + i % 2).load(colL)
            # beta (and beta exp(g)) folded into A's columns: the v and k tiles
            # go from shared memory to the dot as loaded
            a_u = (a_op * b_beta[None, :]).to(gl.bfloat16)
            a_w = (a_op * (b_beta * gl.exp(b_g))[None, :]).to(gl.bfloat16)
            mbarrier.wait(kv_ready.index(s2), (i // S2) & 1)
            v0s = v_ring.index(s2).slice(0, BX, 1)
            v1s = v_ring.index(s2).slice(BX, BX, 1)
            k0s = k_ring.index(s2).slice(0, BX, 1)
            k1s = k_ring.index(s2).slice(BX, BX, 1)
            zero = gl.zeros([BT, BX], gl.float32, mma)
            if WGMMA == 3:
                if i_tc0 + BT <= T:
                    # each product into the tile it read as soon as its (synchronous,
                    # warpgroup-wide) MMA is done: no barrier before the stores, one
                    # [64, 64] result live at a time
                    v0s.store(warpgroup_mma(a_u, v0s, zero, use_acc=False).to(gl.bfloat16))
                    v1s.store(warpgroup_mma(a_u, v1s, zero, use_acc=False).to(gl.bfloat16))
                    k0s.store(warpgroup_mma(a_w, k0s, zero, use_acc=False).to(gl.bfloat16))
                    k1s.store(warpgroup_mma(a_w, k1s, zero, use_acc=False).to(gl.bfloat16))
                    tma_store_tiles(u_desc, w_desc, v0s, v1s, k0s, k1s, bos + i_tc0, i_h, K, V, BX)
                else:
                    u0 = warpgroup_mma(a_u, v0s, zero, use_acc=False).to(gl.bfloat16)
                    u1 = warpgroup_mma(a_u, v1s, zero, use_acc=False).to(gl.bfloat16)
                    w0 = warpgroup_mma(a_w, k0s, zero, use_acc=False).to(gl.bfloat16)
                    w1 = warpgroup_mma(a_w, k1s, zero, use_acc=False).to(gl.bfloat16)
                    masked_store_tiles(u, w, u0, u1, w0, w1, T, bos, i_h, H, K, V, i_tc0, BX)
            else:
                if WGMMA == 2:  # the four products in flight together
                    c_u0 = warpgroup_mma(a_u, v0s, zero, use_acc=False, is_async=True)
                    c_u1 = warpgroup_mma(a_u, v1s, zero, use_acc=False, is_async=True)
                    c_w0 = warpgroup_mma(a_w, k0s, zero, use_acc=False, is_async=True)
                    c_w1 = warpgroup_mma(a_w, k1s, zero, use_acc=False, is_async=True)
                    u0, u1, w0, w1, a_u, a_w = warpgroup_mma_wait(0, deps=[c_u0, c_u1, c_w0, c_w1, a_u, a_w])
                    u0 = u0.to(gl.bfloat16)
                    u1 = u1.to(gl.bfloat16)
                    w0 = w0.to(gl.bfloat16)
                    w1 = w1.to(gl.bfloat16)
                elif WGMMA:
                    u0 = warpgroup_mma(a_u, v0s, zero, use_acc=False).to(gl.bfloat16)
                    u1 = warpgroup_mma(a_u, v1s, zero, use_acc=False).to(gl.bfloat16)
                    w0 = warpgroup_mma(a_w, k0s, zero, use_acc=False).to(gl.bfloat16)
                    w1 = warpgroup_mma(a_w, k1s, zero, use_acc=False).to(gl.bfloat16)
                else:
                    u0 = mma_v2(a_u, v0s.load(opB), zero).to(gl.bfloat16)
                    u1 = mma_v2(a_u, v1s.load(opB), zero).to(gl.bfloat16)
                    w0 = mma_v2(a_w, k0s.load(opB), zero).to(gl.bfloat16)
                    w1 = mma_v2(a_w, k1s.load(opB), zero).to(gl.bfloat16)
                if i_tc0 + BT <= T:
                    # whole chunk: the results into the slot just read, then TMA stores
                    gl.thread_barrier()
                    v0s.store(u0)
                    v1s.store(u1)
                    k0s.store(w0)
                    k1s.store(w1)
                    tma_store_tiles(u_desc, w_desc, v0s, v1s, k0s, k1s, bos + i_tc0, i_h, K, V, BX)
                else:  # the sequence's last, partial chunk: masked stores
                    masked_store_tiles(u, w, u0, u1, w0, w1, T, bos, i_h, H, K, V, i_tc0, BX)
            # the next task's gates (its slot was read in iteration j - 1)
            copy_gates(g, beta, betas.index(2 * CID + (i + 1) % 2), gs_.index(2 * CID + (i + 1) % 2),
                       t + NC * nprog, T, NTC, H, j + NC < n_local)
    tma.store_wait(0)


# ---------------------------------------------------------------- kernel

@gluon.jit
def gdn_fwd_intra_ws_kernel(k, v, g, beta, T, n_tasks, NTC, ROWS, w, u, A,
                            H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                            BK: gl.constexpr, G: gl.constexpr, S2: gl.constexpr,
                            BUILDER_REGS: gl.constexpr, MODE: gl.constexpr, NC: gl.constexpr,
                            CONSUMER_REGS: gl.constexpr, WGMMA: gl.constexpr, KH: gl.constexpr,
                            PERM: gl.constexpr, GPRE: gl.constexpr, ZINIT: gl.constexpr):
    """Parameter order as jax-triton passes them: inputs, scalars (``ROWS`` =
    B T), outputs, constexprs. The TMA descriptors are made here, on the device
    (global scratch: ``triton.set_allocator`` under torch, jax-triton 0.4.1
    with jaxlib > 0.11.0 under JAX), so both launchers pass plain buffers."""
    tile: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    k_desc = tma.make_tensor_descriptor(k, [ROWS, Hg * K], [Hg * K, 1], [BT, K], tile)
    v_desc = tma.make_tensor_descriptor(v, [ROWS, H * V], [H * V, 1], [BT, V], tile)
    w_desc = tma.make_tensor_descriptor(w, [ROWS, H * K], [H * K, 1], [BT, 64], tile)
    u_desc = tma.make_tensor_descriptor(u, [ROWS, H * V], [H * V, 1], [BT, 64], tile)
    a_ring = gl.allocate_shared_memory(gl.bfloat16, [4 * G, BT, BT],
                                       gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
    kb = gl.allocate_shared_memory(gl.bfloat16, [4, BT, KH], gl.SwizzledSharedLayout(8, 1, 8, [2, 1, 0]))
    k_ring = gl.allocate_shared_memory(gl.bfloat16, [NC * S2, BT, K], tile)
    v_ring = gl.allocate_shared_memory(gl.bfloat16, [NC * S2, BT, V], tile)
    ready = gl.allocate_shared_memory(gl.int64, [G, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [G, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [NC * S2, 1], mbarrier.MBarrierLayout())
    betas = gl.allocate_shared_memory(gl.float32, [2 * NC, BT], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    gs_ = gl.allocate_shared_memory(gl.float32, [2 * NC, BT], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    for i in gl.static_range(G):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=NC)
    for i in gl.static_range(NC * S2):
        mbarrier.init(kv_ready.index(i), count=1)
    # (the argument tuples are written out in place: a tuple held in a variable or
    # built with + loses its constexprs)
    if NC == 1:
        gl.warp_specialize([
            (wu_partition, (k_desc, v_desc, w_desc, u_desc, g, beta, w, u, a_ring, ready, empty, k_ring,
                            v_ring, kv_ready, betas, gs_, T, n_tasks, NTC, G, S2, H, Hg, K, V, MODE, 0, 1, WGMMA)),
            (builder_partition, (k, g, beta, A, kb, a_ring, ready, empty, T, n_tasks, NTC, G, H, Hg, K, BK,
                                 MODE, KH, PERM, GPRE, ZINIT))], [4], [BUILDER_REGS])
    else:
        gl.warp_specialize([
            (wu_partition, (k_desc, v_desc, w_desc, u_desc, g, beta, w, u, a_ring, ready, empty, k_ring,
                            v_ring, kv_ready, betas, gs_, T, n_tasks, NTC, G, S2, H, Hg, K, V, MODE, 0, 2, WGMMA)),
            (builder_partition, (k, g, beta, A, kb, a_ring, ready, empty, T, n_tasks, NTC, G, H, Hg, K, BK,
                                 MODE, KH, PERM, GPRE, ZINIT)),
            (wu_partition, (k_desc, v_desc, w_desc, u_desc, g, beta, w, u, a_ring, ready, empty, k_ring,
                            v_ring, kv_ready, betas, gs_, T, n_tasks, NTC, G, S2, H, Hg, K, V, MODE, 1, 2, WGMMA)),
        ], [4, 4], [BUILDER_REGS, CONSUMER_REGS])


# ---------------------------------------------------------------- host side (torch)

CONFIGS = {
    # name: (G groups of four A slots, S2 k/v ring slots per w/u partition, BK, builder
    #        registers, maxnreg, MODE, NC w/u partitions (4 warps each), the second w/u
    #        partition's registers, WGMMA (0 mma_v2, 1 warpgroup MMA, 2 the four warpgroup
    #        MMAs in flight together, 3 each result stored as soon as its MMA is done),
    #        KH columns of the builders' key buffer, PERM (the
    #        builders' 16x16 dots with the inner index permuted, dot32), GPRE (the
    #        builders' gates loaded a group ahead), ZINIT (the A slots' zero blocks written once))
    # MODE 1: the builders alone (the w/u partitions only hand the slots back),
    # MODE 2: the w/u partitions alone (the builders only hand out the slots).
    # Shared memory: 8 KB per A slot, 64 KB of key tiles (KH = 128), 32 KB per k/v
    # slot; 227 KB at most (g1_nc2_kv2 takes 226).
    "g1_nc2_kv2_wgmma": (1, 2, 32, 240, 168, 0, 2, 136, 1, 128, False, False, False),
    "g1_nc2_kv2_wgmma_builders_only": (1, 2, 32, 240, 168, 1, 2, 136, 1, 128, False, False, False),
    "g1_nc2_kv2_wgmma_wu_only": (1, 2, 32, 240, 168, 2, 2, 136, 1, 128, False, False, False),
    "g1_nc2_kv2_wgmma_perm": (1, 2, 32, 240, 168, 0, 2, 136, 1, 128, True, False, False),
    "g1_nc2_kv2_wgmma_perm_builders_only": (1, 2, 32, 240, 168, 1, 2, 136, 1, 128, True, False, False),
    # the register split with the fewest spills offline for PERM (20 bytes against 88)
    "g1_nc2_kv2_wgmma_perm_r224": (1, 2, 32, 224, 168, 0, 2, 144, 1, 128, True, False, False),
    "g1_nc2_kv2_wgasync": (1, 2, 32, 240, 168, 0, 2, 136, 2, 128, False, False, False),
    "g2_nc2_kv1_wgmma": (2, 1, 32, 240, 168, 0, 2, 136, 1, 128, False, False, False),
    "g2_nc2_kv2_wgmma_kh64": (2, 2, 32, 240, 168, 0, 2, 136, 1, 64, False, False, False),
    "g2_nc1_kv2_mma_v2": (2, 2, 32, 240, 248, 0, 1, 0, 0, 128, False, False, False),
    "g1_nc2_kv2_wgmma_perm_gpre": (1, 2, 32, 240, 168, 0, 2, 136, 1, 128, True, True, False),
    "g1_nc2_kv2_wgmma_perm_gpre_zinit": (1, 2, 32, 240, 168, 0, 2, 136, 1, 128, True, True, True),
    "g1_nc2_kv2_wgmma_perm_gpre_zinit_r224": (1, 2, 32, 224, 168, 0, 2, 144, 1, 128, True, True, True),
    "g1_nc2_kv2_wgmma_perm_gpre_zinit_builders_only": (1, 2, 32, 240, 168, 1, 2, 136, 1, 128, True, True, True),
}
# register splits of the PERM + GPRE + ZINIT kernel (builders, second w/u partition); the
# default partition gets what is left of 3 x 168 (NOTES session 16)
CONFIGS.update({f"g1_nc2_kv2_wgmma{'' if w == 1 else w}_pgz_b{b}_c{c}": (1, 2, 32, b, 168, 0, 2, c, w, 128, True, True, True)
                for b in (208, 216, 224, 232) for c in (136, 144, 152) for w in (1, 3)})
MODE_AT = 5  # index of MODE in a config


def _launch_args(k, v, config):
    """Grid, scalars and constexprs of a launch (shapes from ``k``, ``v``)."""
    G, S2, BK, regs, maxnreg, mode, nc, cregs, wgmma, kh, perm, gpre, zinit = CONFIGS[config]
    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    NTC = triton.cdiv(T, 64)
    n_tasks = B * NTC * H
    constexprs = dict(H=H, Hg=Hg, K=K, V=V, BK=BK, G=G, S2=S2, BUILDER_REGS=regs, MODE=mode, NC=nc,
                      CONSUMER_REGS=cregs, WGMMA=wgmma, KH=kh, PERM=perm, GPRE=gpre,
                      ZINIT=zinit)
    return n_tasks, (T, n_tasks, NTC, B * T), constexprs, maxnreg


def ws_forward(k, v, g, beta, config="g1_nc2_kv2_wgmma"):
    """``(w, u, A)`` of fixed-length bf16 torch tensors by the warp-specialized kernel."""
    import torch

    # the kernel makes its TMA descriptors in global scratch
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    n_tasks, scalars, constexprs, maxnreg = _launch_args(k, v, config)
    B, T, H = v.shape[0], v.shape[1], v.shape[2]
    w = torch.empty(B, T, H, k.shape[3], device=k.device, dtype=k.dtype)
    u = torch.empty(B, T, H, v.shape[3], device=k.device, dtype=v.dtype)
    A = torch.empty(B, T, H, 64, device=k.device, dtype=k.dtype)
    n_sm = torch.cuda.get_device_properties(k.device).multi_processor_count
    gdn_fwd_intra_ws_kernel[(min(n_tasks, n_sm), )](k, v, g, beta, *scalars, w, u, A, **constexprs,
                                                     num_warps=4, maxnreg=maxnreg)
    return w, u, A


def compile_gluon_as_triton_does():
    """Two jax-triton 0.4.1 fixes for Gluon kernels, by wrapping
    ``TritonFunction._compile_kernel`` (idempotent):

    - it lowers a Gluon kernel with ``make_ttir`` and ``make_ttgir``, the
      passes for Triton kernels (layouts chosen again, shared memory allocated
      again: 249920 bytes for this kernel, over the H200's 232448), where
      ``triton.compile`` runs ``gluon_to_ttgir``: a Gluon kernel gets a copy of
      the backend whose ``make_ttir`` passes the module through and whose
      ``make_ttgir`` is ``gluon_to_ttgir``;
    - it launches ``num_warps`` warps, where a warp-specialized kernel needs
      all its partitions' (``ttg.total-num-warps``, 12 here; 4 gave
      CUDA_ERROR_INVALID_VALUE): the kernel object is made again with that count.
    """
    import copy
    import re

    from jax_triton import triton_lib
    from triton.experimental.gluon._runtime import GluonJITFunction

    compile_kernel = triton_lib.TritonFunction._compile_kernel
    if getattr(compile_kernel, "gluon_stages", False):
        return

    def _compile_kernel(self, spec, gpu_target, backend, backend_options):
        if not isinstance(self.fn, GluonJITFunction):
            return compile_kernel(self, spec, gpu_target, backend, backend_options)
        gluon_backend = copy.copy(backend)
        gluon_backend.make_ttir = lambda mod, metadata, options, capability: mod
        gluon_backend.make_ttgir = backend.gluon_to_ttgir
        kernel, ttir, options, res = compile_kernel(self, spec, gpu_target, gluon_backend, backend_options)
        total = re.search(r'"?ttg.total-num-warps"?\s*=\s*(\d+)', res.ttgir)
        if total and int(total.group(1)) != backend_options["num_warps"]:
            args = [res.name, int(total.group(1)), backend_options["num_ctas"], res.shared_mem_bytes, res.binary,
                    ttir, gpu_target.arch if isinstance(gpu_target.arch, int) else 0]
            if res.global_scratch_size is not None:  # jaxlib > 0.11.0 (checked by compile_kernel)
                args += [res.global_scratch_size, res.global_scratch_align]
            kernel = triton_lib.triton_kernel_call_lib.TritonKernel(*args)
        return kernel, ttir, options, res

    _compile_kernel.gluon_stages = True
    triton_lib.TritonFunction._compile_kernel = _compile_kernel


def ws_forward_jax(k, v, g, beta, config="g1_nc2_kv2_wgmma", n_sm=132):
    """The same launch from JAX (jax-triton 0.4.1: Gluon kernels, ``maxnreg``
    through ``backend_options``, global scratch with jaxlib > 0.11.0)."""
    import jax
    import jax_triton as jt

    compile_gluon_as_triton_does()

    n_tasks, scalars, constexprs, maxnreg = _launch_args(k, v, config)
    B, T, H = v.shape[0], v.shape[1], v.shape[2]
    out = (jax.ShapeDtypeStruct((B, T, H, k.shape[3]), k.dtype),
           jax.ShapeDtypeStruct((B, T, H, v.shape[3]), v.dtype),
           jax.ShapeDtypeStruct((B, T, H, 64), k.dtype))
    return jt.triton_call(k, v, g, beta, *scalars, kernel=gdn_fwd_intra_ws_kernel, out_type=out,
                          grid=(min(n_tasks, n_sm), ), num_warps=4,
                          backend_options={"maxnreg": maxnreg}, **constexprs)


def offline_report(config, shape=(8, 4096, 16, 32, 128, 128)):
    """Compile ``config`` for sm_90a without a GPU (triton 3.6) and report its
    shared memory, global scratch, ptxas registers and spills, and SASS
    instruction counts by opcode (the checks NOTES asks for before timing)."""
    import collections
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    class Shape:  # what _launch_args reads of a tensor
        def __init__(self, *shape):
            self.shape = shape

    B, T, Hg, H, K, V = shape
    _, _, constexprs, maxnreg = _launch_args(Shape(B, T, Hg, K), Shape(B, T, H, V), config)
    fn = gdn_fwd_intra_ws_kernel
    sig = dict(k="*bf16", v="*bf16", g="*fp32", beta="*fp32", T="i32", n_tasks="i32", NTC="i32",
               ROWS="i32", w="*bf16", u="*bf16", A="*bf16")
    src = GluonASTSource(
        fn=fn, signature={**sig, **{n: "constexpr" for n in constexprs}},
        constexprs={(fn.arg_names.index(n),): v for n, v in constexprs.items()},
        attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items() if t[0] == "*"})
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, maxnreg=maxnreg))
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        open(ptx, "w").write(c.asm["ptx"])
        open(cubin, "wb").write(c.asm["cubin"])
        ptxas = subprocess.run([os.path.join(bin_dir, "ptxas"), "--gpu-name", "sm_90a", "-v", ptx, "-o",
                                os.devnull], capture_output=True, text=True).stderr
        sass = subprocess.run([os.path.join(bin_dir, "nvdisasm"), "-c", cubin], capture_output=True,
                              text=True, check=True).stdout
    ops = [m.group(2) for m in (re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
                                for line in sass.splitlines()) if m]
    counts = collections.Counter(op.split(".")[0] for op in ops)
    return {"shared_bytes": c.metadata.shared, "global_scratch_bytes": c.metadata.global_scratch_size,
            "ptxas": " ".join(line.strip() for line in ptxas.splitlines() if "Used" in line or "spill" in line),
            "sass_instructions": len(ops), "by_opcode": dict(counts.most_common(16))}


def main():
    import os
    import threading
    import time

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--configs", default="g1_nc2_kv2_wgmma,g1_nc2_kv2_wgmma_perm,g1_nc2_kv2_wgmma_perm_r224,"
                    "g1_nc2_kv2_wgmma_builders_only,g1_nc2_kv2_wgmma_perm_builders_only,"
                    "g1_nc2_kv2_wgmma_wu_only")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds (the median is reported)")
    ap.add_argument("--floor", action="store_true", help="also measure the bench's bandwidth floor")
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds per step before exit")
    ap.add_argument("--profile", help="run CONFIG three times at the headline shape (under ncu) and exit")
    ap.add_argument("--offline", metavar="CONFIG",
                    help="compile CONFIG for sm_90a without a GPU and print its resources and SASS counts")
    ap.add_argument("--jax", action="store_true",
                    help="also launch the first config from JAX (jax-triton 0.4.1: device_run.sh 04): "
                    "outputs against the torch launch's, and the time per call of both launchers")
    args = ap.parse_args()
    if args.offline:
        print(json.dumps(offline_report(args.offline), indent=1))
        return 0

    import torch
    from triton.testing import do_bench

    from gdn_jax.torch_launch import fwd_intra_torch

    results = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "steps": []}
    out = os.path.join(args.out, "gluon_ws_probe.json")
    state = {"step": "start", "t": time.time()}

    def watchdog():  # a hung kernel (mbarrier deadlock) must not eat the device call
        while True:
            time.sleep(2)
            if time.time() - state["t"] > args.deadline:
                print(f"WATCHDOG: step {state['step']} ran past {args.deadline} s; exiting", flush=True)
                results["steps"].append({"step": state["step"], "error": "timeout"})
                json.dump(results, open(out, "w"), indent=1)
                os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()

    def step(name, fn):
        state.update(step=name, t=time.time())
        print("step", name, flush=True)
        try:
            res = fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (a probe: record and go on)
            res = {"error": repr(e)[:2000]}
        results["steps"].append({"step": name, **res})
        json.dump(results, open(out, "w"), indent=1)
        print(name, res, flush=True)
        return res

    def inputs(B, T, Hg, H, K, V, seed=0):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        k = torch.randn(B, T, Hg, K, device="cuda", generator=gen)
        k = (k / k.norm(dim=-1, keepdim=True)).to(torch.bfloat16)
        v = torch.randn(B, T, H, V, device="cuda", generator=gen).to(torch.bfloat16)
        beta = torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
        a = -0.3 * torch.rand(B, T + (-T) % 64, H, device="cuda", generator=gen)
        g = a.view(B, -1, 64, H).cumsum(2).view(B, -1, H)[:, :T].contiguous()
        return k, v, g, beta

    def compare(shape, config):
        k, v, g, beta = inputs(*shape)
        ref = fwd_intra_torch(k, v, g, beta, autotune=False, path="split")
        got = ws_forward(k, v, g, beta, config)
        torch.cuda.synchronize()
        return {name: float((a.float() - b.float()).abs().max() / b.float().abs().max())
                for name, a, b in zip("wuA", got, ref)}

    if args.profile:
        k, v, g, beta = inputs(8, 4096, 16, 32, 128, 128)
        for _ in range(3):
            ws_forward(k, v, g, beta, args.profile)
        torch.cuda.synchronize()
        return 0
    configs = args.configs.split(",")
    small = (2, 1000, 2, 4, 128, 128)
    headline = (8, 4096, 16, 32, 128, 128)
    for c in configs:
        if CONFIGS[c][MODE_AT] == 0:
            step(f"compare_small_{c}", lambda c=c: compare(small, c))
            step(f"compare_headline_{c}", lambda c=c: compare(headline, c))
    k, v, g, beta = inputs(*headline)
    calls = {"split": lambda: fwd_intra_torch(k, v, g, beta, autotune=False, path="split"),
             **{c: (lambda c=c: ws_forward(k, v, g, beta, c)) for c in configs}}
    times = {name: [] for name in calls}
    for r in range(args.rounds):
        for name, fn in calls.items():
            res = step(f"time_{name}_round{r}", lambda fn=fn: {"ms": do_bench(fn)})
            if "ms" in res:
                times[name].append(res["ms"])
    results["median_ms"] = {n: sorted(t)[len(t) // 2] for n, t in times.items() if t}
    if args.floor:  # the bench's floor (bytes / copy bandwidth) and each median over it
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_fwd_intra import copy_bandwidth, floor_bytes

        bw = copy_bandwidth()
        results["floor_ms"] = floor_bytes(*headline) / bw * 1e3
        results["over_floor"] = {n: ms / results["floor_ms"] for n, ms in results["median_ms"].items()}
        print("floor_ms", results["floor_ms"], results["over_floor"], flush=True)
    json.dump(results, open(out, "w"), indent=1)
    print(json.dumps(results["median_ms"], indent=1))
    if args.jax:
        step("jax_launch", lambda: jax_launch(k, v, g, beta, configs[0]))


def jax_launch(k, v, g, beta, config, n=100, reps=5):
    """The torch and the JAX launch of ``config`` on the same inputs: the
    largest output difference, and each launcher's time per call (wall clock
    of ``n`` back-to-back calls, then a sync, over ``n``; median of ``reps``)."""
    import functools
    import time

    import jax
    import numpy as np
    import torch

    n_sm = torch.cuda.get_device_properties(k.device).multi_processor_count
    f = jax.jit(functools.partial(ws_forward_jax, config=config, n_sm=n_sm))
    args = [jax.dlpack.from_dlpack(x) for x in (k, v, g, beta)]
    got = jax.block_until_ready(f(*args))
    ref = ws_forward(k, v, g, beta, config)
    torch.cuda.synchronize()
    diff = {name: float(np.max(np.abs(np.asarray(a, np.float32) - b.float().cpu().numpy())))
            for name, a, b in zip("wuA", got, ref)}

    def per_call(call, sync):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                last = call()
            sync(last)
            times.append((time.perf_counter() - t0) / n * 1e3)
        return sorted(times)[reps // 2]

    jax_ms = per_call(lambda: f(*args), jax.block_until_ready)
    torch_ms = per_call(lambda: ws_forward(k, v, g, beta, config), lambda _: torch.cuda.synchronize())
    return {"max_abs_diff_jax_vs_torch": diff, "jax_ms": jax_ms, "torch_ms": torch_ms,
            "jax_over_torch": jax_ms / torch_ms}


if __name__ == "__main__":
    sys.exit(main())
