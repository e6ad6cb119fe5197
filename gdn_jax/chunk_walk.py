"""The chunk walk as an op: the state recurrence over chunks and the output,
after ``fwd_intra`` (docs/math.md, "Chunk form").

``chunk_walk(q, k, w, u, gc, h0, cu_seqlens, chunk_indices) -> (o, final)``
(or from ``A, v, beta`` in place of ``w, u``, on the GPU) runs the Triton kernel (:mod:`gdn_jax.chunk_launch`) or its jnp reference
(:func:`gdn_jax.chunk_jnp.chunk_walk_jnp`), split over batch and heads under
``jax.jit`` (:mod:`gdn_jax.sharding`), with a vmap rule for the Triton launch
(:mod:`gdn_jax.batching`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax.numpy as jnp

from .batching import vmappable
from .chunk_jnp import chunk_walk_jnp
from .chunk_launch import chunk_fwd_triton
from .options import state_from_k_major, state_to_k_major
from .sharding import Layout, partitioned, sharded_call


class WalkStatic(NamedTuple):
    """What the walk op is specialised on (its static argument)."""
    triton: bool  # the Triton kernel, else the jnp reference
    scale: float
    use_h0: bool
    final: bool  # return the final states
    varlen: bool
    v_first: bool  # states [N, H, V, K]
    ratio: int  # GQA: H // Hg
    from_A: bool = False  # A, v (and beta) in place of w, u: the kernel forms v' (Triton only)
    return_qk: bool = False  # also the output's block the walk from A read (for the backward)
    return_states: bool = False  # also the chunk states and v' (for the backward; fixed length, Triton)
    sum_g: bool = False  # gc holds the per-step log gates, summed in the kernels (Triton only)


def _layout(static: WalkStatic) -> Layout:
    """``q, k, w, u, gc, [h0], [cu_seqlens, chunk_indices] -> o, [final]``
    (``q, k, A, v, gc, beta, ...`` with ``from_A``, ``-> o, [final], [qk],
    [h, v_new]`` with ``return_qk``, ``return_states``; the chunk states ``h
    [B, NT, H, K, V]`` fold and split as states, ``n``)."""
    state = "nhvk" if static.v_first else "nhkv"
    operands = ("btgk", "btgk", "btha" if static.from_A else "bthk", "bthv", "bth") \
        + (("bth",) if static.from_A else ()) + ((state,) if static.use_h0 else ()) \
        + (("s", "ij") if static.varlen else ())
    results = ("bthv",) + ((state,) if static.final else ()) + (("btha",) if static.return_qk else ()) \
        + (("nthkv", "bthv") if static.return_states else ())
    return Layout(operands, results, static.varlen, static.ratio)


def _split(static: WalkStatic, arrays):
    arrays = list(arrays)
    q, k, w, u, gc = arrays[:5]
    rest = arrays[5:]
    beta = rest.pop(0) if static.from_A else None
    h0 = rest.pop(0) if static.use_h0 else None
    cu, ci = rest if static.varlen else (None, None)
    return q, k, w, u, gc, beta, h0, cu, ci


def _per_device(static: WalkStatic, *arrays):
    """``(o, [final])`` of the blocks one device holds."""
    if static.triton:
        return _triton_op(static)(*arrays)
    assert not static.from_A, "the walk from A runs on the GPU only"
    q, k, w, u, gc, _, h0, cu, ci = _split(static, arrays)
    B, H, K, V = u.shape[0], u.shape[2], q.shape[3], u.shape[3]
    N = B if cu is None else cu.shape[0] - 1
    h0 = jnp.zeros((N, H, K, V), jnp.float32) if h0 is None else state_to_k_major(h0, static.v_first)
    o, final = chunk_walk_jnp(q, k, w, u, gc, h0, cu, ci, scale=static.scale)
    return (o,) + ((state_from_k_major(final, static.v_first),) if static.final else ())


@functools.cache
def _triton_op(static: WalkStatic):
    """The kernel's launch over the arrays of ``_per_device``, vmappable."""
    layout = _layout(static)

    def fwd(*arrays):
        q, k, w, u, gc, beta, h0, cu, ci = _split(static, arrays)
        o, final, *rest = chunk_fwd_triton(q, k, w, u, gc, h0, cu, scale=static.scale,
                                           output_final_state=static.final, state_v_first=static.v_first,
                                           beta=beta, chunk_indices=ci, return_qk=static.return_qk,
                                           return_states=static.return_states, sum_g=static.sum_g)
        return (o,) + ((final,) if static.final else ()) + tuple(rest)

    return vmappable(fwd, layout.operands, layout.results)


_partitioned = partitioned(_per_device, _layout)


def chunk_walk(q, k, w, u, gc, initial_state, cu_seqlens, chunk_indices, *, scale,
               output_final_state, state_v_first, triton, beta=None, return_qk=False,
               return_states=False, sum_g=False):
    """``(o, final_state or None)``: the walk over checked arrays (shapes as
    :func:`gdn_jax.chunk_jnp.chunk_walk_jnp`, states in the layout
    ``state_v_first`` says; ``initial_state`` may be None), on the Triton
    kernel or in jnp; ``scale`` a Python number. With ``beta [B, T, H]``
    (float32; Triton only): ``w`` is ``A [B, T, H, 64]`` and ``u`` is ``v``,
    and the kernel forms ``v'`` from them (``kernels/chunk_fwd.py``, ``FROM_A``);
    with ``return_qk`` too, ``qk`` after them: the output's block ``[B, T, H,
    64]`` (``kernels/chunk_qk.py``) that walk read; with ``return_states``
    (Triton, fixed length) ``h, v_new`` last: the state entering every chunk
    ``[B, cdiv(T, 64), H, K, V]`` and ``v' [B, T, H, V]``, in u's dtype.
    ``sum_g`` (Triton only): ``gc`` holds the per-step log gates ``[B, T,
    H]`` float32, which the kernels sum within each chunk (``SUM_G``)."""
    assert not return_qk or beta is not None, "the output block is the walk from A's"
    assert not return_states or (triton and cu_seqlens is None), "stored states: Triton, fixed length"
    assert not sum_g or triton, "per-step gates are summed in the kernels (Triton only)"
    static = WalkStatic(bool(triton), float(scale), initial_state is not None,
                        bool(output_final_state), cu_seqlens is not None, bool(state_v_first),
                        u.shape[2] // q.shape[2], beta is not None, bool(return_qk), bool(return_states),
                        bool(sum_g))
    if static.use_h0 and static.triton:
        initial_state = initial_state.astype(jnp.float32)
    arrays = [x for x in (q, k, w, u, gc, beta, initial_state, cu_seqlens, chunk_indices)
              if x is not None]
    out = sharded_call(_partitioned, _per_device, static, _layout(static), arrays)
    o, final = out[0], (out[1] if static.final else None)
    return (o, final) + tuple(out[1 + static.final:])

