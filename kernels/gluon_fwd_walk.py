"""The forward's walk storing the chunk states and ``v'`` (the forward of
``jax.grad``) in Gluon (sm_90): ``kernels/chunk_fwd.py``'s row form
(``FROM_A``, ``SUM_G``, ``STORE_H``, ``STORE_V``, ``V`` in blocks of ``BV = 32``)
with its copies and products scheduled by hand, as ``gluon_bwd_walk.py`` does
for the backward's reverse walk.

Same math, grid and parameters as the Triton kernel (its docstring; docs/math.md,
the chunk form): one program of 4 warps per (sequence, value head, block of
32 value columns) walks the sequence's chunks in order with the state ``S [K,
BV]`` (float32, the warpgroup MMA's accumulator) on chip::

    h[chunk] = S                                            stored
    v'       = A (beta (v - exp(gc) (k S)))                 stored
    o        = scale (exp(gc) (q S) + M v')                 stored (M: chunk_qk's block)
    S       <- exp(gl) S + k^T (exp(gl - gc) v')

with ``gc`` the cumulative sum of the per-step gates within the chunk (taken
here) and ``gl`` its last row's.

What Triton 3.6 does not do with that loop, and this kernel does:

- the next chunk's ``k``, ``A``, ``M``, ``v``, ``beta`` and gates (cp.async into
  the other of two slots) are issued at the top of a step, so they land while
  the step computes (Triton's pipeliner issues them after the step's products
  and awaits them at the next step's top); ``q``, in one slot, is refilled
  once the step's ``q S`` has read it;
- the chain's products (``k S``, ``A (...)``, ``k^T (...)``) go first to the
  tensor cores, ``q S`` beside ``k S`` and ``M v'`` beside the state's update;
- ``h``, ``v'`` and ``o`` are stored as 16-byte vectors from shared-memory
  copies (those of ``S`` and ``v'`` the products read anyway).

Shared memory: 105 KB (two programs an SM). Scope: ``K = 128``, bfloat16 or
float16, fixed length with ``T > 1`` (jax-triton passes ``T = 1`` as a
constant), ``SUM_G``, ``FROM_A``, the output and both stores (the forward of
``jax.grad``); ``gdn_jax.chunk_launch`` runs the Triton kernel elsewhere
(``gdn_jax.chunk_fwd_gluon.storing_walk_missing``). ``TRITON_INTERPRET=1``
does not run Gluon kernels.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from .gluon_intra import cp_async_load, partition_barrier
from .gluon_walk import BT, L1, LV, MMA, ROWS, S1, S64, S128, add, state_tile, walk_offsets, walk_program


@gluon.jit
def copy_chunk(k, w, qk, v, beta, g, k_buf, a_buf, m_buf, v_buf, b_buf, g_buf, row, n, off_k, r_k, off_a, r_a, off_v,
               r_v, m_cv, r_1, H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr, V: gl.constexpr):
    """cp.async of the chunk at row ``row`` (int64, ``n`` rows of it in the
    sequence)'s ``k [64, K]``, ``A``, ``M [64, 64]``, ``v [64, BV]``, ``beta``
    and the gates ``[64]`` into the slot's buffers (rows past ``n`` as
    zeros), one commit group (offsets from ``tile_offsets``)."""
    cp_async_load(k_buf, k + row * (Hg * K) + off_k, mask=(r_k < n)[:, None] & (off_k >= 0))
    m_a = (r_a < n)[:, None] & (off_a >= 0)
    cp_async_load(a_buf, w + row * (H * BT) + off_a, mask=m_a)
    cp_async_load(m_buf, qk + row * (H * BT) + off_a, mask=m_a)
    cp_async_load(v_buf, v + row * (H * V) + off_v, mask=(r_v < n)[:, None] & m_cv[None, :])
    cp_async_load(b_buf, beta + (row + r_1) * H, mask=r_1 < n)
    cp_async_load(g_buf, g + (row + r_1) * H, mask=r_1 < n)
    async_copy.commit_group()


@gluon.jit(do_not_specialize=["T"])
def gdn_chunk_fwd_storing_gluon_kernel(q, k, w, u, gc, beta, qk, h0, scale, T, o, ht, h, v_new,
                                       H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                                       BV: gl.constexpr, USE_H0: gl.constexpr, STORE_FINAL: gl.constexpr,
                                       STATE_V_FIRST: gl.constexpr):
    """``o [B, T, H, V]``, ``ht [B, H, K, V]`` (``[B, H, V, K]`` with
    ``STATE_V_FIRST``; float32, written where ``STORE_FINAL``), ``h [B *
    cdiv(T, 64), H, K, V]`` and ``v_new [B, T, H, V]`` (the inputs' dtype) of
    ``q``, ``k [B, T, Hg, K]``, ``w`` (``A [B, T, H, 64]``), ``u`` (``v [B, T,
    H, V]``), ``gc`` (the per-step log gates ``[B, T, H]``, float32),
    ``beta [B, T, H]`` (float32), ``qk`` (``M``, laid out as ``A``, of the
    gates' chunk sums), ``h0`` (read where ``USE_H0``, the layout of ``ht``):
    as ``gdn_chunk_fwd_kernel`` with ``FROM_A``, ``SUM_G``, ``WRITE_O``,
    ``STORE_H``, ``STORE_V``, ``BK = K``, fixed length; grid ``(cdiv(V, BV)
    H B,)``, 4 warps."""
    gl.static_assert(K == 128)
    gl.static_assert(BV == 32)
    dt: gl.constexpr = q.dtype.element_ty
    i_v, i_h, i_n, i_hk = walk_program(H, Hg, V)
    bos = i_n.to(gl.int64) * T
    n_chunks = (T + BT - 1) // BT
    first_chunk = i_n.to(gl.int64) * n_chunks
    scale = scale.to(gl.float32)
    o_v = i_v * BV

    s_base, s_tile, s_mask = state_tile(i_n, i_h, o_v, H, K, V, STATE_V_FIRST)  # h0, ht
    S = gl.zeros([K, BV], gl.float32, MMA)
    if USE_H0:
        S = gl.load(h0 + s_base + s_tile, mask=s_mask, other=0.0)

    q_s = gl.allocate_shared_memory(dt, [BT, K], S128)  # one slot: refilled once q S has read it
    k_s = gl.allocate_shared_memory(dt, [2, BT, K], S128)
    a_s = gl.allocate_shared_memory(dt, [2, BT, BT], S128)
    m_s = gl.allocate_shared_memory(dt, [2, BT, BT], S128)
    v_s = gl.allocate_shared_memory(dt, [2, BT, BV], S64)
    b_s = gl.allocate_shared_memory(gl.float32, [2, BT], S1)
    g_s = gl.allocate_shared_memory(gl.float32, [2, BT], S1)
    st_s = gl.allocate_shared_memory(dt, [K, BV], S64)  # S for k S, q S (and h's store)
    vn_s = gl.allocate_shared_memory(dt, [BT, BV], S64)  # v' for M v' (and its store)
    x_s = gl.allocate_shared_memory(dt, [BT, BV], S64)  # beta (v - e k S), then exp(gl - gc) v', then o
    zero = gl.zeros([BT, BV], gl.float32, MMA)

    # loop-invariant int32 offsets of a chunk's tiles from its first row
    off_q, r_q, off_a, r_a, off_v, r_v, m_cv, r_1, h_tile, h_mask = walk_offsets(H, Hg, K, V, i_h, i_hk, o_v)
    r_g = gl.arange(0, BT, layout=ROWS)

    copy_chunk(k, w, qk, u, beta + i_h, gc + i_h, k_s.index(0), a_s.index(0), m_s.index(0), v_s.index(0),
               b_s.index(0), g_s.index(0), bos, T, off_q, r_q, off_a, r_a, off_v, r_v, m_cv, r_1, H, Hg, K, V)
    cp_async_load(q_s, q + bos * (Hg * K) + off_q, mask=(r_q < T)[:, None] & (off_q >= 0))
    async_copy.commit_group()
    for i_c in range(n_chunks):
        r0 = i_c * BT
        row = bos + r0
        n = T - r0  # rows of the sequence from this chunk's first (more than 64 before the last)
        s = (i_c % 2).to(gl.int32)
        async_copy.wait_group(0)  # this chunk's copies
        fence_async_shared()
        partition_barrier()  # ... landed for every warp; every warp is past the last step's products
        if i_c + 1 < n_chunks:  # the next chunk's tiles into the other slot, landing during this step
            copy_chunk(k, w, qk, u, beta + i_h, gc + i_h, k_s.index(1 - s), a_s.index(1 - s), m_s.index(1 - s),
                       v_s.index(1 - s), b_s.index(1 - s), g_s.index(1 - s), row + BT, n - BT, off_q, r_q, off_a,
                       r_a, off_v, r_v, m_cv, r_1, H, Hg, K, V)
        st_s.store(S.to(dt))
        fence_async_shared()
        partition_barrier()
        t_ks = warpgroup_mma(k_s.index(s), st_s, zero, use_acc=False, is_async=True)  # k S, on the chain
        t_qs = warpgroup_mma(q_s, st_s, zero, use_acc=False, is_async=True)  # q S
        # the gates summed within the chunk (rows past the end hold 0: the sums stay flat there)
        b_g = gl.convert_layout(gl.associative_scan(g_s.index(s).load(L1), 0, add), ROWS)
        g_last = gl.sum(gl.where(r_g == BT - 1, b_g, 0.0), 0)
        b_beta = b_s.index(s).load(ROWS)
        # the state entering this chunk, from its copy for k S, as 16-byte stores
        gl.store(h + ((first_chunk + i_c) * H + i_h) * (K * V) + h_tile, st_s.load(LV), mask=h_mask)
        b_v = v_s.index(s).load(MMA).to(gl.float32)
        b_ks, b_qs = warpgroup_mma_wait(0, deps=[t_ks, t_qs])
        partition_barrier()  # every warp is past q S: q's slot takes the next chunk's
        if i_c + 1 < n_chunks:
            cp_async_load(q_s, q + (row + BT) * (Hg * K) + off_q, mask=(r_q < n - BT)[:, None] & (off_q >= 0))
            async_copy.commit_group()
        b_e = gl.exp(b_g)
        x_s.store(((b_v - b_e[:, None] * b_ks) * b_beta[:, None]).to(dt))
        fence_async_shared()
        partition_barrier()
        b_vn = warpgroup_mma(a_s.index(s), x_s, zero, use_acc=False)  # v' = A (beta (v - e k S))
        vn_s.store(b_vn.to(dt))
        partition_barrier()  # every warp is past A (...): x_s takes exp(gl - gc) v'
        x_s.store((b_vn * gl.exp(g_last - b_g)[:, None]).to(dt))
        fence_async_shared()
        partition_barrier()
        t_s = warpgroup_mma(k_s.index(s).permute((1, 0)), x_s, S * gl.exp(g_last), is_async=True)  # the chain
        t_o = warpgroup_mma(m_s.index(s), vn_s, b_qs * b_e[:, None], is_async=True)  # M v' + e (q S)
        gl.store(v_new + row * (H * V) + off_v, vn_s.load(LV), mask=(r_v < n)[:, None] & m_cv[None, :])
        S = warpgroup_mma_wait(1, deps=[t_s])
        b_o = warpgroup_mma_wait(0, deps=[t_o])
        partition_barrier()  # every warp is past k^T (...): x_s takes o
        x_s.store((b_o * scale).to(dt))
        partition_barrier()
        gl.store(o + row * (H * V) + off_v, x_s.load(LV), mask=(r_v < n)[:, None] & m_cv[None, :])
    if STORE_FINAL:
        gl.store(ht + s_base + s_tile, S, mask=s_mask)
