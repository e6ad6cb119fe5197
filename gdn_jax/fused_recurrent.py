"""``fused_recurrent_gated_delta_rule``: the GDN forward one token at a time,
for decode (and short prefills, such as speculative tokens to verify).

The per-token recurrence of docs/math.md for ``T`` tokens per sequence,
starting from the given state and returning the new one: on an NVIDIA GPU
``kernels/fused_recurrent.py`` (:mod:`gdn_jax.fused_recurrent_launch`), one
read and one write of each state, in place; elsewhere, and for float64, the
jnp recurrence (:func:`gdn_jax.naive_recurrent.naive_recurrent_gated_delta_rule`)
after the options of :mod:`gdn_jax.options`. The op is split over batch and
heads under ``jax.jit`` (:mod:`gdn_jax.sharding`; heads only with a state
pool or a packed batch) and folds under ``jax.vmap`` (:mod:`gdn_jax.batching`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax.numpy as jnp

from .backend import runs_triton
from .batching import vmappable
from .fused_recurrent_launch import fused_recurrent_triton
from .naive_recurrent import naive_recurrent_gated_delta_rule, prepare_gdn_args
from .options import (Options, apply_options, check_options, l2norm, state_from_k_major,
                      state_to_k_major)
from .precision import compute_dtype
from .sharding import Layout, partitioned, sharded_call
from .validate import (as_array, check_impl, check_state_pool, check_static_flag, kernel_dtypes,
                       python_number)

OP = "fused_recurrent_gated_delta_rule"
IMPLS = ("auto", "triton", "reference")


def owned_state_indices(state_indices, P: int):
    """The pool row each sequence owns, -1 for none: ``state_indices [N]``
    with -1 where an index is outside ``[0, P)`` (a padding entry) or names a
    row that an earlier sequence names too (the first sequence naming a row
    owns it). In the graph, no host round trip."""
    N = state_indices.shape[0]
    n = jnp.arange(N, dtype=jnp.int32)
    idx = state_indices.astype(jnp.int32)
    valid = (idx >= 0) & (idx < P)
    first = jnp.full((P,), N, jnp.int32).at[jnp.where(valid, idx, P)].min(n, mode="drop")
    return jnp.where(valid & (first[jnp.where(valid, idx, 0)] == n), idx, -1)


class RecurrentStatic(NamedTuple):
    """What the op is specialised on (its static argument)."""
    triton: bool  # the Triton kernel, else the jnp recurrence
    scale: float
    options: Options
    q_ready: bool  # q came normalised and scaled (a traced scale): left as it is
    gate_params: int  # A_log, dt_bias given: 0, 1 or 2
    use_h0: bool
    pool: bool  # initial_state is a pool with state_indices
    final: bool  # return the final state
    varlen: bool
    ratio: int  # GQA: H // Hg


def _layout(static: RecurrentStatic) -> Layout:
    """``q, k, v, g, beta, [A_log, [dt_bias]], [h0], [state_indices], [cu_seqlens] -> o, [final]``."""
    state = ("p" if static.pool else "n") + ("hvk" if static.options.state_v_first else "hkv")
    operands = (("btgk", "btgk", "bthv", "bth", "bth") + ("h",) * static.gate_params
                + ((state,) if static.use_h0 else ()) + (("i",) if static.pool else ())
                + (("s",) if static.varlen else ()))
    return Layout(operands, ("bthv",) + ((state,) if static.final else ()),
                  static.varlen or static.pool, static.ratio)


def _split(static: RecurrentStatic, arrays):
    """``(q, k, v, g, beta, A_log, dt_bias, h0, state_indices, cu_seqlens)``, the absent ones None."""
    arrays = list(arrays)
    out = arrays[:5]
    rest = arrays[5:]
    take = lambda present: rest.pop(0) if present else None  # noqa: E731
    out += [take(static.gate_params > 0), take(static.gate_params > 1), take(static.use_h0),
            take(static.pool), take(static.varlen)]
    return out


def _per_device(static: RecurrentStatic, *arrays):
    """``(o, [final])`` of the blocks one device holds."""
    q, k, v, g, beta, A_log, dt_bias, h0, idx, cu = _split(static, arrays)
    if static.pool:
        idx = owned_state_indices(idx, h0.shape[0])
    if static.triton:
        return _triton_op(static)(*[x for x in (q, k, v, g, beta, A_log, dt_bias, h0, idx, cu)
                                    if x is not None])
    return _reference(static, q, k, v, g, beta, A_log, dt_bias, h0, idx, cu)


def _reference(static: RecurrentStatic, q, k, v, g, beta, A_log, dt_bias, h0, idx, cu):
    """The jnp path: the options, then the per-token recurrence; a pool's rows
    gathered before and scattered after (``idx`` as :func:`owned_state_indices`)."""
    q_in = q
    q, k, a, beta = apply_options(static.options, q, k, g, beta, A_log, dt_bias)
    if static.q_ready:
        q = q_in
    v_first = static.options.state_v_first
    states = start = None if h0 is None else state_to_k_major(jnp.asarray(h0), v_first)
    if static.pool:
        start = jnp.where((idx >= 0)[:, None, None, None], states[jnp.maximum(idx, 0)], 0)
    o, final = naive_recurrent_gated_delta_rule(q, k, v, a, beta, scale=static.scale,
                                                initial_state=start, output_final_state=True,
                                                cu_seqlens=cu)
    if not static.final:
        return (o,)
    if static.pool:
        rows = jnp.where(idx >= 0, idx, states.shape[0])  # no row: dropped
        final = states.at[rows].set(final.astype(states.dtype), mode="drop")
    elif h0 is not None:
        final = final.astype(h0.dtype)
    return o, state_from_k_major(final, v_first)


@functools.cache
def _triton_op(static: RecurrentStatic):
    """The kernel's launch over the arrays of ``_per_device``, vmappable."""
    layout = _layout(static)
    options = static.options

    def fwd(*arrays):
        q, k, v, g, beta, A_log, dt_bias, h0, idx, cu = _split(static, arrays)
        o, final = fused_recurrent_triton(
            q, k, v, g, beta, A_log, dt_bias, h0, cu, idx, scale=static.scale,
            output_final_state=static.final, state_v_first=options.state_v_first,
            l2norm_q=options.use_qk_l2norm_in_kernel and not static.q_ready,
            l2norm_k=options.use_qk_l2norm_in_kernel,
            use_gate_in_kernel=options.use_gate_in_kernel,
            use_beta_sigmoid_in_kernel=options.use_beta_sigmoid_in_kernel,
            allow_neg_eigval=options.allow_neg_eigval)
        return (o,) + ((final,) if static.final else ())

    return vmappable(fwd, layout.operands, layout.results)


