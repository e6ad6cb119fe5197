"""The backward's reverse walk in Gluon (sm_90): ``kernels/chunk_bwd_walk.py``'s
row form (``FROM_A``, ``QK_IN``, ``V`` in blocks of ``BV = 32``) with its copies
and products scheduled by hand.

Same math, grid and parameters as the Triton kernel (its docstring; docs/math.md,
"Gradients"): one program of 4 warps per (sequence, value head, block of 32
value columns) walks the sequence's chunks last to first with ``dS [K, BV]``
(float32, the warpgroup MMA's accumulator) on chip::

    dv' = scale M^T do + exp(gl - gc) (k dS)            stored (and dh = dS, entering)
    dS <- gamma dS + scale q^T (e do) - k^T (beta e (A^T dv'))

What Triton 3.6 does not do with that loop, and this kernel does:

- the next chunk's ``q``, ``k``, ``A``, ``beta``, ``gc`` (cp.async into the
  other of two slots) are issued at the top of a step, so they land while
  the step computes. Triton's pipeliner at 2 stages issues them after the
  step's products and awaits them all at the next step's top: each step waited
  a whole load latency (docs/performance.md). ``M`` and ``do``, in one slot
  each, are refilled once the step's first products have read them;
- the chain's products (``k dS``, ``A^T dv'``, ``k^T (...)``) go first to
  the tensor cores, and ``q^T (e do)`` (into ``gamma dS``) runs beside the
  last two;
- ``dh`` and ``dv'`` are stored as 16-byte vectors from the copies the
  products read from shared memory anyway, while those products run (Triton
  converts each through shared memory once more, on the chain).

Shared memory: 109 KB (two programs an SM, as the Triton kernel's 113 KB).
Scope: ``K = 128``, bfloat16 or float16, fixed or packed (cp.async zero-fills
rows past a sequence); fixed length needs ``T > 1`` (jax-triton passes ``T =
1`` as a constant, and with it folded triton 3.6 fails to lower the kernel
to LLVM). ``TRITON_INTERPRET=1`` does not run Gluon kernels.
``gdn_jax.chunk_bwd_launch`` runs the Triton kernel where this one cannot
(``gdn_jax.chunk_bwd_gluon.walk_missing``).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from .gluon_intra import cp_async_load, partition_barrier
from .gluon_walk import BT, LV, MMA, ROWS, S1, S64, S128, state_tile, walk_offsets, walk_program


@gluon.jit
def copy_chunk(q, k, w, beta, gc, q_buf, k_buf, a_buf, b_buf, g_buf, row, n, off_k, r_k, off_a, r_a, r_1,
               H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr):
    """cp.async of the chunk at row ``row`` (int64, ``n`` rows of it in the
    sequence)'s ``q``, ``k [64, K]``, ``A [64, 64]``, ``beta``, ``gc [64]``
    into the slot's buffers (rows past ``n`` as zeros), one commit group
    (offsets from :func:`tile_offsets`)."""
    m_k = (r_k < n)[:, None] & (off_k >= 0)
    cp_async_load(q_buf, q + row * (Hg * K) + off_k, mask=m_k)
    cp_async_load(k_buf, k + row * (Hg * K) + off_k, mask=m_k)
    cp_async_load(a_buf, w + row * (H * BT) + off_a, mask=(r_a < n)[:, None] & (off_a >= 0))
    cp_async_load(b_buf, beta + (row + r_1) * H, mask=r_1 < n)
    cp_async_load(g_buf, gc + (row + r_1) * H, mask=r_1 < n)
    async_copy.commit_group()


@gluon.jit
def copy_block_and_do(qk, do, m_buf, do_buf, row, n, off_a, r_a, off_v, r_v, m_cv,
                      H: gl.constexpr, V: gl.constexpr):
    """cp.async of the chunk's output block ``M [64, 64]`` (``qk``, laid out as
    ``A``) and ``do [64, BV]``, one commit group."""
    cp_async_load(m_buf, qk + row * (H * BT) + off_a, mask=(r_a < n)[:, None] & (off_a >= 0))
    cp_async_load(do_buf, do + row * (H * V) + off_v, mask=(r_v < n)[:, None] & m_cv[None, :])
    async_copy.commit_group()


@gluon.jit(do_not_specialize=["T"])
def gdn_chunk_bwd_walk_gluon_kernel(q, k, w, beta, gc, do, qk, dht, cu_seqlens, chunk_offsets, scale, T,
                                    dv, dh, dh0, H: gl.constexpr, Hg: gl.constexpr, K: gl.constexpr,
                                    V: gl.constexpr, BV: gl.constexpr, USE_DHT: gl.constexpr,
                                    IS_VARLEN: gl.constexpr):
    """``dv [B, T, H, V]`` (the inputs' dtype), ``dh [chunks, H, K, V]`` (the
    inputs' dtype) and ``dh0 [N, H, K, V]`` (float32) of ``q``, ``k [B, T,
    Hg, K]``, ``w`` (``A [B, T, H, 64]``), ``beta``, ``gc [B, T, H]``
    (float32), ``do [B, T, H, V]``, ``qk`` (``M``, laid out as ``A``), ``dht
    [N, H, K, V]`` (float32, read where ``USE_DHT``): as
    ``gdn_chunk_bwd_walk_kernel`` with ``FROM_A``, ``QK_IN``, ``BK = K``;
    grid ``(cdiv(V, BV) H N,)``, 4 warps."""
    gl.static_assert(K == 128)
    gl.static_assert(BV == 32)
    dt: gl.constexpr = q.dtype.element_ty
    i_v, i_h, i_n, i_hk = walk_program(H, Hg, V)
    if IS_VARLEN:
        bos = gl.load(cu_seqlens + i_n).to(gl.int64)
        seq_len = gl.load(cu_seqlens + i_n + 1).to(gl.int64) - bos
        first_chunk = gl.load(chunk_offsets + i_n).to(gl.int64)
    else:
        bos = i_n.to(gl.int64) * T
        seq_len = bos * 0 + T
        first_chunk = i_n.to(gl.int64) * ((T + BT - 1) // BT)
    scale = scale.to(gl.float32)
    o_v = i_v * BV

    s_base, s_tile, s_mask = state_tile(i_n, i_h, o_v, H, K, V, False)  # dht, dh0
    h_base = (first_chunk * H + i_h) * (K * V)
    ds = gl.zeros([K, BV], gl.float32, MMA)
    if USE_DHT:
        ds = gl.load(dht + s_base + s_tile, mask=s_mask, other=0.0)

    q_s = gl.allocate_shared_memory(dt, [2, BT, K], S128)
    k_s = gl.allocate_shared_memory(dt, [2, BT, K], S128)
    a_s = gl.allocate_shared_memory(dt, [2, BT, BT], S128)
    b_s = gl.allocate_shared_memory(gl.float32, [2, BT], S1)
    g_s = gl.allocate_shared_memory(gl.float32, [2, BT], S1)
    m_s = gl.allocate_shared_memory(dt, [BT, BT], S128)  # one slot: refilled after the step's first products
    do_s = gl.allocate_shared_memory(dt, [BT, BV], S64)
    ds_s = gl.allocate_shared_memory(dt, [K, BV], S64)  # dS for k dS (and dh's store), then rows 0..63 hold dv'
    x_s = gl.allocate_shared_memory(dt, [BT, BV], S64)  # scale e do
    y_s = gl.allocate_shared_memory(dt, [BT, BV], S64)  # beta e (A^T dv')
    zero = gl.zeros([BT, BV], gl.float32, MMA)

    # loop-invariant int32 offsets of a chunk's tiles from its first row
    off_k, r_k, off_a, r_a, off_v, r_v, m_cv, r_1, dh_tile, dh_mask = walk_offsets(H, Hg, K, V, i_h, i_hk, o_v)

    n_chunks = (seq_len + BT - 1) // BT
    r_last = (n_chunks - 1) * BT
    if n_chunks > 0:  # (an empty sequence of a packed batch: dh0 = dht)
        copy_chunk(q, k, w, beta + i_h, gc + i_h, q_s.index(0), k_s.index(0), a_s.index(0), b_s.index(0),
                   g_s.index(0), bos + r_last, seq_len - r_last, off_k, r_k, off_a, r_a, r_1, H, Hg, K)
        copy_block_and_do(qk, do, m_s, do_s, bos + r_last, seq_len - r_last, off_a, r_a, off_v, r_v, m_cv, H, V)
    g_last = gl.load(gc + (bos + seq_len - 1) * H + i_h, mask=seq_len > 0, other=0.0)
    for j in range(n_chunks):
        i_c = n_chunks - 1 - j
        r0 = i_c * BT
        row = bos + r0
        s = (j % 2).to(gl.int32)
        async_copy.wait_group(0)  # this chunk's copies
        fence_async_shared()
        partition_barrier()  # ... landed for every warp; every warp is past the last step's products
        g_next = g_last
        if j + 1 < n_chunks:  # the next (earlier) chunk's tiles into the other slot, landing during this step
            copy_chunk(q, k, w, beta + i_h, gc + i_h, q_s.index(1 - s), k_s.index(1 - s), a_s.index(1 - s),
                       b_s.index(1 - s), g_s.index(1 - s), row - BT, BT, off_k, r_k, off_a, r_a, r_1, H, Hg, K)
            g_next = gl.load(gc + (row - 1) * H + i_h)
        b_g = g_s.index(s).load(ROWS)
        b_beta = b_s.index(s).load(ROWS)

        ds_s.store(ds.to(dt))
        b_do = do_s.load(LV).to(gl.float32)
        b_gv = g_s.index(s).load(gl.SliceLayout(1, LV))
        x_s.store((b_do * (scale * gl.exp(b_gv))[:, None]).to(dt))  # scale e do
        fence_async_shared()
        partition_barrier()
        t_kd = warpgroup_mma(k_s.index(s), ds_s, zero, use_acc=False, is_async=True)  # k dS, on the chain
        t_md = warpgroup_mma(m_s.permute((1, 0)), do_s, zero, use_acc=False, is_async=True)  # M^T do
        # the entering state's cotangent, from its copy for k dS, as 16-byte stores
        gl.store(dh + h_base + i_c * (H * K * V) + dh_tile, ds_s.load(LV), mask=dh_mask)
        b_kd, b_md = warpgroup_mma_wait(0, deps=[t_kd, t_md])
        partition_barrier()  # every warp is past M^T do and k dS: their slots take the next chunk's
        if j + 1 < n_chunks:
            copy_block_and_do(qk, do, m_s, do_s, row - BT, BT, off_a, r_a, off_v, r_v, m_cv, H, V)
        b_dv = scale * b_md + gl.exp(g_last - b_g)[:, None] * b_kd  # rows past the end: k, do are 0
        dv_s = ds_s.slice(0, BT, 0)
        dv_s.store(b_dv.to(dt))
        fence_async_shared()
        partition_barrier()
        t_adv = warpgroup_mma(a_s.index(s).permute((1, 0)), dv_s, zero, use_acc=False, is_async=True)  # A^T dv'
        t_ds = warpgroup_mma(q_s.index(s).permute((1, 0)), x_s, ds * gl.exp(g_last), is_async=True)  # off the chain
        gl.store(dv + row * (H * V) + off_v, dv_s.load(LV), mask=(r_v < seq_len - r0)[:, None] & m_cv[None, :])
        b_adv = warpgroup_mma_wait(1, deps=[t_adv])
        y_s.store((b_adv * (-b_beta * gl.exp(b_g))[:, None]).to(dt))
        fence_async_shared()
        partition_barrier()
        b_ds = warpgroup_mma_wait(0, deps=[t_ds])
        ds = warpgroup_mma(k_s.index(s).permute((1, 0)), y_s, b_ds)  # - k^T (beta e (A^T dv'))
        g_last = g_next
    gl.store(dh0 + s_base + s_tile, ds, mask=s_mask)
