"""Second stage of the GDN intra-chunk forward: ``u = A (beta v)``, ``w = A (beta exp(g) k)``.

Written from SPEC.md. One task per (chunk, value head, batch row) in the
head-fastest order of ``fused_intra.py``'s grid (``tiles.chunk_of``), with the
varlen and GQA conventions of the seed kernel in ``kkt_solve.py``: value
head ``i_h`` reads key head ``i_h // (H // Hg)``, and with IS_VARLEN the chunk
``(i_n, i_t)`` of ``chunk_indices`` covers rows ``[bos + 64 i_t, min(bos + 64
(i_t + 1), eos))`` of sequence ``i_n``. An entry with ``i_t * BT >= eos - bos``
stores nothing, which is how the padded tail of an in-graph chunk index is ignored.

Parameter order follows jax-triton: inputs, the scalars ``T`` and ``n_tasks``,
then the outputs ``w`` and ``u``, then the constexprs.
"""
import triton
import triton.language as tl

from .tiles import chunk_of, store_w_u


@triton.autotune(
    configs=[
        # Persistent: the launcher's grid is PER_SM programs per SM (all the
        # tasks at most), each walking the tasks with a stride of the grid, so
        # that Triton software-pipelines the loop: the next tasks' tiles load
        # while this one multiplies and stores (with one tile per matrix, K and
        # V up to 128; wider ones keep an inner loop over column tiles, which
        # is pipelined instead). H200, headline shape, torch do_bench, split
        # path (session 14, benchmarks/wu_persistent.py): 2 per SM at 4 warps,
        # 3 stages 0.3934 ms against 0.4016 with one program per task at 8
        # warps (the kernel until then); w/u alone ~0.275 ms, 91% of the copy
        # bandwidth. PER_SM=0 is one program per task, one pass of the loop
        # (num_stages=1: nothing to pipeline), as the kernel was until then.
        triton.Config({"PER_SM": per_sm}, num_warps=num_warps, num_stages=num_stages)
        for per_sm, num_warps, num_stages in [(2, 4, 3), (1, 8, 3), (2, 8, 2), (0, 8, 1), (0, 4, 1)]
    ],
    key=["H", "Hg", "K", "V", "BT", "BK", "BV"],
)
@triton.jit(do_not_specialize=["T", "n_tasks"])
def recompute_w_u_fwd_kernel(
    k,
    v,
    beta,
    g,
    A,
    cu_seqlens,
    chunk_indices,
    T,
    n_tasks,
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
    PER_SM: tl.constexpr,
):
    # Tasks are the head-fastest work list (the seed's kkt_solve grid is
    # chunk-major): the value heads that share one key head run side by side
    # and read its k rows through L2. n_tasks = NT * H * B, with NT the chunks
    # of one batch row (fixed length) or the work list's length (varlen, B = 1).
    NTH = n_tasks if IS_VARLEN else tl.cdiv(T, BT) * H
    for task in tl.range(tl.program_id(0), n_tasks, tl.num_programs(0)):
        i_t, i_h, bos, T_seq = chunk_of(task % NTH, task // NTH, cu_seqlens, chunk_indices, T, H,
                                        IS_VARLEN)
        # No branch for a chunk past its sequence's end (the padded tail of an
        # in-graph work list): its rows are all masked, so it stores nothing,
        # and the loop body stays one block for the pipeliner.
        store_w_u(A, k, v, g, beta, w, u, bos, i_h, T_seq, i_t * BT, H, Hg, K, V, BT, BK, BV, USE_G,
                  DOT_PRECISION)
