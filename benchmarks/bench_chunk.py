"""Benchmark of the whole GDN forward on the GPU: ``gdn_jax.chunk_gated_delta_rule``
under ``jax.jit`` (``impl="auto"``: the Triton kernels) against
flash-linear-attention's ``chunk_gated_delta_rule`` (torch, same process, same
inputs), against the jnp path, and against the two hardware floors: the bytes
a forward must move over the measured copy bandwidth, and its matrix FLOPs
over the measured bf16 matrix rate.

    python benchmarks/bench_chunk.py [--out DIR] [--shapes a,b] [--no-reference] [--reference-shapes a,b]
                                     [--no-layer] [--backward]

``--reference-shapes``: the jnp path at those shapes only (its compiles take
most of a ``--backward`` run's time).

With ``GDN_JAX_AUTOTUNE=0`` our kernels run their fixed configs (one compile
each: minutes less on a fresh machine, for comparing kernel changes; the
JSON records ``autotuned``).

``--backward`` times forward + backward instead (``jax.value_and_grad`` of
``sum(o * do) + sum(final * dht)`` with respect to q, k, v, g, beta and the
initial state, the loss's value computed as a training step does; fla's
forward, the same loss's value and its gradients, :func:`fla_training_step`)
and records each side's peak memory of
that step (JAX: the compiled step's arguments, outputs and temporaries; torch:
``max_memory_allocated`` over the step). fla 0.6 refuses its gated backward on
Hopper with triton < 3.7.1 (that triton miscompiled its ``dq/dk/dw/dg``
kernel): for timing its guard is switched off here, and its gradients are
not used.

Times are the steady cost per call in a stream of calls (the slope between
batches of N and 5N calls, every column taken in turn for three rounds; see
``bench_fwd_intra.timed``), after warm-up, on random inputs: bf16 q/k/v, unit
q and k, float32 gates ``logsigmoid(normal)`` and ``beta = sigmoid(normal)``,
an initial state and the final state returned. What the forward runs of
``fwd_intra`` (the ``A`` kernel) is timed beside it, so the walk's share is
their difference. Prints the table
last, writes ``bench_chunk.json`` and ``bench_chunk.png`` under --out.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import gdn_jax  # noqa: E402
from bench_fwd_intra import (copy_bandwidth, jax_dispatch_ms, timed_in_turn, torch_triton_cache,  # noqa: E402
                             wall_median)
from gdn_jax.sharding import fwd_intra_sharded  # noqa: E402

# In this order the fixed-length K = 128 shapes come first: after the first,
# fla compiles nothing new for them (its first forward + backward compiles and
# autotunes for about 160 s; 3 to 4 s at each next such shape, about 150 s
# again for K = 256 and for packed sequences).
SHAPES = {  # name: (B, T, Hg, H, K, V, packed sequence lengths or None)
    "headline": (8, 4096, 16, 32, 128, 128, None),
    "B4T8192": (4, 8192, 16, 32, 128, 128, None),
    "T32768": (1, 32768, 16, 32, 128, 128, None),
    "B32T1024": (32, 1024, 16, 32, 128, 128, None),
    "K256": (2, 4096, 16, 16, 256, 256, None),
    "packed32k": (1, 32768, 16, 32, 128, 128, [1000, 7000, 3000, 5500, 2500, 6000, 4000, 3768]),
}
LAYER = dict(batch=4, seq_len=4096, hidden=2048, qk_heads=16, v_heads=32, head_dim=128)
_START = time.perf_counter()


def progress(msg):
    """One line on stderr with the seconds since start: where a cut-off run got to."""
    print(f"[{time.perf_counter() - _START:7.1f} s] {msg}", file=sys.stderr, flush=True)


def make_inputs(B, T, Hg, H, K, V, N, seed=0):
    key = jax.random.split(jax.random.key(seed), 6)
    unit = lambda x: x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True))  # noqa: E731
    q = unit(jax.random.normal(key[0], (B, T, Hg, K))).astype(jnp.bfloat16)
    k = unit(jax.random.normal(key[1], (B, T, Hg, K))).astype(jnp.bfloat16)
    v = jax.random.normal(key[2], (B, T, H, V), jnp.bfloat16)
    g = jax.nn.log_sigmoid(jax.random.normal(key[3], (B, T, H)))
    beta = jax.nn.sigmoid(jax.random.normal(key[4], (B, T, H)))
    h0 = 0.1 * jax.random.normal(key[5], (N, H, K, V))
    return q, k, v, g, beta, h0


def io_bytes(B, T, Hg, H, K, V, N):
    """q, k, v, g, beta read, o written, states read and written (bf16 / fp32)."""
    return B * T * (2 * Hg * K * 2 + H * V * 2 + 2 * H * 4 + H * V * 2) + 2 * N * H * K * V * 4


def matrix_flops(B, T, Hg, H, K, V):
    """The chunk form's matrix work per 64-row chunk and value head: k k^T
    (64 64 K), w and u (64 64 (K + V)), v' = u - w S and q S (2 x 64 K V),
    q k^T (64 64 K), the masked attention times v' (64 64 V), the state
    update (64 K V); 2 FLOPs per multiply-add."""
    per_chunk = 2 * (64 * 64 * K + 64 * 64 * (K + V) + 2 * 64 * K * V + 64 * 64 * K
                     + 64 * 64 * V + 64 * K * V)
    return per_chunk * (-(-T // 64)) * B * H


def matrix_rate():
    """Measured bf16 matrix FLOP/s: an 8192^3 torch matmul on random data."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = wall_median(lambda: a @ b, torch.cuda.synchronize, n_inner=10)
    return 2 * 8192 ** 3 / (ms * 1e-3)


