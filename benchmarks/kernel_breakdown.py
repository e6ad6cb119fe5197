"""GPU time per kernel of the whole forward and of forward + backward, gdn-jax
against flash-linear-attention: where the time goes, kernel by kernel.

    python benchmarks/kernel_breakdown.py [--shape headline] [--reps 10] [--out DIR]

gdn-jax: the jitted step of benchmarks/bench_chunk.py (``impl="auto"``, the
autotuned configs) under ``jax.profiler.trace``; each kernel's time is read
from the trace's GPU plane (``jax.profiler.ProfileData``): the Triton
kernels and the XLA fusions around them (cumsums, casts, the GQA sums).
fla 0.6 (forward, or forward + ``backward``, its Hopper guard off as in
bench_chunk): ``torch.profiler``'s device time per kernel. Both: ms per call,
the sum over ``--reps`` calls divided by ``--reps``, after a warm-up call.
Prints one table per step and side, writes kernel_breakdown.json (with
the GPU plane's line names, to check what was counted).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import sys
import tempfile

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import gdn_jax  # noqa: E402
from bench_chunk import SHAPES, fla_forward, fla_training_step, make_inputs, progress  # noqa: E402
from bench_fwd_intra import torch_triton_cache  # noqa: E402

# Lines of the GPU plane that repeat the kernels' time under another grouping.
AGGREGATE_LINES = ("XLA Modules", "XLA Ops", "TensorFlow", "Source", "Steps", "Launch")


def jax_kernel_ms(fn, args, reps: int):
    """``({kernel name: ms per call}, GPU plane line names)`` of ``fn(*args)``."""
    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(reps):
                out = fn(*args)
            jax.block_until_ready(out)
        path = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)[0]
        data = jax.profiler.ProfileData.from_file(path)
        times, lines = {}, []
        for plane in data.planes:
            if not plane.name.startswith("/device:GPU:0"):
                continue
            for line in plane.lines:
                lines.append(line.name)
                if line.name.startswith(AGGREGATE_LINES):
                    continue
                for ev in line.events:
                    times[ev.name] = times.get(ev.name, 0.0) + ev.duration_ns / 1e6 / reps
    return times, lines


def torch_kernel_ms(fn, reps: int) -> dict:
    """``{kernel name: ms per call}`` of ``fn()`` from torch.profiler's device times."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        t = getattr(ev, "cuda_time_total", 0.0) if t is None else t
        if t and not ev.key.startswith(("aten::", "cuda")):  # kernels, not the ops or API calls over them
            times[ev.key] = t / 1e3 / reps
    return times


def steps(B, T, Hg, H, K, V, lens, with_fla=True):
    """The jitted forward and forward + backward, their arguments, and fla's two steps (or None)."""
    N = B if lens is None else len(lens)
    q, k, v, g, beta, h0 = make_inputs(B, T, Hg, H, K, V, N)
    do = jax.random.normal(jax.random.key(7), (B, T, H, V), jnp.bfloat16)
    dht = jax.random.normal(jax.random.key(8), (N, H, K, V))
    cu = None if lens is None else jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)

    def forward(q, k, v, g, beta, h0):
        return gdn_jax.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                              output_final_state=True, cu_seqlens=cu)

    def loss(*args):
        o, f = forward(*args)
        return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32)) + jnp.sum(f * dht)

    args = (q, k, v, g, beta, h0)
    # the loss's value computed, as a training step does (bench_chunk.fla_training_step on fla's side)
    ours = {"forward": jax.jit(forward),
            "forward + backward": jax.jit(jax.value_and_grad(loss, argnums=range(6)))}
    fla = fla_forward() if with_fla else None
    if fla is None:
        return ours, args, {}
    import fla.ops.common.chunk_o as fla_chunk_o
    import torch

    fla_chunk_o.TRITON_ABOVE_3_7_1 = True  # fla's Hopper guard off: timing only (bench_chunk)
    torch_triton_cache()
    leaves = [torch.from_dlpack(x).clone().requires_grad_() for x in args]
    tdo, tdht = torch.from_dlpack(do), torch.from_dlpack(dht)
    tcu = None if cu is None else torch.from_dlpack(cu).long()

    def fla_fwd():
        with torch.no_grad():
            fla(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=tcu)

    return ours, args, {"forward": fla_fwd, "forward + backward": fla_training_step(fla, leaves, tdo, tdht, tcu)}


def print_table(title, times):
    total = sum(times.values())
    print(f"\n{title}: {total:.3f} ms per call")
    print("| kernel | ms | share |\n| --- | --- | --- |")
    for name, ms in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"| `{name[:90]}` | {ms:.4f} | {ms / total:.1%} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--shape", default="headline", choices=list(SHAPES))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--no-fla", action="store_true", help="profile gdn-jax only")
    args = p.parse_args()
    if not gdn_jax.backend.cuda_available():
        sys.exit("kernel_breakdown.py profiles the GPU path: it needs an NVIDIA GPU as JAX's default backend")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ours, arrays, fla = steps(*SHAPES[args.shape], with_fla=not args.no_fla)
    import triton

    result = dict(shape=args.shape, reps=args.reps, device=jax.devices()[0].device_kind, jax=jax.__version__,
                  triton=triton.__version__, autotuned=gdn_jax.autotune.autotune_enabled(), steps={})
    # every JAX trace before the first torch.profiler one: torch's CUPTI
    # subscription outlives its profiler, and JAX's then fails
    # (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: an empty trace)
    for step, fn in ours.items():
        times, lines = jax_kernel_ms(fn, arrays, args.reps)
        if not times:
            sys.exit(f"{step}: the JAX trace holds no GPU kernel (the profiler could not subscribe to CUPTI, "
                     "or the trace passed protobuf's 2 GB: fewer --reps, GDN_JAX_AUTOTUNE=0)")
        progress(f"{step}: gdn_jax profiled")
        result["steps"][step] = dict(gdn_jax=times, gpu_plane_lines=sorted(set(lines)))
        (out / "kernel_breakdown.json").write_text(json.dumps(result, indent=1))
    for step, fn in fla.items():
        result["steps"][step]["fla"] = torch_kernel_ms(fn, args.reps)
        progress(f"{step}: fla profiled")
        (out / "kernel_breakdown.json").write_text(json.dumps(result, indent=1))
    for step, r in result["steps"].items():
        print_table(f"gdn-jax {step}, {args.shape}", r["gdn_jax"])
        if "fla" in r:
            print_table(f"fla {step}, {args.shape}", r["fla"])


if __name__ == "__main__":
    main()
