"""``chunk_gated_delta_rule``: the whole Gated DeltaNet forward, chunked.

Steps (chunks of 64 tokens that never cross a sequence boundary):

1. the options (:mod:`gdn_jax.options`): q/k L2 norm, the gate from its raw
   input, beta from logits;
2. ``gc``, the chunk-local cumulative sum of the per-step log gates
   (:func:`gdn_jax.chunk_jnp.chunk_local_cumsum`; on the GPU path the
   forward's kernels take the per-step gates and sum them themselves,
   ``SUM_G``, and ``gc`` is the backward's alone);
3. ``w, u = fwd_intra(k, v, gc, beta)`` (:func:`gdn_jax.fwd_intra`);
4. the walk over chunks with the state on chip and the output of every chunk
   (:func:`gdn_jax.chunk_walk.chunk_walk`: ``kernels/chunk_fwd.py`` on an
   NVIDIA GPU, its jnp reference elsewhere).

On the GPU path steps 2 to 4 are :func:`gdn_jax.chunk_bwd.gdn_core`, a
``jax.custom_vjp`` whose backward runs the backward kernels; the jnp path is
differentiated by JAX itself.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .backend import runs_triton
from .chunk_indices import varlen_work_list
from .chunk_bwd import CoreStatic, run_core
from .chunk_launch import walk_kernel_fits
from .context_parallel import call_sharded_over_sequence, sequence_axes
from .naive_recurrent import prepare_gdn_args
from .options import Options, apply_options, check_options
from .precision import compute_dtype
from .sharding import call_with_auto_axes
from .validate import as_array, check_chunk_indices, check_impl, is_traced, python_number


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False,
                           use_gate_in_kernel=False, A_log=None, dt_bias=None,
                           use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, chunk_indices=None,
                           impl="auto"):
    """Gated DeltaNet forward, chunked; equals the per-token recurrence
    :func:`gdn_jax.reference.naive_recurrent_gated_delta_rule` (docs/math.md).

    Per sequence and value head ``h`` (``q_t``, ``k_t`` from key head
    ``h // (H // Hg)``), with state ``S [K, V]`` starting at ``initial_state``::

        S = exp(g_t) S;  v'_t = beta_t (v_t - S^T k_t);  S = S + k_t v'_t^T;  o_t = S^T (scale q_t)

    Args:
      q: ``[B, T, Hg, K]`` queries; bfloat16, float16 or float32 (float64
        runs the jnp path), the dtype of ``k``.
      k: ``[B, T, Hg, K]`` keys (L2-normalised, or see ``use_qk_l2norm_in_kernel``).
      v: ``[B, T, H, V]`` values, dtype of ``k``, ``H % Hg == 0`` (GQA: value
        head ``h`` reads q/k head ``h // (H // Hg)``).
      g: ``[B, T, H]`` per-step log forget gate (natural log, ``<= 0``), not
        cumulated; any float dtype, used in float32. With ``use_gate_in_kernel``
        the raw gate input instead.
      beta: ``[B, T, H]`` write strengths (usually ``sigmoid``), float; with
        ``use_beta_sigmoid_in_kernel`` their logits.
      scale: query scale, default ``K ** -0.5``. A Python number, or an array
        (then the GPU path multiplies ``q`` by it first, one more pass over ``q``).
      initial_state: ``[N, H, K, V]`` float (``[N, H, V, K]`` with
        ``state_v_first``), ``N = B`` or ``len(cu_seqlens) - 1``; None for zeros.
      output_final_state: also return the state after each sequence. Static
        under ``jax.jit`` (``static_argnames``).
      use_qk_l2norm_in_kernel: normalise ``q`` and ``k`` over the head dim
        first, ``x / sqrt(sum(x * x) + 1e-6)``.
      use_gate_in_kernel: ``g`` is the raw gate input, the log gate is
        ``-exp(A_log[h]) * softplus(g + dt_bias[h])`` (Qwen3-Next).
      A_log: ``[H]`` float, with ``use_gate_in_kernel``.
      dt_bias: ``[H]`` float or None (zero), with ``use_gate_in_kernel``.
      use_beta_sigmoid_in_kernel: ``beta`` holds logits, ``beta <- sigmoid(beta)``.
      allow_neg_eigval: with ``use_beta_sigmoid_in_kernel``, ``2 sigmoid(beta)``.
      state_v_first: initial and final states are ``[N, H, V, K]`` (the layout
        of vLLM's, sglang's and FlashInfer's state pools).
      cu_seqlens: ``[N + 1]`` int32 offsets of a packed batch (``B == 1``,
        ``cu[0] == 0``, non-decreasing, ``cu[-1] == T``); may be traced under
        ``jax.jit`` (its values are then not checked).
      chunk_indices: optional ``[NT, 2]`` int32 from
        :func:`gdn_jax.prepare_chunk_indices` (computed when omitted).
      impl: static. ``"auto"``: on an NVIDIA GPU the Triton kernels (the
        fastest ``fwd_intra`` path, then ``kernels/chunk_fwd.py``), elsewhere
        (and for float64 inputs) the jnp path; ``"gluon"``, ``"triton"``,
        ``"split"``, ``"seed"``: the Triton kernels with that ``fwd_intra`` path
        (:func:`gdn_jax.fwd_intra`); ``"reference"``: jnp throughout.

    Returns:
      ``(o, final_state)``: ``o [B, T, H, V]`` in v's dtype; ``final_state``
      float32 ``[N, H, K, V]`` (``[N, H, V, K]`` with ``state_v_first``; an
      empty sequence keeps its initial state), or None unless ``output_final_state``.

    Under ``jax.jit``, inputs sharded over batch and/or heads stay sharded:
    every step is per batch row and head, and the kernels are partitioned
    (:mod:`gdn_jax.sharding`); ``o`` and ``final_state`` come out split the same way.
    With ``T`` sharded over mesh axes of type ``Explicit`` (context
    parallelism, :mod:`gdn_jax.context_parallel`): each device runs its
    segment and the devices exchange only state-sized maps; ``T`` must divide
    by the number of devices on those axes, and ``chunk_indices`` is then
    ignored (each segment builds its own). ``o`` comes out sharded as ``v``
    over ``T``, the final states replicated over those axes.
    """
    op = "chunk_gated_delta_rule"
    check_impl(op, impl)
    if is_traced(output_final_state):
        raise TypeError(f"{op}: `output_final_state` must be a Python bool, static under "
                        f"jax.jit (static_argnames=('output_final_state',)); got a tracer")
    options = Options(bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel),
                      bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), bool(state_v_first))
    q, k, v, g, beta, initial_state, cu_seqlens, dims, scale = prepare_gdn_args(
        op, q, k, v, g, beta, scale, initial_state, cu_seqlens, same_dtype=True,
        state_v_first=options.state_v_first)
    A_log, dt_bias, chunk_indices = map(as_array, (A_log, dt_bias, chunk_indices))
    check_options(op, options, dims.H, A_log, dt_bias)
    if chunk_indices is not None:
        check_chunk_indices(op, chunk_indices, cu_seqlens)
    triton = runs_triton(op, impl, q, k, v)
    scale_number = python_number(scale)
    # Arrays go through call_with_auto_axes; a NumPy cu_seqlens stays a constant (exact chunk list).
    cu_array = cu_seqlens if isinstance(cu_seqlens, jax.Array) else None
    forward = functools.partial(
        _forward, dims=dims, options=options, impl=impl if triton else "reference",
        output_final_state=bool(output_final_state), triton=triton,
        cu_const=None if cu_array is not None else cu_seqlens, scale_number=scale_number)
    args = (q, k, v, g, beta, initial_state, cu_array, chunk_indices, A_log, dt_bias,
            None if scale_number is not None else scale)
    over_sequence = sequence_axes((v, k, q, g, beta))
    if over_sequence is not None:  # T sharded: context parallel (gdn_jax.context_parallel)
        cu_any = None if cu_seqlens is None else jnp.asarray(cu_seqlens, jnp.int32)
        return call_sharded_over_sequence(forward, args[:6] + (cu_any,) + args[7:], *over_sequence,
                                          dims=dims, varlen=cu_seqlens is not None,
                                          final=bool(output_final_state))
    return call_with_auto_axes(  # sharded over batch / heads as o [B, T, H, V], state [N, H, ., .]
        forward, args, k, v, cu_seqlens is not None,
        lambda b, h: (P(b, None, h, None), P(b, h, None, None) if output_final_state else None))


def _forward(q, k, v, g, beta, initial_state, cu_seqlens, chunk_indices, A_log, dt_bias, scale,
             *, dims, options, impl, output_final_state, triton, cu_const, scale_number,
             core=run_core):
    """:func:`chunk_gated_delta_rule` on checked arguments (``cu_const``: a
    NumPy ``cu_seqlens``, passed apart; ``scale`` a traced array where
    ``scale_number``, the scale as a Python float, is None); ``core``: the
    chunked forward after the options (:func:`gdn_jax.chunk_bwd.run_core`, or
    a segment's of :mod:`gdn_jax.context_parallel`)."""
    cu_seqlens = cu_const if cu_seqlens is None else cu_seqlens
    B, T, Hg, H, K, V, N = dims
    q, k, a, beta = apply_options(options, q, k, g, beta, A_log, dt_bias)
    if B * T == 0:
        ct = compute_dtype(q.dtype, k.dtype, v.dtype, a.dtype, beta.dtype)
        shape = (N, H, V, K) if options.state_v_first else (N, H, K, V)
        states = jnp.zeros(shape, ct) if initial_state is None else initial_state.astype(ct)
        return jnp.zeros((B, T, H, V), v.dtype), (states if output_final_state else None)
    if scale_number is None:  # traced: into q (the kernel takes a number)
        ct = compute_dtype(q.dtype, scale.dtype)
        q = (q.astype(ct) * scale.astype(ct)).astype(q.dtype)
        scale_number = 1.0
    cu_seqlens, chunk_indices = varlen_work_list(cu_seqlens, chunk_indices, T, 64)
    static = CoreStatic(impl, triton and walk_kernel_fits(q.dtype, K), scale_number,
                        output_final_state, options.state_v_first)
    return core(static, triton, q, k, v, a, beta, initial_state, cu_seqlens, chunk_indices)