def fla_forward():
    """fla 0.6's public forward, or None where it is not installed."""
    if importlib.util.find_spec("fla") is None:
        return None
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return chunk_gated_delta_rule


def fla_training_step(fla, leaves, tdo, tdht, tcu):
    """fla's step on the torch ``leaves`` (q, k, v, g, beta, h0): the forward,
    the value of the loss ``sum(o * do) + sum(final * dht)`` and its
    gradients into the leaves' ``.grad``. The value is one dot product over
    ``o`` and ``do`` (one read of each, as XLA's fused reduction on our side);
    the gradients come from autograd on the cotangents ``(do, dht)``, which
    are the loss's. Spelled ``(o.float() * do.float()).sum().backward()``,
    torch would write and read float32 copies of ``o`` and ``do`` besides,
    time that is eager torch's, not fla's."""
    import torch

    def step():
        for x in leaves:
            x.grad = None
        o, f = fla(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=tcu)
        with torch.no_grad():
            value = torch.dot(o.reshape(-1), tdo.reshape(-1)).float() + torch.sum(f * tdht)
        torch.autograd.backward((o, f), (tdo, tdht))
        return value

    return step


def with_ratios(row):
    """``row`` with fla's and the jnp path's time over ours, and the configs the JAX autotuner chose."""
    for col in ("fla", "jnp"):
        if f"{col}_steady_ms" in row:
            row[f"{col}_over_gdn_jax"] = row[f"{col}_steady_ms"] / row["gdn_jax_steady_ms"]
    row["jax_configs"] = {key[0]: cfg for key, cfg in gdn_jax.autotune._CHOSEN.items()}
    return row


