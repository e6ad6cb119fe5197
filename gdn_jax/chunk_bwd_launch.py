"""Launch of the backward kernels through jax-triton: the recompute of the
chunk states and ``v'`` (the forward's walk from ``A``), the reverse walk,
the per-chunk gradients and the WY backward (``kernels/chunk_bwd_walk.py``,
``kernels/chunk_bwd_local.py``, ``kernels/wy_bwd.py``; the WY kernel adds the
per-chunk kernel's shares of the gates' cotangent and takes its reverse cumsum
within each chunk), then the sums over GQA heads in jnp. On Hopper the reverse
walk runs in Gluon (``chunk_bwd_gluon``), and so, where switched on, do the
per-chunk and WY kernels (``chunk_bwd_local_gluon``).

What the forward keeps for it: ``A`` of ``fwd_intra`` (``[B, T, H, 64]``),
the output's attention block its walk read (``chunk_qk``, as large; formed
here where not given), the chunk-local gates and, for fixed-length batches,
the states entering each chunk (``[B, T / 64, H, K, V]``, as large as ``v``
at V = 64) and ``v'``, which its walk stores beside the output; where not
given (packed batches) they are recomputed here by the same walk without
the output, as flash-linear-attention does. Both walks read ``A`` in place
of ``w = A (beta e k)`` and ``u = A (beta v)``, which are never built.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .chunk_bwd_gluon import reverse_walk_gluon, reverse_walk_types, walk_missing
from .chunk_bwd_jnp import key_heads
from .chunk_bwd_local_gluon import local_enabled, local_missing, per_chunk_gluon, wy_enabled, wy_gluon
from .chunk_indices import cdiv, chunk_offsets
from .chunk_launch import chunk_fwd_grid, chunk_qk_triton, chunk_walk_triton, programs_bucket
from .triton_launch import check_grid, dot_precision, head_fastest_grid, launch
from .validate import check_kernel_dtypes

BT = 64


def _pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def value_block(V: int, itemsize: int) -> int:
    """The widest ``BV`` of the per-chunk and WY backward kernels: the whole
    ``V`` in one block up to 256 columns of a 2-byte dtype or 128 of float32
    (their V tiles then take what 128 columns of float32 do, which fits an
    sm_90 program's shared memory: 229376 bytes at 4 warps, triton 3.6;
    256 float32 columns asked 393216). ``itemsize``: bytes of k's dtype."""
    return min(_pow2(V), 512 // itemsize)


def value_blocks(K: int, V: int, itemsize: int) -> tuple[int, int, int]:
    """``(BV of the per-chunk kernel, BV of the WY kernel, V_STAGES)``, within
    :func:`value_block`. For 2-byte inputs with ``K <= 128`` and ``64 < V <=
    128``: blocks of 64 columns in a loop Triton software-pipelines at 2
    stages (``V_STAGES``; on an H100, triton 3.6, B=8 T=4096 H=32 K=V=128,
    torch launch, ``benchmarks/chunk_bwd_probe.py``: per-chunk 1.275 ms
    against 1.477 in one unrolled block, WY 0.904 against 1.123). Else, as
    measured on the H200 (triton 3.6, bf16), unrolled: the per-chunk kernel
    at most 128 columns (0.659 ms against 0.718 in one block at K = V = 256,
    B=2 T=4096 H=16, torch launch); the WY kernel the widest block (at B=8
    T=4096 H=32, unrolled blocks of 64 took 0.970 against 1.036 ms from
    torch but 0.905 against 0.874 under JAX, ``benchmarks/kernel_breakdown.py``)."""
    widest = value_block(V, itemsize)
    if itemsize == 2 and K <= 128 and 64 < _pow2(V) <= 128:
        return 64, 64, 2
    return min(widest, 128), widest, 1


def partials_in_input_dtype(dtype_name: str) -> bool:
    """Whether the kernels write the per-value-head partials of ``dq`` and
    ``dk`` (summed over GQA heads and, for ``dk``, the per-chunk and WY
    kernels' shares, in float32) in the inputs' dtype: for bfloat16, which
    halves the bytes the kernels write and the sums read (float32's range:
    no overflow); float32 else (float16's range could overflow where the
    shares cancel)."""
    return dtype_name == "bfloat16"


def chunk_bwd_triton(q, k, v, gc, beta, A, initial_state, do, dht, cu_seqlens=None,
                     chunk_indices=None, *, scale, qk=None, h=None, v_new=None):
    """``(dq, dk, dv, da, dbeta, dh0)`` of the chunked forward on the GPU,
    arguments and results as :func:`gdn_jax.chunk_bwd_jnp.chunk_bwd_per_step_jnp`
    (``initial_state`` and ``dht`` may be None: zeros; ``da [B, T, H]`` the
    per-step gates' cotangent); ``dq``, ``dk``, ``dv`` in their inputs'
    dtypes, the rest float32. ``qk``: the forward's
    output block (:func:`gdn_jax.chunk_launch.chunk_qk_triton` on these ``q,
    k, gc``), or None (formed here); ``h, v_new``: the forward's chunk states
    ``[B, cdiv(T, 64), H, K, V]`` and ``v' [B, T, H, V]`` in k's dtype
    (:func:`gdn_jax.chunk_launch.chunk_fwd_triton`'s ``return_states``, fixed
    length), or None (recomputed here)."""
    check_kernel_dtypes("chunk_gated_delta_rule", q=q, k=k, v=v, do=do)
    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    varlen = cu_seqlens is not None
    N = B if not varlen else cu_seqlens.shape[0] - 1
    f32 = jnp.float32
    if B * T * H == 0:
        zeros = lambda x: jnp.zeros(x.shape, x.dtype)  # noqa: E731
        dh0 = jnp.zeros((N, H, K, V), f32) if dht is None else dht.astype(f32)
        return zeros(q), zeros(k), zeros(v), jnp.zeros(gc.shape, f32), jnp.zeros(beta.shape, f32), dh0
    NT = chunk_indices.shape[0] if varlen else cdiv(T, BT)
    grid = head_fastest_grid(NT, H, B)
    BK = _pow2(K)
    BKl = min(64, BK)  # the per-chunk kernel's K blocks, on axis 0 with the chunks and heads
    NK = cdiv(K, BKl)
    BVl, _, v_stages = value_blocks(K, V, k.dtype.itemsize)  # the per-chunk kernel's V blocks
    check_grid("backward", (grid[0] * NK, grid[1]),
               ("chunks * value heads * K blocks (NT * H * NK)", "batch rows B"))
    dummy = jnp.zeros((1,), jnp.int32)
    cu = cu_seqlens if varlen else dummy
    ci = chunk_indices if varlen else dummy
    offsets = chunk_offsets(cu_seqlens) if varlen else None
    prec = dot_precision()

    beta32 = beta.astype(f32)
    if h is None:
        _, _, h, v_new = chunk_walk_triton(k, k, A, v, gc, initial_state, cu_seqlens, offsets, scale=scale,
                                           write_o=False, store_final=False, store_h=True, store_v=True,
                                           beta=beta32, chunk_indices=chunk_indices)
    else:
        assert not varlen, "a packed batch's chunk states are recomputed"
        h = h.reshape((B * NT,) + h.shape[2:])
    if qk is None:
        qk = chunk_qk_triton(q, k, gc, cu_seqlens, chunk_indices)
    from .kernels.chunk_bwd_local import gdn_chunk_bwd_local_kernel

    # dv' in k's dtype: both kernels that read it round it to that dtype for
    # their dots (the per-chunk kernel to k's, the WY one to A's, which is
    # k's), so storing it rounded gives the same bits at half the bytes
    walk = reverse_walk_gluon if walk_missing(k.dtype, K, T, varlen) is None else reverse_walk_triton
    dv_new, dh, dh0 = walk(q, k, A, beta32, gc, do, qk, dht, cu_seqlens, offsets, scale=scale, N=N,
                           chunks=h.shape[0])
    part = k.dtype if partials_in_input_dtype(k.dtype.name) else f32
    per_head_k = jax.ShapeDtypeStruct((B, T, H, K), part)
    local_types = (per_head_k, per_head_k, jax.ShapeDtypeStruct((B, T, H, K), k.dtype),
                   jax.ShapeDtypeStruct((NK, B, T, H), f32))
    gluon = local_missing(k.dtype, K, V, T, varlen) is None  # where the switches below may take Gluon
    if local_enabled() and gluon:
        dq, dk, dw, dg = per_chunk_gluon(q, k, v_new, gc, do, dv_new, h, dh, cu_seqlens, chunk_indices,
                                         scale=scale, out=local_types)
    else:
        dq, dk, dw, dg = launch(
            "chunk_bwd_local", gdn_chunk_bwd_local_kernel,
            (q, k, v_new, gc, do, dv_new, h, dh, cu, ci, float(scale), T), out=local_types,
            grid=(grid[0] * NK, grid[1]), H=H, Hg=Hg, K=K, V=V, BT=BT, BK=BKl, BV=BVl, IS_VARLEN=varlen,
            DOT_PRECISION=prec, V_STAGES=v_stages)
    if wy_enabled() and gluon:
        dk_wy, dv, dbeta, da = wy_gluon(k, v, beta32, gc, A, dw, dv_new, dg, cu_seqlens, chunk_indices,
                                        out=wy_bwd_types(k, v, beta, gc))
    else:
        dk_wy, dv, dbeta, da = wy_bwd_launch(k, v, beta, gc, A, dw, dv_new, None, cu_seqlens, chunk_indices,
                                             dgc_shares=dg)

    return (key_heads(dq, Hg, q.dtype), key_heads(dk.astype(f32) + dk_wy.astype(f32), Hg, k.dtype), dv,
            da, dbeta, dh0)


def reverse_walk_triton(q, k, A, beta, gc, do, qk, dht, cu_seqlens, offsets, *, scale, N: int, chunks: int):
    """``(dv', dh, dh0)`` of the reverse walk from the Triton kernel
    (``kernels/chunk_bwd_walk.py``, from ``A`` and the output block ``qk``),
    arguments and results as :func:`gdn_jax.chunk_bwd_gluon.reverse_walk_gluon`."""
    from .kernels.chunk_bwd_walk import gdn_chunk_bwd_walk_kernel

    B, T, Hg, K = k.shape
    H, V = do.shape[2], do.shape[3]
    dummy = jnp.zeros((1,), jnp.int32)
    f32 = jnp.float32
    return launch(
        "chunk_bwd_walk", gdn_chunk_bwd_walk_kernel,
        (q, k, A, beta, gc, do, qk, dummy if dht is None else dht.astype(f32),
         dummy if cu_seqlens is None else cu_seqlens, dummy if offsets is None else offsets, float(scale), T),
        out=reverse_walk_types(k, do, N, chunks),
        grid=lambda meta: chunk_fwd_grid(N, H, V, meta["BV"]), tune_key=("programs", programs_bucket(N, H)),
        H=H, Hg=Hg, K=K, V=V, BT=BT, BK=_pow2(K), USE_DHT=dht is not None, IS_VARLEN=cu_seqlens is not None,
        DOT_PRECISION=dot_precision(), QK_IN=True, FROM_A=True)


def wy_bwd_types(k, v, beta, gc):
    """The WY kernel's results' types, either kernel's: ``dk [B, T, H, K]``
    (bfloat16 for bfloat16 inputs, else float32), ``dv`` as ``v``, ``dbeta``
    and ``dgc`` float32 as ``beta`` and ``gc``."""
    B, T, _, K = k.shape
    H = v.shape[2]
    part = k.dtype if partials_in_input_dtype(k.dtype.name) else jnp.float32
    return (jax.ShapeDtypeStruct((B, T, H, K), part), jax.ShapeDtypeStruct(v.shape, v.dtype),
            jax.ShapeDtypeStruct(beta.shape, jnp.float32), jax.ShapeDtypeStruct(gc.shape, jnp.float32))


def wy_bwd_launch(k, v, beta, gc, A, dw, du, dA=None, cu_seqlens=None, chunk_indices=None, dgc_shares=None):
    """``(dk, dv, dbeta, dgc)`` through ``fwd_intra``'s ``w``, ``u`` (and ``A``
    where ``dA`` is given) from the WY kernel (``kernels/wy_bwd.py``): ``dk``
    per value head ``[B, T, H, K]`` (bfloat16 for bfloat16 inputs, else
    float32), ``dv`` in v's dtype, ``dbeta`` and ``dgc`` float32. ``dw [B,
    T, H, K]``, ``du [B, T, H, V]``, ``dA [B, T, H, 64]``: the cotangents,
    laid out as ``w``, ``u``, ``A``; ``gc`` the chunk-local cumulative gates.
    ``dgc_shares [NK, B, T, H]`` (float32): more of ``dgc`` (the per-chunk
    kernel's), added; the last result is then the per-step gates' cotangent
    ``da``, the reverse cumsum of the whole ``dgc`` within each chunk."""
    from .kernels.wy_bwd import gdn_wy_bwd_kernel

    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    varlen = cu_seqlens is not None
    NT = chunk_indices.shape[0] if varlen else cdiv(T, BT)
    grid = head_fastest_grid(NT, H, B)
    check_grid("backward", grid, ("chunks * value heads (NT * H)", "batch rows B"))
    dummy = jnp.zeros((1,), jnp.int32)
    f32 = jnp.float32
    _, BVw, v_stages = value_blocks(K, V, k.dtype.itemsize)
    return launch(
        "wy_bwd", gdn_wy_bwd_kernel,
        (k, v, beta, gc, A, dw, du, dummy if dA is None else dA,
         jnp.zeros((1,), f32) if dgc_shares is None else dgc_shares, cu_seqlens if varlen else dummy,
         chunk_indices if varlen else dummy, T),
        out=wy_bwd_types(k, v, beta, gc),
        grid=grid, H=H, Hg=Hg, K=K, V=V, BT=BT, BK=_pow2(K), BV=BVw, IS_VARLEN=varlen,
        DOT_PRECISION=dot_precision(), V_STAGES=v_stages, DA_IN=dA is not None,
        NK_IN=0 if dgc_shares is None else dgc_shares.shape[0], REV_CUMSUM=dgc_shares is not None)
