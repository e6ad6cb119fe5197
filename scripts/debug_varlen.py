"""Probe of which jitted uses of the Triton path break under the installed
jax-triton (0.4.1 with traced cu_seqlens hit CUDA_ERROR_ILLEGAL_ADDRESS).

    python scripts/debug_varlen.py            # every variant, each in a fresh process
    python scripts/debug_varlen.py VARIANT    # one variant (an illegal address poisons the context)

Set XLA_FLAGS in the environment to probe XLA options (command buffers).
"""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import gdn_jax
from gdn_jax.chunk_indices import chunk_indices_in_graph

sys.path.insert(0, "tests")
from inputs import make_inputs  # noqa: E402

CU = [0, 100, 230]
T = CU[-1]


def exact_in_graph(c):
    """The in-graph chunk list without padding rows (size known here only)."""
    return chunk_indices_in_graph(c, T)[: len(gdn_jax.prepare_chunk_indices(np.array(CU)))]


def variants(k, v, g, beta, cu_arr):
    ci = gdn_jax.prepare_chunk_indices(cu_arr)
    ci_padded = chunk_indices_in_graph(cu_arr, T)  # concrete here: the padded list as data

    def with_ci(make_ci, impl="triton"):
        def f(c, i):
            return gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=c, chunk_indices=make_ci(c, i),
                                     impl=impl)
        return lambda: jax.jit(f)(cu_arr, ci)

    def traced(impl):
        return lambda: jax.jit(lambda c: gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=c, impl=impl))(cu_arr)

    return {
        "traced_cu_fused": traced("triton"),
        "traced_cu_seed": traced("seed"),
        "ci_arg_seed": with_ci(lambda c, i: i, "seed"),
        "ci_plus_zero_seed": with_ci(lambda c, i: i + 0 * c[0], "seed"),
        "padded_ci_arg_seed": lambda: jax.jit(lambda c, i: gdn_jax.fwd_intra(
            k, v, g, beta, cu_seqlens=c, chunk_indices=i, impl="seed"))(cu_arr, ci_padded),
        "exact_in_graph_seed": with_ci(lambda c, i: exact_in_graph(c), "seed"),
        "barrier_seed": with_ci(lambda c, i: jax.lax.optimization_barrier(chunk_indices_in_graph(c, T)),
                                "seed"),
    }


def main():
    if len(sys.argv) == 1:
        k, v, g, beta = make_inputs(0, 1, T, 1, 2, 64, 64, "float32", cu_seqlens=CU)
        names = list(variants(k, v, g, beta, jnp.asarray(CU, jnp.int32)))
        for name in names:
            r = subprocess.run([sys.executable, "-P", __file__, name], capture_output=True,
                               text=True, timeout=300)
            lines = (r.stdout + r.stderr).strip().splitlines()
            print(f"[XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}]", *(lines[-1:] or ["no output"]),
                  flush=True)
        return
    variant = sys.argv[1]
    k, v, g, beta = make_inputs(0, 1, T, 1, 2, 64, 64, "float32", cu_seqlens=CU)
    cu_arr = jnp.asarray(CU, jnp.int32)
    ref = gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu_arr, impl="reference")
    try:
        out = jax.block_until_ready(variants(k, v, g, beta, cu_arr)[variant]())
        print(variant, "OK, max abs diff vs reference",
              ["%.2g" % float(jnp.abs(o - r).max()) for o, r in zip(out, ref)], flush=True)
    except Exception as e:  # noqa: BLE001
        print(variant, "FAILED", type(e).__name__, str(e).splitlines()[0][:160], flush=True)


if __name__ == "__main__":
    main()
