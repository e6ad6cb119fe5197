"""The ops on sharded arrays: each device runs the kernels on its own block.

XLA cannot look inside a Triton custom call, so under ``jax.jit`` it would
gather sharded inputs onto every device and run the whole problem there.
:func:`partitioned` wraps an op's per-device implementation (Triton or jnp)
with :func:`jax.experimental.custom_partitioning.custom_partitioning`, which
tells the partitioner (Shardy by default, or GSPMD) how the op may be split.
An op describes its arrays by a :class:`Layout`, one letter per dim:

- ``b`` batch rows and ``n`` sequences (the states' first dim, ``N = B`` for
  fixed length) may be sharded, over the same mesh axes;
- ``g`` key heads and ``h`` value heads may be sharded. Value head ``h``
  reads key head ``h // (H // Hg)``, so a contiguous block of value heads
  needs the matching block of key heads: both are split over the same mesh
  axes, which needs ``Hg`` divisible by the number of head shards;
- every other dim is whole on each device: ``T`` (chunks and the state
  recurrence span it), the head dims, ``cu_seqlens`` (``s``), the chunk
  indices (``ij``), the rows of a state pool (``p``) and the indices into it
  (``i``). A sharding there is gathered.
- Packed varlen (``cu_seqlens``, ``B == 1``), and any op on a state pool
  (every device would write its sequences' rows into its own copy): heads only.

Any other sharding is not an error: the partitioner reshards the inputs to
what :func:`_plan` asks for (heads or batch replicated where they cannot be
split), the same result, just with the gathers.

Arrays whose types carry shardings (``Explicit`` mesh axes) enter through
:func:`jax.sharding.auto_axes` (:func:`call_with_auto_axes`). Under
``jax.vmap`` and ``jax.jvp`` an op falls back to its plain per-device function
(custom_partitioning has no rules for them).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from .autotune import without_timing
from .batching import split_arrays, vmappable
from .reference import fwd_intra_jnp
from .triton_launch import fwd_intra_triton

WHOLE = "t"  # a dim letter of no special meaning: never split


class Layout(NamedTuple):
    """The dims of an op's array operands and results, one letter per dim
    (module docstring); ``varlen``: split over heads only (a packed batch, a
    state pool), ``ratio``: ``H // Hg``."""
    operands: tuple[str, ...]
    results: tuple[str, ...]
    varlen: bool
    ratio: int


def dim_axes(spec, dim: int) -> tuple[str, ...]:
    """The mesh axes that shard ``dim`` of a ``PartitionSpec`` (``()`` when whole)."""
    entry = spec[dim] if dim < len(spec) else None
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def axes_entry(axes: tuple[str, ...]):
    """The ``PartitionSpec`` entry of mesh axes: None, one name, or a tuple."""
    return None if not axes else axes[0] if len(axes) == 1 else axes


def batch_head_axes(mesh, k, v, varlen: bool):
    """``(batch, heads)``: the mesh axes (PartitionSpec entries) that an op
    splits ``B`` and the heads over, for a key-head array ``k [B, T, Hg, .]``
    and a value-head array ``v [B, T, H, .]`` (anything with ``.shape`` and
    ``.sharding``).

    Taken from ``v``'s sharding (else ``k``'s) where they divide ``B`` and
    ``Hg`` (so also ``H``); packed varlen splits heads only; ``None`` where the
    dim stays whole.
    """
    B, _, Hg, _ = k.shape
    specs = [getattr(x.sharding, "spec", P()) for x in (v, k)]

    def pick(dim, size, taken=()):
        for spec in specs:
            axes = dim_axes(spec, dim)
            if axes and size % math.prod(mesh.shape[a] for a in axes) == 0 \
                    and not set(axes) & set(taken):
                return axes
        return ()

    batch = () if varlen else pick(0, B)
    return axes_entry(batch), axes_entry(pick(2, Hg, batch))


def key_value_operands(layout: Layout, arrays):
    """The first key-head (``btg..``) and value-head (``bth..``) arrays."""
    key = next(x for x, d in zip(arrays, layout.operands) if d.startswith("btg"))
    value = next(x for x, d in zip(arrays, layout.operands) if d.startswith("bth"))
    return key, value


def spec_of(dims: str, batch, heads, varlen: bool) -> P:
    """The ``PartitionSpec`` of an array of ``dims`` split over ``batch`` and ``heads``."""
    def entry(d):
        if d == "b" or (d == "n" and not varlen):
            return batch
        return heads if d in "gh" else None
    return P(*map(entry, dims))


