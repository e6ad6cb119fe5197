"""Benchmark of decode on the GPU machine: gdn_jax.fused_recurrent_gated_delta_rule
(jax.jit, the state donated and updated in place) against flash-linear-attention's
``fused_recurrent_gated_delta_rule`` (torch, same process, same inputs) and
against the state-bytes floor (the state read and written once, at the copy
bandwidth measured in the same run by a large device-to-device copy).

    python benchmarks/bench_decode.py [--out DIR] [--batches 1,64,256,1024] [--tokens 1,4]

Shape: H = 32 value heads, Hg = 16 key heads, K = V = 128, bf16 q/k/v, float32
log gates (natural log) and betas, float32 and bfloat16 states ``[N, H, K,
V]``; batch N sequences of T tokens. Columns (ms per decode call, medians):

- ``*_ms``: the steady cost of one more call in a stream of calls (what a
  serving loop pays: host dispatch or GPU time, whichever is longer; timed as
  benchmarks/bench_fwd_intra.py times, every column in turn for three rounds);
- ``*_gpu_ms``: GPU time, host dispatch left out: gdn_jax as one jitted call
  of 10 chained decode calls (each on the last one's state) divided by 10;
  fla through ``triton.testing.do_bench_cudagraph`` (a CUDA graph of the call);
- ``gdn_jax_kernel_gpu_ms``: the same kernel launched from torch
  (:func:`gdn_jax.torch_launch.fused_recurrent_torch`, in place, Triton's
  autotuner choosing its config for this case) and timed as fla's is, through
  ``do_bench_cudagraph``: kernel against kernel, without XLA's launch gaps;
- ``gdn_jax_pool``: gdn_jax on a state pool (``state_indices``, 1.5 N rows),
  float32 states at T = 1 (``--pool-everywhere``: every case);
- ``floor_ms``: state bytes read + written / copy bandwidth.

fla reads the given state and writes a new float32 one (it has no in-place
mode); each of its calls starts from the same state. Prints a table last,
writes bench_decode.json and bench_decode.png into --out.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_fwd_intra import (copy_bandwidth, jax_dispatch_ms, markdown_table, torch_triton_cache,  # noqa: E402
                             timed_in_turn, wall_median)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gdn_jax  # noqa: E402
from gdn_jax import autotune  # noqa: E402

H, HG, K, V = 32, 16, 128, 128
CHAIN = 10  # decode calls chained in one jitted call for the GPU time
COLUMNS = {  # key: label (chart and table)
    "gdn_jax_ms": "gdn_jax (jit, in place)", "gdn_jax_pool_ms": "gdn_jax, state pool",
    "fla_ms": "fla 0.6 fused_recurrent", "gdn_jax_gpu_ms": "gdn_jax GPU time",
    "fla_gpu_ms": "fla GPU time", "gdn_jax_kernel_gpu_ms": "gdn_jax kernel GPU time (torch launch)",
    "floor_ms": "state-bytes floor",
}


def make_inputs(B, T, state_dtype, seed=0):
    """bf16 q/k/v (unit keys), float32 log gates and betas, a state of ``state_dtype``."""
    key = jax.random.split(jax.random.key(seed), 6)
    q = jax.random.normal(key[0], (B, T, HG, K), jnp.float32)
    k = jax.random.normal(key[1], (B, T, HG, K), jnp.float32)
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    v = jax.random.normal(key[2], (B, T, H, V), jnp.float32)
    g = jax.nn.log_sigmoid(jax.random.normal(key[3], (B, T, H), jnp.float32) + 3)
    beta = jax.nn.sigmoid(jax.random.normal(key[4], (B, T, H), jnp.float32))
    h0 = (jax.random.normal(key[5], (B, H, K, V), jnp.float32) / np.sqrt(K)).astype(state_dtype)
    return [x.astype(jnp.bfloat16) for x in (q, k, v)] + [g, beta], h0


def state_bytes(B, state_dtype) -> int:
    """Bytes of the states read and written by one decode call."""
    return 2 * B * H * K * V * jnp.dtype(state_dtype).itemsize


def array_writes(hlo: str, aval) -> int:
    """Instructions of the compiled HLO that write a whole array of ``aval``'s
    shape and dtype (copies, asynchronous copies, fusions): 0 where a decode
    step updates its state in place."""
    shape = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[jnp.dtype(aval.dtype).name]
    shape += "[" + ",".join(map(str, aval.shape)) + "]"
    return len(re.findall(rf"= {re.escape(shape)}\{{[^}}]*\}} (?:copy|copy-start|fusion)\(", hlo))


def decode(xs, state, idx=None):
    return gdn_jax.fused_recurrent_gated_delta_rule(*xs, initial_state=state, state_indices=idx,
                                                    output_final_state=True)


def chained(xs, state, idx=None):
    """``CHAIN`` decode calls, each on the last one's state."""
    for _ in range(CHAIN):
        o, state = decode(xs, state, idx)
    return o, state


