"""Probe (GPU machine, torch launch): the one-kernel path as a warp-specialized
Gluon kernel, fixed-length inputs, bf16.

    python3 benchmarks/gluon_ws_probe.py [--shape headline] [--out DIR]

Why: the split path is 1.58x the floor at the headline shape. Its `A`
kernel is latency-bound at 1 warp per program (~0.12 ms) and its w/u kernel
bandwidth-bound (~0.28 ms); plain Triton gives one warp count per launch, so
the two run one after the other (NOTES, sessions 8, 10, 14). Here one
persistent CTA per SM runs both at once with `gl.warp_specialize`:

- NB one-warp *builder* partitions each build `A = (I + L)^-1` of every
  NB-th task of the CTA (the split `A` kernel's math: ten 16x16 blocks of
  `k k^T`, gates, the diagonal blocks by recursive halving, the seed's block
  merge; plain tf32 dots, without `block_dot`'s index permutation), store it
  to `A` in HBM and to a ring slot in shared memory, and signal `ready`;
- the 4-warp default partition takes the CTA's tasks in order: issues its
  `v` and `k` tile loads, waits for the task's `A` slot, frees it, and
  stores `u = A (beta v)` and `w = A (beta exp(g) k)`.

`A` is not read back from HBM and `k` is read by the builder and again from L2
by the default partition, so the kernel moves the floor's bytes (1.07 GB at
the headline) where the split path moves 1.36 GB.

Prints ms (torch `do_bench`) per config beside the shipped split path, and the
largest difference of `w`, `u`, `A` to the split path's outputs.
"""
from __future__ import annotations

import argparse
import json
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

BT = gl.constexpr(64)
LOG2E = gl.constexpr(1.4426950408889634)


# ---------------------------------------------------------------- builder (1 warp)

@gluon.jit
def dot32(a, b):
    """``a @ b`` of two [16, 16] float32 blocks in the one-warp mma layout (tf32)."""
    mma: gl.constexpr = a.type.layout
    acc = gl.zeros([16, 16], gl.float32, mma)
    return mma_v2(gl.convert_layout(a, gl.DotOperandLayout(0, mma, 1)),
                  gl.convert_layout(b, gl.DotOperandLayout(1, mma, 1)), acc, input_precision="tf32")


