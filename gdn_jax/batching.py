"""``jax.vmap`` of the Triton paths: the vmapped axis folded into the rows.

jax-triton's custom call has no batching rule (``jax.vmap`` of
``triton_call`` raises), but every kernel already loops over independent
rows: :func:`vmappable` gives a ``fwd_intra``-like function a
:func:`jax.custom_batching.custom_vmap` rule that runs one launch on all
examples at once, their batch rows stacked (fixed length) or their packed
sequences concatenated with shifted offsets (``cu_seqlens``). Nested vmaps
fold once per level.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .chunk_indices import chunk_indices_in_graph


def split_arrays(arrays, use_g: bool, varlen: bool):
    """``(k, v, g, beta, cu_seqlens, chunk_indices)`` from the non-None ones,
    ``k, v, [g], beta, [cu_seqlens, chunk_indices]``; the absent ones None."""
    arrays = list(arrays)
    k, v = arrays.pop(0), arrays.pop(0)
    g = arrays.pop(0) if use_g else None
    beta = arrays.pop(0)
    cu, ci = arrays if varlen else (None, None)
    return k, v, g, beta, cu, ci


def vmappable(fwd, *, use_g: bool, varlen: bool, chunk_size: int):
    """``fwd(k, v, g, beta, cu_seqlens, chunk_indices) -> (w, u, A)`` (shapes as
    :func:`gdn_jax.fwd_intra`; ``g`` None unless ``use_g``, the last two None
    unless ``varlen``) as ``op(*arrays)`` over the non-None arguments, with a
    vmap rule that folds ``n`` examples into one call:

    - fixed length: ``[n, B, T, ...]`` becomes ``[n * B, T, ...]``;
    - packed (``B == 1``): ``[n, 1, T, ...]`` becomes ``[1, n * T, ...]``, and
      the examples' ``cu_seqlens [n, N + 1]`` one list of ``n * N`` segments,
      example ``e``'s offsets shifted by ``e * T``; its chunk indices are
      rebuilt in the graph (the examples' own are not used).

    Arguments not batched are broadcast to the ``n`` examples first.
    """
    def split(arrays):
        return split_arrays(arrays, use_g, varlen)

    @jax.custom_batching.custom_vmap
    def op(*arrays):
        return tuple(fwd(*split(arrays)))

    @op.def_vmap
    def fold(n, in_batched, *arrays):
        arrays = [x if batched else jnp.broadcast_to(x, (n,) + x.shape)
                  for x, batched in zip(arrays, in_batched)]
        k, v, g, beta, cu, _ = split(arrays)
        rows = [x for x in (k, v, g, beta) if x is not None]
        if not varlen:
            B = k.shape[1]
            outs = op(*(x.reshape((n * B,) + x.shape[2:]) for x in rows))
            return tuple(o.reshape((n, B) + o.shape[1:]) for o in outs), (True,) * 3
        T = k.shape[2]
        starts = cu[:, :-1] + (jnp.arange(n, dtype=cu.dtype) * T)[:, None]
        cu = jnp.append(starts.reshape(-1), jnp.asarray(n * T, cu.dtype)).astype(jnp.int32)
        ci = chunk_indices_in_graph(cu, n * T, chunk_size)
        outs = op(*(x.reshape((1, n * T) + x.shape[3:]) for x in rows), cu, ci)
        return tuple(o.reshape((n, 1, T) + o.shape[2:]) for o in outs), (True,) * 3

    return op