def fla_function():
    """fla's fused_recurrent_gated_delta_rule, or None where fla is not installed."""
    if importlib.util.find_spec("fla") is None:
        return None
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    return fused_recurrent_gated_delta_rule


def kernel_gpu_ms(xs, h0):
    """``(ms, config)``: our decode kernel alone, launched from torch on the
    same inputs (state updated in place), Triton's autotuner choosing the
    config for this case (its cache cleared: its key has no batch), timed by
    ``do_bench_cudagraph`` as fla's kernel is."""
    import torch
    import triton.testing

    from gdn_jax.kernels.fused_recurrent import gdn_fused_recurrent_kernel
    from gdn_jax.torch_launch import fused_recurrent_torch

    tq, tk, tv, tg, tb = (torch.from_dlpack(x) for x in xs)
    state = torch.from_dlpack(jnp.array(h0)).clone()
    gdn_fused_recurrent_kernel.cache.clear()

    def call():
        fused_recurrent_torch(tq, tk, tv, tg, tb, initial_state=state, output_final_state=True)

    call()  # autotunes
    torch.cuda.synchronize()
    ms = triton.testing.do_bench_cudagraph(call, rep=100, return_mode="median")
    best = gdn_fused_recurrent_kernel.best_config
    return ms, dict(best.kwargs, num_warps=best.num_warps, num_stages=best.num_stages)


def bench_case(B, T, state_dtype, bw, fla, pool):
    xs, h0 = make_inputs(B, T, state_dtype)
    row = dict(B=B, T=T, state=jnp.dtype(state_dtype).name,
               floor_ms=state_bytes(B, state_dtype) / bw * 1e3)
    calls = {}
    chosen = set(autotune._CHOSEN)

    def jax_call(col, idx=None, rows=B):
        """The jitted step on a donated state (a pool of ``rows`` with ``idx``) into ``calls``."""
        state = [jnp.concatenate([h0, h0[: rows - B]]) if idx is not None else jnp.array(h0)]
        # one compile (which times the configs), called and read
        step = jax.jit(decode, donate_argnums=1).lower(xs, state[0], idx).compile()
        row[f"{col}_state_writes"] = array_writes(step.as_text(), state[0])  # 0: updated in place

        def call():
            state[0] = step(xs, state[0], idx)[1]

        call()
        calls[col] = (call, lambda: jax.block_until_ready(state[0]))

    jax_call("gdn_jax")
    if pool:
        P = B + B // 2 + 1
        perm = np.random.default_rng(B).permutation(P)[:B].astype(np.int32)
        jax_call("gdn_jax_pool", jnp.asarray(perm), P)
    row["jax_configs"] = [dict(size_class=key[1][1], pool=dict(key[1][0])["USE_POOL"], **cfg)
                          for key, cfg in autotune._CHOSEN.items()
                          if key not in chosen and key[0] == "fused_recurrent"]
    # GPU time: one jitted call of CHAIN decode calls, its state donated
    run = jax.jit(chained, donate_argnums=1)
    state = [jnp.array(h0)]
    state[0] = run(xs, state[0])[1]
    row["gdn_jax_gpu_ms"] = wall_median(lambda: state.__setitem__(0, run(xs, state[0])[1]),
                                        lambda: jax.block_until_ready(state[0]), n_inner=5) / CHAIN
    if fla is not None:
        import torch
        import triton.testing

        tq, tk, tv, tg, tb = (torch.from_dlpack(x) for x in xs)
        th0 = torch.from_dlpack(jnp.array(h0))
        out = [None]

        def fla_call():
            out[0] = fla(tq, tk, tv, g=tg, beta=tb, initial_state=th0, output_final_state=True)

        fla_call()
        torch.cuda.synchronize()
        calls["fla"] = (fla_call, torch.cuda.synchronize)
        row["gdn_jax_kernel_gpu_ms"], row["torch_launch_config"] = kernel_gpu_ms(xs, h0)
        try:
            row["fla_gpu_ms"] = triton.testing.do_bench_cudagraph(fla_call, rep=100,
                                                                  return_mode="median")
        except Exception as e:  # noqa: BLE001 (recorded; the other columns go on)
            row["fla_gpu_error"] = repr(e)[:300]
            row["fla_gpu_ms"] = triton.testing.do_bench(fla_call, warmup=25, rep=100,
                                                        return_mode="median")
    for col, times in timed_in_turn(calls, reps=5).items():
        row[f"{col}_wall_ms"], row[f"{col}_enqueue_ms"], row[f"{col}_ms"] = times
    row["gdn_jax_gpu_over_floor"] = row["gdn_jax_gpu_ms"] / row["floor_ms"]
    row["gdn_jax_over_floor"] = row["gdn_jax_ms"] / row["floor_ms"]
    if fla is not None:
        row["fla_over_gdn_jax"] = row["fla_ms"] / row["gdn_jax_ms"]
        row["fla_gpu_over_gdn_jax_gpu"] = row["fla_gpu_ms"] / row["gdn_jax_gpu_ms"]
        row["fla_gpu_over_gdn_jax_kernel"] = row["fla_gpu_ms"] / row["gdn_jax_kernel_gpu_ms"]
        row["gdn_jax_kernel_over_floor"] = row["gdn_jax_kernel_gpu_ms"] / row["floor_ms"]
    return row


