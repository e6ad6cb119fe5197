"""A few torch launches of one path at a benchmark shape, as a target for
Nsight Compute (GPU machine): where the kernels' time goes (stall reasons,
occupancy, bandwidth), which timing differences between variants cannot say.

    ncu --clock-control none --set full -k regex:'gdn_fwd_intra_A_kernel|recompute_w_u' \\
        --launch-skip 2 --launch-count 2 -o split \\
        python3 benchmarks/profile_split.py [--shape headline] [--variant NAME]

Runs ``--calls`` calls (default 3) of the path with fixed configs (the
``gdn_jax.autotune.UNTUNED`` ones, which the autotuner picks at the
headline), so no autotuning launches sit among the profiled ones; the first
call compiles. ``--variant`` replaces one kernel by a benchmark variant
(``bench_fwd_intra.VARIANTS``).
"""
from __future__ import annotations

import argparse

import torch

from bench_fwd_intra import SHAPES, kernel_variant, make_inputs, torch_inputs
from gdn_jax.torch_launch import fwd_intra_torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="headline",
                   choices=sorted(n for n, shape in SHAPES.items() if shape[-1] is None),
                   help="a fixed-length shape of bench_fwd_intra.SHAPES")
    p.add_argument("--path", default="split", choices=["split", "fused", "seed"])
    p.add_argument("--variant", default=None, help="a bench_fwd_intra.VARIANTS name")
    p.add_argument("--calls", type=int, default=3)
    args = p.parse_args()
    B, T, Hg, H, K, V, _ = SHAPES[args.shape]
    k, v, g, beta = torch_inputs(make_inputs(B, T, Hg, H, K, V))
    path, replaced = args.path, {}
    if args.variant:
        path, replaced = kernel_variant(args.variant)
    for _ in range(args.calls):
        fwd_intra_torch(k, v, g, beta, autotune=False, path=path, **replaced)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
