"""Probe (issue 4): the split path's two kernels overlapped on two streams.

The split path's ``A`` kernel is latency-bound (1 warp, ~0.17 ms at the
headline) and its w/u kernel bandwidth-bound (8 warps, ~0.29 ms); one after
the other they take ~0.46 ms. Cut the chunks into ``S`` slabs and run the
``A`` kernel of slab ``i + 1`` on a second stream while the w/u kernel of
slab ``i`` runs: the GPU's block scheduler co-schedules both kernels' programs
on the SMs, each at its own warp count (what one launch could not do, session 8).

Both launchers, the headline shape (and packed), fixed configs (torch's
autotuner's picks of the split path):

- torch: ``A`` kernels on a side stream (optionally high priority), w/u on
  another, joined by events; every slab writes into one set of outputs
  (the upper bound of the gain). Timed with CUDA graphs (GPU time only).
- JAX: ``jax.experimental.compute_on("gpu_stream:1")`` around each slab's
  ``A`` launch; each ``A`` launch has its own output buffer (in-place slabs of
  one buffer would make XLA order or copy them); the w/u launches write
  their slabs into one ``w``, ``u`` through ``input_output_aliases``, and
  optionally copy ``A`` into one aliased output too (``store_A``).

    python benchmarks/stream_overlap.py [--shapes headline,packed32k] [--out DIR]
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
import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_fwd_intra import SHAPES, make_inputs, timed  # noqa: E402

import gdn_jax  # noqa: E402
from gdn_jax.autotune import config_kwargs  # noqa: E402
from gdn_jax.chunk_indices import prepare_chunk_indices  # noqa: E402
from gdn_jax.kernels.fused_intra import gdn_fwd_intra_A_kernel  # noqa: E402
from gdn_jax.kernels.recompute_w_u import recompute_w_u_fwd_kernel  # noqa: E402
from gdn_jax.kernels.tiles import program_chunk, store_w_u, tile_ptr  # noqa: E402
from gdn_jax.torch_launch import fwd_intra_torch  # noqa: E402
from gdn_jax.triton_launch import BC, _out_keyword, triton_call, wu_blocks  # noqa: E402


@triton.jit(do_not_specialize=["T"])
def wu_slab(k, v, beta, g, A, cu_seqlens, chunk_indices, T, w, u, A_out,
            H: tl.constexpr, Hg: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
            BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr,
            IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr, STORE_A: tl.constexpr):
    """recompute_w_u, and with ``STORE_A`` the chunk's ``A`` tile copied to ``A_out``."""
    i_t, i_h, bos, T = program_chunk(cu_seqlens, chunk_indices, T, H, IS_VARLEN)
    if i_t * BT >= T:
        return
    store_w_u(A, k, v, g, beta, w, u, bos, i_h, T, i_t * BT, H, Hg, K, V, BT, BK, BV, USE_G,
              DOT_PRECISION)
    if STORE_A:
        off = (bos * H + i_h) * BT
        b = tl.load(tile_ptr(A + off, T, BT, H * BT, i_t * BT, 0, BT, BT), boundary_check=(0, 1))
        tl.store(tile_ptr(A_out + off, T, BT, H * BT, i_t * BT, 0, BT, BT), b, boundary_check=(0, 1))


@triton.jit(do_not_specialize=["T"])
def wu_slab_aliased(k, v, beta, g, A, cu_seqlens, chunk_indices, T, w_in, u_in, A_in, w, u, A_out,
                    H: tl.constexpr, Hg: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr,
                    IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr, STORE_A: tl.constexpr):
    """:func:`wu_slab` as jax-triton 0.3 launches it with aliased outputs: the
    aliased inputs' pointers come too, before the outputs (0.4 passes them once)."""
    wu_slab(k, v, beta, g, A, cu_seqlens, chunk_indices, T, w, u, A_out, H, Hg, K, V, BT, BK, BV,
            USE_G, IS_VARLEN, DOT_PRECISION, STORE_A)


def slabs_of(ci: np.ndarray, S: int):
    return [s for s in np.array_split(ci, S) if len(s)]


