"""A few torch launches of the backward kernels at the headline shape, as a
target for Nsight Compute (GPU machine): stall reasons, occupancy and
bandwidth of each backward kernel, which timings alone cannot say.

    ncu --clock-control none --set full -k regex:'gdn_chunk_bwd_local|gdn_wy_bwd|gdn_chunk_bwd_walk' \\
        --launch-skip 3 --launch-count 3 -o backward python3 benchmarks/profile_backward.py

(``scripts/device_run.sh 04 profile-backward``: that, the report's details
page and the stall summary of ``benchmarks/ncu_stalls.py``).

Runs ``--calls`` calls (default 3) of ``gdn_jax.torch_launch.chunk_bwd_torch``
with the fixed configs (``gdn_jax.autotune.UNTUNED``); the first compiles.
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import torch

from bench_fwd_intra import SHAPES, make_inputs, torch_inputs
from gdn_jax.torch_launch import chunk_bwd_torch, fwd_intra_torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="headline",
                   choices=sorted(n for n, shape in SHAPES.items() if shape[-1] is None))
    p.add_argument("--calls", type=int, default=3)
    args = p.parse_args()
    B, T, Hg, H, K, V, _ = SHAPES[args.shape]
    keys = jax.random.split(jax.random.key(1), 2)
    q = jax.random.normal(keys[0], (B, T, Hg, K), jnp.float32)
    q = (q / jnp.linalg.norm(q, axis=-1, keepdims=True)).astype(jnp.bfloat16)
    do = jax.random.normal(keys[1], (B, T, H, V), jnp.bfloat16)
    k, v, g, beta = make_inputs(B, T, Hg, H, K, V)
    q, do, k, v, g, beta = torch_inputs((q, do, k, v, g, beta))
    _, _, A = fwd_intra_torch(k, v, g, beta, autotune=False, path="split")
    for _ in range(args.calls):
        chunk_bwd_torch(q, k, v, g, beta, A, None, do, None, scale=K ** -0.5)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
