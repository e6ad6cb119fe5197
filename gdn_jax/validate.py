"""Argument checks of the public ops: every error names the argument, what it
got and what it needs.

Checks on values (``cu_seqlens`` starting at 0, non-decreasing, ending at
``T``) run only where ``cu_seqlens`` is concrete. Under ``jax.jit`` a traced
``cu_seqlens`` cannot raise; :func:`checkify_cu_seqlens` checks it in the graph.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

CHUNK_SIZES = (64,)
KERNEL_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
IMPLS = ("auto", "gluon", "triton", "split", "seed", "reference")


def as_array(x):
    """Array-likes (lists, scalars) as jax arrays; arrays (NumPy or jax) and None as they are."""
    return x if x is None or hasattr(x, "ndim") and hasattr(x, "dtype") else jnp.asarray(x)


def is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def python_number(x):
    """``x`` (a scalar) as a Python float where it is concrete, else None (a tracer)."""
    try:
        return float(x)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return None


def _shape(x) -> tuple[int, ...]:
    return tuple(x.shape)


def _check_rank(op: str, name: str, x, rank: int, layout: str) -> None:
    if x.ndim != rank:
        raise ValueError(
            f"{op}: `{name}` must have rank {rank} {layout}, got shape {_shape(x)}"
        )


def _check_float(op: str, name: str, x, what: str = "a floating dtype") -> None:
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(
            f"{op}: `{name}` must have {what} (bfloat16, float16 or float32), got {x.dtype}"
        )


def _check_shape(op: str, name: str, x, want: tuple[int, ...], layout: str, why: str) -> None:
    if _shape(x) != want:
        raise ValueError(
            f"{op}: `{name}` must have shape {layout} = {want} ({why}), got {_shape(x)}"
        )


def check_impl(op: str, impl: str, impls: tuple[str, ...] = IMPLS) -> None:
    if impl not in impls:
        raise ValueError(f"{op}: `impl` must be one of {impls}, got {impl!r}")


def check_static_flag(op: str, name: str, x) -> None:
    """A flag that decides the outputs' shapes must be a Python bool."""
    if is_traced(x):
        raise TypeError(f"{op}: `{name}` must be a Python bool, static under jax.jit "
                        f"(static_argnames=('{name}',)); got a tracer")


def check_chunk_size(op: str, chunk_size) -> None:
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(
            f"{op}: `chunk_size` must be one of {CHUNK_SIZES} (the fused kernel "
            f"hard-codes 4 sub-blocks of 16 rows), got {chunk_size!r}"
        )


def check_cu_seqlens(op: str, cu_seqlens, B: int, T: int) -> None:
    """Checks ``cu_seqlens``'s type, rank and batch; its values when concrete."""
    if not hasattr(cu_seqlens, "dtype") or not jnp.issubdtype(cu_seqlens.dtype, jnp.integer):
        raise TypeError(
            f"{op}: `cu_seqlens` must be an integer array [N + 1], got "
            f"{getattr(cu_seqlens, 'dtype', type(cu_seqlens).__name__)}"
        )
    if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(
            f"{op}: `cu_seqlens` must have rank 1 and at least 2 entries "
            f"[0, ..., T], got shape {_shape(cu_seqlens)}"
        )
    if B != 1:
        raise ValueError(
            f"{op}: with `cu_seqlens` the sequences are packed along T, so the "
            f"batch size B must be 1, got B={B}"
        )
    if is_traced(cu_seqlens):
        return
    cu = np.asarray(cu_seqlens)
    if cu[0] != 0:
        raise ValueError(f"{op}: `cu_seqlens[0]` must be 0, got {cu[0]}")
    steps = np.diff(cu)
    if (steps < 0).any():
        i = int(np.argmax(steps < 0))
        raise ValueError(
            f"{op}: `cu_seqlens` must be non-decreasing, got cu_seqlens[{i}]={cu[i]} "
            f"> cu_seqlens[{i + 1}]={cu[i + 1]}"
        )
    if cu[-1] != T:
        raise ValueError(
            f"{op}: `cu_seqlens[-1]` must equal T={T} (the packed length), got {cu[-1]}"
        )


