"""One-off probe (run once per variant in a fresh process: an illegal address
poisons the CUDA context): which jitted uses of the Triton path break under
the installed jax-triton."""
import sys

import jax
import jax.numpy as jnp

import gdn_jax

sys.path.insert(0, "tests")
from inputs import make_inputs  # noqa: E402

variant = sys.argv[1]
cu = [0, 100, 230]
k, v, g, beta = make_inputs(0, 1, 230, 1, 2, 64, 64, "float32", cu_seqlens=cu)
cu_arr = jnp.asarray(cu, jnp.int32)
ref = gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu_arr, impl="reference")
ci = gdn_jax.prepare_chunk_indices(cu_arr)
f = {
    # cu traced, chunk indices computed in the graph
    "traced_cu": lambda: jax.jit(lambda c: gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=c, impl="triton"))(cu_arr),
    # cu and chunk indices both jit arguments (nothing computed in the graph)
    "traced_cu_ci": lambda: jax.jit(lambda c, i: gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=c, chunk_indices=i, impl="triton"))(cu_arr, ci),
    # chunk indices arrive as an argument, but pass through an XLA op first
    "ci_plus_zero": lambda: jax.jit(lambda c, i: gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=c, chunk_indices=i + 0 * c[0], impl="triton"))(cu_arr, ci),
    # fixed length, k computed in the graph
    "fixed_k_in_graph": lambda: jax.jit(lambda k: gdn_jax.fwd_intra(k * 0.5, v, g, beta, cu_seqlens=cu_arr, impl="triton"))(k * 2),
    "fixed_g_in_graph": lambda: jax.jit(lambda gg: gdn_jax.fwd_intra(k, v, gg * 0.5, beta, cu_seqlens=cu_arr, impl="triton"))(g * 2),
}[variant]
try:
    out = jax.block_until_ready(f())
    print(variant, "max abs diff", [float(jnp.abs(o - r).max()) for o, r in zip(out, ref)], flush=True)
except Exception as e:  # noqa: BLE001
    print(variant, "FAILED", type(e).__name__, str(e).splitlines()[0][:200], flush=True)
