"""Demo of gdn_jax.fwd_intra: a fixed-length and a packed varlen batch under
jax.jit, checked against the jnp reference, with the median time of a call.

    python examples/demo_fwd_intra.py [--batch 2 --seq-len 1000 ...]

On an NVIDIA GPU it runs the fastest Triton path for the input (the split
path, or the one-kernel path for small inputs, ``impl="auto"``); elsewhere the
plain-jnp reference (the CPU default).
"""
import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import gdn_jax
from gdn_jax.backend import cuda_available, impl_for
from gdn_jax.gluon_launch import gluon_fits

PATHS = {"gluon": "Gluon, warp-specialized kernel", "triton": "Triton, one-kernel path", "split": "Triton, A kernel then w/u kernel",
         "seed": "Triton, the seed's two kernels",
         "reference": "jnp reference (no NVIDIA GPU)"}


def random_inputs(key, B, T, Hg, H, K, V, dtype):
    kk, kv, kb, ka = jax.random.split(key, 4)
    k = jax.random.normal(kk, (B, T, Hg, K), jnp.float32)
    k = (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(dtype)
    v = jax.random.normal(kv, (B, T, H, V), dtype)
    beta = jax.nn.sigmoid(jax.random.normal(kb, (B, T, H), jnp.float32))
    # chunk-local cumulative sum of per-step log gates (natural log, <= 0)
    a = -0.3 * jax.random.uniform(ka, (B, T, H), jnp.float32)
    pos = jnp.arange(T)
    same_chunk = (pos[:, None] // 64 == pos[None, :] // 64) & (pos[None, :] <= pos[:, None])
    g = jnp.einsum("ts,bsh->bth", same_chunk.astype(jnp.float32), a)
    return k, v, g, beta


def median_ms(f, *args, reps=10):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def rel(a, b):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=1000)
    p.add_argument("--k-heads", type=int, default=2)
    p.add_argument("--v-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    a = p.parse_args()
    B, T, Hg, H, D = a.batch, a.seq_len, a.k_heads, a.v_heads, a.head_dim
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")

    k, v, g, beta = random_inputs(jax.random.key(0), B, T, Hg, H, D, D, jnp.dtype(a.dtype))
    fwd = jax.jit(gdn_jax.fwd_intra)
    ref = jax.jit(lambda *x: gdn_jax.fwd_intra(*x, impl="reference"))  # the yardstick on a GPU
    w, u, A = fwd(k, v, g, beta)
    print(f"fixed length: k {k.shape} v {v.shape} -> w {w.shape} u {u.shape} A {A.shape} ({A.dtype})")
    print(f"  ran: {PATHS[impl_for(B, T, H, gluon=gluon_fits(k, v, g, beta, None))]}")
    if cuda_available():
        errs = [rel(o, r) for o, r in zip((w, u, A), ref(k, v, g, beta))]
        print("  Triton vs jnp reference, rel. error: w {:.1e}  u {:.1e}  A {:.1e}".format(*errs))
    print(f"  median jitted call: {median_ms(fwd, k, v, g, beta):.3f} ms")

    # Packed varlen: the batch rows laid end to end, cut into uneven sequences.
    total = B * T
    cuts = sorted({0, total, total // 3, total // 3 + 1, total // 2})
    cu = jnp.asarray(cuts, jnp.int32)
    kp, vp, gp, bp = (x.reshape(1, total, *x.shape[2:]) for x in (k, v, g, beta))
    fwd_varlen = jax.jit(lambda k, v, g, b, cu: gdn_jax.fwd_intra(k, v, g, b, cu_seqlens=cu))
    w, u, A = fwd_varlen(kp, vp, gp, bp, cu)
    print(f"packed varlen: cu_seqlens {cuts} (traced) -> w {w.shape} u {u.shape} A {A.shape}")
    # traced cu_seqlens: the work list has its static bound, cdiv(total, 64) + N rows
    print(f"  ran: {PATHS[impl_for(1, total, H, chunks=-(-total // 64) + len(cuts) - 1)]}")
    print(f"  median jitted call: {median_ms(fwd_varlen, kp, vp, gp, bp, cu):.3f} ms")


if __name__ == "__main__":
    main()
