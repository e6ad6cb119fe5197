"""Chunk indices of a packed variable-length batch: ``[NT, 2]`` int32 rows
``(sequence index, chunk index inside that sequence)``, the work list of the
kernels' first grid axis.

Two versions:

- :func:`prepare_chunk_indices` for concrete ``cu_seqlens`` (NumPy on the host):
  exactly ``sum_n ceil(len_n / chunk_size)`` rows, as the seed's helper.
- :func:`chunk_indices_in_graph` for traced ``cu_seqlens`` (inside ``jax.jit``):
  the grid needs a static size, so it returns the bound
  ``cdiv(T, chunk_size) + N`` rows; the rows past the real chunks are
  :func:`padding rows <padding_row>` that every kernel (and the jnp reference)
  skips. No host round trip.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .validate import is_traced


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def padding_row(T: int, chunk_size: int) -> tuple[int, int]:
    """The ``(0, cdiv(T, chunk_size))`` row: chunk ``c`` of sequence 0 with
    ``c * chunk_size >= T >= len_0``, which the kernels skip."""
    return 0, cdiv(T, chunk_size)


def prepare_chunk_indices(cu_seqlens, chunk_size: int = 64) -> jax.Array:
    """Chunk indices for concrete ``cu_seqlens``.

    Args:
      cu_seqlens: ``[N + 1]`` integer array (NumPy, list or concrete jax
        array), ``cu_seqlens[0] == 0``, non-decreasing.
      chunk_size: rows per chunk (64 for the kernels).

    Returns:
      ``[NT, 2]`` int32 jax array, ``NT = sum_n ceil(len_n / chunk_size)``:
      for every chunk of every sequence, in order, ``(n, c)``. A sequence of
      length 0 has no chunk.
    """
    cu = np.asarray(cu_seqlens)
    if cu.ndim != 1 or not np.issubdtype(cu.dtype, np.integer):
        raise ValueError(
            f"prepare_chunk_indices: `cu_seqlens` must be a 1-D integer array, "
            f"got shape {cu.shape} and dtype {cu.dtype}"
        )
    lens = np.maximum(np.diff(cu.astype(np.int64)), 0)
    n_chunks = -(-lens // chunk_size)
    seq = np.repeat(np.arange(len(lens)), n_chunks)
    first = np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
    chunk = np.arange(len(seq)) - first
    return jnp.asarray(np.stack([seq, chunk], axis=1).astype(np.int32).reshape(-1, 2))


def padded_chunk_rows(T: int, N: int, chunk_size: int = 64) -> int:
    """``cdiv(T, chunk_size) + N``: the bound on the chunks of ``N`` sequences
    packed into ``T`` rows (each adds at most one partial chunk), the static
    length of :func:`chunk_indices_in_graph`."""
    return cdiv(T, chunk_size) + N


def chunk_indices_in_graph(cu_seqlens: jax.Array, T: int, chunk_size: int = 64) -> jax.Array:
    """Chunk indices for traced ``cu_seqlens``, padded to a static length.

    Args:
      cu_seqlens: ``[N + 1]`` integer jax array (may be a tracer).
      T: total number of packed tokens (static).
      chunk_size: rows per chunk.

    Returns:
      ``[cdiv(T, chunk_size) + N, 2]`` int32: the rows of
      :func:`prepare_chunk_indices` followed by :func:`padding_row` rows.
      Segments with ``cu[n + 1] < cu[n]`` count as empty.
    """
    cu = cu_seqlens.astype(jnp.int32)
    n_seq = cu.shape[0] - 1
    n_rows = padded_chunk_rows(T, n_seq, chunk_size)
    lens = jnp.maximum(cu[1:] - cu[:-1], 0)
    n_chunks = (lens + chunk_size - 1) // chunk_size
    ends = jnp.cumsum(n_chunks)
    row = jnp.arange(n_rows, dtype=jnp.int32)
    # "scan_unrolled": log2(N) unrolled steps; the default "scan" is an XLA while
    # loop (a loop of small kernels on the GPU, ahead of the Triton launches).
    seq = jnp.searchsorted(ends, row, side="right", method="scan_unrolled")
    seq = jnp.minimum(seq, n_seq - 1).astype(jnp.int32)
    chunk = row - (ends - n_chunks)[seq]
    real = row < ends[-1]
    pad_seq, pad_chunk = padding_row(T, chunk_size)
    return jnp.stack(
        [jnp.where(real, seq, pad_seq), jnp.where(real, chunk, pad_chunk)], axis=1
    ).astype(jnp.int32)


def varlen_work_list(cu_seqlens, chunk_indices, T: int, chunk_size: int = 64):
    """``(cu_seqlens, chunk_indices)`` as int32 jax arrays for a checked packed
    batch, or ``(None, None)`` without ``cu_seqlens``.

    When ``chunk_indices`` is not given: the exact list of
    :func:`prepare_chunk_indices` for a concrete ``cu_seqlens`` (NumPy or jax
    array, computed on the host once), the padded list of
    :func:`chunk_indices_in_graph` for a traced one.
    """
    if cu_seqlens is None:
        return None, None
    if chunk_indices is None:
        chunk_indices = (chunk_indices_in_graph(cu_seqlens, T, chunk_size) if is_traced(cu_seqlens)
                         else prepare_chunk_indices(cu_seqlens, chunk_size))
    return jnp.asarray(cu_seqlens, jnp.int32), jnp.asarray(chunk_indices, jnp.int32)


def chunk_offsets(cu_seqlens: jax.Array, chunk_size: int = 64) -> jax.Array:
    """``[N + 1]`` int32: the index of each packed sequence's first chunk in
    the list of all chunks (``cumsum`` of ``ceil(len_n / chunk_size)``, from 0);
    works on a traced ``cu_seqlens``."""
    cu = jnp.asarray(cu_seqlens).astype(jnp.int32)
    lens = jnp.maximum(cu[1:] - cu[:-1], 0)
    n_chunks = (lens + chunk_size - 1) // chunk_size
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(n_chunks).astype(jnp.int32)])
