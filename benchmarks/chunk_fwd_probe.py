"""Probe of the chunk walk kernel (kernels/chunk_fwd.py) on the GPU: configs
(V block, row or transposed form, warps, stages) timed from torch
(triton.testing.do_bench) on the same inputs, each checked against the first
config's output; ``--forms wu,A``: the walk on ``fwd_intra``'s ``w, u``, and
the walk forming ``v'`` from ``A``, ``v`` and ``beta`` (``FROM_A``), on the
split path's outputs; rows ``fwd_intra <path>`` time what each form needs
before it (``w, u, A`` by the Gluon kernel or the split path; ``A`` alone,
and ``chunk_qk``, the output's block, which the from-A walk reads, and the
experiment writing that block beside ``A`` in the A kernel).
``wu-state``, ``A-state``: the same walks without the output (``WRITE_O``
off: the state chain alone, what bounds a walk whose output is computed
elsewhere); ``A-save``: the walk from ``A`` writing the output and also the
chunk states and ``v'`` (``STORE_H``, ``STORE_V``: what a forward that keeps
them for the backward runs).

    python benchmarks/chunk_fwd_probe.py [--shapes headline,T32768] [--configs BV:T:warps:stages,...]
                                         [--forms wu,A] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib



SHAPES = {"headline": (8, 4096, 16, 32, 128), "T32768": (1, 32768, 16, 32, 128),
          "B4T8192": (4, 8192, 16, 32, 128), "K256": (2, 4096, 16, 16, 256),
          "B32T1024": (32, 1024, 16, 32, 128)}
CONFIGS = [(BV, int(BV >= 64), w, s) for BV in (16, 32, 64, 128) for w in (4, 8) for s in (1, 2)]


def main():
    import torch
    from triton.testing import do_bench

    from gdn_jax.chunk_launch import chunk_fwd_constexprs, chunk_fwd_grid
    from gdn_jax.kernels.chunk_fwd import gdn_chunk_fwd_kernel
    from gdn_jax.torch_launch import chunk_qk_torch, fwd_intra_A_qk_torch, fwd_intra_torch

    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="headline,T32768")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--configs", default="", help="BV:TRANSPOSED:warps:stages,... (default: CONFIGS)")
    p.add_argument("--forms", default="wu", help="wu (w, u in), A (A, v, beta in), wu-state, A-state "
                   "(without the output), A-save (A, storing the chunk states and v'), comma-separated")
    a = p.parse_args()
    configs = [tuple(map(int, c.split(":"))) for c in a.configs.split(",") if c] or CONFIGS
    rows = []
    for name in a.shapes.split(","):
        B, T, Hg, H, K = SHAPES[name]
        V = K
        g = torch.Generator(device="cuda").manual_seed(0)
        rn = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
        unit = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731
        q, k = unit(rn(B, T, Hg, K)).bfloat16(), unit(rn(B, T, Hg, K)).bfloat16()
        v = rn(B, T, H, V).bfloat16()
        beta = torch.sigmoid(rn(B, T, H))
        a_ = torch.nn.functional.logsigmoid(rn(B, T, H))
        gc = a_.view(B, T // 64, 64, H).cumsum(2).view(B, T, H).contiguous()
        w, u, A = fwd_intra_torch(k, v, gc, beta, autotune=False, path="split")
        h0 = 0.1 * rn(B, H, K, V)
        # what each form needs of fwd_intra: w, u (the Gluon kernel where it applies, the split path) or A alone
        forms = a.forms.split(",")
        intra_paths = ((["gluon"] if K == V == 128 else []) + ["split"]) * ("wu" in forms) + ["A"] * ("A" in forms)
        refs = {}  # per output: the first config's (o, final state)
        for path in intra_paths:
            ms = do_bench(lambda: fwd_intra_torch(k, v, gc, beta, autotune=False, path=path), warmup=25,
                          rep=100, return_mode="median")
            rows.append(dict(shape=name, kernel=f"fwd_intra {path}", BV=0, warps=0, stages=0, ms=ms,
                             rel_diff=0.0))
            print(json.dumps(rows[-1]), flush=True)
        Aqk = chunk_qk_torch(q, k, gc, autotune=False)  # the fixed config's block: the walk's input, the reference
        if "A" in forms:  # the walk from A's output block, its own kernel before the walk, at each warp count
            qk_ref = Aqk.float()
            for warps in (2, 4, 8):
                config = dict(num_warps=warps, num_stages=2)
                ms = do_bench(lambda: chunk_qk_torch(q, k, gc, config=config), warmup=25, rep=100,
                              return_mode="median")
                diff = (chunk_qk_torch(q, k, gc, config=config).float() - qk_ref).abs().max().item()
                rows.append(dict(shape=name, kernel="chunk_qk", BV=0, warps=warps, stages=2, ms=ms,
                                 rel_diff=diff / qk_ref.abs().max().item()))
                print(json.dumps(rows[-1]), flush=True)
            # the experiment: A and the block from one kernel, against "fwd_intra A" + chunk_qk above
            # (rel_diff: the larger of the two outputs' against the split's A and the fixed block)
            for BK, warps in ((32, 1), (64, 2), (32, 4), (64, 4)):
                config = dict(BK=BK, num_warps=warps)
                run = lambda: fwd_intra_A_qk_torch(q, k, gc, beta, config=config)  # noqa: E731
                ms = do_bench(run, warmup=25, rep=100, return_mode="median")
                diff = max(((x.float() - r.float()).abs().max() / r.float().abs().max()).item()
                           for x, r in zip(run(), (A, Aqk)))
                rows.append(dict(shape=name, kernel=f"A + chunk_qk, one kernel (BK={BK})", BV=0, warps=warps,
                                 stages=3, ms=ms, rel_diff=diff))
                print(json.dumps(rows[-1]), flush=True)
        dummy = torch.zeros(1, dtype=torch.int32, device="cuda")
        cx = chunk_fwd_constexprs(Hg, H, K, V, True, True, False, False, "tf32")
        kernel = gdn_chunk_fwd_kernel.fn
        for form, (BV, tr, warps, stages) in [(f, c) for f in forms for c in configs]:
            from_a, write_o, save = form.startswith("A"), not form.endswith("-state"), form.endswith("-save")
            kernel_name = ("transposed" if tr else "rows") + (", from A" if from_a else "") + \
                ("" if write_o else ", state only") + (", storing h and v'" if save else "")
            x, y, b, qk = (A, v, beta, Aqk) if from_a else (w, u, dummy, dummy)
            o = torch.empty(B, T, H, V, device="cuda", dtype=torch.bfloat16)
            ht = torch.empty(B, H, K, V, device="cuda")
            h = torch.empty(B * (T // 64), H, K, V, device="cuda", dtype=torch.bfloat16) if save else dummy
            v_new = torch.empty(B, T, H, V, device="cuda", dtype=torch.bfloat16) if save else dummy

            def run():
                kernel[chunk_fwd_grid(B, H, V, BV)](q, k, x, y, gc, b, qk, h0, dummy, dummy, K ** -0.5, T,
                                                    o, ht, h, v_new, **cx, BV=BV, TRANSPOSED=bool(tr),
                                                    FROM_A=from_a, WRITE_O=write_o, STORE_H=save, STORE_V=save,
                                                    num_warps=warps, num_stages=stages)
            try:
                run()
                torch.cuda.synchronize()
                ms = do_bench(run, warmup=25, rep=100, return_mode="median")
            except Exception as e:  # noqa: BLE001 (out of resources etc.: recorded)
                rows.append(dict(shape=name, kernel=kernel_name, BV=BV, warps=warps, stages=stages,
                                 error=repr(e)[:200]))
                print(json.dumps(rows[-1]), flush=True)
                continue
            ref = refs.setdefault(write_o, (o.float().clone(), ht.clone()))
            diff = float((ht - ref[1]).norm() / ref[1].norm())
            if write_o:
                diff = max(diff, float((o.float() - ref[0]).norm() / ref[0].norm()))
            rows.append(dict(shape=name, kernel=kernel_name, BV=BV, warps=warps, stages=stages, ms=ms,
                             rel_diff=diff))
            print(json.dumps(rows[-1]), flush=True)
    pathlib.Path(a.out, "chunk_fwd_probe.json").write_text(json.dumps(rows, indent=1))
    print("| shape | kernel | BV | warps | stages | ms | rel diff |\n| --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted((r for r in rows if "ms" in r), key=lambda r: (r["shape"], r["ms"])):
        print(f"| {r['shape']} | {r['kernel']} | {r['BV']} | {r['warps']} | {r['stages']} | {r['ms']:.4f} | "
              f"{r['rel_diff']:.1e} |")


if __name__ == "__main__":
    main()