_partitioned = partitioned(_per_device, _layout)


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                                     output_final_state=False, cu_seqlens=None,
                                     state_indices=None, use_qk_l2norm_in_kernel=False,
                                     use_gate_in_kernel=False, A_log=None, dt_bias=None,
                                     use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                                     state_v_first=False, impl="auto"):
    """Gated DeltaNet forward one token at a time (decode): ``T`` steps of the
    per-token recurrence from the given state, returning the new one.

    Per sequence and value head ``h`` (``q_t``, ``k_t`` from key head
    ``h // (H // Hg)``), with state ``S [K, V]`` starting at the sequence's
    initial state::

        S = exp(g_t) S;  v'_t = beta_t (v_t - S^T k_t);  S = S + k_t v'_t^T;  o_t = S^T (scale q_t)

    The same function as :func:`gdn_jax.chunk_gated_delta_rule` (use that one
    for long prefills), with flash-linear-attention's keyword names: a
    prefill by the chunked forward followed by decode steps here equals one
    forward over all the tokens.

    Args:
      q: ``[B, T, Hg, K]`` queries; bfloat16, float16 or float32 (float64 runs
        the jnp path), the dtype of ``k``.
      k: ``[B, T, Hg, K]`` keys (L2-normalised, or see ``use_qk_l2norm_in_kernel``).
      v: ``[B, T, H, V]`` values, dtype of ``k``, ``H % Hg == 0`` (GQA: value
        head ``h`` reads q/k head ``h // (H // Hg)``).
      g: ``[B, T, H]`` per-step log forget gate (natural log, ``<= 0``), any
        float dtype, used in float32; with ``use_gate_in_kernel`` the raw gate input.
      beta: ``[B, T, H]`` write strengths, float; with
        ``use_beta_sigmoid_in_kernel`` their logits.
      scale: query scale, default ``K ** -0.5``; a Python number, or an array
        (then q is normalised and scaled before the kernel, one more pass over q).
      initial_state: the states the sequences start from, None for zeros:
        ``[N, H, K, V]`` (``[N, H, V, K]`` with ``state_v_first``), ``N = B``
        or ``len(cu_seqlens) - 1``; or, with ``state_indices``, a state pool
        ``[P, H, K, V]`` (``[P, H, V, K]``), any ``P >= 1``. float32,
        bfloat16 or float16 (float64 on the jnp path); the math runs in float32.
      output_final_state: also return the states after the last token.
        Static under ``jax.jit`` (``static_argnames``).
      cu_seqlens: ``[N + 1]`` int32 offsets of a packed batch (``B == 1``,
        ``cu[0] == 0``, non-decreasing, ``cu[-1] == T``); may be traced.
      state_indices: ``[N]`` integers, the pool row of each sequence: sequence
        ``n`` reads and writes row ``state_indices[n]``; rows no sequence
        names are left as they are. A negative index (a padding entry, e.g.
        -1) and, under ``jax.jit``, an index ``>= P`` mean no row: that
        sequence starts from zeros and writes nothing. A row named by several
        sequences belongs to the first of them; the later ones run as
        padding entries. May be traced (concrete indices ``>= P`` raise).
      use_qk_l2norm_in_kernel: normalise ``q`` and ``k`` over the head dim
        first, ``x / sqrt(sum(x * x) + 1e-6)``.
      use_gate_in_kernel: ``g`` is the raw gate input, the log gate is
        ``-exp(A_log[h]) * softplus(g + dt_bias[h])`` (Qwen3-Next).
      A_log: ``[H]`` float, with ``use_gate_in_kernel``.
      dt_bias: ``[H]`` float or None (zero), with ``use_gate_in_kernel``.
      use_beta_sigmoid_in_kernel: ``beta`` holds logits, ``beta <- sigmoid(beta)``.
      allow_neg_eigval: with ``use_beta_sigmoid_in_kernel``, ``2 sigmoid(beta)``.
      state_v_first: states and pool are ``[.., H, V, K]`` (the layout of
        vLLM's, sglang's and FlashInfer's state pools).
      impl: static. ``"auto"``: on an NVIDIA GPU the Triton kernel
        (``kernels/fused_recurrent.py``; float64 inputs or states take the jnp
        path), elsewhere the jnp path; ``"triton"``: the kernel (needs an
        NVIDIA GPU); ``"reference"``: the jnp path.

    Returns:
      ``(o, final_state)``: ``o [B, T, H, V]`` in v's dtype; ``final_state``
      (None unless ``output_final_state``) in the shape, layout and dtype of
      ``initial_state``: with a pool, the whole updated pool; float32 ``[N,
      H, K, V]`` (``[N, H, V, K]``) without an initial state (float64 for
      float64 inputs on the jnp path).

    In place: on the Triton path the kernel writes the final state into the
    initial state's buffer (``input_output_aliases``). Under ``jax.jit(...,
    donate_argnums=...)`` with the state donated, no copy of it is made, and
    a pool's rows not named are not even read; without donation XLA copies
    the state once before the kernel, so the caller's array stays intact.

    Under ``jax.jit``, inputs sharded over batch and/or heads stay sharded
    (:mod:`gdn_jax.sharding`); with a pool or a packed batch, heads only (a
    pool's rows, named by any sequence, are whole on every device: a
    sharding over them is gathered). Under ``jax.vmap`` the examples fold
    into one launch (each example's pool its own); ``A_log`` and ``dt_bias``
    cannot be batched there.

    Not supported: gradients on the Triton path (it is forward only;
    ``impl="reference"`` is differentiable), ``g`` or ``beta`` of None,
    per-key or per-value gates (flash-linear-attention's ``gk``, ``gv``),
    per-value ``beta [B, T, H, V]``.
    """
    check_impl(OP, impl, IMPLS)
    check_static_flag(OP, "output_final_state", output_final_state)
    options = Options(bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel),
                      bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), bool(state_v_first))
    state_indices = as_array(state_indices)
    pool = state_indices is not None
    q, k, v, g, beta, h0, cu_seqlens, dims, scale = prepare_gdn_args(
        OP, q, k, v, g, beta, scale, None if pool else initial_state, cu_seqlens, same_dtype=True,
        state_v_first=options.state_v_first)
    initial_state = as_array(initial_state) if pool else h0
    A_log, dt_bias = map(as_array, (A_log, dt_bias))
    check_options(OP, options, dims.H, A_log, dt_bias)
    if pool:
        state_indices = check_state_pool(OP, initial_state, state_indices, dims,
                                         varlen=cu_seqlens is not None,
                                         state_v_first=options.state_v_first)
    final = bool(output_final_state)
    B, T, Hg, H, K, V, N = dims
    if B * T == 0:  # no token: the states as they came in
        shape = (N, H, V, K) if options.state_v_first else (N, H, K, V)
        ct = compute_dtype(q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype)
        state = jnp.zeros(shape, ct) if initial_state is None else initial_state
        return jnp.zeros((B, T, H, V), v.dtype), (state if final else None)
    triton = runs_triton(OP, impl, q, k, v, initial_state)
    scale_number = python_number(scale)
    if scale_number is None:  # traced: q normalised and scaled here (the kernel takes a number)
        ct = compute_dtype(q.dtype, scale.dtype)
        q = l2norm(q) if options.use_qk_l2norm_in_kernel else q.astype(ct)
        q = (q * scale.astype(ct)).astype(k.dtype)
    if triton:  # the kernel reads bfloat16, float16 and float32
        g, beta, A_log, dt_bias = (x if x is None or kernel_dtypes(x) else x.astype(jnp.float32)
                                   for x in (g, beta, A_log, dt_bias))
    cu = None if cu_seqlens is None else jnp.asarray(cu_seqlens, jnp.int32)
    static = RecurrentStatic(triton, 1.0 if scale_number is None else scale_number, options,
                             scale_number is None, (A_log is not None) + (dt_bias is not None),
                             initial_state is not None, pool, final, cu is not None, H // Hg)
    arrays = [x for x in (q, k, v, g, beta, A_log, dt_bias, initial_state, state_indices, cu)
              if x is not None]
    out = sharded_call(_partitioned, _per_device, static, _layout(static), arrays)
    return out[0], (out[1] if final else None)
