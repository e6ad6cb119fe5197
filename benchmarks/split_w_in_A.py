"""Probe (GPU machine): the split path with ``w`` moved into the ``A`` kernel.

    python3 benchmarks/split_w_in_A.py [--shape headline] [--out rows.json]

The split path reads ``k`` twice from HBM: once in the ``A`` kernel for
``k k^T``, once in the w/u kernel for ``w = A (beta exp(g) k)``. Here the
``A`` kernel, right after storing its chunk's ``A``, reads that ``A`` tile and
its ``k`` rows back (both just touched, so from L2) and stores ``w``; the
second kernel computes ``u = A (beta v)`` only. HBM traffic at the headline
shape: 1.21 GB against 1.34 (no second ``k`` read), and the ``A`` kernel's
``w`` stores can overlap its latency-bound compute. Prints ms (torch
``do_bench``) per config against the shipped split path, and the largest
difference to the shipped outputs.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys

import triton
import triton.language as tl

from gdn_jax.kernels.fused_intra import store_chunk_A
from gdn_jax.kernels.tiles import at_head, load_rows, program_chunk, store_A_times, tile_ptr


@triton.jit(do_not_specialize=["T"])
def A_w_kernel(k, g, beta, cu_seqlens, chunk_indices, T, w, A,
               H: tl.constexpr, Hg: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
               BC: tl.constexpr, BK: tl.constexpr, BW: tl.constexpr, USE_G: tl.constexpr,
               IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr):
    i_t, i_h, bos, T = program_chunk(cu_seqlens, chunk_indices, T, H, IS_VARLEN)
    if i_t * BT >= T:
        return
    i_tc0 = i_t * BT
    store_chunk_A(k, g, beta, A, bos, i_h, T, i_tc0, H, Hg, K, BT, BC, BK, USE_G, DOT_PRECISION)
    tl.debug_barrier()  # this CTA's A stores visible to its own loads
    k, g, beta, A = at_head(k, g, beta, A, bos, i_h, H, Hg, K, BT)
    w += (bos * H + i_h) * K
    b_ks = load_rows(beta, T, H, i_tc0, BT)
    if USE_G:
        b_ks = b_ks * tl.exp(load_rows(g, T, H, i_tc0, BT))
    b_A = tl.load(tile_ptr(A, T, BT, H * BT, i_tc0, 0, BT, BT), boundary_check=(0, 1))
    store_A_times(b_A, k, w, b_ks, T, K, Hg * K, H * K, i_tc0, BT, BW, DOT_PRECISION)


@triton.jit(do_not_specialize=["T"])
def u_kernel(v, beta, A, cu_seqlens, chunk_indices, T, u,
             H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
             IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr):
    i_t, i_h, bos, T = program_chunk(cu_seqlens, chunk_indices, T, H, IS_VARLEN)
    if i_t * BT >= T:
        return
    i_tc0 = i_t * BT
    beta += bos * H + i_h
    A += (bos * H + i_h) * BT
    v += (bos * H + i_h) * V
    u += (bos * H + i_h) * V
    b_beta = load_rows(beta, T, H, i_tc0, BT)
    b_A = tl.load(tile_ptr(A, T, BT, H * BT, i_tc0, 0, BT, BT), boundary_check=(0, 1))
    store_A_times(b_A, v, u, b_beta, T, V, H * V, H * V, i_tc0, BT, BV, DOT_PRECISION)


def split_w_in_A(k, v, g, beta, w, u, A, cfg_A, cfg_u):
    """Both kernels on torch tensors ``[B, T, *, *]`` (fixed length)."""
    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    grid = (triton.cdiv(T, 64) * H, B)
    A_w_kernel[grid](k, g, beta, beta, beta, T, w, A, H=H, Hg=Hg, K=K, BT=64, BC=16, USE_G=True,
                     IS_VARLEN=False, DOT_PRECISION="tf32", **cfg_A)
    u_kernel[grid](v, beta, A, beta, beta, T, u, H=H, V=V, BT=64, IS_VARLEN=False,
                   DOT_PRECISION="tf32", **cfg_u)


def main():
    import torch
    from triton.testing import do_bench

    from bench_fwd_intra import SHAPES, make_inputs, torch_inputs
    from gdn_jax.torch_launch import fwd_intra_torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="headline")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args()
    B, T, Hg, H, K, V, _ = SHAPES[args.shape]
    k, v, g, beta = torch_inputs(make_inputs(B, T, Hg, H, K, V))
    w0, u0, A0 = fwd_intra_torch(k, v, g, beta, autotune=False, path="split")
    split = lambda: fwd_intra_torch(k, v, g, beta, autotune=False, path="split")  # noqa: E731
    rows = [dict(config="split as shipped (fixed configs)", ms=do_bench(split, rep=300))]
    print(rows[-1], flush=True)
    w, u, A = torch.empty_like(w0), torch.empty_like(u0), torch.empty_like(A0)
    rel = lambda x, x0: float((x.float() - x0.float()).abs().max() / x0.float().abs().max())  # noqa: E731
    for bw, wa, wu in itertools.product([32, 64, 128], [1, 2, 4], [4, 8]):
        cfg_A, cfg_u = dict(BK=64, BW=bw, num_warps=wa), dict(BV=min(V, 128), num_warps=wu, num_stages=3)
        try:
            split_w_in_A(k, v, g, beta, w, u, A, cfg_A, cfg_u)
            torch.cuda.synchronize()
        except Exception as e:  # out of resources
            print(cfg_A, cfg_u, "failed:", str(e).splitlines()[0][:120], flush=True)
            continue
        row = dict(A_w=cfg_A, u=cfg_u, diff_w=rel(w, w0), diff_u=rel(u, u0), diff_A=rel(A, A0),
                   ms=do_bench(lambda: split_w_in_A(k, v, g, beta, w, u, A, cfg_A, cfg_u), rep=300))
        rows.append(row)
        print(row, flush=True)
    rows.append(dict(config="split as shipped, again", ms=do_bench(split, rep=300)))
    print(rows[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
