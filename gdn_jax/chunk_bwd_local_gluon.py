"""Launch of the backward's per-chunk kernels in Gluon, the per-chunk gradients
(``kernels/gluon_bwd_local.py``) and the WY backward (``kernels/gluon_wy_bwd.py``),
through jax-triton 0.4, which ``chunk_bwd_launch.chunk_bwd_triton`` takes in
place of the Triton kernels (``kernels/chunk_bwd_local.py``, ``wy_bwd.py``)
where :func:`local_missing` says they can: a Hopper GPU, jax-triton >= 0.4,
``K = V = 128``, bfloat16 or float16. Each computes what its Triton kernel does
(docs/design.md); each is persistent, one program an SM, and copies the next
work item's tiles while it computes this one's (docs/performance.md).

Off unless ``GDN_JAX_GLUON_BWD_LOCAL=1`` (the per-chunk kernel) and
``GDN_JAX_GLUON_WY=1`` (the WY kernel) (:func:`local_enabled`,
:func:`wy_enabled`) until they are measured against the Triton kernels on the GPU.
"""
from __future__ import annotations

import os

import jax.numpy as jnp

from .chunk_indices import cdiv
from .gluon_launch import compile_gluon_as_triton_does, compile_gluon_offline, gluon_environment_missing, sm_count
from .triton_launch import triton_call

BK = 64  # key columns of a work item (the Triton kernel's K blocks)


def local_enabled() -> bool:
    """Whether ``GDN_JAX_GLUON_BWD_LOCAL=1`` asks ``chunk_bwd_triton`` for the
    Gluon per-chunk kernel where it can run (off by default: not yet timed)."""
    return os.environ.get("GDN_JAX_GLUON_BWD_LOCAL", "0") == "1"


def wy_enabled() -> bool:
    """Whether ``GDN_JAX_GLUON_WY=1`` asks ``chunk_bwd_triton`` for the Gluon
    WY kernel where it can run (off by default: not yet timed)."""
    return os.environ.get("GDN_JAX_GLUON_WY", "0") == "1"


