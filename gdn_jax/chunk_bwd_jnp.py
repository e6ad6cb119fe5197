"""The backward of the chunk form in plain jnp (docs/math.md, "Gradients"):
the reference of the backward kernels, step by step.

Per chunk with rows ``i, j < n``, entering state ``S``, leaving state ``S'``
with gradient ``dS'``, ``e = exp(gc)``, ``gamma = exp(gl)``, ``kt = k *
exp(gl - gc)``, ``E_ij = exp(gc_i - gc_j)`` (``i >= j``), ``M = tril(q k^T E)``
and the forward ``v' = u - w S``, ``o = scale (e q S + M v')``, ``S' = gamma S
+ kt^T v'``:

    dv'  = scale M^T do + kt dS'                       (then du = dv')
    dS   = gamma dS' + scale (e q)^T do - w^T dv'      (the reverse walk)
    dw   = -dv' S^T
    dq   = scale (e do S^T + (P / (q k^T)) k)          P_ij = scale (do_i . v'_j) (q_i . k_j) E_ij
    dk  += scale (do v'^T E)^T q + kt-rows of dS' v'^T
    dgc += rowsum(P) - colsum(P) + scale e (do . q S) + the S' terms

and through the WY representation ``u = A (beta v)``, ``w = A (beta e k)``,
``A = (I + L)^-1``, ``L = strict_tril(beta k k^T E)``:

    dv   = beta (A^T du);  dk += beta e (A^T dw);  dL = -A^T (du (beta v)^T + dw (beta e k)^T) A^T

with ``dL``'s strictly lower part giving ``dbeta``, ``dk`` and ``dgc``. The
per-step gates' gradient is the reverse cumsum of ``dgc`` inside each chunk;
a key head's ``dq``, ``dk`` sum over the value heads that read it.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .chunk_jnp import chunk_layout, chunk_states_jnp
from .naive_recurrent import repeat_heads
from .precision import HIGHEST, compute_dtype

BT = 64


def _ein(spec, *xs):
    return jnp.einsum(spec, *xs, precision=HIGHEST)


def wy_from_A(A, k, v, gc, beta):
    """``w = A (beta exp(gc) k)``, ``u = A (beta v)`` per chunk, layout ``[L, M, BT, H, .]``
    (``A [L, M, BT, H, BT]``, keys repeated to the value heads)."""
    u = _ein("lmihj,lmjhv->lmihv", A, beta[..., None] * v)
    w = _ein("lmihj,lmjhk->lmihk", A, (beta * jnp.exp(gc))[..., None] * k)
    return w, u


def chunk_bwd_jnp(q, k, v, gc, beta, A, initial_state, do, dht, cu_seqlens=None,
                  chunk_indices=None, *, scale):
    """Gradients of the chunked forward (module docstring).

    Args:
      q, k: ``[B, T, Hg, K]``; v: ``[B, T, H, V]``; gc: ``[B, T, H]`` the
        chunk-local cumulative log gates; beta: ``[B, T, H]``; A: ``[B, T, H,
        64]`` of ``fwd_intra``; initial_state: ``[N, H, K, V]`` or None
        (zeros); do: ``[B, T, H, V]``; dht: ``[N, H, K, V]`` (the final
        state's cotangent) or None (zeros); cu_seqlens, chunk_indices: int32 of a packed batch, or None.

    Returns:
      ``dq, dk [B, T, Hg, K]``, ``dv [B, T, H, V]``, ``dgc [B, T, H]`` (the
      cotangent of the chunk-local cumsum ``gc``), ``dbeta [B, T, H]``,
      ``dh0 [N, H, K, V]``, in the compute dtype.
    """
    B, T, Hg, K = q.shape
    H = v.shape[2]
    ct = compute_dtype(q.dtype, k.dtype, v.dtype, gc.dtype, beta.dtype)
    chunks, unchunk, valid, seq = chunk_layout(B, T, cu_seqlens, chunk_indices)
    N, V = (B if cu_seqlens is None else cu_seqlens.shape[0] - 1), v.shape[3]
    zeros = jnp.zeros((N, H, K, V), ct)
    initial_state = zeros if initial_state is None else initial_state
    dht = zeros if dht is None else dht
    gather = lambda x: chunks(jnp.asarray(x).astype(ct))  # noqa: E731
    qq, kk = repeat_heads(gather(q), H), repeat_heads(gather(k), H)
    vv, g, b, dO = gather(v), gather(gc), gather(beta), gather(do)
    Ac = gather(A)[..., :BT]
    w, u = wy_from_A(Ac, kk, vv, g, b)
    S_in, v_new, _ = chunk_states_jnp(kk, w, u, g, valid, seq, initial_state.astype(ct))

    last = jnp.maximum(valid.sum(-1) - 1, 0)
    gl = jnp.take_along_axis(g, last[:, :, None, None], axis=2)[:, :, 0]  # [L, M, H]
    rows, e, E = chunk_decays(g, valid)
    kt = kk * jnp.where(rows, jnp.exp(gl[:, :, None] - g), 0)[..., None]
    QK = _ein("lmihk,lmjhk->lmhij", qq, kk)  # [L, M, H, BT, BT]
    M = QK * E
    dv_local = scale * _ein("lmhij,lmihv->lmjhv", M, dO)

    def step(dstates, x):  # the reverse walk
        kt_c, w_c, e_c, q_c, dO_c, dvl_c, gl_c, s, live = x
        dS1 = dstates if s is None else dstates[s]  # dS', the cotangent of the leaving state
        dv_c = dvl_c + _ein("mihk,mhkv->mihv", kt_c, dS1)
        dS0 = (jnp.exp(gl_c)[..., None, None] * dS1
               + scale * _ein("mihk,mihv->mhkv", e_c[..., None] * q_c, dO_c)
               - _ein("mihk,mihv->mhkv", w_c, dv_c))
        dS0 = jnp.where(live[:, None, None, None], dS0, dS1)
        return (dS0 if s is None else dstates.at[s].set(dS0)), (dS1, dv_c)

    dstates, (dS_out, dvn) = jax.lax.scan(
        step, dht.astype(ct), (kt, w, e, qq, dO, dv_local, gl, seq, valid[..., 0]), reverse=True)

    # per chunk, in parallel: the walk's part of dq, dk, dw, dgc
    dw = -_ein("lmihv,lmhkv->lmihk", dvn, S_in)
    dOv = scale * _ein("lmihv,lmjhv->lmhij", dO, v_new)  # do_i . v'_j
    P = dOv * M  # [L, M, H, i, j]
    inter = _ein("lmihk,lmhkv->lmihv", qq, S_in)  # q S
    dq = scale * e[..., None] * _ein("lmihv,lmhkv->lmihk", dO, S_in) + _ein("lmhij,lmjhk->lmihk", dOv * E, kk)
    dk = _ein("lmhij,lmihk->lmjhk", dOv * E, qq)
    dk = dk + jnp.where(rows, jnp.exp(gl[:, :, None] - g), 0)[..., None] * _ein(
        "lmhkv,lmjhv->lmjhk", dS_out, v_new)
    dg = jnp.swapaxes(P.sum(-1) - P.sum(-2), -1, -2)  # [L, M, BT, H]
    dg = dg + scale * e * jnp.sum(dO * inter, -1)
    # S' = gamma S + sum_j exp(gl - gc_j) k_j v'_j^T: gamma and the exp(gl - gc_j)
    c = kt * _ein("lmhkv,lmjhv->lmjhk", dS_out, v_new)  # [L, M, BT, H, K]
    c = c.sum(-1)  # [L, M, BT, H]
    dgl = jnp.exp(gl) * jnp.sum(dS_out * S_in, axis=(-1, -2)) + c.sum(2)  # [L, M, H]
    dg = dg - c
    dg = dg + jnp.where(jnp.arange(BT)[None, None, :, None] == last[:, :, None, None], dgl[:, :, None], 0)

    # through the WY representation
    dv, db, dk_wy, dg_wy = wy_bwd_chunks(Ac, kk, vv, b, e, E, dvn, dw)
    dk, dg = dk + dk_wy, dg + dg_wy

    to_rows = functools.partial(chunk_rows, unchunk, rows)
    return (key_heads(to_rows(dq), Hg, ct), key_heads(to_rows(dk), Hg, ct), to_rows(dv),
            to_rows(dg), to_rows(db), dstates.astype(ct))


def chunk_decays(g, valid):
    """``(rows, e, E)`` of chunk-laid gates ``g [L, M, BT, H]``: the valid
    rows ``[L, M, BT, 1]``, ``e = exp(g)`` (0 past the end) and ``E [L, M, H,
    i, j] = exp(g_i - g_j)`` for valid ``i >= j``, else 0."""
    rows = valid[..., None]
    gt = jnp.swapaxes(g, -1, -2)  # [L, M, H, BT]
    causal = jnp.tril(jnp.ones((BT, BT), bool)) & valid[:, :, None, :, None] & valid[:, :, None, None, :]
    E = jnp.where(causal, jnp.exp(jnp.where(causal, gt[..., :, None] - gt[..., None, :], 0)), 0)
    return rows, jnp.where(rows, jnp.exp(g), 0), E


def chunk_rows(unchunk, rows, x):
    """``[B, T, ...]`` of chunk-laid ``x [L, M, BT, H(, .)]``, rows past a chunk's end 0."""
    return unchunk(jnp.where(rows if x.ndim == 4 else rows[..., None], x, 0))


def wy_bwd_chunks(Ac, kk, vv, b, e, E, du, dw, dA=None):
    """``(dv, dbeta, dk, dgc)`` through ``u = A (beta v)``, ``w = A (beta e
    k)`` and ``A = (I + L)^-1`` (module docstring) in the chunk layout ``[L,
    M, BT, H, .]`` (``Ac [L, M, BT, H, BT]``, keys repeated to the value
    heads, ``e``, ``E`` of :func:`chunk_decays`); ``dA``: a cotangent of
    ``A`` itself (laid out as ``Ac``), or None."""
    Atdu = _ein("lmihj,lmihv->lmjhv", Ac, du)
    Atdw = _ein("lmihj,lmihk->lmjhk", Ac, dw)
    dv = b[..., None] * Atdu
    db = jnp.sum(Atdu * vv, -1) + jnp.sum(Atdw * e[..., None] * kk, -1)
    dk = (b * e)[..., None] * Atdw
    dg = b * e * jnp.sum(Atdw * kk, -1)
    At = jnp.swapaxes(Ac, -2, -3)  # [L, M, H, i, j]
    dA_wy = _ein("lmihv,lmjhv->lmhij", du, b[..., None] * vv) + _ein(
        "lmihk,lmjhk->lmhij", dw, (b * e)[..., None] * kk)
    # A an output too (fwd_intra's own backward): its cotangent, [L, M, i, H, j] -> [L, M, H, i, j]
    dA = dA_wy if dA is None else dA_wy + jnp.swapaxes(dA, 2, 3)
    dL = -_ein("lmhai,lmhab,lmhjb->lmhij", At, dA, At)  # -A^T dA A^T
    strict = jnp.tril(jnp.ones((BT, BT), bool), -1)
    dL = jnp.where(strict, dL, 0)
    bt = jnp.swapaxes(b, -1, -2)[..., :, None]  # beta_i [L, M, H, BT, 1]
    G = _ein("lmihk,lmjhk->lmhij", kk, kk) * E  # k_i . k_j E_ij
    db = db + jnp.swapaxes(jnp.sum(dL * G, -1), -1, -2)
    dLb = dL * bt * E
    dk = dk + _ein("lmhij,lmjhk->lmihk", dLb, kk) + _ein("lmhij,lmihk->lmjhk", dLb, kk)
    LdL = dL * bt * G
    dg = dg + jnp.swapaxes(LdL.sum(-1) - LdL.sum(-2), -1, -2)
    return dv, db, dk, dg


def key_heads(x, Hg: int, dtype):
    """``[B, T, Hg, K]`` in ``dtype`` of a per-value-head cotangent ``x [B,
    T, H, K]``: a key head's is the sum over its value heads (GQA), taken in
    float32 at least."""
    B, T, H, K = x.shape
    if H == Hg:
        return x.astype(dtype)
    acc = jnp.promote_types(x.dtype, jnp.float32)  # bf16 partials sum in float32
    return x.reshape(B, T, Hg, H // Hg, K).astype(acc).sum(3).astype(dtype)


def chunk_reverse_cumsum(dgc, cu_seqlens=None, chunk_indices=None):
    """The cotangent of :func:`gdn_jax.chunk_jnp.chunk_local_cumsum`: the
    reverse cumsum of ``dgc [B, T, H]`` inside each 64-chunk."""
    B, T = dgc.shape[:2]
    gather, scatter, _, _ = chunk_layout(B, T, cu_seqlens, chunk_indices)
    x = gather(dgc)
    # The chunk's total less the inclusive cumsum before each row, not
    # flip(cumsum(flip)): XLA's GPU emitter (jax 0.11.2, H200) fails to
    # translate the flipped form's fusion to LLVM IR in the gradient at T < 64.
    return scatter(x.sum(2, keepdims=True) - jnp.cumsum(x, axis=2) + x)


def chunk_bwd_per_step_jnp(q, k, v, gc, beta, A, initial_state, do, dht, cu_seqlens=None,
                           chunk_indices=None, *, scale):
    """:func:`chunk_bwd_jnp` with the gates' cotangent taken back to the
    per-step gates, as the GPU launch returns it
    (:func:`gdn_jax.chunk_bwd_launch.chunk_bwd_triton`): ``(dq, dk, dv, da,
    dbeta, dh0)``, ``da [B, T, H]`` the reverse cumsum of ``dgc`` within each
    chunk (:func:`chunk_reverse_cumsum`)."""
    dq, dk, dv, dgc, dbeta, dh0 = chunk_bwd_jnp(q, k, v, gc, beta, A, initial_state, do, dht, cu_seqlens,
                                                chunk_indices, scale=scale)
    return dq, dk, dv, chunk_reverse_cumsum(dgc, cu_seqlens, chunk_indices), dbeta, dh0
