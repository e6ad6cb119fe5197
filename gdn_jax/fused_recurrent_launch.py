"""Launch of ``kernels/fused_recurrent.py`` (the per-token recurrence) through jax-triton.

The state is written in place: with an initial state and ``output_final_state``
the kernel reads and writes the state buffer itself, aliased to the returned
final state (``input_output_aliases``), so that under ``jax.jit(...,
donate_argnums=...)`` XLA hands the kernel the donated buffer and copies
nothing (without donation XLA copies the state once, before the launch, to
keep the caller's array).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .autotune import UNTUNED, autotune_enabled, chosen_config, timing_allowed
from .chunk_indices import cdiv
from .triton_launch import (GRID_LIMITS, TIMING_ROWS, aliased_outputs_are_parameters,
                            float32_scalar, triton_call)
from .validate import check_kernel_dtypes

NAME = "fused_recurrent"
OPERANDS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "cu_seqlens", "state_indices", "h0")
H0 = OPERANDS.index("h0")  # the operand the final state aliases


def fused_recurrent_grid(N: int, H: int, V: int, BV: int) -> tuple[int]:
    """One program per (V block, value head, sequence), on axis 0."""
    return (cdiv(V, BV) * H * N,)


def check_fused_recurrent_grid(N: int, H: int, V: int) -> None:
    from .kernels.fused_recurrent import gdn_fused_recurrent_kernel

    narrowest = min(c.kwargs["BV"] for c in gdn_fused_recurrent_kernel.configs)
    programs = fused_recurrent_grid(N, H, V, narrowest)[0]
    if programs > GRID_LIMITS[0]:
        raise ValueError(
            f"fused_recurrent_gated_delta_rule: {N} sequences x {H} value heads x "
            f"{cdiv(V, narrowest)} V blocks = {programs} programs, over CUDA's grid limit of "
            f"{GRID_LIMITS[0]}; split the call")


def fused_recurrent_constexprs(Hg, H, K, V, *, use_h0, store_final, in_place, varlen, pool,
                               v_first, l2norm_q, l2norm_k, gate, dt_bias, beta_sigmoid,
                               neg_eigval) -> dict:
    """The kernel's constexprs (shared by the JAX and the torch launch)."""
    return dict(H=H, Hg=Hg, K=K, V=V, BK=max(16, 1 << (K - 1).bit_length()),
                USE_H0=bool(use_h0), STORE_FINAL=bool(store_final), IN_PLACE=bool(in_place),
                IS_VARLEN=bool(varlen), USE_POOL=bool(pool), STATE_V_FIRST=bool(v_first),
                L2NORM_Q=bool(l2norm_q), L2NORM_K=bool(l2norm_k), GATE_IN_KERNEL=bool(gate),
                HAS_DT_BIAS=bool(dt_bias), BETA_SIGMOID=bool(beta_sigmoid),
                NEG_EIGVAL=bool(neg_eigval))


def size_class(N: int, H: int, tokens: int) -> tuple[int, int]:
    """The part of the config key the shapes give: the (sequence, head) pairs
    in powers of 4 and the tokens per sequence in powers of 2 (up to 16): the
    fastest ``BV`` and warps depend on how many programs there are to fill the
    GPU's SMs (a batch of 1 has 32 (sequence, head) pairs, one of 256 has 8192),
    so each class times its own."""
    return (max(N * H, 1).bit_length() + 1) // 2, min(max(tokens, 1), 16).bit_length()


