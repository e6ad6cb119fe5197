"""Second stage of the GDN intra-chunk forward: ``u = A (beta v)``, ``w = A (beta exp(g) k)``.

Written from SPEC.md. One program per (chunk, value head, batch row), the same
grid, varlen and GQA conventions as the seed kernel in ``kkt_solve.py``: value
head ``i_h`` reads key head ``i_h // (H // Hg)``, and with IS_VARLEN the chunk
``(i_n, i_t)`` of ``chunk_indices`` covers rows ``[bos + 64 i_t, min(bos + 64
(i_t + 1), eos))`` of sequence ``i_n``. An entry with ``i_t * BT >= eos - bos``
is skipped, which is how the padded tail of an in-graph chunk index is ignored.

Parameter order follows jax-triton: inputs, the scalar ``T``, then the outputs
``w`` and ``u``, then the constexprs.
"""
import triton
import triton.language as tl


@triton.autotune(
    configs=[
        triton.Config({}, num_warps=num_warps, num_stages=num_stages)
        for num_warps in [2, 4, 8]
        for num_stages in [2, 3, 4]
    ],
    key=["H", "Hg", "K", "V", "BT", "BK", "BV"],
)
@triton.jit(do_not_specialize=["T"])
def recompute_w_u_fwd_kernel(
    k,
    v,
    beta,
    g,
    A,
    cu_seqlens,
    chunk_indices,
    T,
    w,
    u,
    H: tl.constexpr,
    Hg: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_G: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    i_t, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)

    # 64-bit `bos`: offsets such as `bos * H * V` pass 2^31 on large inputs.
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_t * 2).to(tl.int32)
        i_t = tl.load(chunk_indices + i_t * 2 + 1).to(tl.int32)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = eos - bos
    else:
        bos, eos = i_b.to(tl.int64) * T, i_b.to(tl.int64) * T + T

    if i_t * BT >= T:
        return

    # Per-row factors of this chunk: beta, and beta * exp(g) for the keys.
    p_beta = tl.make_block_ptr(beta + bos * H + i_h, (T,), (H,), (i_t * BT,), (BT,), (0,))
    b_beta = tl.load(p_beta, boundary_check=(0,)).to(tl.float32)
    b_kscale = b_beta
    if USE_G:
        p_g = tl.make_block_ptr(g + bos * H + i_h, (T,), (H,), (i_t * BT,), (BT,), (0,))
        b_kscale = b_beta * tl.exp(tl.load(p_g, boundary_check=(0,)).to(tl.float32))

    # The chunk's (I + L)^-1, rows past the sequence end read as zero.
    p_A = tl.make_block_ptr(
        A + (bos * H + i_h) * BT, (T, BT), (H * BT, 1), (i_t * BT, 0), (BT, BT), (1, 0)
    )
    b_A = tl.load(p_A, boundary_check=(0, 1))

    for i_v in range(tl.cdiv(V, BV)):
        p_v = tl.make_block_ptr(
            v + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0)
        )
        p_u = tl.make_block_ptr(
            u + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0)
        )
        b_v = tl.load(p_v, boundary_check=(0, 1))
        b_vb = (b_v * b_beta[:, None]).to(b_A.dtype)
        b_u = tl.dot(b_A, b_vb, input_precision=DOT_PRECISION)
        tl.store(p_u, b_u.to(p_u.dtype.element_ty), boundary_check=(0, 1))

    for i_k in range(tl.cdiv(K, BK)):
        p_k = tl.make_block_ptr(
            k + (bos * Hg + i_h // (H // Hg)) * K,
            (T, K),
            (Hg * K, 1),
            (i_t * BT, i_k * BK),
            (BT, BK),
            (1, 0),
        )
        p_w = tl.make_block_ptr(
            w + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0)
        )
        b_k = tl.load(p_k, boundary_check=(0, 1))
        b_kb = (b_k * b_kscale[:, None]).to(b_A.dtype)
        b_w = tl.dot(b_A, b_kb, input_precision=DOT_PRECISION)
        tl.store(p_w, b_w.to(p_w.dtype.element_ty), boundary_check=(0, 1))
