"""Experiment (not a shipped path): the split path's two kernels in one launch,
their work interleaved so that the ``A`` builds' compute overlaps the w/u
products' memory traffic.

The split path runs the ``A`` kernel (compute-bound, ~0.17 ms at the
headline shape) and then the w/u kernel (memory-bound, ~0.29 ms at 87% of
copy bandwidth) one after the other. Here one launch of ``2 n`` one-warp
programs (``n`` = chunks x value heads x batch rows) does both kinds of work:
each program takes the next ticket from a counter (so the order in which
programs *start* decides the order of work, not their ids) and a ticket is
either the ``A`` build of work item ``j`` (``kernels/fused_intra.py``'s
``store_chunk_A``) or the w/u products of item ``j`` (``tiles.store_w_u``).
Ticket order: the ``A`` builds of the first ``lag`` items, then w/u of item
``j`` and ``A`` of item ``j + lag`` alternately, then the last ``lag`` w/u
products. A w/u program waits (spins on ``ready[j]``) until ``A`` of its
item is stored; as the ``A`` build's ticket always comes first and tickets
go to programs that are already running, the wait always ends. With
``lag`` about one wave of resident programs, the wait is rare, and ``k`` and
the ``A`` tile are read back from L2 rather than HBM (~1.07 GB from HBM
instead of the split's 1.34).

Under the interpreter programs run one at a time in grid order, so they take
tickets in order and never wait: the tests check the arithmetic, not the
synchronisation. The GPU run (``bench_fwd_intra.py --overlap``) checks its
outputs against the split path's.
"""
from __future__ import annotations

import triton
import triton.language as tl

from gdn_jax.kernels.fused_intra import store_chunk_A
from gdn_jax.kernels.tiles import chunk_of, store_w_u


