"""Probe (GPU machine): the warp-specialized Gluon kernel of ``impl="gluon"``
(``kernels/gluon_intra.py``) under ablations and register splits, beside the
shipped split path, at the headline shape; torch launch.

    python3 benchmarks/gluon_ws_probe.py [--out DIR] [--configs a,b] [--rounds N] [--floor] [--jax]
    python3 benchmarks/gluon_ws_probe.py --profile CONFIG   # three launches, for Nsight Compute
    python3 benchmarks/gluon_ws_probe.py --offline CONFIG   # no GPU: resources and SASS counts

A config is a set of ``launch_args`` overrides (:data:`CONFIGS`): the register
split, or ``MODE`` 1 / 2 (the builders alone, the w/u partitions alone; the
other side only passes the slots on). The design choices it measured are in
docs/performance.md; variants that lost (one-warp builder partitions, plain
loads, mma_v2 or asynchronous warpgroup MMAs in the w/u partitions, two groups
of A slots, half-width key tiles, the builders' dots without the index
permutation, gates loaded in the group, zero blocks written every group,
results stored as each MMA ends) are in this file's git history up to commit
34fd239, and TMA descriptors made on the device, TMA for loads or stores
only, cp.async awaited at other points and results stored from the
accumulators without TMA up to commit 982d29a.

Prints ms per config beside the split path (fixed configs), the largest
difference of ``w``, ``u``, ``A`` to the split path's outputs (B=2 H=4 Hg=2
at T=1000, a partial last chunk, or with TMA T=960; and the headline), with ``--floor`` the
bench's bandwidth floor and each time over it, and with ``--jax`` the JAX
launch (``gdn_jax.fwd_intra(impl="gluon")``, jax-triton 0.4.1) against the
torch launch: outputs and time per call.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from gdn_jax.gluon_launch import TMA, compile_offline

CONFIGS = {
    # name: launch_args overrides
    "shipped": {},
    "builders_only": dict(MODE=1),
    "wu_only": dict(MODE=2),
    # no TMA: cp.async k/v tiles, awaited at the iteration's start, results staged in
    # shared memory for 16-byte stores (H200, triton 3.6.0: 0.415 to 0.423 ms against 0.381)
    "no_tma": dict(TMA=False),
    "no_tma_builders_only": dict(TMA=False, MODE=1),
    "no_tma_wu_only": dict(TMA=False, MODE=2),
    # register splits (builders, second w/u partition); H200, triton 3.6.0: 216/144 0.378 ms,
    # 208/136 0.378, 224/144 0.384, 224/136 0.388, 232/144 0.391, 208/144 0.438, 216/136 0.436,
    # 216/152 0.439 (ptxas spills do not rank them)
    **{f"b{b}_c{c}": dict(BUILDER_REGS=b, WU_REGS=c) for b in (208, 216, 224, 232) for c in (136, 144, 152)},
}


def overrides(config):
    """The ``launch_args`` overrides of ``config``: a name of :data:`CONFIGS`,
    optionally followed by ``:KEY=INT`` items (``no_tma:BUILDER_REGS=208``)."""
    name, *items = config.split(":")
    return {**CONFIGS[name], **{key: int(val) for key, val in (item.split("=") for item in items)}}


MODE_OF = lambda c: overrides(c).get("MODE", 0)  # noqa: E731


def offline_report(config, shape=(8, 4096, 16, 32, 128, 128)):
    """Compile ``config`` for sm_90a without a GPU and report its shared
    memory, global scratch, ptxas registers and spills, and SASS instruction
    counts by opcode (the checks to make before timing a change)."""
    import collections
    import re
    import subprocess
    import tempfile

    import triton

    c = compile_offline(*shape, **overrides(config))
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        open(ptx, "w").write(c.asm["ptx"])
        open(cubin, "wb").write(c.asm["cubin"])
        ptxas = subprocess.run([os.path.join(bin_dir, "ptxas"), "--gpu-name", "sm_90a", "-v", ptx, "-o",
                                os.devnull], capture_output=True, text=True).stderr
        sass = subprocess.run([os.path.join(bin_dir, "nvdisasm"), "-c", cubin], capture_output=True,
                              text=True, check=True).stdout
    ops = [m.group(2) for m in (re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
                                for line in sass.splitlines()) if m]
    counts = collections.Counter(op.split(".")[0] for op in ops)
    return {"triton": triton.__version__, "shared_bytes": c.metadata.shared,
            "global_scratch_bytes": c.metadata.global_scratch_size,
            "ptxas": " ".join(line.strip() for line in ptxas.splitlines() if "Used" in line or "spill" in line),
            "sass_instructions": len(ops), "by_opcode": dict(counts.most_common(16))}


def main():
    import threading
    import time

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--configs", default="shipped,builders_only,wu_only")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds (the median is reported)")
    ap.add_argument("--floor", action="store_true", help="also measure the bench's bandwidth floor")
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds per step before exit")
    ap.add_argument("--profile", help="run CONFIG three times at the headline shape (under ncu) and exit")
    ap.add_argument("--offline", metavar="CONFIG",
                    help="compile CONFIG for sm_90a without a GPU and print its resources and SASS counts")
    ap.add_argument("--jax", action="store_true",
                    help="also launch the shipped kernel from JAX (gdn_jax.fwd_intra(impl='gluon'), "
                    "jax-triton 0.4.1: device_run.sh 04): outputs against the torch launch's, and the "
                    "time per call of both launchers")
    args = ap.parse_args()
    if args.offline:
        print(json.dumps(offline_report(args.offline), indent=1))
        return 0

    import torch
    import triton
    from triton.testing import do_bench

    from gdn_jax.torch_launch import fwd_intra_gluon_torch, fwd_intra_torch

    results = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "steps": []}
    out = os.path.join(args.out, "gluon_ws_probe.json")
    state = {"step": "start", "t": time.time()}

    def watchdog():  # a hung kernel (mbarrier deadlock) must not eat the device call
        while True:
            time.sleep(2)
            if time.time() - state["t"] > args.deadline:
                print(f"WATCHDOG: step {state['step']} ran past {args.deadline} s; exiting", flush=True)
                results["steps"].append({"step": state["step"], "error": "timeout"})
                json.dump(results, open(out, "w"), indent=1)
                os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()

    def step(name, fn):
        state.update(step=name, t=time.time())
        print("step", name, flush=True)
        try:
            res = fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (a probe: record and go on)
            res = {"error": repr(e)[:2000]}
        results["steps"].append({"step": name, **res})
        json.dump(results, open(out, "w"), indent=1)
        print(name, res, flush=True)
        return res

    def inputs(B, T, Hg, H, K, V, seed=0):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        k = torch.randn(B, T, Hg, K, device="cuda", generator=gen)
        k = (k / k.norm(dim=-1, keepdim=True)).to(torch.bfloat16)
        v = torch.randn(B, T, H, V, device="cuda", generator=gen).to(torch.bfloat16)
        beta = torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
        a = -0.3 * torch.rand(B, T + (-T) % 64, H, device="cuda", generator=gen)
        g = a.view(B, -1, 64, H).cumsum(2).view(B, -1, H)[:, :T].contiguous()
        return k, v, g, beta

    def compare(shape, config):
        k, v, g, beta = inputs(*shape)
        ref = fwd_intra_torch(k, v, g, beta, autotune=False, path="split")
        got = fwd_intra_gluon_torch(k, v, g, beta, **overrides(config))
        torch.cuda.synchronize()
        return {name: float((a.float() - b.float()).abs().max() / b.float().abs().max())
                for name, a, b in zip("wuA", got, ref)}

    if args.profile:
        k, v, g, beta = inputs(8, 4096, 16, 32, 128, 128)
        for _ in range(3):
            fwd_intra_gluon_torch(k, v, g, beta, **overrides(args.profile))
        torch.cuda.synchronize()
        return 0
    configs = args.configs.split(",")
    # a partial last chunk where the config takes one (without TMA)
    small = lambda c: (2, 1000 if not overrides(c).get("TMA", TMA) else 960, 2, 4, 128, 128)  # noqa: E731
    headline = (8, 4096, 16, 32, 128, 128)
    for c in configs:
        if MODE_OF(c) == 0:
            step(f"compare_small_{c}", lambda c=c: compare(small(c), c))
            step(f"compare_headline_{c}", lambda c=c: compare(headline, c))
    k, v, g, beta = inputs(*headline)
    calls = {"split": lambda: fwd_intra_torch(k, v, g, beta, autotune=False, path="split"),
             **{c: (lambda c=c: fwd_intra_gluon_torch(k, v, g, beta, **overrides(c))) for c in configs}}
    times = {name: [] for name in calls}
    for r in range(args.rounds):
        for name, fn in calls.items():
            res = step(f"time_{name}_round{r}", lambda fn=fn: {"ms": do_bench(fn)})
            if "ms" in res:
                times[name].append(res["ms"])
    results["median_ms"] = {n: sorted(t)[len(t) // 2] for n, t in times.items() if t}
    if args.floor:  # the bench's floor (bytes / copy bandwidth) and each median over it
        bench = bench_module()
        results["floor_ms"] = bench.floor_bytes(*headline) / bench.copy_bandwidth() * 1e3
        results["over_floor"] = {n: ms / results["floor_ms"] for n, ms in results["median_ms"].items()}
        print("floor_ms", results["floor_ms"], results["over_floor"], flush=True)
    json.dump(results, open(out, "w"), indent=1)
    print(json.dumps(results["median_ms"], indent=1))
    if args.jax:
        step("jax_launch", lambda: jax_launch(k, v, g, beta))


def bench_module():
    """``benchmarks/bench_fwd_intra.py`` (its floor and timing), imported from
    beside this file (``python3 -P`` leaves the script's folder off the path)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_fwd_intra

    return bench_fwd_intra


def jax_launch(k, v, g, beta, n=100, reps=5):
    """The torch and the JAX launch of the shipped kernel on the same inputs: the
    largest output difference, and each launcher's time per call (the bench's
    ``wall_median``: ``n`` back-to-back calls, then a sync, over ``n``; median
    of ``reps``)."""
    import functools

    import jax
    import numpy as np
    import torch

    import gdn_jax
    from gdn_jax.torch_launch import fwd_intra_gluon_torch

    f = jax.jit(functools.partial(gdn_jax.fwd_intra, impl="gluon"))
    args = [jax.dlpack.from_dlpack(x) for x in (k, v, g, beta)]
    got = jax.block_until_ready(f(*args))
    ref = fwd_intra_gluon_torch(k, v, g, beta)
    torch.cuda.synchronize()
    diff = {name: float(np.max(np.abs(np.asarray(a, np.float32) - b.float().cpu().numpy())))
            for name, a, b in zip("wuA", got, ref)}

    wall_median = bench_module().wall_median
    out = [got]
    jax_ms = wall_median(lambda: out.__setitem__(0, f(*args)), lambda: jax.block_until_ready(out[0]),
                         n_inner=n, reps=reps)
    torch_ms = wall_median(lambda: fwd_intra_gluon_torch(k, v, g, beta), torch.cuda.synchronize,
                           n_inner=n, reps=reps)
    return {"max_abs_diff_jax_vs_torch": diff, "jax_ms": jax_ms, "torch_ms": torch_ms,
            "jax_over_torch": jax_ms / torch_ms}


if __name__ == "__main__":
    sys.exit(main())
