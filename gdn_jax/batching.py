"""``jax.vmap`` of the Triton launches: the vmapped axis folded into the rows.

jax-triton's custom call has no batching rule (``jax.vmap`` of
``triton_call`` raises), but every kernel already loops over independent
sequences: :func:`vmappable` gives a launch a
:func:`jax.custom_batching.custom_vmap` rule that runs one launch on all
examples at once, their batch rows stacked (fixed length) or their packed
sequences concatenated with shifted offsets (``cu_seqlens``). Nested vmaps
fold once per level.

An op's array operands and results are described by their dims, one letter
each (:class:`gdn_jax.sharding.Layout`): a leading ``b`` is a batch row ``[B,
T, ...]``, a leading ``n`` a sequence's state ``[N, ...]``, ``s`` the
``cu_seqlens [N + 1]`` and ``ij`` the chunk indices ``[NT, 2]`` of a packed
batch; a leading ``p`` a row of a state pool ``[P, ...]`` and ``i`` the
``state_indices [N]`` into it (the examples' pools are stacked and each
example's indices shifted to its own pool); ``h`` a per-head parameter
``[H]`` (one for the whole launch: it cannot differ between examples).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .chunk_indices import chunk_indices_in_graph

ROWS, STATES, CU, CHUNKS, POOL, INDICES, PARAMS = "b", "n", "s", "ij", "p", "i", "h"


def kind(dims: str) -> str:
    """``"b"`` (rows), ``"n"`` (states), ``"s"`` (cu_seqlens), ``"ij"`` (chunk
    indices), ``"p"`` (pool rows), ``"i"`` (pool indices) or ``"h"`` (per-head parameters)."""
    return dims if dims in (CU, CHUNKS, INDICES, PARAMS) else dims[0]


def split_arrays(arrays, use_g: bool, varlen: bool):
    """``(k, v, g, beta, cu_seqlens, chunk_indices)`` from the non-None ones,
    ``k, v, [g], beta, [cu_seqlens, chunk_indices]``; the absent ones None."""
    arrays = list(arrays)
    k, v = arrays.pop(0), arrays.pop(0)
    g = arrays.pop(0) if use_g else None
    beta = arrays.pop(0)
    cu, ci = arrays if varlen else (None, None)
    return k, v, g, beta, cu, ci


def fold(n: int, operands, dims, chunk_size: int):
    """``n`` examples' operands (each with the example axis first) as one
    call's: ``[n, B, T, ...]`` rows as ``[n * B, T, ...]`` (fixed length) or
    ``[1, n * T, ...]`` (packed, ``B == 1``), states ``[n, N, ...]`` as
    ``[n * N, ...]``, the examples' ``cu_seqlens [n, N + 1]`` as one list of
    ``n * N`` segments (example ``e``'s offsets shifted by ``e * T``) and their
    chunk indices rebuilt in the graph for it (the examples' own are not used);
    pools ``[n, P, ...]`` as ``[n * P, ...]`` and the pool indices ``[n, N]``
    as ``[n * N]``, example ``e``'s shifted by ``e * P`` (an index outside
    ``[0, P)``, a sequence that owns no row, stays outside: -1); per-head
    parameters as they are (one, not batched).

    Returns the folded operands and ``unfold(results, result_dims)``, their inverse."""
    kinds = [kind(d) for d in dims]
    varlen = CU in kinds
    row = next(x for x, k in zip(operands, kinds) if k == ROWS)
    B, T = row.shape[1:3]
    cu = None
    if varlen:
        cu = operands[kinds.index(CU)]
        starts = cu[:, :-1] + (jnp.arange(n, dtype=cu.dtype) * T)[:, None]
        cu = jnp.append(starts.reshape(-1), jnp.asarray(n * T, cu.dtype)).astype(jnp.int32)

    pool_rows = next((x.shape[1] for x, k in zip(operands, kinds) if k == POOL), None)

    def one(x, k):
        if k == ROWS:
            return x.reshape(((1, n * T) if varlen else (n * B, T)) + x.shape[3:])
        if k in (STATES, POOL):
            return x.reshape((n * x.shape[1],) + x.shape[2:])
        if k == INDICES:
            shift = (jnp.arange(n, dtype=x.dtype) * pool_rows)[:, None]
            return jnp.where((x >= 0) & (x < pool_rows), x + shift, -1).reshape(-1)
        if k == PARAMS:
            return x
        return cu if k == CU else chunk_indices_in_graph(cu, n * T, chunk_size)

    def unfold(results, result_dims):
        def back(y, d):
            if kind(d) == ROWS:
                return y.reshape((n, B, T) + y.shape[2:])
            return y.reshape((n, y.shape[0] // n) + y.shape[1:])
        return tuple(None if y is None else back(y, d) for y, d in zip(results, result_dims))

    return [one(x, k) for x, k in zip(operands, kinds)], unfold


def vmappable(fwd, dims, result_dims, *, chunk_size: int = 64):
    """``fwd(*arrays) -> tuple`` with a vmap rule that folds ``n`` examples
    into one call (:func:`fold`); ``dims`` and ``result_dims`` name the dims
    of each array operand and result (module docstring). Arguments not
    batched are broadcast to the ``n`` examples first, but per-head
    parameters (``h``), which one launch reads once for all examples, must
    not be batched (a ValueError says what to do instead)."""
    @jax.custom_batching.custom_vmap
    def op(*arrays):
        return tuple(fwd(*arrays))

    @op.def_vmap
    def _fold(n, in_batched, *arrays):
        if any(batched and kind(d) == PARAMS for d, batched in zip(dims, in_batched)):
            raise ValueError(
                "gdn_jax: jax.vmap of a Triton launch over a per-head parameter (A_log, dt_bias "
                "[H]): the launch folds the examples into one and reads one set for all of them. "
                "Map over the examples with jax.lax.map instead, or compute the gate outside "
                "(use_gate_in_kernel=False, g = gdn_jax.options.gate_from_raw(g, A_log, dt_bias))")
        arrays = [x if batched or kind(d) == PARAMS else jnp.broadcast_to(x, (n,) + x.shape)
                  for x, batched, d in zip(arrays, in_batched, dims)]
        folded, unfold = fold(n, arrays, dims, chunk_size)
        return unfold(op(*folded), result_dims), (True,) * len(result_dims)

    return op