def bench_backward(name, B, T, Hg, H, K, V, lens, with_reference):
    """Forward + backward: gdn_jax (jax.value_and_grad, Triton path), the jnp path, fla."""
    N = B if lens is None else len(lens)
    q, k, v, g, beta, h0 = make_inputs(B, T, Hg, H, K, V, N)
    do = jax.random.normal(jax.random.key(7), (B, T, H, V), jnp.bfloat16)
    dht = jax.random.normal(jax.random.key(8), (N, H, K, V))
    cu = None if lens is None else jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
    row = dict(shape=name, B=B, T=T, Hg=Hg, H=H, K=K, V=V, packed=lens is not None, backward=True,
               step="value_and_grad")
    calls = {}

    def step(impl):
        def loss(q, k, v, g, beta, h0):
            o, f = gdn_jax.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                  cu_seqlens=cu, impl=impl)
            return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32)) + jnp.sum(f * dht)
        return jax.jit(jax.value_and_grad(loss, argnums=range(6)))

    for col, impl in [("gdn_jax", "auto")] + ([("jnp", "reference")] if with_reference else []):
        f = step(impl).lower(q, k, v, g, beta, h0).compile()  # one compile: timed and measured
        out = [f(q, k, v, g, beta, h0)]
        jax.block_until_ready(out[0])
        progress(f"{name}: {col} compiled and run")
        mem = f.memory_analysis()
        if mem is not None:
            row[f"{col}_peak_MB"] = (mem.argument_size_in_bytes + mem.output_size_in_bytes
                                     + mem.temp_size_in_bytes) / 2**20
        calls[col] = (lambda f=f, out=out: out.__setitem__(0, f(q, k, v, g, beta, h0)),
                      lambda out=out: jax.block_until_ready(out[0]))
    fla = fla_forward()
    if fla is not None:
        import fla.ops.common.chunk_o as fla_chunk_o
        import torch

        fla_chunk_o.TRITON_ABOVE_3_7_1 = True  # fla's Hopper guard off: timing only (module docstring)
        torch_triton_cache()
        leaves = [torch.from_dlpack(x).clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
        tdo, tdht = torch.from_dlpack(do), torch.from_dlpack(dht)
        tcu = None if cu is None else torch.from_dlpack(cu).long()

        fla_step = fla_training_step(fla, leaves, tdo, tdht, tcu)
        fla_step()
        torch.cuda.synchronize()
        progress(f"{name}: fla compiled and run")
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fla_step()
        torch.cuda.synchronize()
        row["fla_peak_MB"] = (torch.cuda.max_memory_allocated() - base) / 2**20 + sum(
            x.numel() * x.element_size() for x in leaves) / 2**20
        calls["fla"] = (fla_step, torch.cuda.synchronize)
    for col, (wall, enqueue, steady) in timed_in_turn(calls).items():
        row[f"{col}_ms"], row[f"{col}_steady_ms"] = wall, steady
    progress(f"{name}: timed")
    return with_ratios(row)


def bench_shape(name, B, T, Hg, H, K, V, lens, bw, rate, with_reference):
    N = B if lens is None else len(lens)
    q, k, v, g, beta, h0 = make_inputs(B, T, Hg, H, K, V, N)
    cu = None if lens is None else jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
    row = dict(shape=name, B=B, T=T, Hg=Hg, H=H, K=K, V=V, packed=lens is not None)
    calls = {}

    def jax_call(col, f, *args):
        jf = jax.jit(f)
        out = [None]
        jax.block_until_ready(jf(*args))  # compile, autotune
        progress(f"{name}: {col} compiled and run")

        def call():
            out[0] = jf(*args)

        calls[col] = (call, lambda: jax.block_until_ready(out[0]))
        return jf

    def forward(impl):
        return lambda q, k, v, g, beta, h0, cu: gdn_jax.chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, impl=impl)

    ours = jax_call("gdn_jax", forward("auto"), q, k, v, g, beta, h0, cu)

    def intra(k, v, g, beta, cu):
        ci = None if cu is None else gdn_jax.chunk_indices.chunk_indices_in_graph(cu, T)
        # what the forward runs of fwd_intra: A alone (the walk forms v' from it, kernels/chunk_fwd.py),
        # on the per-step gates, which the kernel sums itself (SUM_G: no cumsum in XLA)
        return fwd_intra_sharded(k, v, g.astype(jnp.float32), beta, cu_seqlens=cu, chunk_indices=ci,
                                 impl="A", sum_g=True)

    jax_call("fwd_intra", intra, k, v, g, beta, cu)
    if with_reference:
        jax_call("jnp", forward("reference"), q, k, v, g, beta, h0, cu)
    fla = fla_forward()
    if fla is not None:
        import torch

        torch_triton_cache()
        tq, tk, tv, tg, tb, th0 = (torch.from_dlpack(x) for x in (q, k, v, g, beta, h0))
        tcu = None if cu is None else torch.from_dlpack(cu).long()

        def fla_call():
            return fla(tq, tk, tv, tg, tb, initial_state=th0, output_final_state=True, cu_seqlens=tcu)

        fla_call()
        progress(f"{name}: fla compiled and run")
        calls["fla"] = (fla_call, torch.cuda.synchronize)
        o_fla, f_fla = fla_call()
        o, final = ours(q, k, v, g, beta, h0, cu)
        # the same function: ours against fla's (both bf16 runs; not a correctness test)
        rel = lambda a, b: float(jnp.linalg.norm(a.astype(jnp.float32) - b.astype(jnp.float32))  # noqa: E731
                                 / jnp.linalg.norm(b.astype(jnp.float32)))
        row["o_rel_diff_vs_fla"] = rel(o, jnp.from_dlpack(o_fla.contiguous()))
        row["final_rel_diff_vs_fla"] = rel(final, jnp.from_dlpack(f_fla.float().contiguous()))
    for col, (wall, enqueue, steady) in timed_in_turn(calls).items():
        row[f"{col}_ms"], row[f"{col}_enqueue_ms"], row[f"{col}_steady_ms"] = wall, enqueue, steady
    progress(f"{name}: timed")
    row["walk_ms"] = row["gdn_jax_steady_ms"] - row["fwd_intra_steady_ms"]
    row["io_floor_ms"] = io_bytes(B, T, Hg, H, K, V, N) / bw * 1e3
    row["matrix_floor_ms"] = matrix_flops(B, T, Hg, H, K, V) / rate * 1e3
    floor = max(row["io_floor_ms"], row["matrix_floor_ms"])
    row["gdn_jax_over_floor"] = row["gdn_jax_steady_ms"] / floor
    return with_ratios(row)


