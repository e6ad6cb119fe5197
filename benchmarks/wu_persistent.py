"""Probe (GPU machine): the w/u stage as a persistent kernel whose loop over
(chunk, head) tasks Triton software-pipelines, against the shipped
``recompute_w_u_fwd_kernel`` (one program per task), fixed-length inputs.

    python3 benchmarks/wu_persistent.py [--shape headline]

The shipped kernel keeps at most one tile load in flight per program and
none while it multiplies and stores (ncu, session 12: 54% of its stall
samples wait on loads, DRAM at ~90% of the copy bandwidth). Here each
program walks tasks ``pid, pid + P, ...`` and the loop's loads are issued
``STAGES - 1`` tasks ahead. ``SCALE_A`` folds ``beta`` (and ``exp(g)``) into
``A``'s columns, so the ``v`` and ``k`` tiles go from memory to the dot as
loaded (what lets the pipeliner copy them asynchronously into shared memory).
Prints ms (torch ``do_bench``) per config and the largest difference to the
shipped kernel's outputs.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys

import triton
import triton.language as tl

from gdn_jax.kernels.tiles import at_head, load_rows, tile_ptr


@triton.jit(do_not_specialize=["T"])
def wu_persistent_kernel(k, v, beta, g, A, T, w, u, n_tasks, NTH,
                         H: tl.constexpr, Hg: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         BT: tl.constexpr, USE_G: tl.constexpr, SCALE_A: tl.constexpr,
                         STAGES: tl.constexpr, REVERSED: tl.constexpr):
    # K and V are one tile each (K = BK, V = BV); rows past T are masked, so
    # the loop body needs no branch.
    for task in tl.range(tl.program_id(0), n_tasks, tl.num_programs(0), num_stages=STAGES):
        if REVERSED:  # the A kernel's last tasks first (their A and k rows may be in L2)
            task = n_tasks - 1 - task
        i_b = task // NTH
        i_t, i_h = (task % NTH) // H, (task % NTH) % H
        bos = i_b.to(tl.int64) * T
        i_tc0 = i_t * BT
        kh, gh, bh, Ah = at_head(k, g, beta, A, bos, i_h, H, Hg, K, BT)
        vh = v + (bos * H + i_h) * V
        wh = w + (bos * H + i_h) * K
        uh = u + (bos * H + i_h) * V
        b_beta = load_rows(bh, T, H, i_tc0, BT)
        b_ks = b_beta
        if USE_G:
            b_ks = b_beta * tl.exp(load_rows(gh, T, H, i_tc0, BT))
        b_A = tl.load(tile_ptr(Ah, T, BT, H * BT, i_tc0, 0, BT, BT), boundary_check=(0, 1))
        b_v = tl.load(tile_ptr(vh, T, V, H * V, i_tc0, 0, BT, V), boundary_check=(0, 1))
        b_k = tl.load(tile_ptr(kh, T, K, Hg * K, i_tc0, 0, BT, K), boundary_check=(0, 1))
        if SCALE_A:
            b_u = tl.dot((b_A * b_beta[None, :]).to(b_A.dtype), b_v)
            b_w = tl.dot((b_A * b_ks[None, :]).to(b_A.dtype), b_k)
        else:
            b_u = tl.dot(b_A, (b_v * b_beta[:, None]).to(b_A.dtype))
            b_w = tl.dot(b_A, (b_k * b_ks[:, None]).to(b_A.dtype))
        tl.store(tile_ptr(uh, T, V, H * V, i_tc0, 0, BT, V), b_u.to(u.dtype.element_ty),
                 boundary_check=(0, 1))
        tl.store(tile_ptr(wh, T, K, H * K, i_tc0, 0, BT, K), b_w.to(w.dtype.element_ty),
                 boundary_check=(0, 1))


def wu_persistent(k, v, beta, g, A, w, u, programs, num_warps, stages, scale_a, reversed=False):
    """Launch on torch tensors ``[B, T, *, *]`` (fixed length)."""
    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    NTH = triton.cdiv(T, 64) * H
    n = B * NTH
    wu_persistent_kernel[(min(programs, n),)](
        k, v, beta, g, A, T, w, u, n, NTH, H=H, Hg=Hg, K=K, V=V, BT=64, USE_G=True,
        SCALE_A=scale_a, STAGES=stages, REVERSED=reversed, num_warps=num_warps, num_stages=stages)


def main():
    import torch
    from triton.testing import do_bench

    from bench_fwd_intra import SHAPES, make_inputs, torch_inputs
    from gdn_jax.torch_launch import fwd_intra_torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="headline")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    p.add_argument("--combos", type=int, default=0,
                   help="instead of the config sweep: this many rounds of the shipped split "
                        "against the combinations in COMBOS, in turn")
    args = p.parse_args()
    if args.combos:
        return combos(args)
    B, T, Hg, H, K, V, _ = SHAPES[args.shape]
    k, v, g, beta = torch_inputs(make_inputs(B, T, Hg, H, K, V))
    w0, u0, A = fwd_intra_torch(k, v, g, beta, autotune=False, path="split")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    split = lambda: fwd_intra_torch(k, v, g, beta, autotune=False, path="split")  # noqa: E731
    first = lambda: fwd_intra_torch(k, v, g, beta, autotune=False, path="split",  # noqa: E731
                                    wu_kernel=_NoWU)
    rows = [dict(config="split as shipped (fixed configs)", ms=do_bench(split, rep=200)),
            dict(config="its A kernel alone", ms=do_bench(first, rep=200))]
    print(rows, flush=True)
    w, u = torch.empty_like(w0), torch.empty_like(u0)
    for per_sm, num_warps, stages, scale_a in itertools.product([1, 2, 3, 4], [4, 8], [2, 3], [True, False]):
        cfg = dict(programs=per_sm * sms, num_warps=num_warps, stages=stages, scale_a=scale_a)
        try:
            wu_persistent(k, v, beta, g, A, w, u, **cfg)
            torch.cuda.synchronize()
        except Exception as e:  # out of shared memory or registers
            print(cfg, "failed:", str(e).splitlines()[0][:120], flush=True)
            continue
        diff = max(float((w - w0).abs().max() / w0.abs().max()), float((u - u0).abs().max() / u0.abs().max()))
        ms_wu = do_bench(lambda: wu_persistent(k, v, beta, g, A, w, u, **cfg), rep=200)
        ms_path = do_bench(lambda: (first(), wu_persistent(k, v, beta, g, A, w, u, **cfg)), rep=200)
        rows.append(dict(config=cfg, wu_ms=ms_wu, split_ms=ms_path, max_rel_diff=diff, per_sm=per_sm))
        print(rows[-1], flush=True)
    rows.append(dict(config="split as shipped, again", ms=do_bench(split, rep=200)))
    print(rows[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


# (A kernel: a bench_fwd_intra variant or None for the shipped one, w/u: a
# bench_fwd_intra variant, None, or a persistent config with 2 programs per SM)
_PERSISTENT = dict(per_sm=2, num_warps=4, stages=3, scale_a=False)
_REG168 = dict(BK=32, num_warps=1, maxnreg=168)  # 3 one-warp programs per scheduler
COMBOS = {  # name: (A kernel, w/u, the A kernel's config or None for UNTUNED's)
    "split as shipped": (None, None, None),
    "A BK=32": (None, None, dict(BK=32, num_warps=1)),
    "A BK=32 maxnreg=168": (None, None, _REG168),
    "A BK=64 maxnreg=168": (None, None, dict(BK=64, num_warps=1, maxnreg=168)),
    "A k_plain_pointers BK=32": ("split_k_plain_pointers", None, dict(BK=32, num_warps=1)),
    "A k_plain_pointers BK=32 maxnreg=168": ("split_k_plain_pointers", None, _REG168),
    "w/u persistent": (None, _PERSISTENT, None),
    "A BK=32 maxnreg=168, w/u persistent": (None, _PERSISTENT, _REG168),
    "one kernel as shipped": ("fused", None, None),
}


def combos(args):
    import torch
    from triton.testing import do_bench

    from bench_fwd_intra import SHAPES, kernel_variant, make_inputs, torch_inputs
    from gdn_jax.torch_launch import fwd_intra_torch

    B, T, Hg, H, K, V, _ = SHAPES[args.shape]
    k, v, g, beta = torch_inputs(make_inputs(B, T, Hg, H, K, V))
    w0, u0, A0 = fwd_intra_torch(k, v, g, beta, autotune=False, path="split")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    calls = {}
    for name, (a, wu, config_A) in COMBOS.items():
        path, kw = ("fused", {}) if a == "fused" else kernel_variant(a) if a else ("split", {})
        if config_A:
            kw["configs"] = {"A": config_A}
        if isinstance(wu, str):
            kw.update(kernel_variant(wu)[1])
        if isinstance(wu, dict):
            cfg = dict(wu)
            cfg["programs"] = cfg.pop("per_sm") * sms

            def call(kw=kw, cfg=cfg):
                w, u, A = fwd_intra_torch(k, v, g, beta, autotune=False, path="split", wu_kernel=_NoWU, **kw)
                wu_persistent(k, v, beta, g, A, w, u, **cfg)
                return w, u, A
        else:
            def call(path=path, kw=kw):
                return fwd_intra_torch(k, v, g, beta, autotune=False, path=path, **kw)
        w, u, A = call()
        torch.cuda.synchronize()
        diff = max(float((x.float() - x0.float()).abs().max() / x0.float().abs().max())
                   for x, x0 in [(w, w0), (u, u0), (A, A0)])
        calls[name] = (call, diff)
    rows = {name: dict(max_rel_diff=diff, ms=[]) for name, (_, diff) in calls.items()}
    for _ in range(args.combos):
        for name, (call, _) in calls.items():
            rows[name]["ms"].append(do_bench(call, rep=300))
    for name, row in rows.items():
        row["median_ms"] = sorted(row["ms"])[len(row["ms"]) // 2]
        print(f"{name:48s} {row['median_ms']:.4f}  " + " ".join(f"{m:.4f}" for m in row["ms"])
              + f"  diff {row['max_rel_diff']:.1e}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


class _NoWUKernel:
    """Stands in for the w/u kernel: launches nothing (the A kernel alone)."""
    @property
    def fn(self):
        return self

    def __getitem__(self, grid):
        return lambda **kw: None


_NoWU = _NoWUKernel()

if __name__ == "__main__":
    sys.exit(main())