def torch_variants(k, v, g, beta, cu, ci, H, Hg, K, V, cfgA, cfgW, S_list):
    """``{name: fn}`` of torch launches writing the same outputs; and the outputs."""
    import torch

    rows = k.shape[1]
    A = torch.empty(1, rows, H, 64, device="cuda", dtype=k.dtype)
    w = torch.empty(1, rows, H, K, device="cuda", dtype=k.dtype)
    u = torch.empty(1, rows, H, V, device="cuda", dtype=v.dtype)
    common = dict(g=g, beta=beta, cu_seqlens=cu, T=rows, H=H, Hg=Hg, K=K, BT=64, USE_G=True,
                  IS_VARLEN=True, DOT_PRECISION="tf32")

    def launch_A(c):
        gdn_fwd_intra_A_kernel.fn[(len(c) * H, 1)](k=k, A=A, BC=BC, chunk_indices=c, **common, **cfgA)

    def launch_wu(c):
        recompute_w_u_fwd_kernel.fn[(len(c) * H, 1)](k=k, v=v, A=A, w=w, u=u, V=V, chunk_indices=c,
                                                      **wu_blocks(K, V), **common, **cfgW)

    whole = torch.from_numpy(ci).cuda()

    def serial():
        launch_A(whole)
        launch_wu(whole)

    fns = {"torch S=1 serial": serial}
    for S in S_list:
        parts = [torch.from_numpy(s).cuda() for s in slabs_of(ci, S)]
        for prio in (0, -1):
            sA, sW = torch.cuda.Stream(priority=prio), torch.cuda.Stream()
            events = [torch.cuda.Event() for _ in parts]

            def run(parts=parts, sA=sA, sW=sW, events=events):
                main = torch.cuda.current_stream()
                sA.wait_stream(main)
                sW.wait_stream(main)
                with torch.cuda.stream(sA):
                    for c, e in zip(parts, events):
                        launch_A(c)
                        e.record(sA)
                with torch.cuda.stream(sW):
                    for c, e in zip(parts, events):
                        sW.wait_event(e)
                        launch_wu(c)
                main.wait_stream(sA)
                main.wait_stream(sW)
            fns[f"torch S={S} {'high-prio A' if prio else 'same prio'}"] = run
    return fns, (w, u, A)


def on_stream(n: int, f):
    """``f`` run on XLA's GPU stream ``n``: ``compute_on(f, compute_type=...)``
    in JAX 0.11, the context manager ``compute_on(...)`` as a decorator before."""
    from jax.experimental import compute_on as co

    if hasattr(jax, "memory") and not hasattr(co, "compute_on2"):
        return co.compute_on(f, compute_type=f"gpu_stream:{n}",
                             out_memory_spaces=jax.memory.Space.Device)
    return co.compute_on(f"gpu_stream:{n}")(f)


def jax_variant(H, Hg, K, V, cfgA, cfgW, ci, S, store_A, stream_wu):
    """A jitted ``(k, v, g, beta, cu) -> (w, u[, A])`` on the varlen form."""
    parts = slabs_of(ci, S)

    def A_launch(k, g, beta, cu, c):
        A_type = jax.ShapeDtypeStruct((1, k.shape[1], H, 64), k.dtype)
        return triton_call(k, g, beta, cu, c, k.shape[1], kernel=gdn_fwd_intra_A_kernel.fn,
                           out=A_type, grid=(c.shape[0] * H, 1), H=H, Hg=Hg, K=K, BT=64, BC=BC,
                           USE_G=True, IS_VARLEN=True, DOT_PRECISION="tf32", **cfgA)

    def wu_launch(k, v, beta, g, A, cu, c, prev):
        rows = k.shape[1]
        types = (jax.ShapeDtypeStruct((1, rows, H, K), k.dtype),
                 jax.ShapeDtypeStruct((1, rows, H, V), v.dtype),
                 jax.ShapeDtypeStruct((1, rows, H, 64) if store_A else (1,), k.dtype))
        kernel, ins, aliases = wu_slab, (), {}
        if prev is not None:  # write into the previous slab's outputs
            ins = prev[:3] if store_A else prev[:2]
            # jax-triton 0.3 counts array operands only (T not), 0.4 every argument
            aliases = {8 + i: i for i in range(len(ins))}
            if _out_keyword() == "out_shape":  # 0.3 also passes the aliased inputs
                kernel = wu_slab_aliased  # before all outputs: pad to three inputs
                ins = ins if store_A else (*ins, jnp.zeros((1,), k.dtype))
                aliases = {7 + i: i for i in range(len(prev[:3] if store_A else prev[:2]))}
        return triton_call(k, v, beta, g, A, cu, c, rows, *ins, kernel=kernel, out=types,
                           grid=(c.shape[0] * H, 1), input_output_aliases=aliases, H=H, Hg=Hg,
                           K=K, V=V, BT=64, **wu_blocks(K, V), USE_G=True, IS_VARLEN=True,
                           DOT_PRECISION="tf32", STORE_A=store_A, **cfgW)

    a_fn = on_stream(1, jax.jit(A_launch))
    w_fn = on_stream(2, jax.jit(wu_launch)) if stream_wu else wu_launch

    @jax.jit
    def fwd(k, v, g, beta, cu):
        cs = [jnp.asarray(p) for p in parts]
        As = [a_fn(k, g, beta, cu, c) for c in cs]
        prev = None
        for A_i, c in zip(As, cs):
            prev = w_fn(k, v, beta, g, A_i, cu, c, prev)
        return prev if store_A else prev[:2]
    return fwd


