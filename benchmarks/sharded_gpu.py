"""fwd_intra and chunk_gated_delta_rule on 2+ GPUs (the device machine's
nvidia-h200-x2): sharded results against the one-GPU run, collectives in the
compiled HLO, and the headline fwd_intra time on one GPU vs batch-sharded.

    python benchmarks/sharded_gpu.py [--out DIR] [--impl auto|split|triton|seed]

Prints one JSON line per case and a table last; writes sharded_gpu_<impl>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import gdn_jax  # noqa: E402
from bench_fwd_intra import SHAPES, make_inputs, wall_median  # noqa: E402

COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce", "reduce-scatter")


def collectives(compiled) -> dict:
    hlo = compiled.as_text()
    return {c: n for c in COLLECTIVES if (n := len(re.findall(rf"\b{c}(-start)?\(", hlo)))}


def max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - jax.device_put(y, x.sharding).astype(jnp.float32))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def case(name, f, args, specs, mesh, time_it=False):
    """Run ``f`` on one GPU and on ``args`` placed with ``specs`` over ``mesh``
    (a failure is reported in the row, and the other cases still run)."""
    try:
        return _case(name, f, args, specs, mesh, time_it)
    except Exception as e:  # noqa: BLE001
        row = dict(case=name, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        print(json.dumps(row), flush=True)
        return row


def _case(name, f, args, specs, mesh, time_it):
    one = jax.jit(f)
    ref = jax.block_until_ready(one(*args))
    placed = [a if s is None else jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
    sharded = jax.jit(f)
    out = jax.block_until_ready(sharded(*placed))
    row = dict(case=name, max_abs_diff=max_diff(out, ref),
               collectives=collectives(sharded.lower(*placed).compile()),
               out_specs=[str(x.sharding.spec) for x in jax.tree.leaves(out)])
    if time_it:
        box = [None]
        row["one_gpu_ms"] = wall_median(lambda: box.__setitem__(0, one(*args)),
                                        lambda: jax.block_until_ready(box[0]))
        row["sharded_ms"] = wall_median(lambda: box.__setitem__(0, sharded(*placed)),
                                        lambda: jax.block_until_ready(box[0]))
    print(json.dumps(row), flush=True)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--gdn-T", type=int, default=2048, help="T of the whole-forward cases")
    p.add_argument("--small", action="store_true", help="small shapes (a CPU check of the script)")
    p.add_argument("--impl", default="auto", help="fwd_intra's impl in every case")
    args = p.parse_args()
    if args.small:
        SHAPES.update(headline=(4, 128, 2, 4, 16, 16, None), packed32k=(1, 300, 2, 4, 16, 16, [100, 0, 200]))
    n = jax.device_count()
    mesh = Mesh(np.array(jax.devices()), ("x",))
    impl = args.impl
    fwd = lambda k, v, g, beta: gdn_jax.fwd_intra(k, v, g, beta, impl=impl)  # noqa: E731
    B, T, Hg, H, K, V, lens = SHAPES["headline"]
    x = make_inputs(B, T, Hg, H, K, V)
    rows = [case("fwd_intra headline, batch-sharded", fwd, x, [P("x")] * 4, mesh, time_it=True),
            case("fwd_intra headline, head-sharded", fwd, x, [P(None, None, "x")] * 4, mesh)]
    B, T, Hg, H, K, V, lens = SHAPES["packed32k"]
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
    rows.append(case("fwd_intra packed32k (traced cu), head-sharded",
                     lambda k, v, g, beta, cu: gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu, impl=impl),
                     [*make_inputs(B, T, Hg, H, K, V), cu], [P(None, None, "x")] * 4 + [None], mesh))
    # The whole forward: q, k [B, T, Hg, K], per-step log gates a and beta [B, T, H].
    B, T, Hg, H, D = 2 * n, args.gdn_T, 8, 16, 128
    k, v, g, beta = make_inputs(B, T, Hg, H, D, D, seed=1)
    a = 0.1 * g / (1 - g.min())  # per-step log gates in (-0.1, 0]
    gdn = lambda q, k, v, a, beta: gdn_jax.chunk_gated_delta_rule(q, k, v, a, beta, impl=impl)[0]  # noqa: E731
    for what, s in (("batch", P("x")), ("head", P(None, None, "x"))):
        rows.append(case(f"chunk_gated_delta_rule B{B} T{T}, {what}-sharded", gdn,
                         [k, k, v, a, beta], [s] * 5, mesh))
    info = dict(devices=[str(d) for d in jax.devices()], jax=jax.__version__, impl=impl)
    pathlib.Path(args.out, f"sharded_gpu_{impl}.json").write_text(json.dumps(dict(info=info, rows=rows), indent=1))
    print(info)
    print("| case | max abs diff vs 1 GPU | collectives | one GPU ms | sharded ms |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['case']} | {r['error']} | | | |")
            continue
        print(f"| {r['case']} | {r['max_abs_diff']:.3g} | {r['collectives'] or 'none'} | "
              f"{r.get('one_gpu_ms', float('nan')):.3f} | {r.get('sharded_ms', float('nan')):.3f} |")


if __name__ == "__main__":
    main()
