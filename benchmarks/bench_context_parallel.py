"""Context parallelism: ``chunk_gated_delta_rule`` on one GPU against the
mesh of all visible GPUs with ``T`` sharded (:mod:`gdn_jax.context_parallel`).

    python benchmarks/bench_context_parallel.py [--out DIR] [--T 262144,1048576] [--no-backward]

One sequence (``B = 1``) of each ``T``, H = 32 value heads, Hg = 16 key
heads, K = V = 128, bf16 q/k/v, float32 gates and beta, an initial state
and the final state returned. Columns: ``1 device`` (the plain run on the
first device) and ``CP xN`` (the inputs sharded over ``T`` on a mesh of all
N visible devices: with one GPU, the context parallel path on a one-device
mesh, which shows its cost: the walk widened from V to V + K columns and the
correction ``o += m S_in``). Rows: the forward, and forward + backward
(``jax.grad`` of ``sum(o) + sum(final)`` with respect to q, k, v, g, beta
and the initial state). Times are medians of wall-clock ms per call
(``bench_fwd_intra.wall_median``); each CP row also gives the bytes its
compiled step moves between devices (the results of its collectives).
Prints the table, writes ``bench_context_parallel.json`` under --out. On a
CPU with a tiny ``--T`` (e.g. ``--T 256``) it is a smoke test.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import gdn_jax  # noqa: E402
from bench_chunk import make_inputs  # noqa: E402
from bench_fwd_intra import wall_median  # noqa: E402
import hlo_collectives  # noqa: E402

H, HG, K, V = 32, 16, 128, 128


def forward(q, k, v, g, beta, h0):
    return gdn_jax.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                          output_final_state=True)


def forward_backward(*args):
    def loss(*a):
        o, f = forward(*a)
        return jnp.sum(o.astype(jnp.float32)) + jnp.sum(f)
    return jax.grad(loss, argnums=range(6))(*args)


def time_step(fn, args):
    """``(ms, compiled step)``: the jitted ``fn`` on ``args``."""
    step = jax.jit(fn)
    compiled = step.lower(*args).compile()
    out = [None]

    def call():
        out[0] = step(*args)

    return wall_median(call, lambda: jax.block_until_ready(out[0]), n_inner=3, reps=3,
                       warmup=1), compiled


def run(T, backward: bool):
    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("seq",))
    cp = f"CP x{len(devices)}"
    plain = [jax.device_put(x, devices[0]) for x in make_inputs(1, T, HG, H, K, V, 1)]
    sharded = [jax.device_put(x, NamedSharding(mesh, P(None, "seq") if i < 5 else P()))
               for i, x in enumerate(plain)]
    rows = []
    for name, fn in [("forward", forward)] + ([("forward+backward", forward_backward)]
                                             if backward else []):
        row = dict(T=T, step=name)
        for column, args in (("1 device", plain), (cp, sharded)):
            try:
                ms, compiled = time_step(fn, args)
                row[column] = round(ms, 3)
                if column == cp:
                    row["moved_bytes"] = hlo_collectives.result_bytes(compiled.as_text())
            except Exception as e:  # noqa: BLE001 - out of memory and the like, in the table
                row[column] = f"{type(e).__name__}: {str(e)[:200]}"
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows, cp


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--T", default=f"{2 ** 18},{2 ** 20}", help="tokens per sequence, comma-separated")
    p.add_argument("--no-backward", action="store_true", help="the forward only")
    args = p.parse_args()
    info = dict(devices=[str(d) for d in jax.devices()], jax=jax.__version__, H=H, Hg=HG, K=K, V=V,
                dtype="bfloat16", B=1)
    rows, cp = [], None
    for T in (int(t) for t in args.T.split(",")):
        got, cp = run(T, not args.no_backward)
        rows += got
    print(f"\n{'T':>9} {'step':>17} {'1 device ms':>12} {cp + ' ms':>12} {'speedup':>8} {'moved MB':>9}")
    for r in rows:
        one, many = r["1 device"], r[cp]
        both = isinstance(one, float) and isinstance(many, float)
        fmt = lambda x: f"{x:12.3f}" if isinstance(x, float) else f"{'failed':>12}"  # noqa: E731
        print(f"{r['T']:>9} {r['step']:>17} {fmt(one)} {fmt(many)} "
              f"{(one / many if both else float('nan')):8.2f} {r.get('moved_bytes', 0) / 1e6:9.3f}")
    path = pathlib.Path(args.out, "bench_context_parallel.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(info=info, rows=rows), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
