"""Float64 NumPy implementation of fwd_intra (docs/math.md), written from the
math alone (loops over sequences, chunks and heads; no code shared with
gdn_jax). The independent yardstick of the tests."""
from __future__ import annotations

import numpy as np

BT = 64


def _sequences(B, T, cu_seqlens):
    """(batch row, start, end) of every sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    cu = [int(x) for x in np.asarray(cu_seqlens)]
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def fwd_intra_numpy(k, v, g, beta, cu_seqlens=None):
    """w, u, A in float64 for float inputs of any dtype (upcast first)."""
    k, v, beta = (np.asarray(x, np.float64) for x in (k, v, beta))
    g = None if g is None else np.asarray(g, np.float64)
    B, T, Hg, K = k.shape
    H, V = v.shape[2:]
    w = np.zeros((B, T, H, K))
    u = np.zeros((B, T, H, V))
    A = np.zeros((B, T, H, BT))
    for b, bos, eos in _sequences(B, T, cu_seqlens):
        for c0 in range(bos, eos, BT):
            c1 = min(c0 + BT, eos)
            n = c1 - c0
            for h in range(H):
                kk = k[b, c0:c1, h // (H // Hg)]  # [n, K]
                be = beta[b, c0:c1, h]
                gate = np.zeros(n) if g is None else g[b, c0:c1, h]
                diff = gate[:, None] - gate[None, :]
                with np.errstate(over="ignore"):
                    decay = np.where(diff <= 0, np.exp(np.minimum(diff, 0)), 0.0)
                L = np.tril(be[:, None] * (kk @ kk.T) * decay, -1)
                Ai = np.linalg.solve(np.eye(n) + L, np.eye(n))
                Ai = np.tril(Ai)  # exact zeros above the diagonal
                u[b, c0:c1, h] = Ai @ (be[:, None] * v[b, c0:c1, h])
                w[b, c0:c1, h] = Ai @ ((be * np.exp(gate))[:, None] * kk)
                A[b, c0:c1, h, :n] = Ai
    return w, u, A


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| (Frobenius) in float64; NaN if out has a NaN."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    num = np.linalg.norm(out - ref)
    den = np.linalg.norm(ref)
    return float(num / den) if den > 0 else float(num)


def sequences(B, T, cu_seqlens):
    """(batch row, start, end) of every non-empty sequence."""
    return [s for s in _sequences(B, T, cu_seqlens) if s[2] > s[1]]


def max_rel_err(out, ref, B, T, cu_seqlens=None) -> float:
    """Largest per-sequence relative Frobenius error (a short sequence's error
    is not hidden in the norm of a long one)."""
    out = np.asarray(out, np.float64)
    return max(
        (rel_err(out[b, s:e], ref[b, s:e]) for b, s, e in sequences(B, T, cu_seqlens)),
        default=0.0,
    )


# Largest relative Frobenius error accepted per output and input dtype:
# docs/math.md's measured ranges (fp32 w 4e-4..7e-4, u and A 1e-4..4e-4; bf16 w, u
# ~3e-3, A 2e-4..1e-3) with a margin of about 2.5x. fp16 has 3 more mantissa
# bits than bf16.
INTRA_TOL = {
    "float32": {"w": 2e-3, "u": 1e-3, "A": 1e-3},
    "bfloat16": {"w": 8e-3, "u": 8e-3, "A": 3e-3},
    "float16": {"w": 2e-3, "u": 2e-3, "A": 1e-3},
}


def a_support(B, T, cu_seqlens=None) -> np.ndarray:
    """``[B, T, 64]`` bool: where ``A`` may be non-zero (column j <= row i of
    the row's chunk). Everywhere else ``A`` must be exactly 0."""
    mask = np.zeros((B, T, BT), bool)
    for b, bos, eos in _sequences(B, T, cu_seqlens):
        for t in range(bos, eos):
            i = (t - bos) % BT
            mask[b, t, : i + 1] = True
    return mask


def check_against_numpy(outs, ref, dtype, B, T, cu_seqlens=None, tol=None) -> dict:
    """Asserts w, u, A within ``tol`` (default INTRA_TOL[dtype]) of the float64
    reference per sequence, finite, and A exactly zero off its support.
    Returns the errors {name: err}."""
    tol = INTRA_TOL[dtype] if tol is None else tol
    errs = {}
    for name, o, r in zip("wuA", outs, ref):
        o = np.asarray(o, np.float64) if o.dtype != "bfloat16" else np.asarray(o.astype("float32"), np.float64)
        assert np.isfinite(o).all(), f"{name} has non-finite values"
        errs[name] = max_rel_err(o, r, B, T, cu_seqlens)
        assert errs[name] <= tol[name], f"{name}: rel err {errs[name]:.3g} > {tol[name]:.3g}"
    A = np.asarray(outs[2].astype("float32"))
    off = ~a_support(B, T, cu_seqlens)[:, :, None, :]
    assert (np.broadcast_to(off, A.shape) <= (A == 0)).all(), "A is not zero off its support"
    return errs


def gdn_recurrence_numpy(q, k, v, g, beta, scale=None, h0=None, cu_seqlens=None, chunk_states=False):
    """docs/math.md's per-token recurrence in float64 NumPy, one token at a time,
    vectorised over batch rows and heads (fast enough for the GPU tests'
    shapes): ``S = exp(g_t) S; v'_t = beta_t (v_t - S^T k_t); S += k_t v'_t^T;
    o_t = S^T (scale q_t)``. Per-step natural-log gates ``g``, states
    ``[N, H, K, V]``; returns ``(o [B, T, H, V], final [N, H, K, V])``, and
    with ``chunk_states`` also ``v' [B, T, H, V]`` and the state entering
    every 64-chunk of every sequence, in order (``[chunks, H, K, V]``)."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    B, T, Hg, K = k.shape
    H, V = v.shape[2:]
    scale = K ** -0.5 if scale is None else scale
    rep = lambda x: np.repeat(x, H // Hg, axis=-2)  # noqa: E731  GQA: head h reads h // (H // Hg)
    qq, kk = rep(q) * scale, rep(k)
    o = np.zeros((B, T, H, V))
    if cu_seqlens is None:
        rows = [(slice(None), 0, T)]  # all batch rows at once
        N = B
    else:
        cu = [int(x) for x in np.asarray(cu_seqlens)]
        rows = [(slice(0, 1), cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
        N = len(cu) - 1
    final = np.zeros((N, H, K, V)) if h0 is None else np.array(h0, np.float64)
    vn = np.zeros((B, T, H, V))
    entering = []  # per sequence: [M, chunks, H, K, V]
    for n, (b, bos, eos) in enumerate(rows):
        S = final.copy() if cu_seqlens is None else final[n:n + 1].copy()  # [M, H, K, V]
        seq_states = []
        for t in range(bos, eos):
            if (t - bos) % 64 == 0:
                seq_states.append(S.copy())
            S *= np.exp(g[b, t])[..., None, None]
            v_new = beta[b, t][..., None] * (v[b, t] - np.einsum("mhk,mhkv->mhv", kk[b, t], S))
            vn[b, t] = v_new
            S += kk[b, t][..., :, None] * v_new[..., None, :]
            o[b, t] = np.einsum("mhk,mhkv->mhv", qq[b, t], S)
        entering.append(np.stack(seq_states, 1) if seq_states else np.zeros((S.shape[0], 0, H, K, V)))
        if cu_seqlens is None:
            final = S
        else:
            final[n] = S[0]
    if not chunk_states:
        return o, final
    h = np.concatenate([x.reshape((-1, H, K, V)) for x in entering]) if cu_seqlens is not None \
        else entering[0].reshape((-1, H, K, V))
    return o, final, vn, h
