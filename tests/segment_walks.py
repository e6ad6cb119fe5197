"""The context parallel math in one process: ``T`` cut into segments that
run one after the other through :func:`gdn_jax.context_parallel.widened_walk`
and are composed as the devices compose them (tests/test_context_parallel.py
on the jnp path, tests/test_context_parallel_gpu.py on the Triton kernels)."""
import jax.numpy as jnp

from gdn_jax.chunk_bwd import CoreStatic
from gdn_jax.context_parallel import advance, corrected_output, widened_walk


def run_in_segments(q, k, v, g, beta, h0, segments: int, *, triton: bool, scale=None):
    """``(o [B, T, H, V], final [B, H, K, V])`` (states float32, float64
    for float64 inputs) of the fixed-length forward (``g`` the per-step log gates, ``h0 [B, H, K, V]``) from
    ``segments`` equal segments of ``T``: each segment's widened walk from
    zeros (the first from ``h0``), its output corrected by the state entering
    it, that state carried on by ``S_in <- P S_in + S_local``."""
    B, T, H, V = v.shape
    K = q.shape[-1]
    Tl = T // segments
    static = CoreStatic("auto", triton, K ** -0.5 if scale is None else scale, True, False)
    S_in = jnp.zeros((B, H, K, V), jnp.promote_types(jnp.float32, h0.dtype))
    outs = []
    for s in range(segments):
        cut = [x[:, s * Tl:(s + 1) * Tl] for x in (q, k, v, g, beta)]
        start = h0.astype(S_in.dtype) if s == 0 else jnp.zeros_like(S_in)
        o0, m, S_local, P_seg = widened_walk(static, triton, *cut, start, None, None)
        outs.append(corrected_output(o0, m, S_in))
        S_in = advance(P_seg, S_local, S_in)
    return jnp.concatenate(outs, axis=1), S_in