@triton.jit
def ticket_work(t, n_items, lag):
    """``(is_A, item)`` of ticket ``t`` (see the module docstring)."""
    n_mixed = 2 * (n_items - lag)
    s = t - lag
    is_A = (t < lag) | ((s >= 0) & (s < n_mixed) & (s % 2 == 1))
    item = tl.where(t < lag, t,
                    tl.where(s < n_mixed, tl.where(s % 2 == 1, lag + s // 2, s // 2),
                             n_items - lag + (s - n_mixed)))
    return is_A, item


@triton.jit(do_not_specialize=["T", "n_items", "n_th", "lag"])
def gdn_fwd_intra_overlap_kernel(
    k,
    v,
    g,
    beta,
    cu_seqlens,
    chunk_indices,
    T,
    n_items,
    n_th,
    lag,
    w,
    u,
    A,
    ticket,
    ready,
    H: tl.constexpr,
    Hg: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    BKW: tl.constexpr,
    BVW: tl.constexpr,
    USE_G: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    is_A, item = ticket_work(tl.atomic_add(ticket, 1), n_items, lag)
    i_t, i_h, bos, T = chunk_of(item % n_th, item // n_th, cu_seqlens, chunk_indices, T, H,
                                IS_VARLEN)
    if is_A:
        if i_t * BT < T:
            store_chunk_A(k, g, beta, A, bos, i_h, T, i_t * BT, H, Hg, K, BT, BC, BK, USE_G,
                          DOT_PRECISION)
        # every thread's stores of A, then one release of the flag
        tl.debug_barrier()
        tl.atomic_xchg(ready + item, 1, sem="release", scope="gpu")
    else:
        flag = tl.atomic_add(ready + item, 0, sem="acquire", scope="gpu")
        while flag == 0:
            flag = tl.atomic_add(ready + item, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
        if i_t * BT < T:
            store_w_u(A, k, v, g, beta, w, u, bos, i_h, T, i_t * BT, H, Hg, K, V, BT, BKW, BVW,
                      USE_G, DOT_PRECISION)


def launch_settings(n_items, K, V, lag, BK, wu_tile):
    """``(lag, tiles)`` for a launch of ``n_items`` work items: ``lag`` clamped
    to ``[1, n_items]``, and the ``A`` build's ``BK`` and the w/u products'
    column tiles ``BKW``, ``BVW`` (each at most the head dim's power of two)."""
    tiles = dict(BK=min(BK, triton.next_power_of_2(K)), BKW=min(wu_tile, triton.next_power_of_2(K)),
                 BVW=min(wu_tile, triton.next_power_of_2(V)))
    return max(1, min(lag, n_items)), tiles


def fwd_intra_overlap_torch(k, v, g, beta, cu_seqlens=None, chunk_indices=None, chunk_size=64, *,
                            lag=1056, BK=64, wu_tile=32, num_warps=1, dot_precision="tf32"):
    """``(w, u, A)`` of :func:`gdn_jax.fwd_intra` (torch tensors, as
    ``gdn_jax.torch_launch.fwd_intra_torch``) through the interleaved
    launch. ``lag``: ``A`` builds ahead of their w/u products (at least 1;
    about the resident programs of one wave); ``wu_tile``: the w/u products'
    column tile (at one warp a 64 x 32 float32 accumulator is 64 registers)."""
    import torch

    from gdn_jax.torch_launch import chunks, empty_outputs
    from gdn_jax.triton_launch import BC

    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    chunk_indices, NT = chunks(T, cu_seqlens, chunk_indices, chunk_size, k.device)
    w, u, A = empty_outputs(k, v, chunk_size)
    n_items = NT * H * B
    if n_items == 0:
        return w, u, A
    dummy = torch.zeros(1, dtype=torch.int32, device=k.device)
    ticket = torch.zeros(1, dtype=torch.int32, device=k.device)
    ready = torch.zeros(n_items, dtype=torch.int32, device=k.device)
    lag, tiles = launch_settings(n_items, K, V, lag, BK, wu_tile)
    gdn_fwd_intra_overlap_kernel[(2 * n_items,)](
        k, v, dummy if g is None else g, beta,
        dummy if cu_seqlens is None else cu_seqlens.to(torch.int32),
        dummy if chunk_indices is None else chunk_indices.to(torch.int32),
        T, n_items, NT * H, lag, w, u, A, ticket, ready,
        H=H, Hg=Hg, K=K, V=V, BT=chunk_size, BC=BC, **tiles,
        USE_G=g is not None, IS_VARLEN=cu_seqlens is not None, DOT_PRECISION=dot_precision,
        num_warps=num_warps, num_stages=3)
    return w, u, A


def fwd_intra_overlap_jax(k, v, g, beta, *, lag=1056, BK=64, wu_tile=32, num_warps=1):
    """The same launch from JAX through jax-triton (fixed length, ``g`` given;
    jax arrays shaped as :func:`gdn_jax.fwd_intra`'s): the ticket counter
    and the ready flags are two more outputs, zeroed by jax-triton before the
    launch (``zeroed_outputs``)."""
    import jax
    import jax.numpy as jnp

    from gdn_jax.chunk_indices import cdiv
    from gdn_jax.triton_launch import BC, dot_precision, output_types, triton_call

    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    BT = 64
    n_items = cdiv(T, BT) * H * B
    out = (*output_types(k, v, BT), jax.ShapeDtypeStruct((1,), jnp.int32),
           jax.ShapeDtypeStruct((n_items,), jnp.int32))
    dummy = jnp.zeros((1,), jnp.int32)
    lag, tiles = launch_settings(n_items, K, V, lag, BK, wu_tile)
    w, u, A, _, _ = triton_call(
        k, v, g, beta, dummy, dummy, T, n_items, cdiv(T, BT) * H, lag,
        kernel=gdn_fwd_intra_overlap_kernel, out=out, grid=(2 * n_items,), zeroed_outputs=(3, 4),
        H=H, Hg=Hg, K=K, V=V, BT=BT, BC=BC, **tiles,
        USE_G=True, IS_VARLEN=False, DOT_PRECISION=dot_precision(), num_warps=num_warps, num_stages=3)
    return w, u, A
