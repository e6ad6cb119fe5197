"""The backward's per-chunk gradients in Gluon (sm_90): ``kernels/chunk_bwd_local.py``
(``dq``, ``dk``, ``dw`` and the gates' share per chunk, value head and block of
64 key columns) as one persistent program an SM that copies the next work
item's tiles while it computes this one's.

Same math, work items and results as the Triton kernel (its docstring;
docs/math.md, "Gradients"), with ``S``, ``dS'`` the item's rows of ``h``, ``dh``,
``e = exp(gc)``, ``E_ij = exp(gc_i - gc_j)`` for ``i >= j``::

    D   = scale (do v'^T) E
    dq  = scale e (do S^T) + D k
    dk  = D^T q + exp(gl - gc) (v' dS'^T)
    dw  = -dv' S^T
    dgc = rowsum(P) - colsum(P) + scale e rowsum((do S^T) q) - c,  P = D (q k^T),  c = exp(gl - gc) rowsum(k (v' dS'^T))
    dgc[last] += exp(gl) <dS', S> + sum(c)

What the Triton kernel (two programs an SM, one work item each) does not do,
and this one does: the next item's ``q``, ``k`` (``[64, 64]``), ``v'``, ``do``,
``dv'``, ``S``, ``dS'`` (``[64, V]``) and gates are copied (cp.async, into the
other of two slots) while this item computes, so the copies of an SM never
stop; the four sums over ``V`` are four warpgroup MMAs straight from those
slots, in flight together.

Work items ``t = pid, pid + P, ...`` in the Triton grid's order (the K block
fastest, then the value head, the chunk, the batch row), so the two K blocks
of a chunk run side by side and the second reads ``v'``, ``do``, ``dv'`` from
L2. Shared memory: two slots of 96 KB and ``D``'s 8 KB copy. Scope: ``K = V =
128``, bfloat16 or float16, fixed length or packed; ``gdn_jax.chunk_bwd_launch``
runs the Triton kernel elsewhere (``gdn_jax.chunk_bwd_gluon.local_missing``).
``TRITON_INTERPRET=1`` does not run Gluon kernels.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from .gluon_intra import cp_async_load, partition_barrier
from .gluon_walk import BT, L1, LA, LK, S1, S128

BK = gl.constexpr(64)  # key columns of a work item
_MMA = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
MMA = gl.constexpr(_MMA)  # the [64, 64] accumulators
ROWS = gl.constexpr(gl.SliceLayout(1, _MMA))
COLS = gl.constexpr(gl.SliceLayout(0, _MMA))


@gluon.jit
def chunk_rows(c, cu_seqlens, chunk_indices, T, NTL: gl.constexpr, IS_VARLEN: gl.constexpr):
    """``(row, n)`` of chunk ``c`` (int64; its place in a packed batch's chunk
    list, else in the ``B x NTL`` chunks of fixed-length rows): its first row
    in the flattened ``B T`` rows and the rows of its sequence from there
    (none at a packed batch's padding row, fewer than 64 at a last chunk)."""
    if IS_VARLEN:
        i_n = gl.load(chunk_indices + c * 2)
        i_t = gl.load(chunk_indices + c * 2 + 1).to(gl.int64)
        bos = gl.load(cu_seqlens + i_n).to(gl.int64)
        seq_len = gl.load(cu_seqlens + i_n + 1).to(gl.int64) - bos
    else:
        i_t = c % NTL
        bos = (c // NTL) * T
        seq_len = bos * 0 + T
    return bos + i_t * BT, seq_len - i_t * BT


@gluon.jit
def work_item(t, cu_seqlens, chunk_indices, T, H: gl.constexpr, NK: gl.constexpr, NTL: gl.constexpr,
              IS_VARLEN: gl.constexpr):
    """``(i_k, i_h, h_row, row, n)`` of work item ``t``: its K block, value
    head, its chunk's row in ``h`` and ``dh`` (its place in the chunk list),
    and :func:`chunk_rows`' ``row``, ``n``."""
    h_row = (t // (NK * H)).to(gl.int64)
    row, n = chunk_rows(h_row, cu_seqlens, chunk_indices, T, NTL, IS_VARLEN)
    return t % NK, (t // NK) % H, h_row, row, n


@gluon.jit
def copy_item(q, k, v_new, do, dv, h, dh, gc, slot, q_s, k_s, vn_s, do_s, dv_s, s_s, ds_s, g_s, i_k, i_h, h_row,
              row, n, H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr, V: gl.constexpr):
    """cp.async of a work item's tiles into ``slot`` of the buffers (rows past
    ``n`` as zeros; a padding item's state rows too), one commit group."""
    r_a = gl.arange(0, BT, layout=gl.SliceLayout(1, LA))
    c_a = gl.arange(0, BK, layout=gl.SliceLayout(0, LA))
    r_k = gl.arange(0, BT, layout=gl.SliceLayout(1, LK))
    c_k = gl.arange(0, V, layout=gl.SliceLayout(0, LK))
    r_1 = gl.arange(0, BT, layout=L1)
    i_hk = i_h // (H // Hg)
    off_qk = r_a[:, None] * (Hg * K) + c_a[None, :]
    m_qk = (r_a < n)[:, None] & (c_a < BK)[None, :]
    base_qk = row * (Hg * K) + i_hk * K + i_k * BK
    cp_async_load(q_s.index(slot), q + base_qk + off_qk, mask=m_qk)
    cp_async_load(k_s.index(slot), k + base_qk + off_qk, mask=m_qk)
    off_v = r_k[:, None] * (H * V) + c_k[None, :]
    m_v = (r_k < n)[:, None] & (c_k < V)[None, :]
    base_v = row * (H * V) + i_h * V
    cp_async_load(vn_s.index(slot), v_new + base_v + off_v, mask=m_v)
    cp_async_load(do_s.index(slot), do + base_v + off_v, mask=m_v)
    cp_async_load(dv_s.index(slot), dv + base_v + off_v, mask=m_v)
    off_s = r_k[:, None] * V + c_k[None, :]
    m_s = (r_k < BK)[:, None] & (c_k < V)[None, :] & (n > 0)
    base_s = (h_row * H + i_h) * (K * V) + i_k * (BK * V)
    cp_async_load(s_s.index(slot), h + base_s + off_s, mask=m_s)
    cp_async_load(ds_s.index(slot), dh + base_s + off_s, mask=m_s)
    cp_async_load(g_s.index(slot), gc + (row + r_1) * H + i_h, mask=r_1 < n)
    async_copy.commit_group()


@gluon.jit(do_not_specialize=["T"])
def gdn_chunk_bwd_local_gluon_kernel(q, k, v_new, gc, do, dv, h, dh, cu_seqlens, chunk_indices, scale, T,
                                     dq, dk, dw, dg, H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr,
                                     V: gl.constexpr, B: gl.constexpr, NTL: gl.constexpr,
                                     IS_VARLEN: gl.constexpr):
    """``dq``, ``dk`` (per value head, ``[B, T, H, K]``, bfloat16 for bfloat16
    inputs, else float32), ``dw [B, T, H, K]`` (the inputs' dtype)
    and ``dg [K / 64, B, T, H]`` (float32, each K block's share of the
    gates' cotangent) of ``q``, ``k [B, T, Hg, K]``, ``v_new``, ``do``, ``dv
    [B, T, H, V]`` (``v'``, its output's and its own cotangents), ``gc [B, T,
    H]`` (float32, chunk-local cumulative gates), ``h``, ``dh [chunks, H, K,
    V]`` (the chunks' entering states and leaving-state cotangents): as
    ``gdn_chunk_bwd_local_kernel`` with ``BK = 64``. ``NTL``: chunks per
    batch row (``cdiv(T, 64)``, or the packed work list's rows); grid ``(P,)``
    with ``P`` at most one program an SM, 4 warps."""
    gl.static_assert(K == 128)
    gl.static_assert(V == 128)
    dt: gl.constexpr = q.dtype.element_ty
    NK: gl.constexpr = K // BK
    n_items: gl.constexpr = NTL * H * NK * B
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    scale = scale.to(gl.float32)

    q_s = gl.allocate_shared_memory(dt, [2, BT, BK], S128)
    k_s = gl.allocate_shared_memory(dt, [2, BT, BK], S128)
    vn_s = gl.allocate_shared_memory(dt, [2, BT, V], S128)
    do_s = gl.allocate_shared_memory(dt, [2, BT, V], S128)
    dv_s = gl.allocate_shared_memory(dt, [2, BT, V], S128)
    s_s = gl.allocate_shared_memory(dt, [2, BK, V], S128)
    ds_s = gl.allocate_shared_memory(dt, [2, BK, V], S128)
    g_s = gl.allocate_shared_memory(gl.float32, [2, BT], S1)
    d_s = gl.allocate_shared_memory(dt, [BT, BT], S128)  # D, the A operand of D k and D^T q
    zero = gl.zeros([BT, BK], gl.float32, MMA)

    o_r = gl.arange(0, BT, layout=ROWS)
    o_c = gl.arange(0, BT, layout=COLS)
    r_o = gl.arange(0, BT, layout=gl.SliceLayout(1, LA))
    c_o = gl.arange(0, BK, layout=gl.SliceLayout(0, LA))
    off_o = r_o[:, None] * (H * K) + c_o[None, :]  # dq, dk, dw rows from the item's first

    if pid < n_items:
        i_k, i_h, h_row, row, n = work_item(pid, cu_seqlens, chunk_indices, T, H, NK, NTL, IS_VARLEN)
        copy_item(q, k, v_new, do, dv, h, dh, gc, 0, q_s, k_s, vn_s, do_s, dv_s, s_s, ds_s, g_s, i_k, i_h, h_row,
                  row, n, H, Hg, K, V)
    j = 0
    for t in range(pid, n_items, P):
        s = j % 2
        i_k, i_h, h_row, row, n = work_item(t, cu_seqlens, chunk_indices, T, H, NK, NTL, IS_VARLEN)
        async_copy.wait_group(0)  # this item's copies
        fence_async_shared()
        partition_barrier()  # ... landed for every warp; every warp is past the last item's reads
        if t + P < n_items:  # the next item's tiles into the other slot, landing while this one computes
            i_k2, i_h2, h_row2, row2, n2 = work_item(t + P, cu_seqlens, chunk_indices, T, H, NK, NTL, IS_VARLEN)
            copy_item(q, k, v_new, do, dv, h, dh, gc, 1 - s, q_s, k_s, vn_s, do_s, dv_s, s_s, ds_s, g_s, i_k2,
                      i_h2, h_row2, row2, n2, H, Hg, K, V)
        # the four sums over V, in flight together
        t_dov = warpgroup_mma(do_s.index(s), vn_s.index(s).permute((1, 0)), zero, use_acc=False,
                              is_async=True)  # do v'^T
        t_dos = warpgroup_mma(do_s.index(s), s_s.index(s).permute((1, 0)), zero, use_acc=False,
                              is_async=True)  # do S^T
        t_vds = warpgroup_mma(vn_s.index(s), ds_s.index(s).permute((1, 0)), zero, use_acc=False,
                              is_async=True)  # v' dS'^T
        t_dw = warpgroup_mma(dv_s.index(s), s_s.index(s).permute((1, 0)), zero, use_acc=False,
                             is_async=True)  # dv' S^T
        # <dS', S> and the gates while they run
        sds = 0.0
        for r in gl.static_range(4):  # in four pieces of 16 rows: fewer registers beside the four accumulators
            sds += gl.sum(gl.sum(ds_s.index(s).slice(16 * r, 16, 0).load(LK).to(gl.float32)
                                 * s_s.index(s).slice(16 * r, 16, 0).load(LK).to(gl.float32), 1), 0)
        b_g = g_s.index(s).load(ROWS)  # rows past the end hold 0
        g_c = g_s.index(s).load(COLS)
        m_r = o_r < n
        last = gl.minimum(n, BT) - 1
        g_last = gl.sum(gl.where(o_r == last, b_g, 0.0), 0)
        b_e = gl.where(m_r, gl.exp(b_g), 0.0)
        b_decay = gl.where(m_r, gl.exp(g_last - b_g), 0.0)
        # rows past the end stay out of the exponent (safe_exp.causal_decay)
        b_E = gl.exp(gl.where((o_r[:, None] >= o_c[None, :]) & m_r[:, None], b_g[:, None] - g_c[None, :],
                              float("-inf")))
        b_dov = warpgroup_mma_wait(3, deps=[t_dov])
        b_D = scale * b_dov * b_E
        d_s.store(b_D.to(dt))
        fence_async_shared()
        partition_barrier()
        t_qk = warpgroup_mma(q_s.index(s), k_s.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
        b_dos, b_vds, b_dw = warpgroup_mma_wait(1, deps=[t_dos, t_vds, t_dw])
        m_o = (r_o < n)[:, None] & (c_o < BK)[None, :]
        base_o = row * (H * K) + i_h * K + i_k * BK
        gl.store(dw + base_o + off_o, gl.convert_layout((-b_dw).to(dw.dtype.element_ty), LA), mask=m_o)
        b_t1 = scale * b_e * gl.sum(b_dos * q_s.index(s).load(MMA).to(gl.float32), 1)
        b_c = b_decay * gl.sum(k_s.index(s).load(MMA).to(gl.float32) * b_vds, 1)
        b_qk = warpgroup_mma_wait(0, deps=[t_qk])
        b_P = b_D * b_qk
        b_dg = gl.sum(b_P, 1) - gl.convert_layout(gl.sum(b_P, 0), ROWS) + b_t1 - b_c
        b_dg += gl.where(o_r == last, gl.exp(g_last) * sds + gl.sum(b_c, 0), 0.0)
        t_dq = warpgroup_mma(d_s, k_s.index(s), b_dos * (scale * b_e)[:, None], is_async=True)  # + D k
        t_dk = warpgroup_mma(d_s.permute((1, 0)), q_s.index(s), b_vds * b_decay[:, None], is_async=True)  # + D^T q
        gl.store(dg + (i_k * B).to(gl.int64) * T * H + (row + o_r) * H + i_h, b_dg, mask=m_r)
        b_dq, b_dk = warpgroup_mma_wait(0, deps=[t_dq, t_dk])
        gl.store(dq + base_o + off_o, gl.convert_layout(b_dq.to(dq.dtype.element_ty), LA), mask=m_o)
        gl.store(dk + base_o + off_o, gl.convert_layout(b_dk.to(dk.dtype.element_ty), LA), mask=m_o)
        j += 1