def _timing_launch(operands, T: int, constexprs: dict):
    """What the configs are timed on: ``(operands, out, T, N)`` of a launch
    of at most ``TIMING_ROWS`` rows that writes the final state out of place
    (the same bytes as in place, without the copy XLA adds before an aliased
    operand that is not donated), with as many states as sequences and pool
    indices ``0 .. N - 1`` (concrete, so that the stand-ins address real
    rows); the other operands abstract (:func:`gdn_jax.autotune.stand_ins`
    fills them with random values)."""
    ops = dict(zip(OPERANDS, operands))
    B, _, H, V = ops["v"].shape
    varlen = constexprs["IS_VARLEN"]
    rows = (1 if varlen else min(B, max(1, TIMING_ROWS // max(T, 1))), min(T, TIMING_ROWS))
    N = ops["cu_seqlens"].shape[0] - 1 if varlen else rows[0]
    timing = {name: jax.ShapeDtypeStruct(x.shape, x.dtype) for name, x in ops.items()}
    for name in ("q", "k", "v", "g", "beta"):
        timing[name] = jax.ShapeDtypeStruct(rows + ops[name].shape[2:], ops[name].dtype)
    K = constexprs["K"]
    state = jax.ShapeDtypeStruct((1,), jnp.float32)
    if constexprs["USE_H0"]:
        timing["h0"] = state = jax.ShapeDtypeStruct((N,) + ops["h0"].shape[1:], ops["h0"].dtype)
    elif constexprs["STORE_FINAL"]:
        state = jax.ShapeDtypeStruct((N, H, V, K) if constexprs["STATE_V_FIRST"] else (N, H, K, V),
                                     jnp.float32)
    if not constexprs["STORE_FINAL"]:
        state = jax.ShapeDtypeStruct((1,), jnp.float32)
    if constexprs["USE_POOL"]:
        timing["state_indices"] = np.arange(N, dtype=np.int32)
    out = (jax.ShapeDtypeStruct(rows + (H, V), ops["v"].dtype), state)
    return [timing[n] for n in OPERANDS], out, rows[1], N


def _config(kernel, operands, T: int, scale, constexprs, size: tuple) -> dict:
    """The launch's config: :func:`gdn_jax.autotune.chosen_config`, keyed by
    the constexprs (``IN_PLACE`` left out) and ``size`` (:func:`size_class`),
    timed on :func:`_timing_launch`."""
    if not autotune_enabled():
        return UNTUNED[NAME]
    timed = dict(constexprs, IN_PLACE=False)
    timing, out, T_t, N_t = _timing_launch(operands, T, constexprs)
    H, V = constexprs["H"], constexprs["V"]
    scalars = (float32_scalar(scale), T_t, N_t)

    def run(ops, **config):  # ops: the arrays, then the scalars (traced by the timing: ignored)
        return triton_call(*ops[:len(OPERANDS)], *scalars, kernel=kernel.fn, out=out,
                           grid=lambda meta: fused_recurrent_grid(N_t, H, V, meta["BV"]),
                           **timed, **config)

    concrete = {i: x for i, x in enumerate(timing) if isinstance(x, np.ndarray)}
    found = {}

    def choose(*arrays):
        arrays = list(arrays)
        for i, x in sorted(concrete.items()):
            arrays.insert(i, x)
        key = (tuple(sorted(timed.items())), size)
        found["config"] = chosen_config(NAME, kernel.configs, [*arrays, *scalars], run, key, T=T_t)
        return arrays[0]

    abstract = [x for i, x in enumerate(timing) if i not in concrete]
    if timing_allowed():
        jax.eval_shape(choose, *abstract)  # tracers of the stand-ins' shapes
    else:  # inside XLA's partitioner: the config chosen for this key, or the fixed one
        choose(*abstract)
    return found["config"]


def fused_recurrent_triton(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None,
                           cu_seqlens=None, state_indices=None, *, scale, output_final_state,
                           state_v_first=False, l2norm_q=False, l2norm_k=False,
                           use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                           allow_neg_eigval=False):
    """``(o, final_state)`` of the per-token recurrence (``kernels/fused_recurrent.py``).

    Args (already checked, shapes as :func:`gdn_jax.fused_recurrent_gated_delta_rule`):
      q, k: ``[B, T, Hg, K]``; v: ``[B, T, H, V]``, bfloat16, float16 or float32.
      g, beta: ``[B, T, H]`` float32, bfloat16 or float16 (raw gate input and
        beta logits where the options say).
      A_log, dt_bias: ``[H]`` or None.
      initial_state: ``[N, H, K, V]`` (``[N, H, V, K]`` with
        ``state_v_first``), or a pool ``[P, H, K, V]`` with ``state_indices``;
        bfloat16, float16 or float32; None for zeros.
      cu_seqlens: ``[N + 1]`` int32 of a packed batch (``B == 1``), or None.
      state_indices: ``[N]`` int32 pool rows, or None; a sequence whose index
        is outside ``[0, P)`` starts from zeros and writes nothing.
      scale: the query scale, a Python number.
      l2norm_q, l2norm_k, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
        allow_neg_eigval: the options, fused in the kernel.

    Returns:
      ``o [B, T, H, V]`` in v's dtype; the final state, or None unless
      ``output_final_state``: ``initial_state`` updated in place (its shape
      and dtype; a pool whole), or float32 ``[N, H, K, V]`` without one.
    """
    check_kernel_dtypes("fused_recurrent_gated_delta_rule", q=q, k=k, v=v, g=g, beta=beta,
                        A_log=A_log, dt_bias=dt_bias, initial_state=initial_state)
    B, T, Hg, K = q.shape
    H, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    pool = state_indices is not None
    use_h0 = initial_state is not None
    in_place = use_h0 and output_final_state
    shape = (N, H, V, K) if state_v_first else (N, H, K, V)
    o_type = jax.ShapeDtypeStruct((B, T, H, V), v.dtype)
    fresh = jax.ShapeDtypeStruct(shape if output_final_state and not use_h0 else (1,), jnp.float32)
    if N * H == 0 or B * T == 0:  # nothing to run: the states as they came in
        state = (initial_state if use_h0 else jnp.zeros(shape, jnp.float32))
        return jnp.zeros(o_type.shape, o_type.dtype), (state if output_final_state else None)
    check_fused_recurrent_grid(N, H, V)
    from .kernels.fused_recurrent import gdn_fused_recurrent_kernel as kernel

    # jax-triton 0.3 takes no None operand: 1-element dummies, flagged unused.
    dummy = jnp.zeros((1,), jnp.int32)
    operands = [dummy if x is None else x for x in
                (q, k, v, g, beta, A_log, dt_bias, cu_seqlens, state_indices, initial_state)]
    P = initial_state.shape[0] if use_h0 else N
    scalars = (float32_scalar(scale), T, P)
    constexprs = fused_recurrent_constexprs(
        Hg, H, K, V, use_h0=use_h0, store_final=output_final_state, in_place=in_place,
        varlen=cu_seqlens is not None, pool=pool, v_first=state_v_first, l2norm_q=l2norm_q,
        l2norm_k=l2norm_k, gate=use_gate_in_kernel, dt_bias=dt_bias is not None,
        beta_sigmoid=use_beta_sigmoid_in_kernel, neg_eigval=allow_neg_eigval)
    config = _config(kernel, operands, T, scale, constexprs, size_class(N, H, B * T // N))
    grid = lambda meta: fused_recurrent_grid(N, H, V, meta["BV"])  # noqa: E731
    if not in_place:
        o, final = triton_call(*operands, *scalars, kernel=kernel.fn, out=(o_type, fresh),
                               grid=grid, **constexprs, **config)
        return o, (final if output_final_state else None)
    # In place: the kernel writes the state through its h0 parameter. Results
    # unaliased first (o, then on jax-triton 0.4 a 1-element stand-in for the
    # ht parameter the kernel leaves alone), the aliased state last.
    state = jax.ShapeDtypeStruct(initial_state.shape, initial_state.dtype)
    out = (o_type, state) if aliased_outputs_are_parameters() else (o_type, fresh, state)
    results = triton_call(*operands, *scalars, kernel=kernel.fn, out=out, grid=grid,
                          input_output_aliases={H0: len(out) - 1}, **constexprs, **config)
    return results[0], results[-1]
