"""Benchmark of fwd_intra on the GPU machine: the gdn_jax Triton paths under
jax.jit (the warp-specialized Gluon kernel ``impl="gluon"`` where the shape
fits it and jax-triton is 0.4, the one-kernel path ``impl="triton"``, its A
kernel then the w/u kernel ``impl="split"``, and the seed's two kernels
``impl="seed"``), the same
kernels launched from torch, the jnp reference under
jax.jit, and the bandwidth floor (bytes that must move / measured copy bandwidth).

    python benchmarks/bench_fwd_intra.py [--out DIR] [--shapes a,b] [--sweep] [--variants [NAME,...]]

Every column is the median over repeated timed runs after warm-up, on random
inputs. JAX and torch are timed the same way, every path of both launchers
in turn for three rounds: wall clock around N back-to-back
calls, then a device sync, divided by N (launches queue asynchronously, so
this is device time once a call takes longer than its dispatch); the table's
ms are the steady cost per call, the slope between batches of N and 5N calls
(the first call's dispatch latency and the final sync left out); torch's
triton.testing.do_bench (CUDA events) is reported beside it, and beside the
JAX paths their GPU time: the wall clock of one jitted call that chains
several calls, divided by their number (host dispatch amortized). Prints the table
last, writes JSON (and, with --sweep, a PNG of time against T) under --out.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import statistics
import tempfile
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch
# Triton's cache as the caller set it, before jax-triton's import deletes it
_TRITON_CACHE_DIR = os.environ.get("TRITON_CACHE_DIR")


def torch_triton_cache():
    """Call before launching Triton kernels from torch in a process that
    imported jax-triton, which deletes ``TRITON_CACHE_DIR`` (0.3.1 sets it
    empty), breaking torch-launched kernels: puts back the directory the
    caller set, so that compiles and the autotuner's saved results (fla's
    ``cache_results``, ``scripts/device_run.sh save-autotune``) land there,
    else a new temporary one."""
    if not os.environ.get("TRITON_CACHE_DIR"):
        os.environ["TRITON_CACHE_DIR"] = _TRITON_CACHE_DIR or tempfile.mkdtemp(prefix="triton_cache")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gdn_jax  # noqa: E402
from gdn_jax import autotune  # noqa: E402

SWEEP_T = (1024, 2048, 4096, 8192)  # --sweep: the headline shape at these T, for the chart
SHAPES = {
    # name: (B, T, Hg, H, K, V, packed sequence lengths or None)
    "headline": (8, 4096, 16, 32, 128, 128, None),
    "packed32k": (1, 32768, 16, 32, 128, 128,
                  [1000, 7000, 3000, 5500, 2500, 6000, 4000, 3768]),
    "B4T2048H8": (4, 2048, 8, 8, 128, 128, None),
    "K256": (2, 4096, 16, 16, 256, 256, None),
    **{f"sweep_T{T}": (8, T, 16, 32, 128, 128, None) for T in SWEEP_T},
}
# column: gdn_jax impl ("gluon" where the shape fits it and the machine runs it)
IMPLS = {"gluon": "gluon", "fused": "triton", "split": "split", "seed": "seed"}
PATHS = {"gluon_steady_ms": "gdn_jax gluon (jax.jit)", "torch_gluon_steady_ms": "gluon kernel, torch launch",
         "split_steady_ms": "gdn_jax split (jax.jit)", "fused_steady_ms": "gdn_jax one-kernel (jax.jit)",
         "seed_steady_ms": "gdn_jax seed kernels (jax.jit)", "torch_split_steady_ms": "split kernels, torch launch",
         "torch_fused_steady_ms": "one kernel, torch launch", "torch_seed_steady_ms": "seed kernels, torch launch",
         "jnp_reference_steady_ms": "jnp reference (jax.jit)", "floor_ms": "bandwidth floor"}


def path_ms(row, key):
    """``row[key]``, or for a result file without the steady column the
    wall time of ``n_inner`` calls it has instead."""
    return row.get(key, row.get(key.replace("_steady", "")))


def plot_sweep(rows, path):
    """PNG of time against T (headline B, heads and dims) for every path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = sorted((r for r in rows if r["shape"].startswith("sweep_T")), key=lambda r: r["T"])
    if not sweep:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in PATHS.items():
        pts = [(r["T"], path_ms(r, key)) for r in sweep if path_ms(r, key) is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=label, linestyle="--" if key == "floor_ms" else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("T (B=8, Hg=16, H=32, K=V=128, bf16)")
    ax.set_ylabel("ms per call (median)")
    ax.set_title("fwd_intra")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_shapes(rows, path):
    """PNG of every path's time at each benchmarked shape (bars, log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if not r["shape"].startswith("sweep_T")]
    keys = [k for k in PATHS if any(path_ms(r, k) is not None for r in rows)]
    if not rows or not keys:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        have = [(j, path_ms(r, key)) for j, r in enumerate(rows) if path_ms(r, key) is not None]
        ax.bar([j + i * width for j, _ in have], [ms for _, ms in have], width, label=PATHS[key])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], [r["shape"] for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("ms per call (median)")
    ax.set_title("fwd_intra, bf16, g on")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def timed(fn, sync, n_inner=20, reps=7, warmup=3, long=5, batch_ms=100.0):
    """``(wall, enqueue, steady)`` ms per call, medians over ``reps``:

    - wall: ``n_inner`` back-to-back calls then ``sync``, per call (it includes
      the first call's dispatch latency and the last one's drain, spread over
      ``n_inner`` calls);
    - enqueue: host ms per call spent before the sync (near the wall time, the
      host's dispatch, not the GPU, sets the pace);
    - steady: the cost of one more call in a stream of calls, the slope
      between batches of ``n_inner`` and ``long * n_inner`` calls (taken in
      turn), which leaves the one-off latency and drain out.

    Calls slower than ``batch_ms / n_inner`` run in batches of about
    ``batch_ms`` (at least 3 calls), so that a 40 ms call costs seconds, not
    minutes; faster calls keep ``n_inner``.
    """
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one_ms = (time.perf_counter() - t0) * 1e3
    n_inner = max(3, min(n_inner, int(batch_ms / max(one_ms, 1e-6))))
    times, queued, longer = [], [], []

    def batch(n):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        sync()
        return t1 - t0, time.perf_counter() - t0

    for _ in range(reps):
        q, t = batch(n_inner)
        queued.append(q / n_inner * 1e3)
        times.append(t / n_inner * 1e3)
        if long:
            longer.append(batch(long * n_inner)[1] / n_inner * 1e3)
    wall = statistics.median(times)
    steady = (statistics.median(longer) - wall) / (long - 1) if long else wall
    return wall, statistics.median(queued), steady


def timed_in_turn(calls: dict, rounds=3, **kw) -> dict:
    """``{name: (wall, enqueue, steady)}``: :func:`timed` of each ``(fn, sync)``
    of ``calls``, the calls taken in turn for ``rounds`` rounds (so that a
    drift of the host's or the GPU's speed favours none of them), the
    medians over the rounds."""
    runs = {name: [] for name in calls}
    for _ in range(rounds):
        for name, (fn, sync) in calls.items():
            runs[name].append(timed(fn, sync, **kw))
    return {name: tuple(statistics.median(x) for x in zip(*r)) for name, r in runs.items()}


NOT_KERNELS = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}


def device_ops(compiled_hlo: str) -> dict:
    """``{opcode: count}`` of the optimized HLO's ENTRY computation, less the
    instructions that launch nothing (parameters, constants, tuples,
    bitcasts): the Triton custom calls, and any fusion or copy XLA adds
    around them (an extra kernel per call that torch's launch does not run)."""
    entry = compiled_hlo[compiled_hlo.index("\nENTRY "):]
    entry = entry[:entry.index("\n}")]
    ops = {}
    for line in entry.splitlines()[1:]:
        m = re.search(r"= .*? ([a-z][a-z0-9-]*)\(", line)
        if m and m.group(1) not in NOT_KERNELS:
            ops[m.group(1)] = ops.get(m.group(1), 0) + 1
    return ops


def wall_median(fn, sync, **kw):
    """Median ms per call (:func:`timed`'s wall time)."""
    return timed(fn, sync, long=0, **kw)[0]


def jax_dispatch_ms():
    """Host ms per call of a jitted one-op function on 8 floats: JAX's own
    dispatch cost on this host, the base under the enqueue columns."""
    f = jax.jit(lambda x: x + 1)
    x = jnp.ones(8)
    out = [x]
    return timed(lambda: out.__setitem__(0, f(x)), lambda: jax.block_until_ready(out[0]),
                 n_inner=200, long=0)[1]


def make_inputs(B, T, Hg, H, K, V, seed=0):
    key = jax.random.split(jax.random.key(seed), 4)
    k = jax.random.normal(key[0], (B, T, Hg, K), jnp.float32)
    k = (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(jnp.bfloat16)
    v = jax.random.normal(key[1], (B, T, H, V), jnp.bfloat16)
    beta = jax.nn.sigmoid(jax.random.normal(key[2], (B, T, H), jnp.float32))
    a = -0.3 * jax.random.uniform(key[3], (B, T, H), jnp.float32)
    # chunk-local cumsum (64-chunks from each row start; fine for timing)
    pad = (-T) % 64
    g = jnp.cumsum(jnp.pad(a, ((0, 0), (0, pad), (0, 0))).reshape(B, -1, 64, H), axis=2)
    g = g.reshape(B, -1, H)[:, :T]
    return k, v, g, beta


def floor_bytes(B, T, Hg, H, K, V):
    bf16, f32 = 2, 4
    reads = B * T * (Hg * K * bf16 + H * V * bf16 + H * f32 + H * f32)
    writes = B * T * (H * K * bf16 + H * V * bf16 + H * 64 * bf16)
    return reads + writes


def copy_bandwidth():
    import torch

    x = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    ms = wall_median(lambda: y.copy_(x), torch.cuda.synchronize, n_inner=10)
    return 2 * x.numel() * 2 / (ms * 1e-3)  # bytes read + written per second


def torch_inputs(jax_arrays):
    import torch

    return [None if a is None else torch.from_dlpack(a) for a in jax_arrays]


def _replace(*pairs):
    """A source change: each ``(old, new)`` replaced once, in order (``old`` must be there)."""
    def change(src: str) -> str:
        for old, new in pairs:
            assert old in src, old
            src = src.replace(old, new, 1)
        return src
    return change


def _insert_before(src: str, function: str, helpers: str) -> str:
    """``src`` with the ``@triton.jit`` functions ``helpers`` pasted in front of
    the jitted ``function``."""
    i = src.index(f"@triton.jit\ndef {function}(")
    return src[:i] + helpers.lstrip() + "\n" + src[i:]


def _diagonal_blocks(call: str):
    """A change of kkt_solve.py: its four forward-substitution loops replaced
    by ``call`` (a helper of ``kernels/unit_lower.py``)."""
    def change(src: str) -> str:
        start = src.index("    b_Ai00 = -b_A00\n")
        end = src.index("    b_Ai33 += m_I\n") + len("    b_Ai33 += m_I\n")
        name = call.split("(")[0].split()[-1]
        src = src[:start] + call + src[end:]
        return src.replace("from .safe_exp import safe_exp",
                           f"from .safe_exp import safe_exp\nfrom .unit_lower import {name}")
    return change


_NEUMANN = "".join(f"    b_Ai{i}{i} = unit_lower_inverse(b_A{i}{i}, BC)\n" for i in range(4))
_INTERLEAVED = ("    b_Ai00, b_Ai11, b_Ai22, b_Ai33 = unit_lower_inverses(b_A00, b_A11, b_A22, b_A33, BC)\n")
# fused_intra.py's diagonal blocks, inverted by recursive halving
_HALVING = "".join(f"    b_Ai{i}{i} = unit_lower_inverse_by_halving(b_A{i}{i}, BC, DOT_PRECISION)\n"
                   for i in range(4))


def _diagonal_by(call, helper):
    """A change of fused_intra.py: the diagonal blocks (``L``, strictly lower)
    inverted by ``call`` (``helper`` of ``kernels/unit_lower.py``)."""
    return _replace((_HALVING, call), ("from .unit_lower import block_dot, unit_lower_inverse_by_halving",
                                       f"from .unit_lower import block_dot, {helper}"))


# the one-kernel path (and the split's A kernel) with the product-of-powers diagonal
_FUSED_NEUMANN = _diagonal_by(_NEUMANN, "unit_lower_inverse")
# ... with the row-reading forward substitution (unit_lower_inverses)
_FUSED_ROWS = _diagonal_by(_INTERLEAVED, "unit_lower_inverses")
# ... with the forward substitution on L^T (no layout conversion in its loop)
_FUSED_SUBSTITUTION = _diagonal_by(
    "    b_Ai00, b_Ai11, b_Ai22, b_Ai33 = unit_lower_inverses_from_transposes(\n"
    "        tl.trans(b_A00), tl.trans(b_A11), tl.trans(b_A22), tl.trans(b_A33), BC)\n",
    "unit_lower_inverses_from_transposes")


def _merge_left_out(src: str) -> str:
    """fused_intra.py with the six blocks below the diagonal stored as ``L``'s
    (no block merge): an ablation, for timing only."""
    start = src.index("    b_Ai10 = -block_dot(")
    end = src.index("    b_0 = tl.zeros([BC, BC], dtype=tl.float32)\n    store_row_block")
    return src[:start] + "".join(f"    b_Ai{i}{j} = b_A{i}{j}\n" for i, j in
                                 ["10", "21", "32", "20", "31", "30"]) + src[end:]


def _max_registers(n):
    """The split's A kernel's configs capped at ``n`` registers per thread
    (ptxas ``-maxrregcount``; jax-triton 0.4 passes it as ``backend_options``,
    0.3 cannot)."""
    config = 'triton.Config({"BK": BK}, num_warps=num_warps'  # fused_intra.A_CONFIGS
    return _replace((f"{config}) for BK", f"{config}, maxnreg={n}) for BK"))


# unit_lower.halving_step's two dots
_HALVING_DOTS = ("                    block_dot(b_Y, b_N, P), 0.0)\n"
                 "    return b_Y - block_dot(b_YC, b_Y, P)\n")
# unit_lower.block_dot's permutes of the inner index
_BLOCK_DOT_PERMUTES = (
    "    a = tl.reshape(tl.permute(tl.reshape(a, [16, 2, 4, 2]), (0, 1, 3, 2)), [16, 16])\n"
    "    b = tl.reshape(tl.permute(tl.reshape(b, [2, 4, 2, 16]), (0, 2, 1, 3)), [16, 16])\n")


# tiles.store_w_u's two products (the w/u kernel's, and the one kernel's tail)
_WU_PRODUCTS = (
    "    store_A_times(b_A, v, u, b_beta, T, V, H * V, H * V, i_tc0, BT, BV, DOT_PRECISION)\n"
    "    store_A_times(b_A, k, w, b_kscale, T, K, Hg * K, H * K, i_tc0, BT, BK, DOT_PRECISION)\n")

# fused_intra.gate's exp2 of base-2 g as the exp of g (tl.exp: a scaled ex2 and a subnormal guard)
_GATE_EXP = _replace(
    ("from .safe_exp import LOG2E, safe_exp2\n", "from .safe_exp import safe_exp\n"),
    ("        b_A *= safe_exp2(g_r[:, None] - g_c[None, :])\n",
     "        b_A *= safe_exp(g_r[:, None] - g_c[None, :])\n"),
    *[(f"        b_g{i} = load_rows(g, T, H, i_tc{i}, BC) * LOG2E\n",
       f"        b_g{i} = load_rows(g, T, H, i_tc{i}, BC)\n") for i in range(4)])

# halving_step's mask on N (C = the masked N) instead of on the product Y N
_MASK_BEFORE = _replace((
    "    b_YC = tl.where(((r // (2 * S)) == (c // (2 * S))) & ((r // S) != (c // S)),\n"
    "                    block_dot(b_Y, b_N, P), 0.0)\n",
    "    b_C = tl.where(((r // (2 * S)) == (c // (2 * S))) & ((r // S) != (c // S)), b_N, 0.0)\n"
    "    b_YC = block_dot(b_Y, b_C, P)\n"))

# fused_intra.chunk_gates' eight 16-row loads of beta and g (tiles.load_rows,
# each loaded in the layout of the gate products that use it)
_GATE_LOADS = (
    "    i_tc1 = i_tc0 + BC\n    i_tc2 = i_tc0 + 2 * BC\n    i_tc3 = i_tc0 + 3 * BC\n"
    + "".join(f"    b_b{i} = load_rows(beta, T, H, i_tc{i}, BC)\n" for i in range(4))
    + "    if USE_G:\n"
    + "".join(f"        b_g{i} = load_rows(g, T, H, i_tc{i}, BC) * LOG2E\n" for i in range(4))
    + "    else:\n        b_g0 = tl.zeros([BC], dtype=tl.float32)\n")
_GATE_VECTORS = """
@triton.jit
def load_vec(ptr, T, stride, r0, BC: tl.constexpr):
    o = r0 + tl.arange(0, 4 * BC)
    return tl.load(ptr + o.to(tl.int64) * stride, mask=o < T, other=0.0).to(tl.float32)


@triton.jit
def quarters(x, BC: tl.constexpr):
    x = tl.permute(tl.reshape(x, [2, 2, BC]), (2, 0, 1))
    x0, x1 = tl.split(x)
    q0, q2 = tl.split(x0)
    q1, q3 = tl.split(x1)
    return q0, q1, q2, q3

"""


def _gate_vectors(late: bool):
    """A change of fused_intra.py: ``beta`` and ``g`` each loaded as one
    64-row vector (two values per thread, ``load_vec``) and cut into the four
    16-row pieces by reshape / split (``quarters``), instead of eight 16-row
    loads (``tiles.load_rows``; measured when those were block-pointer loads,
    sm_90a, split's ``A`` kernel: 2392 instructions and 226 registers against
    2664 and 220). ``late``: the vectors loaded before the ``k k^T`` loop but
    cut after it (2440 instructions, 222 registers)."""
    def change(src: str) -> str:
        if late:  # chunk_gates returns the two whole vectors, cut in store_chunk_A
            loads = ("    b_b0 = load_vec(beta, T, H, i_tc0, BC)\n"
                     "    if USE_G:\n"
                     "        b_g0 = load_vec(g, T, H, i_tc0, BC) * LOG2E\n"
                     "    else:\n        b_g0 = tl.zeros([4 * BC], dtype=tl.float32)\n")
            call = ("    store_inverse(b_A00, b_A10, b_A11, b_A20, b_A21, b_A22, b_A30, b_A31, b_A32, b_A33,\n")
            src = _replace((_GATE_LOADS, loads),
                           ("    return b_b0, b_b1, b_b2, b_b3, b_g0, b_g1, b_g2, b_g3\n",
                            "    return b_b0, b_b0, b_b0, b_b0, b_g0, b_g0, b_g0, b_g0\n"),
                           (call, "    b_b0, b_b1, b_b2, b_b3 = quarters(b_b0, BC)\n"
                                  "    b_g0, b_g1, b_g2, b_g3 = quarters(b_g0, BC)\n" + call))(src)
        else:
            loads = ("    b_b0, b_b1, b_b2, b_b3 = quarters(load_vec(beta, T, H, i_tc0, BC), BC)\n"
                     "    if USE_G:\n"
                     "        b_g0, b_g1, b_g2, b_g3 = quarters(\n"
                     "            load_vec(g, T, H, i_tc0, BC) * LOG2E, BC)\n"
                     "    else:\n        b_g0 = tl.zeros([BC], dtype=tl.float32)\n")
            src = _replace((_GATE_LOADS, loads))(src)
        return _insert_before(src, "chunk_gates", _GATE_VECTORS)
    return change


_GATES_ONE_LOAD = _gate_vectors(late=False)
_GATES_SPLIT_LATE = _gate_vectors(late=True)


VARIANTS = {  # name: (change of the source of the stage's kernels/ file, stage: STAGES)
    # the seed's forward-substitution loop bound, which the interpreter cannot run
    "seed_loop_bound": (_replace(*[("for i in range(2, BC):", f"for i in range(2, min(BC, T - i_tc{i})):")
                                   for i in range(4)]), "seed"),
    # the seed's int32 sequence offsets (wrong past 2^31 elements)
    "int32_offsets": (_replace(*[(".to(tl.int64)", ".to(tl.int32)")] * 2,
                               *[("i_b.to(tl.int64) * T", "i_b * T")] * 2), "seed"),
    # the diagonal blocks inverted as in the one-kernel path
    "seed_neumann": (_diagonal_blocks(_NEUMANN), "seed"),
    # the four substitution loops as one (four independent chains per step)
    "seed_interleaved": (_diagonal_blocks(_INTERLEAVED), "seed"),
    "fused_neumann": (_FUSED_NEUMANN, "fused"),
    "split_neumann": (_FUSED_NEUMANN, "split"),
    "split_substitution": (_FUSED_SUBSTITUTION, "split"),
    # the halving's dots with fp16 operands: 0.409 against 0.425 ms with tf32
    # (H200, headline, torch do_bench), but timing only: fp16 overflows where |N| is large (past
    # about 2.3 with 8x8 blocks), and a guard that branches per program made
    # ptxas wrap every shuffle in the branch in warp-synchronisation code
    # (2.8x the instructions)
    "split_halving_fp16": (_replace((
        _HALVING_DOTS,
        "                    tl.dot(b_Y.to(tl.float16), b_N.to(tl.float16)), 0.0)\n"
        "    return b_Y - tl.dot(b_YC.to(tl.float16), b_Y.to(tl.float16))\n")), "split_unit_lower"),
    "fused_rows": (_FUSED_ROWS, "fused"),
    "split_rows": (_FUSED_ROWS, "split"),
    # block_dot as a plain tl.dot: 0.429 against 0.412 ms (split), 0.544
    # against 0.502 (one kernel), H200, headline, torch do_bench
    "split_plain_dots": (_replace((_BLOCK_DOT_PERMUTES, "")), "split_unit_lower"),
    "fused_plain_dots": (_replace((_BLOCK_DOT_PERMUTES, "")), "fused_unit_lower"),
    # the gate factor as safe_exp of g: 0.409 against 0.399 ms (split), 0.497
    # against 0.465 (one kernel), H200, headline, torch do_bench
    "split_gate_exp": (_GATE_EXP, "split"),
    "fused_gate_exp": (_GATE_EXP, "fused"),
    # halving_step's mask on N instead of on the product Y N
    "split_mask_before": (_MASK_BEFORE, "split_unit_lower"),
    "fused_mask_before": (_MASK_BEFORE, "fused_unit_lower"),
    "split_gates_one_load": (_GATES_ONE_LOAD, "split"),
    "fused_gates_one_load": (_GATES_ONE_LOAD, "fused"),
    "split_gates_split_late": (_GATES_SPLIT_LATE, "split"),
    "fused_gates_split_late": (_GATES_SPLIT_LATE, "fused"),
    "split_maxnreg128": (_max_registers(128), "split"),
    "split_maxnreg168": (_max_registers(168), "split"),
    # ablations (wrong results; timing only): the split path with one stage of
    # its A kernel left out, to place the time inside the kernel
    "ablate_A_kernel": (_replace(("if i_t * BT >= T:\n        return\n    store_chunk_A(",
                                  "if i_t * BT >= 0:\n        return\n    store_chunk_A(")), "split"),
    "ablate_solve": (_replace((_HALVING, "".join(f"    b_Ai{i}{i} = b_A{i}{i}\n" for i in range(4)))),
                     "split"),
    "ablate_merge": (_merge_left_out, "split"),
    "ablate_k_blocks": (_replace(("for i_k in range(tl.cdiv(K, BK)):", "for i_k in range(1):")), "split"),
    # the split path's w/u kernel (tiles.store_w_u) with column tiles half as
    # wide (64 at K = V = 128)
    "wu_narrow": (_replace((_WU_PRODUCTS, _WU_PRODUCTS.replace("BV, DOT", "BV // 2, DOT")
                            .replace("BK, DOT", "BK // 2, DOT"))), "split_wu"),
}
STAGES = {  # stage: (torch path, kernels/ file, kernel, fwd_intra_torch argument that
    # replaces it, a helper kernels/ file pasted in first so that the change reaches it too)
    "seed": ("seed", "kkt_solve", "chunk_gated_delta_rule_fwd_kkt_solve_kernel", "A_kernel", None),
    "fused": ("fused", "fused_intra", "gdn_fwd_intra_fused_kernel", "A_kernel", None),
    "split": ("split", "fused_intra", "gdn_fwd_intra_A_kernel", "A_kernel", None),
    "split_wu": ("split", "recompute_w_u", "recompute_w_u_fwd_kernel", "wu_kernel", "tiles"),
    "split_unit_lower": ("split", "fused_intra", "gdn_fwd_intra_A_kernel", "A_kernel", "unit_lower"),
    "fused_unit_lower": ("fused", "fused_intra", "gdn_fwd_intra_fused_kernel", "A_kernel", "unit_lower"),
}


def kernel_variant(name):
    """``(path, {argument: kernel})``: the torch path to time and the kernel
    that replaces one of its stages (``fwd_intra_torch``'s ``A_kernel`` or
    ``wu_kernel``), built from its kernels/ file with one change (VARIANTS)
    as a fresh module. Where the stage names a helper file (``tiles.py``),
    that file is pasted into the kernel's file in place of its import first,
    and the change applies to both."""
    import gdn_jax.kernels

    change, stage = VARIANTS[name]
    path, file, kernel, argument, helpers = STAGES[stage]
    kernels = pathlib.Path(gdn_jax.kernels.__file__).parent
    src = (kernels / f"{file}.py").read_text()
    if helpers is not None:
        src = re.sub(rf"^from \.{helpers} import .*$", lambda _: (kernels / f"{helpers}.py").read_text(),
                     src, count=1, flags=re.M)
    src = change(src)
    tmp = pathlib.Path(tempfile.mkdtemp()) / f"{file}_{name}.py"
    tmp.write_text(src)
    spec = importlib.util.spec_from_file_location(f"gdn_jax.kernels.{file}_{name}", tmp)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return path, {argument: getattr(mod, kernel)}


def bench_shape(name, B, T, Hg, H, K, V, lens, bw, with_torch, with_reference, variants,
                with_jax=True):
    k, v, g, beta = make_inputs(B, T, Hg, H, K, V)
    cu = None if lens is None else jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
    row = dict(shape=name, B=B, T=T, Hg=Hg, H=H, K=K, V=V, packed=lens is not None)

    def fwd(k, v, g, beta, cu, impl):
        return gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu, impl=impl)

    calls = {}  # row column prefix: (call, sync), timed in turn below

    def jax_call(col, impl):
        """``impl`` under ``jax.jit`` into ``calls[col]``, its optimized HLO's
        launches into ``row[col + "_device_ops"]``."""
        f = jax.jit(lambda *arrays: fwd(*arrays, impl))
        out = [None]

        def call():
            out[0] = f(k, v, g, beta, cu)

        calls[col] = (call, lambda: jax.block_until_ready(out[0]))
        row[f"{col}_device_ops"] = device_ops(f.lower(k, v, g, beta, cu).compile().as_text())

    def jax_gpu_time(impl):
        """ms per call with the host's dispatch amortized: one jitted call runs
        ``autotune.LAUNCHES_PER_CALL`` chained calls (``autotune.repeated``),
        the JAX counterpart of torch's ``do_bench``."""
        operands = [k, v, g, beta, cu]
        arrays = [i for i, x in enumerate(operands) if x is not None]
        run = autotune.repeated(lambda ops, impl: fwd(*ops, impl), operands, arrays, dict(impl=impl))
        args = [operands[i] for i in arrays]
        out = [None]
        return wall_median(lambda: out.__setitem__(0, run(*args)), lambda: jax.block_until_ready(out[0]),
                           n_inner=5) / autotune.LAUNCHES_PER_CALL

    from gdn_jax.gluon_launch import gluon_fits

    cols = {c: i for c, i in IMPLS.items() if i != "gluon" or gluon_fits(k, v, g, beta, cu)}
    if with_jax:
        chosen = set(autotune._CHOSEN)
        for col, impl in cols.items():
            jax_call(col, impl)
            try:
                row[f"{col}_gpu_ms"] = jax_gpu_time(impl)
            except Exception as e:  # noqa: BLE001 (recorded; the other columns go on)
                row[f"{col}_gpu_error"] = repr(e)[:500]
                print(f"{name} {col} GPU time: {e!r}"[:500], flush=True)
        row["jax_configs"] = {key[0]: cfg for key, cfg in autotune._CHOSEN.items() if key not in chosen}
    jax_picks = row.get("jax_configs", {})
    if with_reference:
        jax_call("jnp_reference", "reference")
    if with_torch:
        import torch
        import triton.testing

        from gdn_jax.kernels.fused_intra import gdn_fwd_intra_A_kernel, gdn_fwd_intra_fused_kernel
        from gdn_jax.kernels.kkt_solve import chunk_gated_delta_rule_fwd_kkt_solve_kernel as kkt_solve_kernel
        from gdn_jax.kernels.recompute_w_u import recompute_w_u_fwd_kernel
        from gdn_jax.torch_launch import fwd_intra_torch

        torch_triton_cache()

        tk, tv, tg, tb = torch_inputs((k, v, g, beta))
        tcu = None if cu is None else torch.from_dlpack(cu)
        ci = None if cu is None else torch.from_dlpack(gdn_jax.prepare_chunk_indices(cu))

        tune = autotune.autotune_enabled()  # GDN_JAX_AUTOTUNE=0 (--fixed-config): no autotuner on either side

        def tcall(**kw):
            return lambda: fwd_intra_torch(tk, tv, tg, tb, cu_seqlens=tcu, chunk_indices=ci,
                                           autotune=tune, **kw)

        def do_bench(**kw):
            return triton.testing.do_bench(tcall(**kw), warmup=50, rep=300, return_mode="median")

        for col in cols:  # the torch launcher's path names are the columns'
            calls[f"torch_{col}"] = (tcall(path=col), torch.cuda.synchronize)
            row[f"torch_{col}_do_bench_ms"] = do_bench(path=col)
            # the configs JAX's autotuner chose at this shape, launched from torch (every
            # shape of SHAPES has its own constexprs, so its own picks; a sweep
            # shape reuses the headline's and gets no such column)
            if tune and jax_picks:
                row[f"torch_{col}_jax_configs_do_bench_ms"] = do_bench(path=col, configs=jax_picks)
        if tune:
            row["torch_configs"] = {
                name: str(kernel.best_config) for name, kernel in [
                    ("kkt_solve", kkt_solve_kernel), ("recompute_w_u", recompute_w_u_fwd_kernel),
                    ("fused", gdn_fwd_intra_fused_kernel), ("A", gdn_fwd_intra_A_kernel)]}
        for name in variants:
            path, replaced = kernel_variant(name)
            row[f"torch_{name}_do_bench_ms"] = do_bench(path=path, **replaced)
            if tune:
                row[f"{name}_config"] = str(next(iter(replaced.values())).best_config)
        if variants:
            row["torch_seed_do_bench_again_ms"] = do_bench(path="seed")
    for col, times in timed_in_turn(calls).items():  # every path of both launchers, in turn
        row[f"{col}_ms"], row[f"{col}_enqueue_ms"], row[f"{col}_steady_ms"] = times
    row["floor_ms"] = floor_bytes(B, T, Hg, H, K, V) / bw * 1e3
    for col in cols:
        if f"torch_{col}_ms" in row and f"{col}_ms" in row:
            row[f"{col}_jax_over_torch"] = row[f"{col}_ms"] / row[f"torch_{col}_ms"]
            row[f"{col}_steady_jax_over_torch"] = row[f"{col}_steady_ms"] / row[f"torch_{col}_steady_ms"]
            if f"{col}_gpu_ms" in row:
                row[f"{col}_gpu_jax_over_torch"] = row[f"{col}_gpu_ms"] / row[f"torch_{col}_do_bench_ms"]
            if f"torch_{col}_jax_configs_do_bench_ms" in row and f"{col}_gpu_ms" in row:
                row[f"{col}_gpu_jax_over_torch_same_configs"] = (
                    row[f"{col}_gpu_ms"] / row[f"torch_{col}_jax_configs_do_bench_ms"])
    if with_jax:
        for col in [c for c in ("gluon", "split", "fused") if c in cols]:
            row[f"{col}_over_floor"] = row[f"{col}_steady_ms"] / row["floor_ms"]
            row[f"{col}_over_seed"] = row[f"{col}_steady_ms"] / row["seed_steady_ms"]
    return row


TABLE = [  # (column, header); ms per call in a stream of calls (timed's steady)
    ("shape", "shape"), ("gluon_steady_ms", "gluon"), ("split_steady_ms", "split"),
    ("fused_steady_ms", "one-kernel"), ("seed_steady_ms", "seed"), ("torch_gluon_steady_ms", "torch gluon"),
    ("torch_split_steady_ms", "torch split"),
    ("torch_fused_steady_ms", "torch 1k"), ("torch_seed_steady_ms", "torch seed"),
    ("jnp_reference_steady_ms", "jnp ref"), ("floor_ms", "floor"),
    ("gluon_steady_jax_over_torch", "gluon jax/torch"), ("split_steady_jax_over_torch", "split jax/torch"), ("fused_steady_jax_over_torch", "1k jax/torch"),
    ("seed_steady_jax_over_torch", "seed jax/torch"),
    ("gluon_over_floor", "gluon/floor"), ("gluon_over_seed", "gluon/seed"),
    ("split_over_floor", "split/floor"), ("split_over_seed", "split/seed"), ("fused_over_seed", "1k/seed"),
    ("gluon_gpu_ms", "gluon GPU"), ("split_gpu_ms", "split GPU"), ("fused_gpu_ms", "1k GPU"), ("seed_gpu_ms", "seed GPU"),
    ("gluon_gpu_jax_over_torch", "gluon GPU jax/torch"), ("split_gpu_jax_over_torch", "split GPU jax/torch"), ("fused_gpu_jax_over_torch", "1k GPU jax/torch"),
    ("seed_gpu_jax_over_torch", "seed GPU jax/torch"),
    ("split_gpu_jax_over_torch_same_configs", "split GPU jax/torch, JAX's configs"),
    ("fused_gpu_jax_over_torch_same_configs", "1k GPU jax/torch, JAX's configs"),
    ("seed_gpu_jax_over_torch_same_configs", "seed GPU jax/torch, JAX's configs"),
]


def print_table(rows, bw):
    """Markdown table of the rows (ms and ratios), the last thing printed."""
    print(f"\ncopy bandwidth {bw / 1e12:.2f} TB/s; {jax.devices()[0].device_kind}; jax {jax.__version__}")
    for r in rows:
        if "torch_seed_do_bench_again_ms" in r:
            print(f"{r['shape']} variants, torch do_bench median ms: seed as shipped "
                  f"{r['torch_seed_do_bench_ms']:.4f} (again {r['torch_seed_do_bench_again_ms']:.4f}); "
                  + "; ".join(f"{n} {r[f'torch_{n}_do_bench_ms']:.4f}" for n in VARIANTS
                              if f"torch_{n}_do_bench_ms" in r)
                  + f"; one-kernel {r['torch_fused_do_bench_ms']:.4f}; split "
                  f"{r['torch_split_do_bench_ms']:.4f}")
    print("\n".join(markdown_table(rows, TABLE)))


def markdown_table(rows, columns, digits=3):
    """The lines of a Markdown table of ``rows`` (dicts) in ``columns``
    (``(key, header)`` pairs): floats to ``digits`` places, "-" where a row has none."""
    def cell(r, c):
        return f"{r[c]:.{digits}f}" if isinstance(r.get(c), float) else str(r.get(c, "-"))
    return (["| " + " | ".join(h for _, h in columns) + " |", "|" + " --- |" * len(columns)]
            + ["| " + " | ".join(cell(r, c) for c, _ in columns) + " |" for r in rows])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--shapes", default=",".join(n for n in SHAPES if not n.startswith("sweep_")))
    p.add_argument("--sweep", action="store_true", help=f"also time T in {SWEEP_T} and draw a PNG")
    p.add_argument("--no-reference", action="store_true")
    p.add_argument("--fixed-config", action="store_true",
                   help="one fixed config per kernel on both launchers (GDN_JAX_AUTOTUNE=0): "
                        "launch cost alone, without the two autotuners' choices")
    p.add_argument("--torch-only", action="store_true",
                   help="time the torch launches only (quick kernel comparisons)")
    p.add_argument("--variants", nargs="?", const=",".join(VARIANTS), default="",
                   help="also time these kernel variants (default all of VARIANTS: one change "
                        "each) at the headline shape")
    p.add_argument("--replot", metavar="JSON",
                   help="only redraw the charts from a saved run's JSON (no GPU needed), into --out")
    args = p.parse_args()
    if args.replot:
        rows = json.loads(pathlib.Path(args.replot).read_text())["rows"]
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        plot_sweep(rows, out / "bench_fwd_intra.png")
        plot_shapes(rows, out / "bench_fwd_intra_shapes.png")
        return
    if args.fixed_config:
        os.environ["GDN_JAX_AUTOTUNE"] = "0"
    with_torch = importlib.util.find_spec("torch") is not None
    bw = copy_bandwidth() if with_torch else 4.19e12
    versions = dict(jax=jax.__version__, device=jax.devices()[0].device_kind,
                    jax_trivial_dispatch_ms=jax_dispatch_ms())
    try:
        import jax_triton
        import triton

        versions.update(jax_triton=jax_triton.__version__, triton=triton.__version__)
    except ImportError:
        pass
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    names = args.shapes.split(",") + ([f"sweep_T{T}" for T in SWEEP_T] if args.sweep else [])
    for name in names:
        rows.append(bench_shape(name, *SHAPES[name], bw, with_torch,
                                not (args.no_reference or args.torch_only),
                                [v for v in args.variants.split(",") if v] if name == "headline" else [],
                                not args.torch_only))
        print(json.dumps(rows[-1]), flush=True)
        # after every shape, so that a run cut by a time limit keeps its rows
        (out / "bench_fwd_intra.json").write_text(
            json.dumps(dict(versions=versions, copy_bw=bw, rows=rows), indent=1))
    plot_sweep(rows, out / "bench_fwd_intra.png")
    plot_shapes(rows, out / "bench_fwd_intra_shapes.png")
    print(versions)
    print_table(rows, bw)


if __name__ == "__main__":
    main()
