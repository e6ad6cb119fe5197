"""Second stage of the GDN intra-chunk forward: ``u = A (beta v)``, ``w = A (beta exp(g) k)``.

Written from docs/math.md. One program per (chunk, value head, batch row) on the
head-fastest grid of ``fused_intra.py`` (``tiles.program_chunk``), with the
varlen and GQA conventions of the seed kernel in ``kkt_solve.py``: value
head ``i_h`` reads key head ``i_h // (H // Hg)``, and with IS_VARLEN the chunk
``(i_n, i_t)`` of ``chunk_indices`` covers rows ``[bos + 64 i_t, min(bos + 64
(i_t + 1), eos))`` of sequence ``i_n``. An entry with ``i_t * BT >= eos - bos``
is skipped, which is how the padded tail of an in-graph chunk index is ignored.

Parameter order follows jax-triton: inputs, the scalar ``T``, then the outputs
``w`` and ``u``, then the constexprs.
"""
import triton
import triton.language as tl

from .tiles import program_chunk, store_w_u


@triton.autotune(
    configs=[
        # One num_stages: stages 2, 3 and 4 compile to the same PTX (triton 3.6
        # and 3.8), see gdn_fwd_intra_fused_kernel.
        triton.Config({}, num_warps=num_warps, num_stages=3)
        for num_warps in [2, 4, 8]
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
    # Head fastest (the seed's kkt_solve grid is chunk-major): the value heads
    # that share one key head run side by side and read its k rows through L2.
    i_t, i_h, bos, T = program_chunk(cu_seqlens, chunk_indices, T, H, IS_VARLEN)
    if i_t * BT >= T:
        return

    store_w_u(A, k, v, g, beta, w, u, bos, i_h, T, i_t * BT, H, Hg, K, V, BT, BK, BV, USE_G,
              DOT_PRECISION)
