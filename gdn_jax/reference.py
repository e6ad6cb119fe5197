"""Plain-jnp references: the GDN intra-chunk forward (:func:`fwd_intra_reference`)
and, re-exported from ``naive_recurrent.py``, the per-token recurrence
(:func:`naive_recurrent_gated_delta_rule`).

Float32 math (float64 where the inputs are float64 and x64 is on), fixed
length and packed varlen, traced ``cu_seqlens`` included. It is the CPU
default of :func:`gdn_jax.fwd_intra` and the yardstick of the GPU tests. The
math is docs/math.md's, written once in :func:`chunk_wy`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from .chunk_indices import cdiv, varlen_work_list
from .naive_recurrent import naive_recurrent_gated_delta_rule
from .precision import HIGHEST, compute_dtype
from .validate import check_fwd_intra_args



def safe_exp(x: jax.Array) -> jax.Array:
    """``exp(x)`` where ``x <= 0``, else 0 (the kernels' guard)."""
    return jnp.exp(jnp.where(x <= 0, x, -jnp.inf))


def chunk_wy(kk, v, g, beta, valid):
    """docs/math.md's per-chunk math on chunks laid out as ``[..., BT, heads, dim]``.

    Args:
      kk: ``[..., BT, H, K]`` keys, already repeated to the H value heads.
      v: ``[..., BT, H, V]``.
      g: ``[..., BT, H]`` chunk-local cumulative log gates, or ``None``.
      beta: ``[..., BT, H]``.
      valid: ``[..., BT]`` bool, the rows that belong to the chunk; other rows
        are ignored (never read into the math, so a NaN there stays there).

    Returns:
      ``w [..., BT, H, K]``, ``u [..., BT, H, V]``, ``A [..., BT, H, BT]`` in
      the compute dtype; ``A`` is zero above the diagonal and outside the valid
      rows and columns.
    """
    BT = valid.shape[-1]
    row = valid[..., :, None]
    kk = jnp.where(row[..., None], kk, 0)
    v = jnp.where(row[..., None], v, 0)
    beta = jnp.where(row, beta, 0)
    gram = jnp.einsum("...ihk,...jhk->...hij", kk, kk, precision=HIGHEST)
    lower = jnp.tril(jnp.ones((BT, BT), bool), -1)
    pair = valid[..., None, :, None] & valid[..., None, None, :]  # [..., 1, BT, BT]
    scale = jnp.swapaxes(beta, -1, -2)[..., :, None]  # beta_i, [..., H, BT, 1]
    if g is not None:
        g = jnp.where(row, g, 0)
        gt = jnp.swapaxes(g, -1, -2)  # [..., H, BT]
        scale = scale * safe_exp(gt[..., :, None] - gt[..., None, :])
    L = jnp.where(lower & pair, gram * scale, 0)
    eye = jnp.eye(BT, dtype=L.dtype)
    A = solve_triangular(eye + L, jnp.broadcast_to(eye, L.shape), lower=True, unit_diagonal=True)
    A = jnp.where((lower | jnp.eye(BT, dtype=bool)) & pair, A, 0)
    kscale = beta if g is None else beta * jnp.exp(g)
    u = jnp.einsum("...hij,...jhv->...ihv", A, beta[..., None] * v, precision=HIGHEST)
    w = jnp.einsum("...hij,...jhk->...ihk", A, kscale[..., None] * kk, precision=HIGHEST)
    return w, u, jnp.swapaxes(A, -2, -3)


def fwd_intra_jnp(k, v, g, beta, *, cu_seqlens=None, chunk_size=64, chunk_indices=None):
    """:func:`fwd_intra_reference` without the argument checks: inputs already
    checked, and with ``cu_seqlens`` both it and ``chunk_indices`` int32 jax
    arrays (:func:`gdn_jax.chunk_indices.varlen_work_list`)."""
    B, T, Hg, K = k.shape
    H = v.shape[2]
    BT = chunk_size
    ct = compute_dtype(k.dtype, beta.dtype, *(() if g is None else (g.dtype,)))
    out_dtypes = (k.dtype, v.dtype, k.dtype)
    kk = jnp.repeat(k.astype(ct), H // Hg, axis=2)
    v32, b32 = jnp.asarray(v, ct), jnp.asarray(beta, ct)  # NumPy inputs too (gathers by tracers)
    g32 = None if g is None else jnp.asarray(g, ct)

    if cu_seqlens is None:
        # Each batch row is one sequence: pad T to whole chunks and reshape.
        NT = cdiv(T, BT)
        pad = NT * BT - T

        def chunks(x):
            x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
            return x.reshape(B, NT, BT, *x.shape[2:])

        valid = (jnp.arange(NT * BT) < T).reshape(NT, BT)
        outs = chunk_wy(chunks(kk), chunks(v32), None if g32 is None else chunks(g32),
                        chunks(b32), jnp.broadcast_to(valid, (B, NT, BT)))
        return tuple(
            o.reshape(B, NT * BT, *o.shape[3:])[:, :T].astype(dt) for o, dt in zip(outs, out_dtypes)
        )

    # Packed varlen: gather every chunk of the work list, compute, scatter back.
    cu = cu_seqlens
    seq, c = chunk_indices[:, 0], chunk_indices[:, 1]
    start = cu[seq] + c * BT
    end = jnp.minimum(start + BT, cu[seq + 1])
    pos = start[:, None] + jnp.arange(BT)  # [NT, BT]
    valid = pos < end[:, None]
    src = jnp.where(valid, pos, 0)

    def gather(x):
        return x[0][src]

    outs = chunk_wy(gather(kk), gather(v32), None if g32 is None else gather(g32),
                    gather(b32), valid)
    dst = jnp.where(valid, pos, T)  # rows outside every chunk are dropped
    results = []
    for o, dt in zip(outs, out_dtypes):
        full = jnp.zeros((T, *o.shape[2:]), dt).at[dst].set(o.astype(dt), mode="drop")
        results.append(full[None])
    return tuple(results)


def fwd_intra_reference(k, v, g=None, beta=None, *, cu_seqlens=None, chunk_size=64,
                        chunk_indices=None):
    """Plain-jnp ``fwd_intra``; same signature and outputs as :func:`gdn_jax.fwd_intra`.

    Args:
      k: ``[B, T, Hg, K]`` keys (bfloat16, float16 or float32).
      v: ``[B, T, H, V]`` values, dtype of ``k``, ``H % Hg == 0``.
      g: ``[B, T, H]`` chunk-local cumulative log gates (natural log), or None.
      beta: ``[B, T, H]`` write strengths.
      cu_seqlens: ``[N + 1]`` int32, packed varlen (then ``B == 1``); may be traced.
      chunk_size: 64.
      chunk_indices: ``[NT, 2]`` int32 from :func:`gdn_jax.prepare_chunk_indices`.

    Returns:
      ``w [B, T, H, K]`` (k.dtype), ``u [B, T, H, V]`` (v.dtype),
      ``A [B, T, H, 64]`` (k.dtype).
    """
    check_fwd_intra_args(k, v, g, beta, cu_seqlens, chunk_size, chunk_indices)
    cu_seqlens, chunk_indices = varlen_work_list(cu_seqlens, chunk_indices, k.shape[1], chunk_size)
    return fwd_intra_jnp(k, v, g, beta, cu_seqlens=cu_seqlens, chunk_size=chunk_size,
                         chunk_indices=chunk_indices)


__all__ = ["fwd_intra_reference", "naive_recurrent_gated_delta_rule", "chunk_wy", "safe_exp"]
