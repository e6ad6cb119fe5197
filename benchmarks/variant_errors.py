"""Errors of benchmark kernel variants on the GPU against the float64 NumPy
reference (tests/numpy_reference.py), beside the shipped paths': what a
variant costs in accuracy before it may ship (the CPU interpreter runs dots
in float32, so tf32 and 16-bit dots are only seen here).

    PYTHONPATH=benchmarks:tests python benchmarks/variant_errors.py split_plain_dots,fused_plain_dots [--out DIR]

Torch launches with the fixed configs (``gdn_jax.autotune.UNTUNED``: one
compile per kernel and dtype; Triton's autotuner would compile every config,
minutes per variant), B=2 T=1000 Hg=2 H=4 K=V=128, unit keys
(tests/inputs.make_inputs) and correlated ones (cosine about 0.95 to a
shared direction), in bfloat16, float16 and float32. Prints one line per
case and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib

import numpy as np
import torch

from bench_fwd_intra import kernel_variant
from gdn_jax.torch_launch import fwd_intra_torch
from inputs import as_f64, make_inputs
from numpy_reference import fwd_intra_numpy, rel_err

SHAPE = dict(B=2, T=1000, Hg=2, H=4, K=128, V=128)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: TRITON_INTERPRET=1
DTYPES = ["bfloat16", "float16", "float32"]


def inputs(keys, dtype, seed=0):
    B, T, Hg, H, K, V = SHAPE.values()
    k, v, g, beta = (np.array(x, np.float32) for x in make_inputs(seed, B, T, Hg, H, K, V, "float32"))
    if keys == "correlated":  # unit keys of cosine ~0.95 to a shared direction per head
        rng = np.random.default_rng(seed + 1)
        c = rng.standard_normal((1, 1, Hg, K)).astype(np.float32)
        k = c / np.linalg.norm(c, axis=-1, keepdims=True) + 0.33 * k
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
    td = getattr(torch, dtype)
    k, v = (torch.from_numpy(x).to(td).float().numpy() for x in (k, v))  # rounded as launched
    return k, v, g, beta, td


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("variants", help="comma-separated bench_fwd_intra.VARIANTS names")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    cases = {"split": ("split", {}), "one-kernel": ("fused", {})}
    cases.update({name: kernel_variant(name) for name in args.variants.split(",") if name})
    errors = {}
    for keys in ["unit", "correlated"]:
        for dtype in DTYPES:
            k, v, g, beta, td = inputs(keys, dtype)
            ref = fwd_intra_numpy(*as_f64(k, v, g, beta))
            dev = [torch.from_numpy(x).to(DEVICE) for x in (k, v, g, beta)]
            dev = [dev[0].to(td), dev[1].to(td), dev[2], dev[3]]
            for name, (path, replaced) in cases.items():
                outs = fwd_intra_torch(*dev, path=path, autotune=False, **replaced)
                got = {n: rel_err(o.float().cpu().numpy(), r) for n, o, r in zip("wuA", outs, ref)}
                errors[f"{keys} {dtype} {name}"] = got
                print(f"{keys:10s} {dtype:8s} {name:18s} "
                      + " ".join(f"{n} {e:.2e}" for n, e in got.items()), flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "variant_errors.json").write_text(json.dumps(dict(shape=SHAPE, errors=errors), indent=1))


if __name__ == "__main__":
    main()