def run_shape(name, S_list, results):
    import torch
    from triton.testing import do_bench_cudagraph

    B, T, Hg, H, K, V, lens = SHAPES[name]
    k, v, g, beta = make_inputs(B, T, Hg, H, K, V)
    rows = B * T
    if lens is None:
        cu_np = np.arange(0, rows + 1, T, dtype=np.int32)
    else:
        cu_np = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    k, v, g, beta = (x.reshape(1, rows, *x.shape[2:]) for x in (k, v, g, beta))
    cu = jnp.asarray(cu_np)
    ci = np.asarray(prepare_chunk_indices(cu_np, 64))
    tk, tv, tg, tbeta, tcu = (torch.from_dlpack(x) for x in (k, v, g, beta, cu))

    # configs: torch's autotuner's picks for the split path at this shape
    fwd_intra_torch(tk, tv, tg, tbeta, tcu, path="split")
    cfgA = config_kwargs(gdn_fwd_intra_A_kernel.best_config)
    cfgW = config_kwargs(recompute_w_u_fwd_kernel.best_config)
    print(name, "configs", cfgA, cfgW, flush=True)
    row = {"shape": name, "cfgA": cfgA, "cfgW": cfgW}

    fns, (tw, tu, tA) = torch_variants(tk, tv, tg, tbeta, tcu, ci, H, Hg, K, V, cfgA, cfgW, S_list)
    ref = None
    for label, fn in fns.items():
        fn()
        torch.cuda.synchronize()
        outs = [x.float().clone() for x in (tw, tu, tA)]
        if ref is None:
            ref = outs
        diff = max((a - b).abs().max().item() for a, b in zip(outs, ref))
        ms = do_bench_cudagraph(fn, rep=200)
        row[label] = {"cudagraph_ms": ms, "max_diff_vs_serial": diff}
        print(f"  {label:32s} {ms:.4f} ms (CUDA graph)  diff {diff:g}", flush=True)

    # JAX: the shipped split for reference, then the stream variants
    split = jax.jit(lambda k, v, g, beta, cu: gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu,
                                                                 impl="split"))
    calls = {"jax split (shipped)": split}
    for S in S_list:
        for store_A in (False, True):
            for stream_wu in (False, True):
                label = f"jax S={S}{' +A' if store_A else ''}{' wu@2' if stream_wu else ''}"
                calls[label] = jax_variant(H, Hg, K, V, cfgA, cfgW, ci, S, store_A, stream_wu)
    for label, f in calls.items():
        try:
            out = f(k, v, g, beta, cu)
            jax.block_until_ready(out)
            hlo = f.lower(k, v, g, beta, cu).compile().as_text()
            diff = max((torch.from_dlpack(a).float() - r).abs().max().item()
                       for a, r in zip(out, ref))
            box = [out]
            wall, enq, steady = timed(lambda: box.__setitem__(0, f(k, v, g, beta, cu)),
                                      lambda: jax.block_until_ready(box[0]))
            row[label] = {"steady_ms": steady, "wall_ms": wall, "enqueue_ms": enq,
                          "max_diff_vs_torch_serial": diff,
                          "call_starts": hlo.count("call-start"), "copies": hlo.count(" copy(")
                          + hlo.count(" copy-start(")}
            print(f"  {label:32s} steady {steady:.4f} wall {wall:.4f} enq {enq:.4f} ms  "
                  f"diff {diff:g}  call-starts {row[label]['call_starts']} copies {row[label]['copies']}",
                  flush=True)
            if label.startswith("jax S=4") and "+A" not in label and "wu@2" not in label:
                pathlib.Path(OUT, f"hlo_{name}_S4.txt").write_text(hlo)
        except Exception as e:  # a probe: report and go on
            row[label] = {"error": f"{type(e).__name__}: {e}"[:2000]}
            print(f"  {label:32s} FAILED {type(e).__name__}: {str(e)[:600]}", flush=True)
    results.append(row)


OUT = "/tmp/out"


def main():
    global OUT
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="headline")
    p.add_argument("--slabs", default="2,4,8,16")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    a = p.parse_args()
    OUT = a.out
    pathlib.Path(OUT).mkdir(parents=True, exist_ok=True)
    results = []
    for name in a.shapes.split(","):
        run_shape(name, [int(s) for s in a.slabs.split(",")], results)
        pathlib.Path(OUT, "stream_overlap.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