def check_chunk_indices(op: str, chunk_indices, cu_seqlens) -> None:
    if cu_seqlens is None:
        raise ValueError(f"{op}: `chunk_indices` is given but `cu_seqlens` is None; pass both")
    if not hasattr(chunk_indices, "dtype") or not jnp.issubdtype(chunk_indices.dtype, jnp.integer):
        raise TypeError(
            f"{op}: `chunk_indices` must be an integer array [NT, 2], got "
            f"{getattr(chunk_indices, 'dtype', type(chunk_indices).__name__)}"
        )
    if chunk_indices.ndim != 2 or chunk_indices.shape[1] != 2:
        raise ValueError(
            f"{op}: `chunk_indices` must have shape [NT, 2] (sequence, chunk), "
            f"got {_shape(chunk_indices)}"
        )


def _check_key_value_heads(op: str, k, v) -> tuple[int, int, int, int, int, int]:
    """``k [B, T, Hg, K]`` and ``v [B, T, H, V]`` agree (GQA: ``H % Hg == 0``);
    returns ``B, T, Hg, H, K, V``."""
    B, T, Hg, K = _shape(k)
    H, V = v.shape[2], v.shape[3]
    if _shape(v)[:2] != (B, T):
        raise ValueError(
            f"{op}: `v` must have shape [B, T, H, V] with B, T = {(B, T)} as `k`, got {_shape(v)}"
        )
    if Hg == 0 or H % Hg:
        raise ValueError(
            f"{op}: the value heads H = v.shape[2] = {H} must be a multiple of the "
            f"key heads Hg = k.shape[2] = {Hg} (GQA: value head h reads key head h // (H // Hg))"
        )
    if K == 0 or V == 0:
        raise ValueError(f"{op}: head dims must be >= 1, got K = {K} (k), V = {V} (v)")
    return B, T, Hg, H, K, V


def check_fwd_intra_args(k, v, g, beta, cu_seqlens, chunk_size, chunk_indices) -> None:
    """Checks the arguments of ``fwd_intra``."""
    op = "fwd_intra"
    if beta is None:
        raise TypeError(
            f"{op}: `beta` is required: the write strength [B, T, H] (usually sigmoid of a projection)"
        )
    _check_rank(op, "k", k, 4, "[B, T, Hg, K]")
    _check_rank(op, "v", v, 4, "[B, T, H, V]")
    _check_rank(op, "beta", beta, 3, "[B, T, H]")
    _check_float(op, "k", k)
    _check_float(op, "v", v)
    _check_float(op, "beta", beta)
    if v.dtype != k.dtype:
        raise TypeError(f"{op}: `v` must have the dtype of `k` ({k.dtype}), got {v.dtype}")
    B, T, Hg, H, K, V = _check_key_value_heads(op, k, v)
    _check_shape(op, "beta", beta, (B, T, H), "[B, T, H]", "B, T of `k`, H of `v`")
    if g is not None:
        _check_rank(op, "g", g, 3, "[B, T, H]")
        _check_float(op, "g", g)
        _check_shape(op, "g", g, (B, T, H), "[B, T, H]", "B, T of `k`, H of `v`")
    check_chunk_size(op, chunk_size)
    if cu_seqlens is not None:
        check_cu_seqlens(op, cu_seqlens, B, T)
    if chunk_indices is not None:
        check_chunk_indices(op, chunk_indices, cu_seqlens)


def kernel_dtypes(*arrays) -> bool:
    """True when every given array is bfloat16, float16 or float32 (what the
    Triton kernels take); ``impl="auto"`` runs the jnp reference otherwise."""
    return all(x is None or jnp.dtype(x.dtype) in KERNEL_DTYPES for x in arrays)


