"""Float64 NumPy decode: the options, the state pool and the per-token
recurrence (``gdn_numpy``), written from docs/math.md alone (no code shared with
gdn_jax), and the random inputs of the decode tests."""
from __future__ import annotations

import numpy as np

from numpy_reference import rel_err
from test_naive_recurrent import gdn_numpy

# keyword sets of the options, by name (for parametrized tests)
OPTIONS = {
    "none": {},
    "l2norm": dict(use_qk_l2norm_in_kernel=True),
    "gate": dict(use_gate_in_kernel=True),
    "gate_no_dt_bias": dict(use_gate_in_kernel=True, dt_bias=None),
    "beta_sigmoid": dict(use_beta_sigmoid_in_kernel=True),
    "neg_eigval": dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
    "all": dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
}


def f64(x):
    return None if x is None else np.asarray(np.asarray(x, np.float32), np.float64)


def options_numpy(q, k, g, beta, *, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                  A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                  allow_neg_eigval=False):
    """``(q, k, a, beta)`` after docs/math.md's options, float64."""
    q, k, g, beta = map(f64, (q, k, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = (x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6) for x in (q, k))
    if use_gate_in_kernel:
        x = g + (0 if dt_bias is None else f64(dt_bias))
        g = -np.exp(f64(A_log)) * np.logaddexp(0, x)
    if use_beta_sigmoid_in_kernel:
        beta = (2 if allow_neg_eigval else 1) / (1 + np.exp(-beta))
    return q, k, g, beta


def owners(state_indices, P):
    """The pool row each sequence owns (None: none), by a loop: indices in
    ``[0, P)``, each row to the first sequence naming it."""
    seen, out = set(), []
    for i in np.asarray(state_indices).tolist():
        out.append(i if 0 <= i < P and i not in seen else None)
        seen.add(i)
    return out


def decode_numpy(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None,
                 state_indices=None, state_v_first=False, **options):
    """``(o, final)`` in float64: the states (``[N, H, K, V]``, a pool with
    ``state_indices``, V-first with ``state_v_first``) updated as
    :func:`gdn_jax.fused_recurrent_gated_delta_rule` documents."""
    q, k, a, beta = options_numpy(q, k, g, beta, **options)
    B, T, H = np.shape(v)[:3]
    K, V = np.shape(k)[-1], np.shape(v)[-1]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    states = None if initial_state is None else f64(initial_state)
    if states is not None and state_v_first:
        states = np.swapaxes(states, -1, -2)
    if state_indices is None:
        start = states
    else:
        rows = owners(state_indices, states.shape[0])
        start = np.stack([np.zeros((H, K, V)) if r is None else states[r] for r in rows])
    o, final = gdn_numpy(q, k, f64(v), a, beta, scale=scale, h0=start, cu_seqlens=cu_seqlens)
    if state_indices is not None:
        pool = states.copy()
        for n, r in enumerate(rows):
            if r is not None:
                pool[r] = final[n]
        final = pool
    assert final.shape[0] == (N if state_indices is None else states.shape[0])
    return o, (np.swapaxes(final, -1, -2) if state_v_first else final)


def decode_inputs(seed, B, T, Hg, H, K, V, *, N=None, pool=None, raw=False, state=True):
    """Float32 NumPy ``dict(q, k, v, g, beta, A_log, dt_bias, initial_state)``
    as docs/math.md draws them: unit keys (``raw``: unnormalised q/k, raw gate
    input and beta logits, for the options), ``v`` normal, a state of norm
    about one per column, ``N`` states (default B), or a ``pool`` of that many."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, Hg, K))
    k = rng.standard_normal((B, T, Hg, K))
    if raw:
        q, k = 3 * q, 0.5 * k
    else:
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
    out = dict(q=q, k=k, v=rng.standard_normal((B, T, H, V)))
    if raw:
        out["g"] = rng.standard_normal((B, T, H))
        out["beta"] = rng.standard_normal((B, T, H))
    else:
        out["g"] = -np.logaddexp(0, -rng.standard_normal((B, T, H)))  # logsigmoid
        out["beta"] = 1 / (1 + np.exp(-rng.standard_normal((B, T, H))))
    out["A_log"] = np.log(rng.uniform(1, 16, H))
    out["dt_bias"] = 0.5 * rng.standard_normal(H)
    rows = pool or N or B
    if state:
        out["initial_state"] = rng.standard_normal((rows, H, K, V)) / np.sqrt(K)
    return {n: x.astype(np.float32) for n, x in out.items()}


def check_decode(o, final, ref, tol, B=None, T=None, cu_seqlens=None) -> dict:
    """Finite, and within ``tol`` of the float64 ``ref`` (``o`` per sequence,
    ``final`` per state); returns ``{"o": err, "final": err}``."""
    o_ref, final_ref = ref
    o = f64(o)
    assert np.isfinite(o).all(), "o has non-finite values"
    if cu_seqlens is None:
        seqs = [o[b:b + 1] for b in range(o.shape[0])], [o_ref[b:b + 1] for b in range(o.shape[0])]
    else:
        cu = np.asarray(cu_seqlens)
        spans = [(s, e) for s, e in zip(cu[:-1], cu[1:]) if e > s]
        seqs = [o[:, s:e] for s, e in spans], [o_ref[:, s:e] for s, e in spans]
    errs = {"o": max((rel_err(a, b) for a, b in zip(*seqs)), default=0.0)}
    if final is not None:
        final = f64(final)
        assert np.isfinite(final).all(), "final state has non-finite values"
        errs["final"] = max(rel_err(a, b) for a, b in zip(final, final_ref))
    for name, e in errs.items():
        assert e <= tol, f"{name}: rel err {e:.3g} > {tol:.3g}"
    return errs
