"""The input options of the GDN ops, with flash-linear-attention's keyword names.

Written once here, in jnp, for every op (the chunked forward, the recurrent
decode): each op applies them to its inputs the same way, and ``jax.grad``
differentiates through them (the raw gate input, ``A_log``, ``dt_bias``, the
beta logits, q and k before normalisation).

| keyword | effect |
| --- | --- |
| ``use_qk_l2norm_in_kernel`` | ``q, k <- x / sqrt(sum(x * x) + 1e-6)`` over the head dim |
| ``use_gate_in_kernel`` | ``g`` is the raw gate input: ``a = -exp(A_log[h]) * softplus(g + dt_bias[h])`` |
| ``use_beta_sigmoid_in_kernel`` | ``beta`` holds logits: ``beta <- sigmoid(beta)`` (``2 sigmoid`` with ``allow_neg_eigval``) |
| ``state_v_first`` | states are ``[N, H, V, K]`` instead of ``[N, H, K, V]`` |
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

L2NORM_EPS = 1e-6


class Options(NamedTuple):
    """The options of one call (static under ``jax.jit``)."""
    use_qk_l2norm_in_kernel: bool = False
    use_gate_in_kernel: bool = False
    use_beta_sigmoid_in_kernel: bool = False
    allow_neg_eigval: bool = False
    state_v_first: bool = False


def l2norm(x):
    """``x / sqrt(sum(x * x, -1) + 1e-6)`` in float32 (float64 for float64 ``x``)."""
    x = x.astype(jnp.promote_types(jnp.float32, x.dtype))
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)


def gate_from_raw(raw, A_log, dt_bias=None):
    """Per-step log gate of Qwen3-Next: ``-exp(A_log) * softplus(raw + dt_bias)``.

    ``raw [..., H]``, ``A_log [H]``, ``dt_bias [H]`` or None (zero); float32
    result (float64 where an input is float64)."""
    ct = jnp.promote_types(jnp.float32, jnp.result_type(raw, A_log))
    x = raw.astype(ct)
    if dt_bias is not None:
        x = x + dt_bias.astype(ct)
    return -jnp.exp(A_log.astype(ct)) * jax.nn.softplus(x)


def beta_from_logits(b, allow_neg_eigval: bool = False):
    """``sigmoid(b)``, or ``2 sigmoid(b)`` where negative eigenvalues are allowed."""
    beta = jax.nn.sigmoid(b.astype(jnp.promote_types(jnp.float32, b.dtype)))
    return 2 * beta if allow_neg_eigval else beta


def check_options(op: str, options: Options, H: int, A_log, dt_bias) -> None:
    """Errors naming the option: ``A_log`` and ``dt_bias`` need
    ``use_gate_in_kernel`` and shape ``[H]``; ``allow_neg_eigval`` needs
    ``use_beta_sigmoid_in_kernel`` (it scales the sigmoid)."""
    if options.use_gate_in_kernel:
        if A_log is None:
            raise TypeError(f"{op}: use_gate_in_kernel=True needs `A_log` [H] = [{H}] "
                            f"(the gate is -exp(A_log) * softplus(g + dt_bias))")
    elif A_log is not None or dt_bias is not None:
        raise ValueError(f"{op}: `A_log` / `dt_bias` are given but use_gate_in_kernel=False; "
                         f"pass use_gate_in_kernel=True to compute the gate from the raw input `g`")
    for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
        if x is None:
            continue
        if not hasattr(x, "shape") or tuple(x.shape) != (H,):
            raise ValueError(f"{op}: `{name}` must have shape [H] = ({H},) (one per value head), "
                             f"got {tuple(getattr(x, 'shape', ()))}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{op}: `{name}` must be a float array, got {x.dtype}")
    if options.allow_neg_eigval and not options.use_beta_sigmoid_in_kernel:
        raise ValueError(f"{op}: allow_neg_eigval=True scales sigmoid(beta) to (0, 2) and needs "
                         f"use_beta_sigmoid_in_kernel=True (else pass beta in (0, 2) yourself)")


def apply_options(options: Options, q, k, g, beta, A_log=None, dt_bias=None):
    """``(q, k, a, beta)`` after the options: q/k normalised (back in their
    dtype), ``a`` the per-step log gate (float32), ``beta`` the write
    strength. Arguments as the ops take them, already checked."""
    if options.use_qk_l2norm_in_kernel:
        q, k = l2norm(q).astype(q.dtype), l2norm(k).astype(k.dtype)
    if options.use_gate_in_kernel:
        g = gate_from_raw(g, A_log, dt_bias)
    if options.use_beta_sigmoid_in_kernel:
        beta = beta_from_logits(beta, options.allow_neg_eigval)
    return q, k, g, beta


def state_to_k_major(state, v_first: bool):
    """``[N, H, V, K]`` (V-first) as ``[N, H, K, V]``; K-major states as they are."""
    return state if state is None or not v_first else jnp.swapaxes(state, -1, -2)


def state_from_k_major(state, v_first: bool):
    """The inverse of :func:`state_to_k_major`."""
    return state_to_k_major(state, v_first)