def local_missing(dtype, K: int, V: int, T: int, varlen: bool) -> str | None:
    """Why the Gluon per-chunk and WY kernels cannot take a launch of inputs of
    ``dtype`` with ``K`` key and ``V`` value columns and ``T`` rows per batch
    row (``varlen``: a packed batch) here, or None when it can."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"it takes bfloat16 or float16 inputs, got {jnp.dtype(dtype).name}"
    if K != 128 or V != 128:
        return f"it takes K = V = 128, got K={K}, V={V}"
    if T == 1 and not varlen:
        return "it takes T > 1 at fixed length (jax-triton passes T = 1 as a constant)"
    return gluon_environment_missing("gluon_bwd_local", False) or gluon_environment_missing("gluon_wy_bwd", False)


def persistent_launch(B: int, T: int, H: int, blocks: int, cu_seqlens, chunk_indices):
    """``(cu_seqlens, chunk_indices, grid, constexprs)`` of either kernel's
    launch over ``B`` rows of ``T`` (packed where ``cu_seqlens`` is given)
    with ``blocks`` work items per chunk and value head: the work list (1-element
    placeholders at fixed length), at most one program an SM, and the
    constexprs ``B``, ``NTL`` (chunks per batch row, or the packed work
    list's rows), ``IS_VARLEN``. Readies jax-triton for a Gluon launch."""
    compile_gluon_as_triton_does()
    varlen = cu_seqlens is not None
    NTL = chunk_indices.shape[0] if varlen else cdiv(T, 64)
    dummy = jnp.zeros((1,), jnp.int32)
    grid = (max(1, min(NTL * H * blocks * B, sm_count())),)
    return (cu_seqlens if varlen else dummy, chunk_indices if varlen else dummy, grid,
            dict(B=B, NTL=NTL, IS_VARLEN=varlen))


def per_chunk_gluon(q, k, v_new, gc, do, dv_new, h, dh, cu_seqlens, chunk_indices, *, scale, out):
    """``(dq, dk, dw, dg)`` of the per-chunk kernel, of the types ``out`` (the
    Triton launch's in ``chunk_bwd_triton``: ``dq``, ``dk``, ``dw [B, T, H,
    K]``, ``dg [K / 64, B, T, H]`` float32). ``q``, ``k [B, T, Hg, K]``;
    ``v_new``, ``do``, ``dv_new [B, T, H, V]``; ``gc [B, T, H]`` float32;
    ``h``, ``dh [chunks, H, K, V]``; ``cu_seqlens`` and ``chunk_indices``
    int32 or None (fixed length)."""
    from .kernels.gluon_bwd_local import gdn_chunk_bwd_local_gluon_kernel

    B, T, Hg, K = k.shape
    H, V = v_new.shape[2], v_new.shape[3]
    cu, ci, grid, constexprs = persistent_launch(B, T, H, cdiv(K, BK), cu_seqlens, chunk_indices)
    return triton_call(
        q, k, v_new, gc, do, dv_new, h, dh, cu, ci, float(scale), T, kernel=gdn_chunk_bwd_local_gluon_kernel,
        out=out, grid=grid, num_warps=4, H=H, Hg=Hg, K=K, V=V, **constexprs)


def wy_gluon(k, v, beta, gc, A, dw, du, dgc_shares, cu_seqlens, chunk_indices, *, out):
    """``(dk, dv, dbeta, da)`` of the WY kernel as the chunk backward launches
    it (the per-chunk kernel's ``dgc_shares [NK, B, T, H]`` float32 added,
    ``da`` the per-step gates' cotangent), of the types ``out`` (the Triton
    launch's, ``chunk_bwd_launch.wy_bwd_types``). ``k [B, T, Hg, K]``; ``v``,
    ``du [B, T, H, V]``; ``beta``, ``gc [B, T, H]`` float32; ``A [B, T, H,
    64]``; ``dw [B, T, H, K]``; ``cu_seqlens`` and ``chunk_indices`` int32
    or None (fixed length)."""
    from .kernels.gluon_wy_bwd import gdn_wy_bwd_gluon_kernel

    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    cu, ci, grid, constexprs = persistent_launch(B, T, H, 1, cu_seqlens, chunk_indices)
    return triton_call(
        k, v, beta, gc, A, dw, du, dgc_shares, cu, ci, T, kernel=gdn_wy_bwd_gluon_kernel, out=out, grid=grid,
        num_warps=4, H=H, Hg=Hg, K=K, V=V, NK_IN=dgc_shares.shape[0], **constexprs)


def compile_offline(dtype: str = "bfloat16", varlen: bool = False, B: int = 8, T: int = 4096, H: int = 32,
                    Hg: int = 16):
    """The kernel compiled for ``sm_90a`` without a GPU (the installed triton's
    compiler and ptxas; ``dtype``: ``"bfloat16"`` or ``"float16"``), at ``B``
    rows of ``T`` (a packed batch of ``T`` rows in ``cdiv(T, 64) + B``
    chunks with ``varlen``): the ``CompiledKernel`` (``.asm["ptx"]``,
    ``.metadata.shared``)."""
    from .kernels.gluon_bwd_local import gdn_chunk_bwd_local_gluon_kernel as fn

    x, part, constexprs = offline_launch(dtype, varlen, B, T, H, Hg)
    sig = dict(q=x, k=x, v_new=x, gc="*fp32", do=x, dv=x, h=x, dh=x, cu_seqlens="*i32", chunk_indices="*i32",
               scale="fp32", T="i32", dq=part, dk=part, dw=x, dg="*fp32")
    return compile_gluon_offline(fn, sig, constexprs, dict(num_warps=4))


def compile_offline_wy(dtype: str = "bfloat16", varlen: bool = False, B: int = 8, T: int = 4096, H: int = 32,
                       Hg: int = 16):
    """The WY kernel compiled for ``sm_90a`` without a GPU, as
    :func:`compile_offline` compiles the per-chunk kernel."""
    from .kernels.gluon_wy_bwd import gdn_wy_bwd_gluon_kernel as fn

    x, part, constexprs = offline_launch(dtype, varlen, B, T, H, Hg)
    sig = dict(k=x, v=x, beta="*fp32", gc="*fp32", A=x, dw=x, du=x, dg_in="*fp32", cu_seqlens="*i32",
               chunk_indices="*i32", T="i32", dk=part, dv=x, dbeta="*fp32", dg="*fp32")
    return compile_gluon_offline(fn, sig, {**constexprs, "NK_IN": 128 // BK}, dict(num_warps=4))


def offline_launch(dtype: str, varlen: bool, B: int, T: int, H: int, Hg: int):
    """``(pointer type, partials' pointer type, constexprs)`` of an offline
    compile of either kernel for inputs of ``dtype`` at ``K = V = 128``
    (:func:`compile_offline`'s shapes)."""
    from .chunk_bwd_launch import partials_in_input_dtype

    x = {"bfloat16": "*bf16", "float16": "*fp16"}[dtype]
    part = x if partials_in_input_dtype(dtype) else "*fp32"
    NTL = cdiv(T, 64) + B if varlen else cdiv(T, 64)
    return x, part, dict(H=H, Hg=Hg, K=128, V=128, B=1 if varlen else B, NTL=NTL, IS_VARLEN=varlen)