def _plan(layout: Layout, mesh, arg_shapes):
    """The shardings the op runs with: ``(operand shardings, result shardings)``."""
    b, h = batch_head_axes(mesh, *key_value_operands(layout, arg_shapes), layout.varlen)
    shard = lambda dims: NamedSharding(mesh, spec_of(dims, b, h, layout.varlen))  # noqa: E731
    return tuple(map(shard, layout.operands)), tuple(map(shard, layout.results))


def _rule(layout: Layout):
    """Shardy's einsum-like rule. Value heads are the compound factor
    ``(hg r)``: key head ``hg`` times the GQA ratio ``r = H // Hg``, so that a
    head sharding moves between key and value arrays by blocks; ``n`` is
    ``b`` for fixed length."""
    heads = "hg" if layout.ratio == 1 else "(hg r)"
    names = dict(b="b", g="hg", h=heads, n="n" if layout.varlen else "b")
    rule = " -> ".join(", ".join(" ".join(names.get(d, d) for d in dims) for dims in side)
                       for side in (layout.operands, layout.results))
    # Factors that must stay whole, in order of first appearance (Shardy wants them sorted).
    factors = rule.replace("(", " ").replace(")", " ").replace(",", " ").replace("->", " ").split()
    whole = tuple(dict.fromkeys(f for f in factors if f not in ("b", "hg", "r")))
    sizes = {} if layout.ratio == 1 else {"r": layout.ratio}
    return rule, dict(need_replication_factors=whole, **sizes)


def partitioned(per_device: Callable, layout_of: Callable):
    """``per_device(static, *arrays) -> tuple`` as an op the SPMD partitioner
    splits over batch and heads; ``layout_of(static)`` is its :class:`Layout`
    (``static`` hashable)."""
    op = custom_partitioning(per_device, static_argnums=(0,))

    def partition(static, mesh, arg_shapes, result_shape):
        operands, results = _plan(layout_of(static), mesh, arg_shapes)

        def lower(*arrays):  # called from inside XLA's partitioner: no config timing there
            with without_timing():
                return per_device(static, *arrays)

        return mesh, lower, results, operands

    op.def_partition(
        partition=partition,
        infer_sharding_from_operands=lambda static, mesh, args, result: _plan(
            layout_of(static), mesh, args)[1],
        sharding_rule=lambda static, mesh, operands, results: _rule(layout_of(static)))
    return op


@functools.cache
def transformable(op, per_device: Callable, static):
    """The partitioned ``op`` at ``static``, plus the jvp and vmap rules
    custom_partitioning lacks: both use the plain per-device function, so a
    jnp implementation stays differentiable and vmappable (XLA partitions its
    jnp itself)."""
    plain = functools.partial(per_device, static)

    @jax.custom_batching.custom_vmap
    def call(*arrays):
        return tuple(op(static, *arrays))

    @call.def_vmap
    def _vmap(axis_size, in_batched, *arrays):
        in_axes = tuple(0 if batched else None for batched in in_batched)
        out = jax.vmap(plain, in_axes=in_axes)(*arrays)
        return out, (True,) * len(out)

    call = jax.custom_jvp(call)
    call.defjvp(lambda primals, tangents: jax.jvp(plain, primals, tangents))
    return call


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
    (a pytree, ``None`` for an absent result) from :func:`batch_head_axes`
    of the key-head array ``k`` and the value-head array ``v``.
    """
    mesh = explicit_mesh(args)
    if mesh is None:
        return f(*args)
    b, h = batch_head_axes(mesh, jax.typeof(k), jax.typeof(v), varlen)
    out = jax.tree.map(lambda spec: NamedSharding(mesh, spec), result_specs(b, h),
                       is_leaf=lambda x: isinstance(x, P))
    return jax.sharding.auto_axes(f, out_sharding=out)(*args)


def inside_manual_body() -> bool:
    """Whether this trace is inside a ``jax.shard_map`` body over every axis
    of its mesh (the context parallel path, :mod:`gdn_jax.context_parallel`)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and all(t == AxisType.Manual for t in mesh.axis_types)


