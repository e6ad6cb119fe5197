"""The walk from ``A``'s per-chunk inputs as an op: ``(gc, A, qk)`` from the
per-step gates in one launch (:func:`gdn_jax.chunk_launch.intra_qk_triton`),
split over batch and heads under ``jax.jit`` (:mod:`gdn_jax.sharding`),
vmappable (:mod:`gdn_jax.batching`). GPU only: the jnp path sums the gates
(:func:`gdn_jax.chunk_jnp.chunk_local_cumsum`) and builds ``w, u`` instead.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

from .batching import vmappable
from .chunk_launch import intra_qk_triton
from .sharding import Layout, partitioned, sharded_call


class IntraQkStatic(NamedTuple):
    """What the op is specialised on."""
    varlen: bool
    ratio: int  # GQA: H // Hg


def _layout(static: IntraQkStatic) -> Layout:
    """``q, k, a, beta, [cu_seqlens, chunk_indices] -> gc, A, qk``."""
    operands = ("btgk", "btgk", "bth", "bth") + (("s", "ij") if static.varlen else ())
    return Layout(operands, ("bth", "btha", "btha"), static.varlen, static.ratio)


@functools.cache
def _triton_op(static: IntraQkStatic):
    layout = _layout(static)

    def fwd(q, k, a, beta, cu=None, ci=None):
        return intra_qk_triton(q, k, a, beta, cu, ci)

    return vmappable(fwd, layout.operands, layout.results)


def _per_device(static: IntraQkStatic, *arrays):
    return _triton_op(static)(*arrays)


_partitioned = partitioned(_per_device, _layout)


def intra_qk(q, k, a, beta, cu_seqlens=None, chunk_indices=None):
    """``(gc, A, qk)`` of checked arrays (shapes and dtypes as
    :func:`gdn_jax.chunk_launch.intra_qk_triton`; ``cu_seqlens`` and
    ``chunk_indices`` int32 jax arrays of a packed batch, or both None)."""
    static = IntraQkStatic(cu_seqlens is not None, a.shape[2] // q.shape[2])
    arrays = [x for x in (q, k, a, beta, cu_seqlens, chunk_indices) if x is not None]
    return sharded_call(_partitioned, _per_device, static, _layout(static), arrays)
