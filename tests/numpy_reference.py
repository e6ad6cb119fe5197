"""Float64 NumPy implementation of SPEC.md's fwd_intra, written from the spec
alone (loops over sequences, chunks and heads; no code shared with gdn_jax).
The independent yardstick of the tests."""
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