def varying_like(x, like):
    """``x`` varying over every manual mesh axis that ``like`` varies over.
    Inside a ``jax.shard_map`` body a Triton launch's results vary over none
    (jax-triton's custom call gives its results no such axes), and a
    ``custom_vjp`` backward must return each cotangent with its primal's."""
    if x is None or like is None:
        return x
    varying = lambda a: jax.typeof(a).manual_axis_type.varying  # noqa: E731 (jax 0.10 and 0.11)
    missing = tuple(sorted(varying(like) - varying(x)))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def sharded_call(op, per_device: Callable, static, layout: Layout, arrays):
    """``per_device(static, *arrays)``, split over batch and heads under
    ``jax.jit`` where the arrays are sharded (``op``: :func:`partitioned`
    of ``per_device``). On one device, or inside a ``jax.shard_map`` body
    over every mesh axis (the arrays are already a device's blocks), the
    plain per-device function."""
    if jax.device_count() == 1 or inside_manual_body():  # nothing to partition: the plain launch
        return per_device(static, *arrays)
    k, v = key_value_operands(layout, arrays)
    with without_timing():  # custom_partitioning traces per_device at the global shapes
        return call_with_auto_axes(
            transformable(op, per_device, static), arrays, k, v, layout.varlen,
            lambda b, h: tuple(spec_of(d, b, h, layout.varlen) for d in layout.results))


# --------------------------------------------------------------------------- fwd_intra

class Static(NamedTuple):
    """What the partitioned ``fwd_intra`` is specialised on (its static argument)."""
    impl: str  # "gluon", "triton", "split", "seed", "reference", or "A" (the split path's A kernel alone)
    chunk_size: int
    use_g: bool  # g given
    varlen: bool  # cu_seqlens and chunk_indices given
    ratio: int  # GQA: H // Hg
    sum_g: bool = False  # g holds the per-step log gates, summed in the kernel (impl "A" only)


def _intra_layout(static: Static) -> Layout:
    """``k, v, [g], beta, [cu_seqlens, chunk_indices] -> w, u, A`` (``-> A`` for impl "A")."""
    operands = ("btgk", "bthv") + ("bth",) * (1 + static.use_g) + (("s", "ij") if static.varlen else ())
    results = ("btha",) if static.impl == "A" else ("bthk", "bthv", "btha")
    return Layout(operands, results, static.varlen, static.ratio)


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
    rule), and saying so when differentiated: the launch has no derivative of
    its own (``gdn_jax.fwd_intra`` wraps it in the ``custom_vjp`` of
    :mod:`gdn_jax.intra_bwd`; the chunked forward, in its own)."""
    layout = _intra_layout(static)

    def fwd(*arrays):
        k, v, g, beta, cu, ci = split_arrays(arrays, static.use_g, static.varlen)
        return fwd_intra_triton(k, v, g, beta, cu_seqlens=cu, chunk_size=static.chunk_size,
                                chunk_indices=ci, path=static.impl, sum_g=static.sum_g)

    op = jax.custom_jvp(vmappable(fwd, layout.operands, layout.results,
                                  chunk_size=static.chunk_size))

    @op.defjvp
    def _no_derivative(primals, tangents):
        raise NotImplementedError(
            f"gdn_jax: the Triton launch of fwd_intra's impl={static.impl!r} has no derivative of "
            f"its own: differentiate gdn_jax.fwd_intra (a custom_vjp on this path), or impl='reference'")

    return op


_fwd_intra_partitioned = partitioned(_per_device, _intra_layout)


def fwd_intra_sharded(k, v, g, beta, *, cu_seqlens=None, chunk_size=64, chunk_indices=None,
                      impl="reference", sum_g=False):
    """``fwd_intra`` that the SPMD partitioner splits over batch and heads
    (``impl="A"``: ``(A,)`` alone, from the split path's A kernel; GPU only;
    with ``sum_g``, ``g`` holds the per-step log gates ``[B, T, H]`` float32
    and the kernel sums them within each chunk, ``SUM_G``).

    Inputs as :func:`gdn_jax.fwd_intra`, already checked, ``impl`` resolved to
    a path (``"gluon"``, ``"triton"``, ``"split"``, ``"seed"`` or
    ``"reference"``), and with ``cu_seqlens`` both it and ``chunk_indices``
    int32 jax arrays (:func:`gdn_jax.chunk_indices.varlen_work_list`). Under
    ``jax.jit`` with arrays sharded over ``B`` and/or heads, each device
    computes its block and ``w [B, T, H, K]``, ``u [B, T, H, V]``, ``A [B, T,
    H, 64]`` come out sharded the same way (see the module docstring). On one
    device, or outside ``jax.jit``, it is the plain per-device function.
    """
    assert not sum_g or (impl == "A" and g is not None), "sum_g: the A kernel's, on given gates"
    static = Static(impl, chunk_size, g is not None, cu_seqlens is not None,
                    v.shape[2] // k.shape[2], bool(sum_g))
    arrays = [x for x in (k, v, g, beta, cu_seqlens, chunk_indices) if x is not None]
    return sharded_call(_fwd_intra_partitioned, _per_device, static, _intra_layout(static), arrays)
