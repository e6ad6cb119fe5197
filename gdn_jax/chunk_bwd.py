"""The backward of the chunked forward as an op, and the ``jax.custom_vjp`` that
uses it on the GPU path.

``chunk_bwd(q, k, v, gc, beta, A, h0, do, dht, cu_seqlens, chunk_indices)``
runs the backward kernels (:mod:`gdn_jax.chunk_bwd_launch`) or their jnp
reference (:func:`gdn_jax.chunk_bwd_jnp.chunk_bwd_per_step_jnp`; both give the
per-step gates' cotangent), split over batch and
heads under ``jax.jit`` (:mod:`gdn_jax.sharding`), vmappable
(:mod:`gdn_jax.batching`). :func:`gdn_core` is the chunked forward after the
options, with this backward (``jax.grad``, ``jax.vjp``); forward-mode
(``jax.jvp``) raises, naming the jnp path, which has it.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .batching import vmappable
from .chunk_bwd_jnp import chunk_bwd_per_step_jnp
from .chunk_bwd_launch import chunk_bwd_triton
from .chunk_jnp import chunk_local_cumsum
from .chunk_walk import chunk_walk
from .intra import fwd_intra
from .options import state_from_k_major, state_to_k_major
from .sharding import Layout, fwd_intra_sharded, partitioned, sharded_call, varying_like
from .validate import check_not_forward_mode


class BwdStatic(NamedTuple):
    """What the backward op is specialised on."""
    triton: bool
    scale: float
    use_h0: bool
    use_dht: bool
    varlen: bool
    ratio: int
    qk_in: bool = False  # the forward's output block given (Triton only), else recomputed
    states_in: bool = False  # the forward's chunk states and v' given (Triton, fixed length), else recomputed


def _layout(static: BwdStatic) -> Layout:
    """``q, k, v, gc, beta, A, [qk], [h, v_new], [h0], do, [dht], [cu, ci] -> dq, dk, dv, da, dbeta, dh0``."""
    operands = ("btgk", "btgk", "bthv", "bth", "bth", "btha") + (("btha",) if static.qk_in else ()) \
        + (("nthkv", "bthv") if static.states_in else ()) \
        + (("nhkv",) if static.use_h0 else ()) \
        + ("bthv",) + (("nhkv",) if static.use_dht else ()) + (("s", "ij") if static.varlen else ())
    return Layout(operands, ("btgk", "btgk", "bthv", "bth", "bth", "nhkv"), static.varlen, static.ratio)


def _split(static: BwdStatic, arrays):
    arrays = list(arrays)
    q, k, v, gc, beta, A = arrays[:6]
    rest = arrays[6:]
    qk = rest.pop(0) if static.qk_in else None
    h, v_new = (rest.pop(0), rest.pop(0)) if static.states_in else (None, None)
    h0 = rest.pop(0) if static.use_h0 else None
    do = rest.pop(0)
    dht = rest.pop(0) if static.use_dht else None
    cu, ci = rest if static.varlen else (None, None)
    return q, k, v, gc, beta, A, qk, h, v_new, h0, do, dht, cu, ci


def _per_device(static: BwdStatic, *arrays):
    if static.triton:
        return _triton_op(static)(*arrays)
    q, k, v, gc, beta, A, _, _, _, h0, do, dht, cu, ci = _split(static, arrays)  # jnp forms its own
    return chunk_bwd_per_step_jnp(q, k, v, gc, beta, A, h0, do, dht, cu, ci, scale=static.scale)


@functools.cache
def _triton_op(static: BwdStatic):
    layout = _layout(static)

    def bwd(*arrays):
        q, k, v, gc, beta, A, qk, h, v_new, h0, do, dht, cu, ci = _split(static, arrays)
        return chunk_bwd_triton(q, k, v, gc, beta, A, h0, do, dht, cu, ci, scale=static.scale, qk=qk,
                                h=h, v_new=v_new)

    return vmappable(bwd, layout.operands, layout.results)


_partitioned = partitioned(_per_device, _layout)


def chunk_bwd(q, k, v, gc, beta, A, initial_state, do, dht, cu_seqlens, chunk_indices, *,
              scale, triton, qk=None, states=None):
    """``(dq, dk, dv, da, dbeta, dh0)``, shapes and dtypes as
    :func:`gdn_jax.chunk_bwd_jnp.chunk_bwd_per_step_jnp` (K-major states;
    ``initial_state`` and ``dht`` may be None; ``da`` the per-step gates'
    cotangent, taken on the GPU in the WY kernel); ``qk``: the forward's output block
    (:func:`gdn_jax.chunk_walk.chunk_walk`'s ``return_qk``), or None;
    ``states``: its chunk states and ``v'`` (``return_states``), or None."""
    static = BwdStatic(bool(triton), float(scale), initial_state is not None, dht is not None,
                       cu_seqlens is not None, v.shape[2] // q.shape[2], qk is not None, states is not None)
    h, v_new = (None, None) if states is None else states
    arrays = [x for x in (q, k, v, gc, beta, A, qk, h, v_new, initial_state, do, dht, cu_seqlens,
                          chunk_indices) if x is not None]
    return sharded_call(_partitioned, _per_device, static, _layout(static), arrays)


class CoreStatic(NamedTuple):
    """What :func:`gdn_core` is specialised on."""
    impl: str  # fwd_intra's path
    walk_triton: bool  # the walk and the backward on their kernels, else jnp
    scale: float
    final: bool
    v_first: bool


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def gdn_core(static: CoreStatic, q, k, v, a, beta, h0, cu, ci):
    """``(o, final_state or None)`` of the chunked forward on the per-step gates
    ``a`` (the options already applied; ``cu``, ``ci`` None or int32), with the
    backward of :func:`chunk_bwd`."""
    return core_forward(static, q, k, v, a, beta, h0, cu, ci)[0]


def core_forward(static, q, k, v, a, beta, h0, cu, ci, save_states=False):
    """``((o, final_state or None), residuals)``: the cumsum of the gates,
    ``fwd_intra`` and the walk, and what the backward keeps. With ``impl``
    "auto" on the walk kernel: ``A`` alone (the split path's first kernel),
    then the walk that forms ``v'`` from ``A``, ``v`` and ``beta``, so ``w``
    and ``u`` never go through HBM; else ``fwd_intra``'s path ``impl``, then
    the walk on ``w``, ``u``. ``save_states`` (the forward of ``jax.grad``):
    that walk also stores the chunk states and ``v'`` for the backward where
    the batch has fixed length and ``v`` is bfloat16 or float16 (0.19 ms more
    at B=8 T=4096 against 0.59 for the backward's recompute; ``docs/design.md``).
    On that "auto" path the kernels take the per-step gates and sum them
    within each chunk themselves (``SUM_G``): XLA's cumsum ``gc`` is then the
    backward's residual alone, dead code without a gradient (two small XLA
    fusions and their launch gaps less in inference)."""
    gc = chunk_local_cumsum(a, cu, ci)  # float32 (float64 for float64 a): the kernels take float32
    gc = gc if static.impl == "reference" else gc.astype(jnp.float32)
    walk = functools.partial(chunk_walk, scale=static.scale, output_final_state=static.final,
                             state_v_first=static.v_first, triton=static.walk_triton)
    qk = states = None
    if static.walk_triton and static.impl == "auto":
        a32 = a.astype(jnp.float32)  # the per-step gates: the kernels sum them (SUM_G), not XLA
        (A,) = fwd_intra_sharded(k, v, a32, beta, cu_seqlens=cu, chunk_indices=ci, impl="A", sum_g=True)
        # the output block the walk reads, kept for the backward's reverse walk
        # ([B, T, H, 64], a quarter of v's bytes at V = 128) instead of formed again
        # float32: the walk's tiles with both stores ask more shared memory
        # than an sm_90 program has at its fixed config (238084 of 232448 bytes)
        save = save_states and cu is None and jnp.dtype(v.dtype).itemsize == 2
        o, final, qk, *states = walk(q, k, A, v, a32, h0, cu, ci, beta=beta.astype(jnp.float32),
                                     return_qk=True, return_states=save, sum_g=True)
        out, states = (o, final), (tuple(states) if save else None)
    else:
        w, u, A = fwd_intra(k, v, gc, beta, cu_seqlens=cu, chunk_indices=ci, impl=static.impl)
        out = walk(q, k, w, u, gc, h0, cu, ci)
    return out, (q, k, v, gc, beta, A, qk, states, h0, cu, ci)


def _core_fwd(static, q, k, v, a, beta, h0, cu, ci):
    return core_forward(static, q, k, v, a, beta, h0, cu, ci, save_states=True)


def _core_bwd(static, residuals, cotangents):
    q, k, v, gc, beta, A, qk, states, h0, cu, ci = residuals
    do, dht = cotangents
    h0k = state_to_k_major(h0, static.v_first)
    dhtk = None if dht is None else state_to_k_major(dht, static.v_first).astype(jnp.float32)
    dq, dk, dv, da, dbeta, dh0 = chunk_bwd(
        q, k, v, gc, beta, A, None if h0k is None else h0k.astype(jnp.float32), do.astype(v.dtype),
        dhtk, cu, ci, scale=static.scale, triton=static.walk_triton, qk=qk, states=states)
    dh0 = None if h0 is None else state_from_k_major(dh0, static.v_first).astype(h0.dtype)
    grads = (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), da.astype(jnp.float32),
             dbeta.astype(beta.dtype), dh0)
    # gc varies as the gates it is the cumsum of
    return (*map(varying_like, grads, (q, k, v, gc, beta, h0)), None, None)


gdn_core.defvjp(_core_fwd, _core_bwd)


def run_core(static: CoreStatic, triton: bool, q, k, v, a, beta, h0, cu, ci):
    """``(o, final_state or None)`` of the chunked forward after the options:
    jnp throughout where ``triton`` is False (differentiated by JAX, forward
    and reverse mode), else :func:`gdn_core` (the kernels, this backward)."""
    if not triton:
        return core_forward(static, q, k, v, a, beta, h0, cu, ci)[0]
    check_not_forward_mode("chunk_gated_delta_rule", static.impl, (q, k, v, a, beta, h0))
    return gdn_core(static, q, k, v, a, beta, h0, cu, ci)
