"""The derivative of ``fwd_intra`` on its Triton paths: a ``jax.custom_vjp``
whose backward runs the WY kernel (``kernels/wy_bwd.py``) with the
cotangent of ``A`` added (``DA_IN``), split over batch and heads under
``jax.jit`` (:mod:`gdn_jax.sharding`), vmappable (:mod:`gdn_jax.batching`).

For every chunk and value head (docs/math.md, "Gradients"; ``e = exp(g)``,
``E_ij = exp(g_i - g_j)``, ``A = (I + L)^-1``, ``L = strict_tril(beta k k^T
E)``), from the cotangents ``dw``, ``du``, ``dA`` of ``w = A (beta e k)``,
``u = A (beta v)`` and ``A``::

    dv = beta (A^T du)
    dL = strict_tril(-A^T (du (beta v)^T + dw (beta e k)^T + dA) A^T)

and from ``dL``, ``dk``, ``dbeta`` and ``dg`` (``g`` being the chunk-local
cumulative gates ``fwd_intra`` takes, its cotangent is the kernel's ``dgc``
as it is); a key head's ``dk`` sums over its value heads. The jnp form
(:func:`intra_bwd_jnp`, the same math as the chunk backward's WY part,
:func:`gdn_jax.chunk_bwd_jnp.wy_bwd_chunks`) runs where the WY kernel's
tiles do not fit shared memory (float32 past K = 128, as the walk,
:func:`gdn_jax.chunk_launch.walk_kernel_fits`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .batching import vmappable
from .chunk_bwd_jnp import chunk_decays, chunk_rows, key_heads, wy_bwd_chunks
from .chunk_bwd_launch import wy_bwd_launch
from .chunk_jnp import chunk_layout
from .naive_recurrent import repeat_heads
from .precision import compute_dtype
from .sharding import Layout, fwd_intra_sharded, partitioned, sharded_call, varying_like

BT = 64


def intra_bwd_jnp(k, v, g, beta, A, dw, du, dA, cu_seqlens=None, chunk_indices=None):
    """``(dk [B, T, Hg, K], dv [B, T, H, V], dg [B, T, H], dbeta [B, T, H])``
    of ``fwd_intra`` in plain jnp (compute dtype), from its inputs (``g``
    the chunk-local cumulative gates, zeros where there is no gate), its
    ``A`` and the cotangents ``dw``, ``du``, ``dA`` of ``w``, ``u``, ``A``."""
    B, T, Hg, _ = k.shape
    H = v.shape[2]
    ct = compute_dtype(k.dtype, v.dtype, g.dtype, beta.dtype)
    gather, scatter, valid, _ = chunk_layout(B, T, cu_seqlens, chunk_indices)
    chunks = lambda x: gather(jnp.asarray(x).astype(ct))  # noqa: E731
    gc = chunks(g)
    rows, e, E = chunk_decays(gc, valid)
    dv, db, dk, dg = wy_bwd_chunks(chunks(A)[..., :BT], repeat_heads(chunks(k), H), chunks(v), chunks(beta),
                                   e, E, chunks(du), chunks(dw), chunks(dA)[..., :BT])
    to_rows = functools.partial(chunk_rows, scatter, rows)
    return key_heads(to_rows(dk), Hg, ct), to_rows(dv), to_rows(dg), to_rows(db)


def intra_bwd_triton(k, v, g, beta, A, dw, du, dA, cu_seqlens=None, chunk_indices=None):
    """:func:`intra_bwd_jnp` from the WY kernel on the GPU: ``dk`` in k's
    dtype, ``dv`` in v's, ``dg`` and ``dbeta`` float32."""
    dk, dv, dbeta, dg = wy_bwd_launch(k, v, beta, g.astype(jnp.float32), A, dw, du, dA, cu_seqlens,
                                      chunk_indices)
    return key_heads(dk, k.shape[2], k.dtype), dv, dg, dbeta


class IntraBwdStatic(NamedTuple):
    """What the backward op is specialised on."""
    triton: bool
    varlen: bool
    ratio: int  # GQA: H // Hg


def _layout(static: IntraBwdStatic) -> Layout:
    """``k, v, g, beta, A, dw, du, dA, [cu, ci] -> dk, dv, dg, dbeta``."""
    operands = ("btgk", "bthv", "bth", "bth", "btha", "bthk", "bthv", "btha") \
        + (("s", "ij") if static.varlen else ())
    return Layout(operands, ("btgk", "bthv", "bth", "bth"), static.varlen, static.ratio)


def _per_device(static: IntraBwdStatic, *arrays):
    if static.triton:
        return _triton_op(static)(*arrays)
    return intra_bwd_jnp(*arrays)


@functools.cache
def _triton_op(static: IntraBwdStatic):
    layout = _layout(static)
    return vmappable(intra_bwd_triton, layout.operands, layout.results)


_partitioned = partitioned(_per_device, _layout)


def intra_bwd(k, v, g, beta, A, dw, du, dA, cu_seqlens, chunk_indices, *, triton):
    """``(dk, dv, dg, dbeta)`` of ``fwd_intra`` (:func:`intra_bwd_jnp`'s
    arguments; ``g`` given, zeros for no gate), on the WY kernel where
    ``triton``, else in jnp."""
    static = IntraBwdStatic(bool(triton), cu_seqlens is not None, v.shape[2] // k.shape[2])
    arrays = [x for x in (k, v, g, beta, A, dw, du, dA, cu_seqlens, chunk_indices) if x is not None]
    return sharded_call(_partitioned, _per_device, static, _layout(static), arrays)


class IntraStatic(NamedTuple):
    """What :func:`fwd_intra_with_vjp` is specialised on."""
    impl: str  # fwd_intra's resolved Triton path
    chunk_size: int
    triton_bwd: bool = True  # the backward on the WY kernel, else jnp (where its tiles do not fit)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def fwd_intra_with_vjp(static: IntraStatic, k, v, g, beta, cu, ci):
    """``(w, u, A)`` of ``fwd_intra``'s path ``static.impl`` (inputs checked,
    ``cu``, ``ci`` None or int32), with the backward of :func:`intra_bwd`."""
    return fwd_intra_sharded(k, v, g, beta, cu_seqlens=cu, chunk_size=static.chunk_size, chunk_indices=ci,
                             impl=static.impl)


def _fwd(static, k, v, g, beta, cu, ci):
    out = fwd_intra_with_vjp(static, k, v, g, beta, cu, ci)
    return out, (k, v, g, beta, out[2], cu, ci)


def _bwd(static, residuals, cotangents):
    k, v, g, beta, A, cu, ci = residuals
    dw, du, dA = cotangents
    gc = jnp.zeros(beta.shape, jnp.float32) if g is None else g
    dk, dv, dg, dbeta = intra_bwd(k, v, gc, beta, A, dw.astype(k.dtype), du.astype(v.dtype), dA.astype(k.dtype),
                                  cu, ci, triton=static.triton_bwd)
    dg = None if g is None else varying_like(dg.astype(g.dtype), g)
    return (varying_like(dk.astype(k.dtype), k), varying_like(dv.astype(v.dtype), v), dg,
            varying_like(dbeta.astype(beta.dtype), beta), None, None)


fwd_intra_with_vjp.defvjp(_fwd, _bwd)
