"""``fwd_intra`` on sharded arrays: each device runs the kernels on its own block.

XLA cannot look inside a Triton custom call, so under ``jax.jit`` it would
gather sharded inputs onto every device and run the whole problem there.
:func:`fwd_intra_sharded` wraps the per-device implementation (Triton or jnp)
with :func:`jax.experimental.custom_partitioning.custom_partitioning`, which
tells the partitioner (Shardy by default, or GSPMD) how the op may be split:

- batch ``B`` (dim 0 of every array) and heads (dim 2: ``H`` of ``v``, ``g``,
  ``beta`` and the outputs, ``Hg`` of ``k``) may be sharded. Value head ``h``
  reads key head ``h // (H // Hg)``, so a contiguous block of value heads needs
  the matching block of key heads: both are split over the same mesh axes,
  which needs ``Hg`` divisible by the number of head shards.
- ``T`` and the head dims ``K``, ``V`` must be whole on each device (chunks and
  the triangular solve span them); sharding there is gathered.
- Packed varlen (``cu_seqlens``, ``B == 1``): heads only; ``cu_seqlens`` and
  ``chunk_indices`` are replicated.

Any other sharding is not an error: the partitioner reshards the inputs to
what :func:`_plan` asks for (heads or batch replicated where they cannot be
split), the same result, just with the gathers.

Arrays whose types carry shardings (``Explicit`` mesh axes) enter through
:func:`jax.sharding.auto_axes` (:func:`call_with_auto_axes`). Under
``jax.grad`` / ``jax.vmap`` the op falls back to the plain per-device function
(custom_partitioning has no rules for them).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .autotune import without_timing
from .batching import split_arrays, vmappable
from .reference import fwd_intra_jnp
from .triton_launch import fwd_intra_triton


class Static(NamedTuple):
    """What the partitioned op is specialised on (its static argument)."""
    impl: str  # "gluon", "triton", "split", "seed" or "reference"
    chunk_size: int
    use_g: bool  # g given
    varlen: bool  # cu_seqlens and chunk_indices given
    ratio: int  # GQA: H // Hg


def _per_device(static: Static, *arrays):
    """``(w, u, A)`` of the blocks one device holds; ``arrays`` are ``k, v,
    [g], beta, [cu_seqlens, chunk_indices]`` with shapes as ``fwd_intra``."""
    if static.impl != "reference":
        return _triton_op(static)(*arrays)
    k, v, g, beta, cu, ci = split_arrays(arrays, static.use_g, static.varlen)
    return fwd_intra_jnp(k, v, g, beta, cu_seqlens=cu, chunk_size=static.chunk_size,
                         chunk_indices=ci)


@functools.cache
def _triton_op(static: Static):
    """The Triton launch of ``static.impl`` over the arrays of ``_per_device``,
    vmappable (:func:`gdn_jax.batching.vmappable`: jax-triton has no vmap
    rule), and saying so when differentiated (the kernels are forward only)."""
    def fwd(k, v, g, beta, cu, ci):
        return fwd_intra_triton(k, v, g, beta, cu_seqlens=cu, chunk_size=static.chunk_size,
                                chunk_indices=ci, path=static.impl)

    op = jax.custom_jvp(vmappable(fwd, use_g=static.use_g, varlen=static.varlen,
                                  chunk_size=static.chunk_size))

    @op.defjvp
    def _no_derivative(primals, tangents):
        raise NotImplementedError(
            f"gdn_jax.fwd_intra: impl={static.impl!r} runs forward-only Triton kernels and has "
            f"no derivative; differentiate impl='reference' (the jnp reference) instead")

    return op


def _axes(spec, dim: int) -> tuple[str, ...]:
    """The mesh axes that shard ``dim`` of a ``PartitionSpec`` (``()`` when whole)."""
    entry = spec[dim] if dim < len(spec) else None
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _entry(axes: tuple[str, ...]):
    return None if not axes else axes[0] if len(axes) == 1 else axes


def batch_head_axes(mesh, k, v, varlen: bool):
    """``(batch, heads)``: the mesh axes (PartitionSpec entries) that the op
    splits ``B`` and the heads over, for ``k [B, T, Hg, K]``, ``v [B, T, H, V]``
    (anything with ``.shape`` and ``.sharding``).

    Taken from ``v``'s sharding (else ``k``'s) where they divide ``B`` and
    ``Hg`` (so also ``H``); packed varlen splits heads only; ``None`` where the
    dim stays whole.
    """
    B, _, Hg, _ = k.shape
    specs = [getattr(x.sharding, "spec", P()) for x in (v, k)]

    def pick(dim, size, taken=()):
        for spec in specs:
            axes = _axes(spec, dim)
            if axes and size % math.prod(mesh.shape[a] for a in axes) == 0 \
                    and not set(axes) & set(taken):
                return axes
        return ()

    batch = () if varlen else pick(0, B)
    return _entry(batch), _entry(pick(2, Hg, batch))


def _plan(static: Static, mesh, arg_shapes):
    """The shardings the op runs with: ``(operand shardings, result shardings)``.

    ``k``, ``v``, ``g``, ``beta`` and the results split over the axes of
    :func:`batch_head_axes` (``k``'s heads over the same axes as ``v``'s);
    ``T``, ``K``, ``V``, ``cu_seqlens`` and ``chunk_indices`` whole.
    """
    b, h = batch_head_axes(mesh, arg_shapes[0], arg_shapes[1], static.varlen)
    by_rank = {4: NamedSharding(mesh, P(b, None, h, None)), 3: NamedSharding(mesh, P(b, None, h)),
               2: NamedSharding(mesh, P(None, None)), 1: NamedSharding(mesh, P(None))}
    operands = tuple(by_rank[len(x.shape)] for x in arg_shapes)
    return operands, (by_rank[4],) * 3


def _partition(static: Static, mesh, arg_shapes, result_shape):
    """The partitioner's callback: shardings to run with, and the per-device function."""
    operands, results = _plan(static, mesh, arg_shapes)

    def lower(*arrays):  # called from inside XLA's partitioner: no config timing there
        with without_timing():
            return _per_device(static, *arrays)

    return mesh, lower, results, operands


