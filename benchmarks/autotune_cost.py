"""Where the first autotuned call's time goes: ``jax.value_and_grad`` of the
whole forward at one shape (``bench_chunk.py`` SHAPES), compiled once with
autotuning on, a line per autotuned kernel as it is chosen: the seconds its
configs took to compile ahead, to run once each (the compiles the threads
left over, and the warm-up) and to be timed, and whether the choice came
from the store (``GDN_JAX_CACHE_DIR``).

    python benchmarks/autotune_cost.py [--shape headline]
"""
import argparse
import os
import sys
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_chunk import SHAPES, make_inputs, progress as say  # noqa: E402

import gdn_jax  # noqa: E402
from gdn_jax import autotune, autotune_store  # noqa: E402


def logged(module, name, describe):
    """``module.name`` wrapped: a line with its seconds, until the arrays it
    returns are ready, and ``describe(args, result)``."""
    inner = getattr(module, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = jax.block_until_ready(inner(*args, **kwargs))
        say(f"{name}: {time.perf_counter() - t0:.2f} s {describe(args, out)}")
        return out
    setattr(module, name, wrapper)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="headline", choices=list(SHAPES))
    args = p.parse_args()
    B, T, Hg, H, K, V, lens = SHAPES[args.shape]
    assert lens is None, "fixed-length shapes only"
    logged(autotune, "stand_ins", lambda a, out: f"({len(out)} operands made concrete)")
    logged(autotune, "compiled_runs", lambda a, out: f"({len(out)} configs compiled ahead)")
    logged(autotune, "fastest", lambda a, out: f"(all configs run and timed; picked {out[0]})")
    logged(autotune_store, "lookup", lambda a, out: f"({a[0][0]}: {'stored' if out is not None else 'not stored'})")
    q, k, v, g, beta, h0 = make_inputs(B, T, Hg, H, K, V, B)

    def loss(q, k, v, g, beta, h0):
        o, f = gdn_jax.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        return (o.astype(jax.numpy.float32) ** 2).sum() + (f ** 2).sum()

    say(f"{args.shape}: autotune {'on' if autotune.autotune_enabled() else 'off'}, "
        f"store {autotune_store.store_path() or 'none (GDN_JAX_CACHE_DIR empty)'}")
    lowered = jax.jit(jax.value_and_grad(loss, argnums=range(6))).lower(q, k, v, g, beta, h0)
    say("traced and lowered (the kernels' configs chosen)")
    compiled = lowered.compile()
    say("compiled")
    jax.block_until_ready(compiled(q, k, v, g, beta, h0))
    say("first call done")


if __name__ == "__main__":
    main()
