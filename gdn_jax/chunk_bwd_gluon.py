"""Launch of the backward's reverse walk in Gluon (``kernels/gluon_bwd_walk.py``)
through jax-triton 0.4, which ``chunk_bwd_launch`` takes in place of the
Triton walk (``kernels/chunk_bwd_walk.py``) where :func:`walk_missing` says
it can: a Hopper GPU, jax-triton >= 0.4, ``K = 128``, bfloat16 or float16.
The two compute the same thing (docs/design.md); the Gluon one issues each
chunk's copies a whole step ahead (docs/performance.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .chunk_indices import cdiv
from .gluon_launch import compile_gluon_as_triton_does, compile_gluon_offline, gluon_environment_missing
from .triton_launch import triton_call

BV = 32  # the value columns of one program (the Triton walk's fixed config at K = 128)


def walk_missing(dtype, K: int, T: int = 2, packed: bool = False) -> str | None:
    """Why the Gluon reverse walk cannot take a launch of inputs of ``dtype``
    with ``K`` key columns and ``T`` rows per batch row (``packed``: one row
    of packed sequences) here, or None when it can."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"it takes bfloat16 or float16 inputs, got {jnp.dtype(dtype).name}"
    if K != 128:
        return f"it takes K = 128, got K={K}"
    if T == 1 and not packed:
        # one chunk gains nothing from copies a step ahead
        return ("it takes T > 1 at fixed length, got T=1 (jax-triton passes T = 1 as a constant, with which "
                "triton 3.6 fails to lower the kernel to LLVM)")
    return gluon_environment_missing("gluon_bwd_walk", False)


def reverse_walk_types(k, do, N: int, chunks: int):
    """The reverse walk's results' types, either kernel's: ``dv' [B, T, H,
    V]`` and ``dh [chunks, H, K, V]`` in ``k``'s dtype, ``dh0 [N, H, K, V]``
    float32."""
    B, T, _, K = k.shape
    H, V = do.shape[2], do.shape[3]
    return (jax.ShapeDtypeStruct((B, T, H, V), k.dtype), jax.ShapeDtypeStruct((chunks, H, K, V), k.dtype),
            jax.ShapeDtypeStruct((N, H, K, V), jnp.float32))


def reverse_walk_gluon(q, k, A, beta, gc, do, qk, dht, cu_seqlens, offsets, *, scale, N: int, chunks: int):
    """``(dv', dh, dh0)`` of the reverse walk, as the Triton walk's launch in
    ``chunk_bwd_launch`` gives them: ``dv' [B, T, H, V]`` and ``dh [chunks, H,
    K, V]`` in ``k``'s dtype, ``dh0 [N, H, K, V]`` float32. ``q``, ``k [B, T,
    Hg, K]``; ``A``, ``qk [B, T, H, 64]``; ``beta``, ``gc [B, T, H]``
    float32; ``do [B, T, H, V]``; ``dht [N, H, K, V]`` float32 or None;
    ``cu_seqlens`` and ``offsets`` (the sequences' first chunks) int32 or
    None (fixed length, ``N = B``, ``T > 1``: :func:`walk_missing`);
    ``chunks``: rows of ``dh``."""
    from .kernels.gluon_bwd_walk import gdn_chunk_bwd_walk_gluon_kernel

    compile_gluon_as_triton_does()
    B, T, Hg, K = k.shape
    H, V = do.shape[2], do.shape[3]
    dummy = jnp.zeros((1,), jnp.int32)
    out = reverse_walk_types(k, do, N, chunks)
    return triton_call(
        q, k, A, beta, gc, do, qk, dummy if dht is None else dht.astype(jnp.float32),
        dummy if cu_seqlens is None else cu_seqlens, dummy if offsets is None else offsets, float(scale), T,
        kernel=gdn_chunk_bwd_walk_gluon_kernel, out=out, grid=(cdiv(V, BV) * H * N,), num_warps=4,
        H=H, Hg=Hg, K=K, V=V, BV=BV, USE_DHT=dht is not None, IS_VARLEN=cu_seqlens is not None)


def compile_offline(dtype: str = "bfloat16", varlen: bool = False, H: int = 32, Hg: int = 16, V: int = 128):
    """The kernel compiled for ``sm_90a`` without a GPU (the installed triton's
    compiler and ptxas; ``dtype``: ``"bfloat16"`` or ``"float16"``): the
    ``CompiledKernel`` (``.asm["ptx"]``, ``.metadata.shared``)."""
    from .kernels.gluon_bwd_walk import gdn_chunk_bwd_walk_gluon_kernel as fn

    x = {"bfloat16": "*bf16", "float16": "*fp16"}[dtype]
    sig = dict(q=x, k=x, w=x, beta="*fp32", gc="*fp32", do=x, qk=x, dht="*fp32", cu_seqlens="*i32",
               chunk_offsets="*i32", scale="fp32", T="i32", dv=x, dh=x, dh0="*fp32")
    constexprs = dict(H=H, Hg=Hg, K=128, V=V, BV=BV, USE_DHT=True, IS_VARLEN=varlen)
    return compile_gluon_offline(fn, sig, constexprs, dict(num_warps=4))