def check_kernel_dtypes(op: str, **arrays) -> None:
    """The Triton kernels take bfloat16, float16 and float32 only."""
    for name, x in arrays.items():
        if x is not None and jnp.dtype(x.dtype) not in KERNEL_DTYPES:
            raise TypeError(
                f"{op}: the Triton path takes `{name}` in bfloat16, float16 or float32, "
                f"got {x.dtype}; cast it, or use impl='reference'"
            )


class GdnDims(NamedTuple):
    B: int
    T: int
    Hg: int
    H: int
    K: int
    V: int
    N: int  # number of sequences: B, or len(cu_seqlens) - 1 when packed


def check_gdn_args(op: str, q, k, v, g, beta, scale, initial_state, cu_seqlens,
                   *, same_dtype: bool, state_v_first: bool = False) -> GdnDims:
    """Checks the arguments of the whole GDN forward and returns its dimensions.

    ``same_dtype`` asks ``q``, ``k`` and ``v`` to share one dtype (the fused
    kernels read ``k`` and ``v`` with one element type); ``state_v_first``:
    ``initial_state`` is ``[N, H, V, K]``.
    """
    for name, x in (("g", g), ("beta", beta)):
        if x is None:
            raise TypeError(
                f"{op}: `{name}` is required: a float array [B, T, H] "
                f"({'per-step log forget gate, <= 0' if name == 'g' else 'write strength'})"
            )
    _check_rank(op, "q", q, 4, "[B, T, Hg, K]")
    _check_rank(op, "k", k, 4, "[B, T, Hg, K]")
    _check_rank(op, "v", v, 4, "[B, T, H, V]")
    _check_rank(op, "g", g, 3, "[B, T, H]")
    _check_rank(op, "beta", beta, 3, "[B, T, H]")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _check_float(op, name, x)
    if same_dtype:
        for name, x in (("q", q), ("v", v)):
            if x.dtype != k.dtype:
                raise TypeError(
                    f"{op}: `{name}` must have the dtype of `k` ({k.dtype}), got {x.dtype}"
                )
    B, T, Hg, H, K, V = _check_key_value_heads(op, k, v)
    _check_shape(op, "q", q, (B, T, Hg, K), "[B, T, Hg, K]", "the shape of `k`")
    _check_shape(op, "g", g, (B, T, H), "[B, T, H]", "B, T of `k`, H of `v`")
    _check_shape(op, "beta", beta, (B, T, H), "[B, T, H]", "B, T of `k`, H of `v`")
    if scale is not None and jnp.ndim(scale) != 0:
        raise ValueError(f"{op}: `scale` must be a scalar (or None for K ** -0.5), "
                         f"got shape {jnp.shape(scale)}")
    N = B
    if cu_seqlens is not None:
        check_cu_seqlens(op, cu_seqlens, B, T)
        N = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        layout, want = ("[N, H, V, K]", (N, H, V, K)) if state_v_first else ("[N, H, K, V]", (N, H, K, V))
        _check_rank(op, "initial_state", initial_state, 4, layout)
        _check_float(op, "initial_state", initial_state)
        _check_shape(op, "initial_state", initial_state, want, layout,
                     ("N = len(cu_seqlens) - 1 sequences" if cu_seqlens is not None
                      else "N = B sequences") + (", state_v_first=True" if state_v_first else ""))
    return GdnDims(B, T, Hg, H, K, V, N)


def checkify_cu_seqlens(cu_seqlens, T: int) -> None:
    """In-graph checks of a traced ``cu_seqlens`` ([N + 1] ints), for
    ``jax.experimental.checkify``: ``cu[0] == 0``, non-decreasing, ``cu[-1] == T``.

    ``fwd_intra`` cannot raise on the values of a traced ``cu_seqlens``. To
    check them, call this inside the function you transform::

        from jax.experimental import checkify

        def f(k, v, g, beta, cu):
            gdn_jax.checkify_cu_seqlens(cu, k.shape[1])
            return gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu)

        err, out = jax.jit(checkify.checkify(f))(k, v, g, beta, cu)
        err.throw()  # raises checkify.JaxRuntimeError naming the failed check
    """
    from jax.experimental import checkify

    cu = jnp.asarray(cu_seqlens)
    checkify.check(cu[0] == 0, "cu_seqlens[0] must be 0, got {}", cu[0])
    steps = cu[1:] - cu[:-1]
    checkify.check(jnp.all(steps >= 0),
                   "cu_seqlens must be non-decreasing; first decrease after index {}",
                   jnp.argmax(steps < 0))
    checkify.check(cu[-1] == T, "cu_seqlens[-1] must equal T=" + str(T) + ", got {}", cu[-1])


