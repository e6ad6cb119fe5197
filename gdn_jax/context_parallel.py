"""Context parallelism: :func:`gdn_jax.chunk_gated_delta_rule` with ``T``
sharded over mesh axes (docs/math.md, "Context parallelism").

Device ``d`` of the sequence axes holds the segment ``[lo, lo + T_l)``,
``lo = d T_l``, of every batch row (or of the one packed row). The recurrence
is affine in the state entering a segment, ``S_out = P S_in + S_local``, and
the segment's walk gives ``P`` with the existing kernels: its value axis
widened by ``K`` columns (``v -> [v | 0]``, entering state ``[S_0 | I]``), the
final state is ``[S_local | P]`` and the output's extra columns are
``m_t = P_t^T (scale q_t)``, so the true output is ``o_t = o0_t + m_t S_in``.

The devices exchange only the ``(S_local, P)`` of the piece at each
segment's right end (``all_gather``: ``D x [M, H, K, V + K]`` float32,
``M = B``, or 1 for a packed row), compose their predecessors' maps locally
into ``S_in``, and add the final states of the sequences that end on them
(``psum`` of ``[N, H, K, V]``). Everything runs in one ``jax.shard_map`` over
all mesh axes (batch and heads split as elsewhere, :mod:`gdn_jax.sharding`),
written with differentiable pieces (the walk's ``custom_vjp`` on the GPU
path, einsums, the collectives), so ``jax.grad`` moves only the cotangents
of the same state-sized arrays.

Packed rows: each segment cuts the sequences at its ends (local
``cu_seqlens``, traced, no host sync). Sequences that start inside a segment
start there from their initial state; only the one entering from the left
takes ``S_in``, and the one at the right end is handed on, through any
number of devices it spans.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .chunk_bwd import CoreStatic, run_core
from .options import state_from_k_major, state_to_k_major
from .precision import HIGHEST, compute_dtype
from .sharding import axes_entry, batch_head_axes, dim_axes, explicit_mesh


def sequence_axes(arrays):
    """``(mesh, axes)``: the ``Explicit`` mesh axes that shard dim 1 (``T``)
    of the first of ``arrays`` (``[B, T, ...]``) sharded there, or None."""
    mesh = explicit_mesh(arrays)
    if mesh is None:
        return None
    for x in arrays:
        axes = dim_axes(getattr(jax.typeof(x).sharding, "spec", P()), 1)
        if axes:
            return mesh, axes
    return None


class Segment(NamedTuple):
    """Where the sequences lie relative to one device's segment (traced).

    ``axes``, ``D``: the sequence mesh axes and their size; ``d``: this
    segment's index; ``starts_here [N]``: the sequence starts at or after the
    segment's first token (it starts from its own initial state);
    ``left [M]``, ``right [M]``: the sequence holding the segment's first and
    last token, per lane (``M = B`` batch rows, or 1 packed row);
    ``rows [B, T_l]`` or None (all): the tokens of ``left``'s piece;
    ``owned [N]``: the sequence's final state is this segment's."""
    axes: tuple
    D: int
    d: jax.Array
    starts_here: jax.Array
    left: jax.Array
    right: jax.Array
    rows: jax.Array | None
    owned: jax.Array


def locate(axes, D: int, T_local: int, B: int, cu_seqlens):
    """``(segment, local cu_seqlens or None)`` of this device: the
    :class:`Segment` and, for a packed row, ``cu_seqlens [N + 1]`` (int32)
    cut to ``[lo, lo + T_local)`` and shifted to start at 0."""
    d = jax.lax.axis_index(axes)
    if cu_seqlens is None:
        lanes = jnp.arange(B, dtype=jnp.int32)
        return Segment(axes, D, d, jnp.full((B,), d == 0), lanes, lanes, None,
                       jnp.full((B,), d == D - 1)), None
    cu = cu_seqlens.astype(jnp.int32)
    N = cu.shape[0] - 1
    lo = d * T_local
    hi = lo + T_local
    holding = lambda t: jnp.clip(  # noqa: E731  the sequence holding token t
        jnp.searchsorted(cu, t, side="right", method="scan_unrolled") - 1, 0, N - 1)[None]
    local = jnp.clip(cu - lo, 0, T_local)
    left = holding(lo)
    rows = jnp.arange(T_local)[None] < local[left + 1][:, None]
    # a sequence's last token is here; an empty one's initial state is device 0's
    owned = jnp.where(cu[:-1] == cu[1:], d == 0, (cu[1:] > lo) & (cu[1:] <= hi))
    return Segment(axes, D, d, cu[:-1] >= lo, left, holding(hi - 1), rows, owned), local


def widened_walk(static: CoreStatic, triton: bool, q, k, v, a, beta, h0, cu, ci):
    """``(o0, m, S_local, P)`` of one segment: the chunked forward with the
    value axis widened by ``K`` columns of zeros and the entering state by
    ``I_K``.

    ``q, k [B, T, Hg, K]``, ``v [B, T, H, V]``, ``a, beta [B, T, H]`` (the
    options applied), ``h0 [N, H, K, V]`` K-major in the compute dtype
    (float32, or float64), ``cu, ci`` int32 or None; ``static`` as
    :func:`gdn_jax.chunk_bwd.gdn_core` (its ``final`` and ``v_first`` are
    set here). Returns ``o0 [B, T, H, V]`` and
    ``m [B, T, H, K]`` in ``v``'s dtype (``o0`` from ``h0``; ``m_t = P_t^T
    (scale q_t)``), ``S_local [N, H, K, V]`` and ``P [N, H, K, K]`` in
    ``h0``'s dtype (each sequence's final state from ``h0``, and its
    transition)."""
    B, T, H, V = v.shape
    K = q.shape[-1]
    N = h0.shape[0]
    eye = jnp.broadcast_to(jnp.eye(K, dtype=h0.dtype), (N, H, K, K))
    v_wide = jnp.concatenate([v, jnp.zeros((B, T, H, K), v.dtype)], axis=-1)
    o, final = run_core(static._replace(final=True, v_first=False), triton, q, k, v_wide, a, beta,
                        jnp.concatenate([h0, eye], axis=-1), cu, ci)
    return o[..., :V], o[..., V:], final[..., :V], final[..., V:]


def advance(P_seg, S_local, S_in):
    """``P S_in + S_local`` (``[..., K, K]``, ``[..., K, V]``): the state
    after a segment from the one entering it."""
    return jnp.einsum("...ij,...jv->...iv", P_seg, S_in, precision=HIGHEST) + S_local


def corrected_output(o0, m, S_in, rows=None):
    """``o0 + m S_in`` in ``o0``'s dtype: ``o0, m [B, T, H, .]``,
    ``S_in [B, H, K, V]``; only at ``rows [B, T]`` where given (summed in
    ``S_in``'s dtype)."""
    fix = jnp.einsum("bthk,bhkv->bthv", m.astype(S_in.dtype), S_in, precision=HIGHEST)
    if rows is not None:
        fix = jnp.where(rows[:, :, None, None], fix, 0)
    return (o0.astype(S_in.dtype) + fix).astype(o0.dtype)


def entering_state(handed, d):
    """The state entering segment ``d`` from the maps of the segments before
    it: ``handed [D, M, H, K, V + K]``, ``(S_local | P)`` of each segment's
    right-end piece (``P = 0`` where that piece starts inside its segment).
    ``[M, H, K, V]`` in ``handed``'s dtype, zeros for ``d = 0``."""
    K = handed.shape[-2]
    V = handed.shape[-1] - K
    S = jnp.zeros(handed.shape[1:-1] + (V,), handed.dtype)
    for j in range(handed.shape[0] - 1):
        S = jnp.where(j < d, advance(handed[j, ..., V:], handed[j, ..., :V], S), S)
    return S


def segment_core(static: CoreStatic, triton: bool, q, k, v, a, beta, h0, cu, ci, *, seg: Segment):
    """The core of :func:`gdn_jax.chunk.chunk_gated_delta_rule` on one
    device's segment (arguments as :func:`gdn_jax.chunk_bwd.run_core`, local
    shapes, states in the layout ``static.v_first``): ``(o, final or None)``
    equal to the unsharded run's ``o`` on these tokens and its final states."""
    H, V = v.shape[2:]
    K = q.shape[-1]
    N = seg.owned.shape[0]
    ct = compute_dtype(q.dtype, k.dtype, v.dtype)
    h0k = jnp.zeros((N, H, K, V), ct) if h0 is None \
        else state_to_k_major(h0, static.v_first).astype(ct)
    here = seg.starts_here[:, None, None, None]
    o0, m, S_local, P_seg = widened_walk(static, triton, q, k, v, a, beta,
                                         jnp.where(here, h0k, 0), cu, ci)
    handing = jnp.concatenate([S_local[seg.right],
                               jnp.where(here[seg.right], 0, P_seg[seg.right])], axis=-1)
    handed = jax.lax.all_gather(handing, seg.axes)  # [D, M, H, K, V + K]: all that moves
    S_in = jnp.where(here[seg.left], 0, entering_state(handed, seg.d))  # [M, H, K, V]
    o = corrected_output(o0, m, S_in, seg.rows)
    if not static.final:
        return o, None
    final = S_local.at[seg.left].add(advance(P_seg[seg.left], 0, S_in))
    final = jax.lax.psum(jnp.where(seg.owned[:, None, None, None], final, 0), seg.axes)
    return o, state_from_k_major(final, static.v_first)


def call_sharded_over_sequence(forward, args, mesh, axes, *, dims, varlen: bool, final: bool):
    """``forward(*args)`` of :func:`gdn_jax.chunk._forward` with ``T``
    sharded over the mesh ``axes``, as one ``jax.shard_map`` over every mesh
    axis (batch and heads as :func:`gdn_jax.sharding.batch_head_axes` picks);
    ``args`` as there, ``cu_seqlens`` an int32 array (or None),
    ``chunk_indices`` ignored (each segment builds its own).

    Returns ``(o [B, T, H, V] sharded P(batch, axes, heads), final [N, H, .,
    .] sharded P(batch, heads) or None)``."""
    q, k, v, g, beta, h0, cu, _, A_log, dt_bias, scale = args
    T = dims.T
    D = math.prod(mesh.shape[a] for a in axes)
    if T % D:
        raise ValueError(
            f"chunk_gated_delta_rule: `q`/`k`/`v` have T = {T} tokens sharded over mesh axes "
            f"{axes} of {D} devices; context parallelism needs T divisible by {D}")
    b, h = batch_head_axes(mesh, jax.typeof(k), jax.typeof(v), varlen)
    b, h = (None if x is None or set(dim_axes(P(x), 0)) & set(axes) else x for x in (b, h))
    s = axes_entry(axes)
    tokens, gates, state = P(b, s, h, None), P(b, s, h), P(None if varlen else b, h, None, None)
    specs = (tokens, tokens, tokens, gates, gates, state, P(), P(), P(), P())
    arrays = (q, k, v, g, beta, h0, cu, A_log, dt_bias, scale)
    present = [i for i, x in enumerate(arrays) if x is not None]

    def body(*local):
        full = [None] * len(arrays)
        for i, x in zip(present, local):
            full[i] = x
        q, k, v, g, beta, h0, cu, A_log, dt_bias, scale = full
        seg, cu_local = locate(axes, D, q.shape[1], q.shape[0], cu)
        local_dims = dims._replace(B=q.shape[0], T=q.shape[1], Hg=q.shape[2], H=v.shape[2],
                                   N=seg.owned.shape[0])
        o, fin = forward(q, k, v, g, beta, h0, cu_local, None, A_log, dt_bias, scale,
                         dims=local_dims, core=functools.partial(segment_core, seg=seg))
        return (o, fin) if final else (o,)

    put = [jax.sharding.reshard(arrays[i], NamedSharding(mesh, specs[i])) for i in present]
    out = jax.shard_map(body, mesh=mesh, in_specs=tuple(specs[i] for i in present),
                        out_specs=(P(b, s, h, None), state) if final else (P(b, s, h, None),))(*put)
    return (out[0], out[1]) if final else (out[0], None)
