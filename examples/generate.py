"""Prefill, then decode steps, with the Flax GDN layer's cache: the same outputs as one forward.

    python examples/generate.py                      # small CPU run (seconds)
    python examples/generate.py --batch 64 --prompt-len 1024 --decode-steps 64 --hidden 2048 \\
        --qk-heads 16 --v-heads 32 --head-dim 128 --dtype bfloat16   # GPU shape

Runs the layer of examples/flax_gdn_layer.py (random weights) three ways
under ``jax.jit``: one forward over ``P + D`` tokens; a prefill of the first
``P`` (chunked forward) returning the cache; then ``D`` decode steps of one
token each (recurrent forward), each from the last step's cache, donated so
that the state is updated in place. The prefill's and the steps' outputs,
put together, must equal the forward's to docs/math.md's tolerance for the dtype
(relative Frobenius error per sequence); the script exits with status 1
where they do not. Prints the errors and the time per decode step (the
whole layer: projections, conv, recurrence, norm, output projection), and,
for comparison, the same step through the chunked forward.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from flax_gdn_layer import GatedDeltaNet  # noqa: E402
from gdn_jax.backend import cuda_available  # noqa: E402
from gdn_jax.validate import IMPLS  # noqa: E402

# docs/math.md's accuracy of the forward against float64 (o and final state), per dtype
TOLERANCE = {"float32": 3e-3, "float16": 5e-3, "bfloat16": 1e-2}


def rel_errors(got, want):
    """Relative Frobenius error of each batch row (sequence), in float32."""
    got, want = (jnp.asarray(x, jnp.float32).reshape(x.shape[0], -1) for x in (got, want))
    return jnp.linalg.norm(got - want, axis=1) / jnp.linalg.norm(want, axis=1)


def step_ms(step, state, x, cache, steps):
    """Median ms of ``steps`` decode steps (after one warm-up), each on the
    last one's cache; returns ``(ms, outputs, cache)``."""
    ys, times = [], []
    for t in range(steps):
        t0 = time.perf_counter()
        y, cache = step(state, x[:, t:t + 1], cache)
        jax.block_until_ready((y, cache))
        times.append(time.perf_counter() - t0)
        ys.append(y)
    return statistics.median(times[1:] or times) * 1e3, jnp.concatenate(ys, axis=1), cache


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=70)
    p.add_argument("--decode-steps", type=int, default=8)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--qk-heads", type=int, default=2)
    p.add_argument("--v-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--dtype", choices=list(TOLERANCE), default="float32")
    p.add_argument("--state-dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--impl", choices=list(IMPLS), default="auto")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    dtype = jnp.dtype(args.dtype)
    B, P, D = args.batch, args.prompt_len, args.decode_steps
    layer = GatedDeltaNet(args.hidden, args.qk_heads, args.v_heads, args.head_dim, dtype=dtype,
                          impl=args.impl, state_dtype=jnp.dtype(args.state_dtype),
                          rngs=nnx.Rngs(args.seed))
    graphdef, state = nnx.split(layer)
    chunked = nnx.split(GatedDeltaNet(args.hidden, args.qk_heads, args.v_heads, args.head_dim,
                                      dtype=dtype, impl=args.impl,
                                      state_dtype=jnp.dtype(args.state_dtype), decode_max_tokens=0,
                                      rngs=nnx.Rngs(args.seed)))[0]

    forward = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    step = jax.jit(lambda s, x, cache: nnx.merge(graphdef, s)(x, cache), donate_argnums=2)
    chunked_step = jax.jit(lambda s, x, cache: nnx.merge(chunked, s)(x, cache), donate_argnums=2)

    x = jax.random.normal(jax.random.key(args.seed + 1), (B, P + D, args.hidden)).astype(dtype)
    y_full, _ = forward(state, x)
    y_prompt, cache = forward(state, x[:, :P])
    _, cache_copy = forward(state, x[:, :P])  # a second cache: the first is donated below
    ms, y_steps, cache = step_ms(step, state, x[:, P:], cache, D)
    chunked_ms, _, _ = step_ms(chunked_step, state, x[:, P:], cache_copy, D)

    errs = rel_errors(jnp.concatenate([y_prompt, y_steps], axis=1), y_full)
    tol = TOLERANCE[args.dtype]
    worst = float(errs.max())
    print(f"backend {jax.default_backend()} (cuda_available={cuda_available()}), impl {args.impl}, "
          f"B={B} P={P} D={D} hidden={args.hidden} Hg={args.qk_heads} H={args.v_heads} "
          f"head_dim={args.head_dim} {args.dtype}, {args.state_dtype} state")
    print(f"prefill + {D} decode steps vs one forward of {P + D} tokens: largest relative error "
          f"per sequence {worst:.3e} (tolerance {tol:.0e})")
    print(f"decode step (whole layer, recurrent forward, state donated): {ms:.3f} ms; "
          f"through the chunked forward: {chunked_ms:.3f} ms")
    if not worst <= tol:
        print("MISMATCH: prefill + decode differs from the forward", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
