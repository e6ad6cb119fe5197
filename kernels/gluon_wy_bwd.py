"""The backward through the WY representation in Gluon (sm_90): ``kernels/wy_bwd.py``
as the chunk backward launches it (``NK_IN`` shares of the gates' cotangent
from the per-chunk kernel added, their reverse cumsum within the chunk taken),
as one persistent program an SM that copies the next work item's tiles while
it computes this one's, as ``gluon_bwd_local.py`` does for the per-chunk kernel.

Same math, work items and results as the Triton kernel (its docstring;
docs/math.md, "Gradients"): per chunk and value head, ``e = exp(gc)``,
``E_ij = exp(gc_i - gc_j)`` for ``i > j``::

    dv     = beta (A^T du)
    dA     = (du v^T) beta_j + (dw k^T) beta_j e_j
    dL     = strict_tril(-A^T (dA A^T)),  G = (k k^T) E
    dbeta  = rowsum((A^T du) v) + e rowsum((A^T dw) k) + rowsum(dL G)
    dk     = beta e (A^T dw) + (dL beta E) k + (dL beta E)^T k
    dgc    = beta e rowsum((A^T dw) k) + rowsum(dL beta G) - colsum(dL beta G) + the shares
    dg     = the reverse cumsum of dgc within the chunk

A work item is a (chunk, value head) in the Triton grid's order (the value
head fastest, then the chunk, then the batch row). Its copies (cp.async into
the other of two slots): ``v`` and ``du`` in two ``[64, 64]`` halves, ``k``,
``dw [64, K]``, ``A [64, 64]``, ``beta``, ``gc`` and the shares. Shared memory:
two slots of 72 KB and three ``[64, 64]`` operands. Scope: ``K = V = 128``,
bfloat16 or float16, fixed length or packed, without ``DA_IN`` (``fwd_intra``'s
own backward runs the Triton kernel); ``gdn_jax.chunk_bwd_launch`` runs the
Triton kernel elsewhere (``gdn_jax.chunk_bwd_local_gluon.local_missing``).
``TRITON_INTERPRET=1`` does not run Gluon kernels.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from .gluon_bwd_local import COLS, MMA, ROWS, chunk_rows
from .gluon_intra import cp_async_load, partition_barrier
from .gluon_walk import BT, L1, LA, LK, S1, S128, add

_MMA128 = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16])
MMA128 = gl.constexpr(_MMA128)  # the [64, K] accumulator of dk
ROWS128 = gl.constexpr(gl.SliceLayout(1, _MMA128))
HALF = gl.constexpr(64)  # value columns of a half of v and du


@gluon.jit
def work_item(t, cu_seqlens, chunk_indices, T, H: gl.constexpr, NTL: gl.constexpr, IS_VARLEN: gl.constexpr):
    """``(i_h, row, n)`` of work item ``t``: its value head and
    ``gluon_bwd_local.chunk_rows``' ``row``, ``n``."""
    row, n = chunk_rows((t // H).to(gl.int64), cu_seqlens, chunk_indices, T, NTL, IS_VARLEN)
    return t % H, row, n


@gluon.jit
def copy_item(k, v, beta, gc, A, dw, du, dg_in, slot, v_s, du_s, k_s, dw_s, a_s, b_s, g_s, sh_s, i_h, row, n,
              shares, H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr, V: gl.constexpr, NK_IN: gl.constexpr):
    """cp.async of a work item's tiles into ``slot`` (rows past ``n`` as
    zeros), one commit group. ``shares``: elements of one ``[B, T, H]`` row
    of ``dg_in``."""
    r_a = gl.arange(0, BT, layout=gl.SliceLayout(1, LA))
    c_a = gl.arange(0, HALF, layout=gl.SliceLayout(0, LA))
    r_k = gl.arange(0, BT, layout=gl.SliceLayout(1, LK))
    c_k = gl.arange(0, K, layout=gl.SliceLayout(0, LK))
    r_1 = gl.arange(0, BT, layout=L1)
    m_a = (r_a < n)[:, None] & (c_a < HALF)[None, :]
    off_v = r_a[:, None] * (H * V) + c_a[None, :]
    base_v = row * (H * V) + i_h * V
    for half in gl.static_range(2):
        cp_async_load(v_s.index(slot * 2 + half), v + base_v + half * HALF + off_v, mask=m_a)
        cp_async_load(du_s.index(slot * 2 + half), du + base_v + half * HALF + off_v, mask=m_a)
    m_k = (r_k < n)[:, None] & (c_k < K)[None, :]
    cp_async_load(k_s.index(slot), k + row * (Hg * K) + (i_h // (H // Hg)) * K + r_k[:, None] * (Hg * K)
                  + c_k[None, :], mask=m_k)
    cp_async_load(dw_s.index(slot), dw + row * (H * K) + i_h * K + r_k[:, None] * (H * K) + c_k[None, :],
                  mask=m_k)
    cp_async_load(a_s.index(slot), A + row * (H * BT) + i_h * BT + r_a[:, None] * (H * BT) + c_a[None, :],
                  mask=m_a)
    m_1 = r_1 < n
    rows_1 = (row + r_1) * H + i_h
    cp_async_load(b_s.index(slot), beta + rows_1, mask=m_1)
    cp_async_load(g_s.index(slot), gc + rows_1, mask=m_1)
    for i in gl.static_range(NK_IN):
        cp_async_load(sh_s.index(slot * NK_IN + i), dg_in + i * shares + rows_1, mask=m_1)
    async_copy.commit_group()


@gluon.jit(do_not_specialize=["T"])
def gdn_wy_bwd_gluon_kernel(k, v, beta, gc, A, dw, du, dg_in, cu_seqlens, chunk_indices, T, dk, dv, dbeta, dg,
                            H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                            B: gl.constexpr, NTL: gl.constexpr, IS_VARLEN: gl.constexpr, NK_IN: gl.constexpr):
    """``dk [B, T, H, K]`` (per value head, bfloat16 for bfloat16 inputs,
    else float32), ``dv [B, T, H, V]`` (v's dtype), ``dbeta`` and ``dg [B, T,
    H]`` (float32; ``dg`` the per-step gates' cotangent) of ``k [B, T, Hg,
    K]``, ``v``, ``du [B, T, H, V]``, ``beta``, ``gc [B, T, H]`` (float32,
    chunk-local cumulative gates), ``A [B, T, H, 64]``, ``dw [B, T, H, K]``,
    ``dg_in [NK_IN, B, T, H]`` (float32 shares of the gates' cotangent): as
    ``gdn_wy_bwd_kernel`` with ``NK_IN``, ``REV_CUMSUM``, ``BK = K``.
    ``NTL``: chunks per batch row (``cdiv(T, 64)``, or the packed work
    list's rows); grid ``(P,)`` with ``P`` at most one program an SM, 4 warps."""
    gl.static_assert(K == 128)
    gl.static_assert(V == 2 * HALF)
    dt: gl.constexpr = k.dtype.element_ty
    n_items: gl.constexpr = NTL * H * B
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    shares = (pid * 0 + B * H).to(gl.int64) * T  # elements of one share

    v_s = gl.allocate_shared_memory(dt, [4, BT, HALF], S128)  # slot * 2 + half
    du_s = gl.allocate_shared_memory(dt, [4, BT, HALF], S128)
    k_s = gl.allocate_shared_memory(dt, [2, BT, K], S128)
    dw_s = gl.allocate_shared_memory(dt, [2, BT, K], S128)
    a_s = gl.allocate_shared_memory(dt, [2, BT, BT], S128)
    b_s = gl.allocate_shared_memory(gl.float32, [2, BT], S1)
    g_s = gl.allocate_shared_memory(gl.float32, [2, BT], S1)
    sh_s = gl.allocate_shared_memory(gl.float32, [2 * NK_IN, BT], S1)
    x_s = gl.allocate_shared_memory(dt, [BT, BT], S128)  # dA
    y_s = gl.allocate_shared_memory(dt, [BT, BT], S128)  # dA A^T
    z_s = gl.allocate_shared_memory(dt, [BT, BT], S128)  # dL beta E
    zero = gl.zeros([BT, BT], gl.float32, MMA)

    o_r = gl.arange(0, BT, layout=ROWS)
    o_c = gl.arange(0, BT, layout=COLS)
    r_o = gl.arange(0, BT, layout=gl.SliceLayout(1, LA))
    c_o = gl.arange(0, HALF, layout=gl.SliceLayout(0, LA))
    r_k = gl.arange(0, BT, layout=gl.SliceLayout(1, LK))
    c_k = gl.arange(0, K, layout=gl.SliceLayout(0, LK))
    r_1 = gl.arange(0, BT, layout=L1)

    if pid < n_items:
        i_h, row, n = work_item(pid, cu_seqlens, chunk_indices, T, H, NTL, IS_VARLEN)
        copy_item(k, v, beta, gc, A, dw, du, dg_in, 0, v_s, du_s, k_s, dw_s, a_s, b_s, g_s, sh_s, i_h, row, n,
                  shares, H, Hg, K, V, NK_IN)
    j = 0
    for t in range(pid, n_items, P):
        s = j % 2
        i_h, row, n = work_item(t, cu_seqlens, chunk_indices, T, H, NTL, IS_VARLEN)
        async_copy.wait_group(0)  # this item's copies
        fence_async_shared()
        partition_barrier()  # ... landed for every warp; every warp is past the last item's reads
        if t + P < n_items:  # the next item's tiles into the other slot, landing while this one computes
            i_h2, row2, n2 = work_item(t + P, cu_seqlens, chunk_indices, T, H, NTL, IS_VARLEN)
            copy_item(k, v, beta, gc, A, dw, du, dg_in, 1 - s, v_s, du_s, k_s, dw_s, a_s, b_s, g_s, sh_s, i_h2,
                      row2, n2, shares, H, Hg, K, V, NK_IN)
        At = a_s.index(s).permute((1, 0))
        # the V side: A^T du by halves, du v^T summed over both
        t_a0 = warpgroup_mma(At, du_s.index(2 * s), zero, use_acc=False, is_async=True)
        t_a1 = warpgroup_mma(At, du_s.index(2 * s + 1), zero, use_acc=False, is_async=True)
        t_duv = warpgroup_mma(du_s.index(2 * s), v_s.index(2 * s).permute((1, 0)), zero, use_acc=False,
                              is_async=True)
        t_duv = warpgroup_mma(du_s.index(2 * s + 1), v_s.index(2 * s + 1).permute((1, 0)), t_duv, is_async=True)
        b_g = g_s.index(s).load(ROWS)  # rows past the end hold 0
        g_c = g_s.index(s).load(COLS)
        b_beta = b_s.index(s).load(ROWS)
        beta_c = b_s.index(s).load(COLS)
        m_r = o_r < n
        m_c = o_c < n
        b_e = gl.where(m_r, gl.exp(b_g), 0.0)
        e_c = gl.where(m_c, gl.exp(g_c), 0.0)
        m_o = (r_o < n)[:, None] & (c_o < HALF)[None, :]
        base_o = row * (H * V) + i_h * V + r_o[:, None] * (H * V) + c_o[None, :]
        b_a0, b_a1 = warpgroup_mma_wait(2, deps=[t_a0, t_a1])
        gl.store(dv + base_o, gl.convert_layout((b_beta[:, None] * b_a0).to(dv.dtype.element_ty), LA), mask=m_o)
        gl.store(dv + base_o + HALF, gl.convert_layout((b_beta[:, None] * b_a1).to(dv.dtype.element_ty), LA),
                 mask=m_o)
        b_db = gl.sum(b_a0 * v_s.index(2 * s).load(MMA).to(gl.float32), 1) \
            + gl.sum(b_a1 * v_s.index(2 * s + 1).load(MMA).to(gl.float32), 1)
        # the K side's [64, 64] products: dw k^T (into dA), then k k^T beside dA A^T
        t_dwk = warpgroup_mma(dw_s.index(s), k_s.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
        b_duv, b_dwk = warpgroup_mma_wait(0, deps=[t_duv, t_dwk])
        # rowsum((A^T dw) k) = colsum(A (dw k^T)): from the [64, 64] product, not the [64, K] one
        b_kdw = gl.convert_layout(gl.sum(a_s.index(s).load(MMA).to(gl.float32) * b_dwk, 0), ROWS)
        b_dA = b_duv * beta_c[None, :] + b_dwk * (beta_c * e_c)[None, :]
        x_s.store(b_dA.to(dt))
        fence_async_shared()
        partition_barrier()
        t_kk = warpgroup_mma(k_s.index(s), k_s.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
        t_dAA = warpgroup_mma(x_s, At, zero, use_acc=False, is_async=True)  # dA A^T
        b_kk, b_dAA = warpgroup_mma_wait(0, deps=[t_kk, t_dAA])
        y_s.store(b_dAA.to(dt))
        fence_async_shared()
        partition_barrier()
        b_dL = warpgroup_mma(At, y_s, zero, use_acc=False)  # A^T (dA A^T)
        strict = (o_r[:, None] > o_c[None, :]) & m_r[:, None] & m_c[None, :]
        b_E = gl.exp(gl.where(strict, b_g[:, None] - g_c[None, :], float("-inf")))
        b_dL = gl.where(strict, -b_dL, 0.0)
        z_s.store((b_dL * b_beta[:, None] * b_E).to(dt))
        b_G = b_kk * b_E
        b_db += gl.sum(b_dL * b_G, 1)
        b_LdL = b_dL * b_beta[:, None] * b_G
        b_dg = gl.sum(b_LdL, 1) - gl.convert_layout(gl.sum(b_LdL, 0), ROWS)
        fence_async_shared()
        partition_barrier()
        # dk: beta e (A^T dw), then + (dL beta E) k + (dL beta E)^T k into the same accumulator
        b_atdw = warpgroup_mma(At, dw_s.index(s), gl.zeros([BT, K], gl.float32, MMA128), use_acc=False)
        be = gl.convert_layout(b_beta * b_e, ROWS128)
        t_dk = warpgroup_mma(z_s, k_s.index(s), b_atdw * be[:, None], is_async=True)
        t_dk = warpgroup_mma(z_s.permute((1, 0)), k_s.index(s), t_dk, is_async=True)
        b_db += b_e * b_kdw
        b_dg += b_beta * b_e * b_kdw
        gl.store(dbeta + (row + o_r) * H + i_h, b_db, mask=m_r)
        b_dg1 = gl.convert_layout(b_dg, L1)
        for i in gl.static_range(NK_IN):  # the per-chunk kernel's shares
            b_dg1 += sh_s.index(s * NK_IN + i).load(L1)
        # the reverse cumsum within the chunk (rows past the end hold 0)
        b_dg1 = gl.sum(b_dg1, 0) - gl.associative_scan(b_dg1, 0, add) + b_dg1
        gl.store(dg + (row + r_1) * H + i_h, b_dg1, mask=r_1 < n)
        b_dk = warpgroup_mma_wait(0, deps=[t_dk])
        gl.store(dk + row * (H * K) + i_h * K + r_k[:, None] * (H * K) + c_k[None, :],
                 gl.convert_layout(b_dk.to(dk.dtype.element_ty), LK), mask=(r_k < n)[:, None] & (c_k < K)[None, :])
        j += 1
