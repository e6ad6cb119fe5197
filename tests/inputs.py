"""Random test inputs as docs/math.md describes them (never zeros)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

BT = 64
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def chunk_local_cumsum(a: np.ndarray, starts) -> np.ndarray:
    """Cumulative sum of the per-step log gates ``a [B, T, H]`` restarting at
    every 64-chunk of every sequence (``starts``: the sequence starts)."""
    g = np.empty_like(a)
    T = a.shape[1]
    bounds = sorted(set(starts) | {T})
    for s, e in zip(bounds[:-1], bounds[1:]):
        for c0 in range(s, e, BT):
            g[:, c0:min(c0 + BT, e)] = np.cumsum(a[:, c0:min(c0 + BT, e)], axis=1)
    return g


def per_step_gates(rng, B, T, H) -> np.ndarray:
    """Per-step log gates ``a [B, T, H]`` float32 for the kernels that sum them
    themselves (``SUM_G``): ``-s softplus(z)``, the strength ``s`` 0.05, 1, 4
    and 16 for the heads in turn: weak gates keep entries far apart in a
    chunk large, strong ones make a wrong sum move an exponent by tens."""
    s = np.resize(np.array([0.05, 1.0, 4.0, 16.0]), H)
    return (-s * np.logaddexp(0, rng.standard_normal((B, T, H)))).astype(np.float32)


def make_inputs(seed, B, T, Hg, H, K, V, dtype="float32", use_g=True, cu_seqlens=None):
    """``k, v, g, beta`` as jax arrays: L2-normalised keys, normal values,
    ``beta = sigmoid(normal)``, ``g`` the chunk-local cumsum of per-step log
    gates in (-0.3, 0) (None when ``use_g`` is False). k and v in ``dtype``,
    g and beta in float32."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, T, Hg, K)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, T, H, V)).astype(np.float32)
    beta = 1 / (1 + np.exp(-rng.standard_normal((B, T, H)))).astype(np.float32)
    g = None
    if use_g:
        a = -0.3 * rng.random((B, T, H)).astype(np.float32) - 1e-3
        starts = [0] if cu_seqlens is None else list(np.asarray(cu_seqlens)[:-1])
        g = jnp.asarray(chunk_local_cumsum(a, starts))
    dt = DTYPES[dtype]
    return jnp.asarray(k, dt), jnp.asarray(v, dt), g, jnp.asarray(beta)


def as_f64(*xs):
    """Upcast jax arrays (any float dtype, bf16 included) to float64 NumPy; None stays."""
    return [None if x is None else np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in xs]


def many_sequences(seed, n=1000, max_len=130):
    """``cu_seqlens`` (int32 NumPy) of ``n`` random lengths in [0, max_len), with
    empty sequences first, in the middle and last, and lengths 1, 63, 64, 65."""
    lens = np.random.default_rng(seed).integers(0, max_len, size=n)
    lens[[0, n // 2, n - 1]] = 0
    lens[[1, 2, 3, 4]] = [1, 63, 64, 65]
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