def plot(rows, path):
    """PNG: ms per decode call against batch, one panel per (state dtype, T)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["state"], r["T"]) for r in rows})
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (state, T) in zip(axes[0], panels):
        sel = sorted((r for r in rows if (r["state"], r["T"]) == (state, T)), key=lambda r: r["B"])
        for key, label in COLUMNS.items():
            pts = [(r["B"], r[key]) for r in sel if isinstance(r.get(key), float)]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label,
                        linestyle="--" if key == "floor_ms" else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (sequences)")
        ax.set_title(f"{state} state, T={T}")
    axes[0][0].set_ylabel(f"ms per call (H={H}, Hg={HG}, K=V={K}, bf16)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


TABLE = [("B", "B"), ("T", "T"), ("state", "state"), ("gdn_jax_ms", "gdn_jax"),
         ("gdn_jax_pool_ms", "gdn_jax pool"), ("fla_ms", "fla"), ("gdn_jax_gpu_ms", "gdn_jax GPU"),
         ("gdn_jax_kernel_gpu_ms", "gdn_jax kernel"), ("fla_gpu_ms", "fla GPU"), ("floor_ms", "floor"),
         ("gdn_jax_gpu_over_floor", "GPU/floor"), ("gdn_jax_kernel_over_floor", "kernel/floor"),
         ("fla_over_gdn_jax", "fla/gdn_jax"), ("fla_gpu_over_gdn_jax_kernel", "fla/gdn_jax kernel")]


def print_table(rows, versions):
    """Markdown table of the rows (ms and ratios), the last thing printed."""
    print(f"\n{versions}")
    print("\n".join(markdown_table(rows, TABLE, digits=4)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--batches", default="1,64,256,1024")
    p.add_argument("--tokens", default="1,4")
    p.add_argument("--states", default="float32,bfloat16")
    p.add_argument("--no-fla", action="store_true")
    p.add_argument("--pool-everywhere", action="store_true",
                   help="time the state pool at every case (default: float32 states, T = 1)")
    p.add_argument("--replot", metavar="JSON", help="only redraw the chart of a saved run, into --out")
    args = p.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        plot(json.loads(pathlib.Path(args.replot).read_text())["rows"], out / "bench_decode.png")
        return
    if not gdn_jax.backend.cuda_available():
        sys.exit("bench_decode.py times the GPU path: it needs an NVIDIA GPU as JAX's default backend")
    torch_triton_cache()
    fla = None if args.no_fla else fla_function()
    bw = copy_bandwidth()
    versions = dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                    copy_bandwidth_TBps=bw / 1e12, jax_trivial_dispatch_ms=jax_dispatch_ms())
    for name in ("jax_triton", "triton", "torch", "fla"):
        try:
            versions[name] = __import__(name).__version__
        except (ImportError, AttributeError):
            pass
    rows = []
    for state in args.states.split(","):
        for T in map(int, args.tokens.split(",")):
            for B in map(int, args.batches.split(",")):
                pool = args.pool_everywhere or (state == "float32" and T == 1)
                rows.append(bench_case(B, T, jnp.dtype(state), bw, fla, pool))
                print(json.dumps(rows[-1]), flush=True)
                (out / "bench_decode.json").write_text(
                    json.dumps(dict(versions=versions, rows=rows), indent=1))
    plot(rows, out / "bench_decode.png")
    writes = max(r.get(f"{c}_state_writes", 0) for r in rows for c in ("gdn_jax", "gdn_jax_pool"))
    print(f"copies or fusions of the whole state in a compiled decode step (0: in place): {writes}")
    print_table(rows, versions)


if __name__ == "__main__":
    main()