def bench_layer():
    """The Flax layer (examples/flax_gdn_layer.py) at LAYER's shape, bf16."""
    spec = importlib.util.spec_from_file_location(
        "flax_gdn_layer", pathlib.Path(__file__).parents[1] / "examples" / "flax_gdn_layer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from flax import nnx

    c = LAYER
    layer = mod.GatedDeltaNet(c["hidden"], c["qk_heads"], c["v_heads"], c["head_dim"],
                              dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(layer)

    @jax.jit
    def f(state, x):
        y = nnx.merge(graphdef, state)(x)
        return y[0] if isinstance(y, tuple) else y

    x = jax.random.normal(jax.random.key(1), (c["batch"], c["seq_len"], c["hidden"]), jnp.bfloat16)
    out = [f(state, x)]
    jax.block_until_ready(out[0])
    calls = {"layer": (lambda: out.__setitem__(0, f(state, x)), lambda: jax.block_until_ready(out[0]))}
    wall, enqueue, steady = timed_in_turn(calls)["layer"]
    return dict(c, layer_steady_ms=steady, layer_ms=wall)


BACKWARD_TABLE = [("shape", "shape"), ("gdn_jax_steady_ms", "gdn_jax fwd+bwd"), ("fla_steady_ms", "fla 0.6 fwd+bwd"),
                  ("jnp_steady_ms", "jnp path fwd+bwd"), ("fla_over_gdn_jax", "fla / gdn_jax"),
                  ("jnp_over_gdn_jax", "jnp / gdn_jax"), ("gdn_jax_peak_MB", "gdn_jax peak MB"),
                  ("fla_peak_MB", "fla peak MB")]
TABLE = [("shape", "shape"), ("gdn_jax_steady_ms", "gdn_jax"), ("fwd_intra_steady_ms", "of it fwd_intra"),
         ("walk_ms", "of it the walk"), ("fla_steady_ms", "fla 0.6"), ("jnp_steady_ms", "jnp path"),
         ("io_floor_ms", "I/O floor"), ("matrix_floor_ms", "matrix floor"),
         ("fla_over_gdn_jax", "fla / gdn_jax"), ("jnp_over_gdn_jax", "jnp / gdn_jax"),
         ("gdn_jax_over_floor", "gdn_jax / floor"), ("o_rel_diff_vs_fla", "o vs fla")]


def print_table(rows, versions, table=TABLE):
    print(f"\n{versions}")
    print("| " + " | ".join(h for _, h in table) + " |")
    print("|" + " --- |" * len(table))
    for r in rows:
        print("| " + " | ".join(
            (f"{r[c]:.2e}" if c.endswith("diff_vs_fla") else f"{r[c]:.3f}")
            if isinstance(r.get(c), float) else str(r.get(c, "-")) for c, _ in table) + " |")


def chart_title(backward: bool, device: str) -> str:
    """The chart's title, naming the run's GPU (``versions["device"]``, "NVIDIA H100 80GB HBM3" as "H100")."""
    name = re.search(r"[A-Z]\d{3}", device)
    return f"GDN {'forward + backward' if backward else 'forward'}, bf16, {name[0] if name else device} (lower is better)"


def plot(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [("gdn_jax_steady_ms", "gdn-jax (jax.jit)"), ("fla_steady_ms", "flash-linear-attention 0.6"),
            ("jnp_steady_ms", "plain jnp (jax.jit)"), ("io_floor_ms", "I/O floor"),
            ("matrix_floor_ms", "matrix floor")]
    cols = [(c, label) for c, label in cols if any(c in r for r in rows)]  # e.g. the jnp path left out
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(cols)
    for i, (c, label) in enumerate(cols):
        xs = [j + i * width for j, r in enumerate(rows) if c in r]
        ax.bar(xs, [r[c] for r in rows if c in r], width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], [r["shape"] for r in rows])
    ax.set_yscale("log")
    # bars start a factor below the smallest value, so that their heights compare on the log axis
    values = [r[c] for c, _ in cols for r in rows if c in r]
    ax.set_ylim(bottom=0.3 * min(values), top=4 * max(values))  # room above the bars for the legend
    ax.set_ylabel("ms per call (log)")
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=len(cols), loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--no-reference", action="store_true", help="skip the jnp path")
    p.add_argument("--reference-shapes", default=None, help="the jnp path at these shapes only (a,b)")
    p.add_argument("--no-layer", action="store_true", help="skip the Flax layer")
    p.add_argument("--backward", action="store_true", help="forward + backward (module docstring)")
    p.add_argument("--replot", metavar="JSON", help="only redraw the chart of a saved run (no GPU), into --out")
    args = p.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        saved = json.loads(pathlib.Path(args.replot).read_text())
        backward = any(r.get("backward") for r in saved["rows"])
        plot(saved["rows"], out / ("bench_chunk_backward.png" if backward else "bench_chunk.png"),
             chart_title(backward, saved["versions"]["device"]))
        print_table(saved["rows"], saved["versions"], BACKWARD_TABLE if backward else TABLE)
        return
    bw, rate = copy_bandwidth(), matrix_rate()
    versions = dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                    copy_TBps=round(bw / 1e12, 3), bf16_TFLOPs=round(rate / 1e12, 1),
                    jax_trivial_dispatch_ms=jax_dispatch_ms(),
                    autotuned=gdn_jax.autotune.autotune_enabled())  # GDN_JAX_AUTOTUNE=0: fixed configs
    for mod in ("jax_triton", "triton", "torch", "fla"):
        if importlib.util.find_spec(mod) is not None:
            versions[mod] = getattr(__import__(mod), "__version__", "?")
    rows = []
    reference = set(args.shapes.split(",") if args.reference_shapes is None else args.reference_shapes.split(","))
    with_reference = lambda name: not args.no_reference and name in reference  # noqa: E731
    if args.backward:
        for name in args.shapes.split(","):
            rows.append(bench_backward(name, *SHAPES[name], with_reference(name)))
            print(json.dumps(rows[-1]), flush=True)
            (out / "bench_chunk_backward.json").write_text(json.dumps(dict(versions=versions, rows=rows), indent=1))
        plot(rows, out / "bench_chunk_backward.png", chart_title(True, versions["device"]))
        print_table(rows, versions, BACKWARD_TABLE)
        return
    for name in args.shapes.split(","):
        rows.append(bench_shape(name, *SHAPES[name], bw, rate, with_reference(name)))
        print(json.dumps(rows[-1]), flush=True)
        (out / "bench_chunk.json").write_text(json.dumps(dict(versions=versions, rows=rows), indent=1))
    layer = None if args.no_layer else bench_layer()
    (out / "bench_chunk.json").write_text(json.dumps(dict(versions=versions, rows=rows, layer=layer),
                                                     indent=1))
    plot(rows, out / "bench_chunk.png", chart_title(False, versions["device"]))
    if layer:
        print(f"Flax layer {layer}")
    print_table(rows, versions)


if __name__ == "__main__":
    main()
