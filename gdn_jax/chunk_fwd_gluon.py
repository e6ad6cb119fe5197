"""Launch of the forward's walk storing the chunk states and ``v'`` in Gluon
(``kernels/gluon_fwd_walk.py``) through jax-triton 0.4, which
``chunk_launch.chunk_walk_triton`` takes in place of the Triton walk
(``kernels/chunk_fwd.py``) where :func:`storing_walk_missing` says it can: the
forward of ``jax.grad`` (from ``A``, summing the gates, writing the output and
storing the states and ``v'``) at fixed length, on a Hopper GPU with
jax-triton >= 0.4, ``K = 128``, bfloat16 or float16. The two compute the same
thing (docs/design.md); the Gluon one issues each chunk's copies a whole step
ahead (docs/performance.md, "The walks' copies").

Off unless ``GDN_JAX_GLUON_FWD_WALK=1`` (:func:`storing_walk_enabled`): on an
H100 the gradient tests through it pass against float64, but it took 0.903 ms
against the Triton walk's 0.806 at B=8 T=4096 (docs/performance.md).
"""
from __future__ import annotations

import os

import jax.numpy as jnp

from .chunk_indices import cdiv
from .gluon_launch import compile_gluon_as_triton_does, compile_gluon_offline, gluon_environment_missing
from .triton_launch import triton_call

BV = 32  # the value columns of one program (the Triton walk's fixed config at K = 128)


def storing_walk_enabled() -> bool:
    """Whether ``GDN_JAX_GLUON_FWD_WALK=1`` asks ``chunk_walk_triton`` for the
    Gluon storing walk where it can run (off by default: slower than the Triton walk on an H100)."""
    return os.environ.get("GDN_JAX_GLUON_FWD_WALK", "0") == "1"


def storing_walk_missing(dtype, K: int, T: int, varlen: bool) -> str | None:
    """Why the Gluon storing walk cannot take a launch of inputs of ``dtype``
    with ``K`` key columns and ``T`` rows per batch row (``varlen``: a packed
    batch) here, or None when it can."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"it takes bfloat16 or float16 inputs, got {jnp.dtype(dtype).name}"
    if K != 128:
        return f"it takes K = 128, got K={K}"
    if varlen:
        return "it takes fixed-length batches (a packed batch's states are recomputed in the backward)"
    if T == 1:
        return "it takes T > 1 (jax-triton passes T = 1 as a constant; one chunk gains nothing from copies ahead)"
    return gluon_environment_missing("gluon_fwd_walk", False)


def storing_walk_gluon(q, k, A, v, a, beta, qk, initial_state, *, scale, out, store_final: bool,
                       state_v_first: bool):
    """``(o, final_state, h, v_new)`` of the walk, of the types ``out``
    (``chunk_walk_triton``'s with ``beta``, ``write_o``, ``store_h``,
    ``store_v`` and ``sum_g``: the final state a 1-element placeholder
    without ``store_final``). ``q``, ``k [B, T, Hg, K]``; ``A``, ``qk [B, T,
    H, 64]``; ``v [B, T, H, V]``; ``a``, ``beta [B, T, H]`` float32 (``a``
    the per-step log gates); ``initial_state [B, H, K, V]`` (``[B, H, V,
    K]`` with ``state_v_first``) float32 or None."""
    from .kernels.gluon_fwd_walk import gdn_chunk_fwd_storing_gluon_kernel

    compile_gluon_as_triton_does()
    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    return triton_call(
        q, k, A, v, a, beta, qk, jnp.zeros((1,), jnp.float32) if initial_state is None else initial_state,
        float(scale), T, kernel=gdn_chunk_fwd_storing_gluon_kernel, out=out, grid=(cdiv(V, BV) * H * B,),
        num_warps=4, H=H, Hg=Hg, K=K, V=V, BV=BV, USE_H0=initial_state is not None, STORE_FINAL=store_final,
        STATE_V_FIRST=state_v_first)


def compile_offline(dtype: str = "bfloat16", H: int = 32, Hg: int = 16, V: int = 128, use_h0: bool = True,
                    state_v_first: bool = False):
    """The kernel compiled for ``sm_90a`` without a GPU (the installed triton's
    compiler and ptxas; ``dtype``: ``"bfloat16"`` or ``"float16"``): the
    ``CompiledKernel`` (``.asm["ptx"]``, ``.metadata.shared``)."""
    from .kernels.gluon_fwd_walk import gdn_chunk_fwd_storing_gluon_kernel as fn

    x = {"bfloat16": "*bf16", "float16": "*fp16"}[dtype]
    sig = dict(q=x, k=x, w=x, u=x, gc="*fp32", beta="*fp32", qk=x, h0="*fp32", scale="fp32", T="i32", o=x,
               ht="*fp32", h=x, v_new=x)
    constexprs = dict(H=H, Hg=Hg, K=128, V=V, BV=BV, USE_H0=use_h0, STORE_FINAL=True, STATE_V_FIRST=state_v_first)
    return compile_gluon_offline(fn, sig, constexprs, dict(num_warps=4))
