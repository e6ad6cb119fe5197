"""First-call cost of the Triton path (jax-triton lowering + Triton compile +
autotuning at first execution) and what later calls with new shapes cost.

    python benchmarks/compile_times.py
"""
import time

import jax
import jax.numpy as jnp

import gdn_jax


def inputs(B, T, Hg=16, H=32, D=128):
    ks = jax.random.split(jax.random.key(T), 4)
    k = jax.random.normal(ks[0], (B, T, Hg, D), jnp.bfloat16) * 0.08
    v = jax.random.normal(ks[1], (B, T, H, D), jnp.bfloat16)
    g = -0.01 * jax.random.uniform(ks[2], (B, T, H))
    beta = jax.nn.sigmoid(jax.random.normal(ks[3], (B, T, H)))
    return k, v, g, beta


def timed(label, f, *args):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    print(f"{label:58s} {time.perf_counter() - t0:8.3f} s", flush=True)


def main():
    f = jax.jit(lambda k, v, g, b: gdn_jax.fwd_intra(k, v, g, b, impl="triton"))
    fv = jax.jit(lambda k, v, g, b, cu: gdn_jax.fwd_intra(k, v, g, b, cu_seqlens=cu, impl="triton"))
    timed("first call, B=2 T=4096 (compile + autotune)", f, *inputs(2, 4096))
    timed("same shape again", f, *inputs(2, 4096))
    timed("new T=4032 (T % 16 == 0 as before): new XLA executable", f, *inputs(2, 4032))
    timed("new T=1000 (T % 16 != 0: new Triton specialization)", f, *inputs(2, 1000))
    timed("new B=4, T=4096", f, *inputs(4, 4096))
    k, v, g, b = inputs(1, 8192)
    timed("packed T=8192, cu=[0,1000,8192] (first varlen call)", fv, k, v, g, b, jnp.array([0, 1000, 8192], jnp.int32))
    timed("packed T=8192, cu=[0,5000,8192] (same executable)", fv, k, v, g, b, jnp.array([0, 5000, 8192], jnp.int32))
    timed("packed T=8192, cu=[0,7,4000,8192] (new N: new executable)", fv, k, v, g, b,
          jnp.array([0, 7, 4000, 8192], jnp.int32))


if __name__ == "__main__":
    main()