def check_state_pool(op: str, pool, state_indices, dims: GdnDims, *, varlen: bool,
                     state_v_first: bool = False):
    """Checks a state pool ``initial_state [P, H, K, V]`` (``[P, H, V, K]``
    V-first) and ``state_indices [N]`` (integers; concrete ones below ``P``,
    negative ones allowed: a sequence without a row). Returns the indices
    as int32."""
    if pool is None:
        raise ValueError(f"{op}: `state_indices` names rows of a state pool; pass the pool "
                         f"[P, H, K, V] as `initial_state`")
    layout = "[P, H, V, K]" if state_v_first else "[P, H, K, V]"
    _check_rank(op, "initial_state", pool, 4, f"{layout} (a state pool, with `state_indices`)")
    _check_float(op, "initial_state", pool)
    rest = (dims.H, dims.V, dims.K) if state_v_first else (dims.H, dims.K, dims.V)
    if _shape(pool)[1:] != rest or pool.shape[0] < 1:
        raise ValueError(
            f"{op}: `initial_state`, a state pool with `state_indices`, must have shape {layout} = "
            f"(P, {', '.join(map(str, rest))}) with P >= 1 rows, got {_shape(pool)}")
    if not hasattr(state_indices, "dtype") or not jnp.issubdtype(state_indices.dtype, jnp.integer):
        raise TypeError(f"{op}: `state_indices` must be an integer array [N] (one pool row per "
                        f"sequence), got {getattr(state_indices, 'dtype', type(state_indices).__name__)}")
    _check_shape(op, "state_indices", state_indices, (dims.N,), "[N]",
                 "one pool row per sequence, N = " + ("len(cu_seqlens) - 1" if varlen else "B"))
    if not is_traced(state_indices):
        idx = np.asarray(state_indices)
        past = np.flatnonzero(idx >= pool.shape[0])
        if past.size:
            raise ValueError(
                f"{op}: `state_indices[{past[0]}]` = {idx[past[0]]} is past the pool's P = "
                f"{pool.shape[0]} rows (a sequence without a row takes a negative index, e.g. -1)")
    return jnp.asarray(state_indices, jnp.int32)


def check_not_forward_mode(op: str, impl: str, arrays) -> None:
    """NotImplementedError under ``jax.jvp`` / ``jax.jacfwd`` (forward mode):
    the GPU path's derivative is a ``custom_vjp`` (reverse mode only). Seen
    from the inputs' tracers (``jax.grad`` traces with linearize tracers,
    ``jax.jvp`` with JVP tracers, in the JAX versions tested); where JAX's
    tracer classes differ, JAX's own error comes instead."""
    from jax._src.interpreters import ad

    jvp_tracer = getattr(ad, "JVPTracer", None)
    if jvp_tracer is None:
        return
    for x in arrays:
        while x is not None:
            if isinstance(x, jvp_tracer):
                raise NotImplementedError(
                    f"gdn_jax.{op}: forward-mode differentiation (jax.jvp, jax.jacfwd) of "
                    f"impl={impl!r}, the Triton path, is not supported: its derivative is a "
                    f"custom_vjp (jax.grad, jax.vjp, jax.jacrev work). Use impl='reference' "
                    f"(the jnp path) for forward mode.")
            x = getattr(x, "val", None) if isinstance(x, jax.core.Tracer) else None
