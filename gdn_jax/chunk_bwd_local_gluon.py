"""Launch of the backward's per-chunk gradients in Gluon
(``kernels/gluon_bwd_local.py``) through jax-triton 0.4, which
``chunk_bwd_launch.chunk_bwd_triton`` takes in place of the Triton kernel
(``kernels/chunk_bwd_local.py``) where :func:`local_missing` says it can: a
Hopper GPU, jax-triton >= 0.4, ``K = V = 128``, bfloat16 or float16. The two
compute the same thing (docs/design.md); the Gluon one is persistent, one
program an SM, and copies the next work item's tiles while it computes this
one's (docs/performance.md).

Off unless ``GDN_JAX_GLUON_BWD_LOCAL=1`` (:func:`local_enabled`) until it is
measured against the Triton kernel on the GPU.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from .chunk_indices import cdiv
from .gluon_launch import compile_gluon_as_triton_does, compile_gluon_offline, gluon_environment_missing
from .triton_launch import triton_call

BK = 64  # key columns of a work item (the Triton kernel's K blocks)


def local_enabled() -> bool:
    """Whether ``GDN_JAX_GLUON_BWD_LOCAL=1`` asks ``chunk_bwd_triton`` for the
    Gluon per-chunk kernel where it can run (off by default: not yet timed)."""
    return os.environ.get("GDN_JAX_GLUON_BWD_LOCAL", "0") == "1"


def local_missing(dtype, K: int, V: int, T: int, varlen: bool) -> str | None:
    """Why the Gluon per-chunk kernel cannot take a launch of inputs of
    ``dtype`` with ``K`` key and ``V`` value columns and ``T`` rows per batch
    row (``varlen``: a packed batch) here, or None when it can."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"it takes bfloat16 or float16 inputs, got {jnp.dtype(dtype).name}"
    if K != 128 or V != 128:
        return f"it takes K = V = 128, got K={K}, V={V}"
    if T == 1 and not varlen:
        return "it takes T > 1 at fixed length (jax-triton passes T = 1 as a constant)"
    return gluon_environment_missing("gluon_bwd_local", False)


def per_chunk_gluon(q, k, v_new, gc, do, dv_new, h, dh, cu_seqlens, chunk_indices, *, scale, out):
    """``(dq, dk, dw, dg)`` of the per-chunk kernel, of the types ``out`` (the
    Triton launch's in ``chunk_bwd_triton``: ``dq``, ``dk``, ``dw [B, T, H,
    K]``, ``dg [K / 64, B, T, H]`` float32). ``q``, ``k [B, T, Hg, K]``;
    ``v_new``, ``do``, ``dv_new [B, T, H, V]``; ``gc [B, T, H]`` float32;
    ``h``, ``dh [chunks, H, K, V]``; ``cu_seqlens`` and ``chunk_indices``
    int32 or None (fixed length)."""
    from .kernels.gluon_bwd_local import gdn_chunk_bwd_local_gluon_kernel

    compile_gluon_as_triton_does()
    B, T, Hg, K = k.shape
    H, V = v_new.shape[2], v_new.shape[3]
    varlen = cu_seqlens is not None
    NTL = chunk_indices.shape[0] if varlen else cdiv(T, 64)
    items = NTL * H * cdiv(K, BK) * B
    n_sm = getattr(jax.devices()[0], "core_count", 132)
    dummy = jnp.zeros((1,), jnp.int32)
    return triton_call(
        q, k, v_new, gc, do, dv_new, h, dh, cu_seqlens if varlen else dummy, chunk_indices if varlen else dummy,
        float(scale), T, kernel=gdn_chunk_bwd_local_gluon_kernel, out=out, grid=(max(1, min(items, n_sm)),),
        num_warps=4, H=H, Hg=Hg, K=K, V=V, B=B, NTL=NTL, IS_VARLEN=varlen)


def compile_offline(dtype: str = "bfloat16", varlen: bool = False, B: int = 8, T: int = 4096, H: int = 32,
                    Hg: int = 16):
    """The kernel compiled for ``sm_90a`` without a GPU (the installed triton's
    compiler and ptxas; ``dtype``: ``"bfloat16"`` or ``"float16"``), at ``B``
    rows of ``T`` (a packed batch of ``T`` rows in ``cdiv(T, 64) + B``
    chunks with ``varlen``): the ``CompiledKernel`` (``.asm["ptx"]``,
    ``.metadata.shared``)."""
    from .kernels.gluon_bwd_local import gdn_chunk_bwd_local_gluon_kernel as fn

    x = {"bfloat16": "*bf16", "float16": "*fp16"}[dtype]
    part = x if dtype == "bfloat16" else "*fp32"  # chunk_bwd_launch.partials_in_input_dtype
    sig = dict(q=x, k=x, v_new=x, gc="*fp32", do=x, dv=x, h=x, dh=x, cu_seqlens="*i32", chunk_indices="*i32",
               scale="fp32", T="i32", dq=part, dk=part, dw=x, dg="*fp32")
    NTL = cdiv(T, 64) + B if varlen else cdiv(T, 64)
    constexprs = dict(H=H, Hg=Hg, K=128, V=128, B=1 if varlen else B, NTL=NTL, IS_VARLEN=varlen)
    return compile_gluon_offline(fn, sig, constexprs, dict(num_warps=4))