def _infer(static: Static, mesh, arg_shapes, result_shape):
    """GSPMD's question (when Shardy is off): the result shardings."""
    return _plan(static, mesh, arg_shapes)[1]


def _rule(static: Static, mesh, operand_types, result_types):
    """Shardy's einsum-like rule. Value heads are the compound factor
    ``(hg r)``: key head ``hg`` times the GQA ratio ``r = H // Hg``, so that a
    head sharding moves between ``k`` and ``v`` by blocks."""
    heads = "hg" if static.ratio == 1 else "(hg r)"
    operands = ["b t hg k", f"b t {heads} v"] + [f"b t {heads}"] * (1 + static.use_g)
    if static.varlen:
        operands += ["n", "nt two"]
    results = [f"b t {heads} k", f"b t {heads} v", f"b t {heads} c"]
    rule = f"{', '.join(operands)} -> {', '.join(results)}"
    # Factors that must stay whole, in order of first appearance (Shardy wants them sorted).
    names = rule.replace("(", " ").replace(")", " ").replace(",", " ").split()
    whole = tuple(dict.fromkeys(f for f in names if f in ("t", "k", "v", "c", "n", "nt", "two")))
    sizes = {} if static.ratio == 1 else {"r": static.ratio}
    return rule, dict(need_replication_factors=whole, **sizes)


_fwd_intra_partitioned = custom_partitioning(_per_device, static_argnums=(0,))
_fwd_intra_partitioned.def_partition(partition=_partition, infer_sharding_from_operands=_infer,
                                     sharding_rule=_rule)


@functools.cache
def _transformable(static: Static):
    """The partitioned op, plus the jvp and vmap rules custom_partitioning lacks:
    both use the plain per-device function (as before this module), so the jnp
    reference stays differentiable and vmappable (XLA partitions its jnp itself)."""
    plain = functools.partial(_per_device, static)

    @jax.custom_batching.custom_vmap
    def op(*arrays):
        return tuple(_fwd_intra_partitioned(static, *arrays))

    @op.def_vmap
    def _vmap(axis_size, in_batched, *arrays):
        in_axes = tuple(0 if batched else None for batched in in_batched)
        return jax.vmap(plain, in_axes=in_axes)(*arrays), (True,) * 3

    op = jax.custom_jvp(op)
    op.defjvp(lambda primals, tangents: jax.jvp(plain, primals, tangents))
    return op


def explicit_mesh(arrays):
    """The mesh of the first array whose type carries an Explicit sharding, else None."""
    for x in arrays:
        mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None) \
            if x is not None else None
        if mesh is not None and not mesh.empty and mesh.explicit_axes:
            return mesh
    return None


def call_with_auto_axes(f, args, k, v, varlen: bool, result_specs):
    """``f(*args)``; where the arrays' types carry shardings (mesh axes of type
    ``Explicit``, the default of ``jax.make_mesh``), through
    :func:`jax.sharding.auto_axes`: custom_partitioning traces with
    sharding-free types, and XLA's partitioner then sees the shardings.

    ``result_specs(batch, heads)`` gives the ``PartitionSpec`` of each result
    (a pytree, ``None`` for an absent result) from :func:`batch_head_axes`.
    """
    mesh = explicit_mesh(args)
    if mesh is None:
        return f(*args)
    b, h = batch_head_axes(mesh, jax.typeof(k), jax.typeof(v), varlen)
    out = jax.tree.map(lambda spec: NamedSharding(mesh, spec), result_specs(b, h),
                       is_leaf=lambda x: isinstance(x, P))
    return jax.sharding.auto_axes(f, out_sharding=out)(*args)


def fwd_intra_sharded(k, v, g, beta, *, cu_seqlens=None, chunk_size=64, chunk_indices=None,
                      impl="reference"):
    """``fwd_intra`` that the SPMD partitioner splits over batch and heads.

    Inputs as :func:`gdn_jax.fwd_intra`, already checked, ``impl`` resolved to
    ``"triton"``, ``"seed"`` or ``"reference"``, and with ``cu_seqlens`` both it and
    ``chunk_indices`` int32 jax arrays
    (:func:`gdn_jax.chunk_indices.varlen_work_list`). Under ``jax.jit`` with
    arrays sharded over ``B`` and/or heads, each device computes its block and
    ``w [B, T, H, K]``, ``u [B, T, H, V]``, ``A [B, T, H, 64]`` come out
    sharded the same way (see the module docstring). On one device, or
    outside ``jax.jit``, it is the plain per-device function.
    """
    static = Static(impl, chunk_size, g is not None, cu_seqlens is not None,
                    v.shape[2] // k.shape[2])
    arrays = [x for x in (k, v, g, beta, cu_seqlens, chunk_indices) if x is not None]
    if jax.device_count() == 1:  # nothing to partition: the plain launch
        return _per_device(static, *arrays)
    with without_timing():  # custom_partitioning traces _per_device at the global shapes
        return call_with_auto_axes(_transformable(static), arrays, k, v, static.varlen,
                                   lambda b, h: (P(b, None, h, None),) * 3)
