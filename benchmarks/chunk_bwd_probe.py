"""Probe of the backward kernels' configs on the GPU (warps, stages and a
register cap, ``maxnreg``): the whole Triton backward
(``gdn_jax.torch_launch.chunk_bwd_torch``) timed from torch
(``triton.testing.do_bench``) with one config per kernel, each kernel's GPU
time (torch.profiler), and the gradients against the first config's.

    python benchmarks/chunk_bwd_probe.py [--shape headline] [--configs SPEC;SPEC...] [--out DIR]

A SPEC is ``name=warps:stages:maxnreg[:BV[:BK[:V_STAGES[:TRANSPOSED]]]]][,name=...]``
(``maxnreg`` 0: no cap; ``BV`` the kernel's block of value columns where it
has one, ``BK`` the per-chunk kernel's key columns, ``V_STAGES`` the
per-chunk and WY kernels' V loop software-pipelined at that many stages,
``TRANSPOSED`` 1 the reverse walk's transposed form;
a 0 among the last four keeps the launch's own; names as
in ``gdn_jax.autotune.UNTUNED``; a kernel left out keeps its fixed config),
with ``qk=0`` (the reverse walk forms ``q k^T`` itself) and ``A=0`` (``w, u``
rebuilt for both walks) for the kernels' other forms
(``chunk_bwd_torch``'s ``qk_in``, ``from_A``). Why a cap: the per-chunk and
WY kernels sit at 255 registers, one 8-warp program per SM
(docs/performance.md); at 128 registers two fit.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # as the other benchmarks: run with python -P too
from bench_fwd_intra import SHAPES, make_inputs, torch_inputs  # noqa: E402
from kernel_breakdown import torch_kernel_ms  # noqa: E402
from gdn_jax.autotune import UNTUNED  # noqa: E402
from gdn_jax.torch_launch import chunk_bwd_torch, fwd_intra_torch  # noqa: E402

CONFIGS = ";".join([
    "",  # the fixed configs
    "A=0,qk=0",
    "A=0",
    "chunk_bwd_walk=4:2:0:64:0:0:1",
    "chunk_bwd_walk=8:2:0:64:0:0:1",
    "chunk_bwd_walk=4:2:0:16",
    "chunk_bwd_walk=8:2:0:32",
])


def parse(spec: str) -> tuple[dict, dict]:
    """``({kernel name: config kwargs}, {qk_in, from_A})`` of one SPEC (module docstring)."""
    configs, forms = {}, {}
    for item in filter(None, spec.split(",")):
        name, values = item.split("=")
        if name in ("qk", "A"):
            forms[{"qk": "qk_in", "A": "from_A"}[name]] = bool(int(values))
            continue
        warps, stages, maxnreg, *blocks = map(int, values.split(":"))
        configs[name] = dict(UNTUNED[name], num_warps=warps, num_stages=stages,
                             **({"maxnreg": maxnreg} if maxnreg else {}),
                             **{n: x for n, x in zip(("BV", "BK", "V_STAGES"), blocks) if x},
                             **({"TRANSPOSED": True} if blocks[3:4] == [1] else {}))
    return configs, forms


def main():
    import torch
    from triton.testing import do_bench

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="headline",
                   choices=sorted(n for n, shape in SHAPES.items() if shape[-1] is None))
    p.add_argument("--configs", default=CONFIGS)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    a = p.parse_args()
    B, T, Hg, H, K, V, _ = SHAPES[a.shape]
    keys = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(keys[0], (B, T, Hg, K), jnp.float32)
    q = (q / jnp.linalg.norm(q, axis=-1, keepdims=True)).astype(jnp.bfloat16)
    do = jax.random.normal(keys[1], (B, T, H, V), jnp.bfloat16)
    h0 = 0.1 * jax.random.normal(keys[2], (B, H, K, V), jnp.float32)
    k, v, g, beta = make_inputs(B, T, Hg, H, K, V)
    q, do, h0, k, v, g, beta = torch_inputs((q, do, h0, k, v, g, beta))
    _, _, A = fwd_intra_torch(k, v, g, beta, autotune=False, path="split")
    rows, ref = [], None
    for spec in a.configs.split(";"):
        configs, forms = parse(spec)
        run = lambda: chunk_bwd_torch(q, k, v, g, beta, A, h0, do, None, scale=K ** -0.5,  # noqa: E731
                                      configs=configs, **forms)
        try:
            grads = run()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (out of resources etc.: recorded)
            rows.append(dict(spec=spec, error=repr(e)[:300]))
            print(json.dumps(rows[-1]), flush=True)
            continue
        grads = [x.float().clone() for x in grads]
        ref = ref or grads
        diff = max(float((x - r).norm() / r.norm()) for x, r in zip(grads, ref))
        ms = do_bench(run, warmup=10, rep=200, return_mode="median")
        kernels = {n: t for n, t in torch_kernel_ms(run, 5).items() if n.startswith(("gdn_", "recompute"))}
        rows.append(dict(spec=spec or "fixed", ms=ms, rel_diff=diff, kernels=kernels))
        print(json.dumps(rows[-1]), flush=True)
        # after each row: a run cut short keeps what it measured
        pathlib.Path(a.out, "chunk_bwd_probe.json").write_text(json.dumps(rows, indent=1))
    names = sorted({n for r in rows for n in r.get("kernels", {})})
    print(f"\n{a.shape}, ms\n| configs | backward | " + " | ".join(names) + " | rel diff |")
    print("| --- " * (len(names) + 3) + "|")
    for r in rows:
        if "ms" in r:
            cells = " | ".join(f"{r['kernels'].get(n, 0):.3f}" for n in names)
            print(f"| {r['spec']} | {r['ms']:.3f} | {cells} | {r['rel_diff']:.1e} |")


if __name__ == "__main__":
    main()