@gluon.jit
def halving_step(Y, N, r, c, S: gl.constexpr):
    YC = gl.where(((r // (2 * S)) == (c // (2 * S))) & ((r // S) != (c // S)), dot32(Y, N), 0.0)
    return Y - dot32(YC, Y)


@gluon.jit
def inverse_by_halving(N, r, c):
    Y = (r == c).to(gl.float32) - gl.where((r // 2) == (c // 2), N, 0.0)
    Y = halving_step(Y, N, r, c, 2)
    Y = halving_step(Y, N, r, c, 4)
    return halving_step(Y, N, r, c, 8)


@gluon.jit
def gate(b, g_r, g_c, beta_r):
    b = b * gl.exp2(gl.where(g_r[:, None] - g_c[None, :] <= 0, g_r[:, None] - g_c[None, :],
                             float("-inf")))
    return b * beta_r[:, None]


@gluon.jit
def load_k_block(k, T, bos, kh, row0, col0, Hg: gl.constexpr, K: gl.constexpr,
                 BK: gl.constexpr, ld: gl.constexpr):
    rows = row0 + gl.arange(0, 16, layout=gl.SliceLayout(1, ld))
    cols = col0 + gl.arange(0, BK, layout=gl.SliceLayout(0, ld))
    ptr = k + ((bos + rows[:, None]) * Hg + kh) * K + cols[None, :]
    return gl.load(ptr, mask=rows[:, None] < T, other=0.0)


@gluon.jit
def store_block(A, a_slot, T, bos, i_h, i_tc0, rb: gl.constexpr, cb: gl.constexpr, blk, r, c,
                H: gl.constexpr):
    """Block (rb, cb) of the chunk's A to HBM (rows < T) and to the ring slot."""
    val = blk.to(gl.bfloat16)
    rows = i_tc0 + rb * 16 + r
    ptr = A + ((bos + rows) * H + i_h) * BT + cb * 16 + c
    gl.store(ptr, val, mask=(rows < T) & (c >= 0))
    a_slot.slice(rb * 16, 16, 0).slice(cb * 16, 16, 1).store(val)


@gluon.jit
def builder_partition(k, g, beta, A, a_ring, ready, empty, T, n_tasks, NTC,
                      BID: gl.constexpr, NB: gl.constexpr, S: gl.constexpr,
                      H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr, BK: gl.constexpr,
                      MODE: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1],
                                                  instr_shape=[16, 8])
    opA: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    opB: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])
    ldT: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, 1], [0, 1])
    rowL: gl.constexpr = gl.SliceLayout(1, mma)
    colL: gl.constexpr = gl.SliceLayout(0, mma)
    o_r = gl.arange(0, 16, layout=rowL)
    o_c = gl.arange(0, 16, layout=colL)
    r = o_r[:, None]
    c = o_c[None, :]
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    n_local = gl.cdiv(n_tasks - pid, nprog)
    for j in range(BID, n_local, NB):
        if MODE == 2:  # ablation: the w/u partition alone (A slots as they are)
            mbarrier.wait(empty.index(j % S), ((j // S) & 1) ^ 1)
            mbarrier.arrive(ready.index(j % S))
        else:
            t = pid + j * nprog
            i_h = t % H
            i_t = (t // H) % NTC
            i_b = t // (H * NTC)
            bos = i_b.to(gl.int64) * T
            kh = i_h // (H // Hg)
            i_tc0 = i_t * BT
            # gates
            gp = g + (bos + i_tc0) * H + i_h
            bp = beta + (bos + i_tc0) * H + i_h
            g_r0 = gl.load(gp + o_r * H, mask=i_tc0 + o_r < T, other=0.0) * LOG2E
            g_r1 = gl.load(gp + (o_r + 16) * H, mask=i_tc0 + 16 + o_r < T, other=0.0) * LOG2E
            g_r2 = gl.load(gp + (o_r + 32) * H, mask=i_tc0 + 32 + o_r < T, other=0.0) * LOG2E
            g_r3 = gl.load(gp + (o_r + 48) * H, mask=i_tc0 + 48 + o_r < T, other=0.0) * LOG2E
            g_c0 = gl.load(gp + o_c * H, mask=i_tc0 + o_c < T, other=0.0) * LOG2E
            g_c1 = gl.load(gp + (o_c + 16) * H, mask=i_tc0 + 16 + o_c < T, other=0.0) * LOG2E
            g_c2 = gl.load(gp + (o_c + 32) * H, mask=i_tc0 + 32 + o_c < T, other=0.0) * LOG2E
            b_r0 = gl.load(bp + o_r * H, mask=i_tc0 + o_r < T, other=0.0)
            b_r1 = gl.load(bp + (o_r + 16) * H, mask=i_tc0 + 16 + o_r < T, other=0.0)
            b_r2 = gl.load(bp + (o_r + 32) * H, mask=i_tc0 + 32 + o_r < T, other=0.0)
            b_r3 = gl.load(bp + (o_r + 48) * H, mask=i_tc0 + 48 + o_r < T, other=0.0)
            # k k^T in ten 16x16 blocks
            A00 = gl.zeros([16, 16], gl.float32, mma)
            A10 = gl.zeros([16, 16], gl.float32, mma)
            A11 = gl.zeros([16, 16], gl.float32, mma)
            A20 = gl.zeros([16, 16], gl.float32, mma)
            A21 = gl.zeros([16, 16], gl.float32, mma)
            A22 = gl.zeros([16, 16], gl.float32, mma)
            A30 = gl.zeros([16, 16], gl.float32, mma)
            A31 = gl.zeros([16, 16], gl.float32, mma)
            A32 = gl.zeros([16, 16], gl.float32, mma)
            A33 = gl.zeros([16, 16], gl.float32, mma)
            for i_k in range(K // BK):
                k0 = load_k_block(k, T, bos, kh, i_tc0, i_k * BK, Hg, K, BK, ld)
                k1 = load_k_block(k, T, bos, kh, i_tc0 + 16, i_k * BK, Hg, K, BK, ld)
                k2 = load_k_block(k, T, bos, kh, i_tc0 + 32, i_k * BK, Hg, K, BK, ld)
                k3 = load_k_block(k, T, bos, kh, i_tc0 + 48, i_k * BK, Hg, K, BK, ld)
                a0 = gl.convert_layout(k0, opA)
                a1 = gl.convert_layout(k1, opA)
                a2 = gl.convert_layout(k2, opA)
                a3 = gl.convert_layout(k3, opA)
                t0 = gl.convert_layout(gl.permute(k0, [1, 0]), opB)
                t1 = gl.convert_layout(gl.permute(k1, [1, 0]), opB)
                t2 = gl.convert_layout(gl.permute(k2, [1, 0]), opB)
                A00 = mma_v2(a0, t0, A00)
                A10 = mma_v2(a1, t0, A10)
                A11 = mma_v2(a1, t1, A11)
                A20 = mma_v2(a2, t0, A20)
                A21 = mma_v2(a2, t1, A21)
                A22 = mma_v2(a2, t2, A22)
                A30 = mma_v2(a3, t0, A30)
                A31 = mma_v2(a3, t1, A31)
                A32 = mma_v2(a3, t2, A32)
                A33 = mma_v2(a3, gl.convert_layout(gl.permute(k3, [1, 0]), opB), A33)
            s = j % S
            mbarrier.wait(empty.index(s), ((j // S) & 1) ^ 1)
            slot = a_ring.index(s)
            zero = gl.zeros([16, 16], gl.float32, mma)
            store_block(A, slot, T, bos, i_h, i_tc0, 0, 1, zero, r, c, H)
            store_block(A, slot, T, bos, i_h, i_tc0, 0, 2, zero, r, c, H)
            store_block(A, slot, T, bos, i_h, i_tc0, 0, 3, zero, r, c, H)
            store_block(A, slot, T, bos, i_h, i_tc0, 1, 2, zero, r, c, H)
            store_block(A, slot, T, bos, i_h, i_tc0, 1, 3, zero, r, c, H)
            store_block(A, slot, T, bos, i_h, i_tc0, 2, 3, zero, r, c, H)
            # Each block is stored as soon as it is final (fewer live registers).
            m_d = r > c
            g_c3 = gl.convert_layout(g_r3, colL)
            Ai00 = inverse_by_halving(gl.where(m_d, gate(A00, g_r0, g_c0, b_r0), 0.0), r, c)
            store_block(A, slot, T, bos, i_h, i_tc0, 0, 0, Ai00, r, c, H)
            Ai11 = inverse_by_halving(gl.where(m_d, gate(A11, g_r1, g_c1, b_r1), 0.0), r, c)
            store_block(A, slot, T, bos, i_h, i_tc0, 1, 1, Ai11, r, c, H)
            Ai10 = -dot32(dot32(Ai11, gate(A10, g_r1, g_c0, b_r1)), Ai00)
            store_block(A, slot, T, bos, i_h, i_tc0, 1, 0, Ai10, r, c, H)
            Ai22 = inverse_by_halving(gl.where(m_d, gate(A22, g_r2, g_c2, b_r2), 0.0), r, c)
            store_block(A, slot, T, bos, i_h, i_tc0, 2, 2, Ai22, r, c, H)
            L21 = gate(A21, g_r2, g_c1, b_r2)
            Ai21 = -dot32(dot32(Ai22, L21), Ai11)
            store_block(A, slot, T, bos, i_h, i_tc0, 2, 1, Ai21, r, c, H)
            Ai20 = -dot32(Ai22, dot32(gate(A20, g_r2, g_c0, b_r2), Ai00) + dot32(L21, Ai10))
            store_block(A, slot, T, bos, i_h, i_tc0, 2, 0, Ai20, r, c, H)
            Ai33 = inverse_by_halving(gl.where(m_d, gate(A33, g_r3, g_c3, b_r3), 0.0), r, c)
            store_block(A, slot, T, bos, i_h, i_tc0, 3, 3, Ai33, r, c, H)
            L32 = gate(A32, g_r3, g_c2, b_r3)
            Ai32 = -dot32(dot32(Ai33, L32), Ai22)
            store_block(A, slot, T, bos, i_h, i_tc0, 3, 2, Ai32, r, c, H)
            L31 = gate(A31, g_r3, g_c1, b_r3)
            Ai31 = -dot32(Ai33, dot32(L31, Ai11) + dot32(L32, Ai21))
            store_block(A, slot, T, bos, i_h, i_tc0, 3, 1, Ai31, r, c, H)
            Ai30 = -dot32(Ai33, dot32(gate(A30, g_r3, g_c0, b_r3), Ai00) + dot32(L31, Ai10)
                          + dot32(L32, Ai20))
            store_block(A, slot, T, bos, i_h, i_tc0, 3, 0, Ai30, r, c, H)
            gl.thread_barrier()
            mbarrier.arrive(ready.index(s))


# ---------------------------------------------------------------- w/u (default, 4 warps)

@gluon.jit
def load_tile(x, T, bos, head, n_heads: gl.constexpr, D: gl.constexpr, i_tc0, col0,
              BX: gl.constexpr, blk: gl.constexpr):
    rows = i_tc0 + gl.arange(0, BT, layout=gl.SliceLayout(1, blk))
    cols = col0 + gl.arange(0, BX, layout=gl.SliceLayout(0, blk))
    ptr = x + ((bos + rows[:, None]) * n_heads + head) * D + cols[None, :]
    return gl.load(ptr, mask=rows[:, None] < T, other=0.0)


@gluon.jit
def store_tile(y, val, T, bos, head, n_heads: gl.constexpr, D: gl.constexpr, i_tc0, col0,
               BX: gl.constexpr, blk: gl.constexpr):
    rows = i_tc0 + gl.arange(0, BT, layout=gl.SliceLayout(1, blk))
    cols = col0 + gl.arange(0, BX, layout=gl.SliceLayout(0, blk))
    ptr = y + ((bos + rows[:, None]) * n_heads + head) * D + cols[None, :]
    gl.store(ptr, gl.convert_layout(val, blk).to(gl.bfloat16), mask=rows[:, None] < T)


@gluon.jit
def times_A(a_op, x, scale, mma: gl.constexpr, opB: gl.constexpr, BX: gl.constexpr):
    xb = (x.to(gl.float32) * scale[:, None]).to(gl.bfloat16)
    acc = gl.zeros([BT, BX], gl.float32, mma)
    return mma_v2(a_op, gl.convert_layout(xb, opB), acc)


@gluon.jit
def issue_kv(k_desc, v_desc, bar, k_buf, v_buf, t, T, NTC, H: gl.constexpr, Hg: gl.constexpr,
             K: gl.constexpr, V: gl.constexpr):
    """TMA loads of task ``t``'s ``[64, K]`` key tile and ``[64, V]`` value tile
    (rows of the flattened ``[B T, heads dim]`` tensors; a last chunk past ``T``
    reads the next batch row's first rows, which only meet zero columns of
    ``A`` and masked output rows)."""
    i_h = t % H
    row = (t // (H * NTC)) * T + ((t // H) % NTC) * BT
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [row, (i_h // (H // Hg)) * K], bar, k_buf)
    tma.async_copy_global_to_shared(v_desc, [row, i_h * V], bar, v_buf)


@gluon.jit
def wu_partition(k_desc, v_desc, g, beta, w, u, a_ring, ready, empty, k_ring, v_ring, kv_ready,
                 T, n_tasks, NTC, S: gl.constexpr, S2: gl.constexpr, H: gl.constexpr,
                 Hg: gl.constexpr, K: gl.constexpr, V: gl.constexpr, MODE: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 8])
    opA: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    opB: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rowL: gl.constexpr = gl.SliceLayout(1, blk)
    BX: gl.constexpr = 64
    gl.static_assert((K == 128) & (V == 128))
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    n_local = gl.cdiv(n_tasks - pid, nprog)
    o_r = gl.arange(0, BT, layout=rowL)
    if MODE != 1:
        for p in gl.static_range(S2 - 1):
            if p < n_local:
                issue_kv(k_desc, v_desc, kv_ready.index(p), k_ring.index(p), v_ring.index(p),
                         pid + p * nprog, T, NTC, H, Hg, K, V)
    for j in range(0, n_local):
        t = pid + j * nprog
        s = j % S
        if MODE == 1:  # ablation: builders alone
            mbarrier.wait(ready.index(s), (j // S) & 1)
            mbarrier.arrive(empty.index(s))
        else:
            jn = j + S2 - 1
            if jn < n_local:  # refill the slot read in iteration j - 1
                fence_async_shared()
                issue_kv(k_desc, v_desc, kv_ready.index(jn % S2), k_ring.index(jn % S2),
                         v_ring.index(jn % S2), pid + jn * nprog, T, NTC, H, Hg, K, V)
            i_h = t % H
            i_t = (t // H) % NTC
            i_b = t // (H * NTC)
            bos = i_b.to(gl.int64) * T
            i_tc0 = i_t * BT
            m_r = i_tc0 + o_r < T
            b_beta = gl.load(beta + (bos + i_tc0 + o_r) * H + i_h, mask=m_r, other=0.0)
            b_g = gl.load(g + (bos + i_tc0 + o_r) * H + i_h, mask=m_r, other=0.0)
            s2 = j % S2
            mbarrier.wait(kv_ready.index(s2), (j // S2) & 1)
            v0 = v_ring.index(s2).slice(0, BX, 1).load(blk)
            v1 = v_ring.index(s2).slice(BX, BX, 1).load(blk)
            k0 = k_ring.index(s2).slice(0, BX, 1).load(blk)
            k1 = k_ring.index(s2).slice(BX, BX, 1).load(blk)
            mbarrier.wait(ready.index(s), (j // S) & 1)
            a_op = a_ring.index(s).load(opA)
            gl.thread_barrier()
            mbarrier.arrive(empty.index(s))
            b_ks = b_beta * gl.exp(b_g)
            store_tile(u, times_A(a_op, v0, b_beta, mma, opB, BX), T, bos, i_h, H, V, i_tc0, 0, BX, blk)
            store_tile(u, times_A(a_op, v1, b_beta, mma, opB, BX), T, bos, i_h, H, V, i_tc0, BX, BX, blk)
            store_tile(w, times_A(a_op, k0, b_ks, mma, opB, BX), T, bos, i_h, H, K, i_tc0, 0, BX, blk)
            store_tile(w, times_A(a_op, k1, b_ks, mma, opB, BX), T, bos, i_h, H, K, i_tc0, BX, BX, blk)


# ---------------------------------------------------------------- kernel

@gluon.jit
def gdn_fwd_intra_ws_kernel(k, k_desc, v_desc, g, beta, T, n_tasks, NTC, w, u, A,
                            H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                            BK: gl.constexpr, NB: gl.constexpr, S: gl.constexpr,
                            S2: gl.constexpr, BUILDER_REGS: gl.constexpr, MODE: gl.constexpr):
    gl.static_assert(NB == 4)
    ring_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    a_ring = gl.allocate_shared_memory(gl.bfloat16, [S, BT, BT], ring_layout)
    k_ring = gl.allocate_shared_memory(gl.bfloat16, [S2, BT, K], k_desc.layout)
    v_ring = gl.allocate_shared_memory(gl.bfloat16, [S2, BT, V], v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [S2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(S2):
        mbarrier.init(kv_ready.index(i), count=1)
    gl.warp_specialize([
        (wu_partition, (k_desc, v_desc, g, beta, w, u, a_ring, ready, empty, k_ring, v_ring, kv_ready,
                        T, n_tasks, NTC, S, S2, H, Hg, K, V, MODE)),
        (builder_partition, (k, g, beta, A, a_ring, ready, empty, T, n_tasks, NTC, 0, NB, S, H, Hg, K, BK, MODE)),
        (builder_partition, (k, g, beta, A, a_ring, ready, empty, T, n_tasks, NTC, 1, NB, S, H, Hg, K, BK, MODE)),
        (builder_partition, (k, g, beta, A, a_ring, ready, empty, T, n_tasks, NTC, 2, NB, S, H, Hg, K, BK, MODE)),
        (builder_partition, (k, g, beta, A, a_ring, ready, empty, T, n_tasks, NTC, 3, NB, S, H, Hg, K, BK, MODE)),
    ], [1, 1, 1, 1], [BUILDER_REGS] * 4)


# ---------------------------------------------------------------- host side (torch)

CONFIGS = {
    # name: (S A-ring slots, S2 k/v-ring slots, BK, builder registers, maxnreg, MODE)
    # MODE 1: the builders alone (w/u partition only waits), 2: the w/u partition alone
    "s8_kv3_bk32": (8, 3, 32, 240, 248, 0),
    "s8_kv3_bk16": (8, 3, 16, 232, 248, 0),
    "s8_kv2_bk32": (8, 2, 32, 240, 248, 0),
    "s8_kv3_bk32_builders_only": (8, 3, 32, 240, 248, 1),
    "s8_kv3_bk32_wu_only": (8, 3, 32, 240, 248, 2),
}


def ws_forward(k, v, g, beta, config="s8_kv3_bk32"):
    """``(w, u, A)`` of fixed-length bf16 inputs by the warp-specialized kernel."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    S, S2, BK, regs, maxnreg, mode = CONFIGS[config]
    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    NTC = triton.cdiv(T, 64)
    n_tasks = B * NTC * H
    w = torch.empty(B, T, H, K, device=k.device, dtype=k.dtype)
    u = torch.empty(B, T, H, V, device=k.device, dtype=v.dtype)
    A = torch.empty(B, T, H, 64, device=k.device, dtype=k.dtype)
    n_sm = torch.cuda.get_device_properties(k.device).multi_processor_count
    layout = gl.NVMMASharedLayout.get_default_for([64, K], gl.bfloat16)
    k_desc = TensorDescriptor.from_tensor(k.view(B * T, Hg * K), [64, K], layout)
    v_desc = TensorDescriptor.from_tensor(v.view(B * T, H * V), [64, V], layout)
    gdn_fwd_intra_ws_kernel[(min(n_tasks, n_sm), )](
        k, k_desc, v_desc, g, beta, T, n_tasks, NTC, w, u, A, H=H, Hg=Hg, K=K, V=V, BK=BK, NB=4,
        S=S, S2=S2, BUILDER_REGS=regs, MODE=mode, num_warps=4, maxnreg=maxnreg)
    return w, u, A


def main():
    import os
    import threading
    import time

    import torch
    from triton.testing import do_bench

    from gdn_jax.torch_launch import fwd_intra_torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds per step before exit")
    args = ap.parse_args()
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

    configs = args.configs.split(",")
    small = (2, 1000, 2, 4, 128, 128)
    headline = (8, 4096, 16, 32, 128, 128)
    for c in configs:
        if CONFIGS[c][-1] == 0:
            step(f"compare_small_{c}", lambda c=c: compare(small, c))
            step(f"compare_headline_{c}", lambda c=c: compare(headline, c))
    k, v, g, beta = inputs(*headline)
    calls = {"split": lambda: fwd_intra_torch(k, v, g, beta, autotune=False, path="split"),
             **{c: (lambda c=c: ws_forward(k, v, g, beta, c)) for c in configs}}
    times = {name: [] for name in calls}
    for r in range(3):
        for name, fn in calls.items():
            res = step(f"time_{name}_round{r}", lambda fn=fn: {"ms": do_bench(fn)})
            if "ms" in res:
                times[name].append(res["ms"])
    results["median_ms"] = {n: sorted(t)[len(t) // 2] for n, t in times.items() if t}
    json.dump(results, open(out, "w"), indent=1)
    print(json.dumps(results["median_ms"], indent=1))


if __name__ == "__main__":
    sys.exit(main())
