"""Probe of the chunk walk kernel (kernels/chunk_fwd.py) on the GPU: its configs,
and a transposed formulation, timed from torch (triton.testing.do_bench) on the
same inputs, each checked against the shipped kernel's output.

    python benchmarks/chunk_fwd_probe.py [--shapes headline,T32768] [--out DIR]

The transposed variant keeps ``S^T [BV, K]`` as the accumulator and as the
register operand of its dots (``v'^T = u^T - S^T w^T``, ``o^T = S^T q^T +
v'^T (k q^T)``, ``S^T += v'^T k``): the state never goes to shared memory
for a dot, the loaded tiles are the shared operands.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from kernels.chunk_fwd import sequence_rows, state_tile  # noqa: E402


@triton.jit(do_not_specialize=["T"])
def chunk_fwd_transposed(q, k, w, u, gc, h0, cu_seqlens, scale, T, o, ht, H: tl.constexpr,
                         Hg: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, USE_H0: tl.constexpr,
                         STORE_FINAL: tl.constexpr, IS_VARLEN: tl.constexpr,
                         STATE_V_FIRST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    NV: tl.constexpr = tl.cdiv(V, BV)
    pid = tl.program_id(0)
    i_v = pid % NV
    i_h = (pid // NV) % H
    i_n = pid // (NV * H)
    bos, seq_len = sequence_rows(i_n, cu_seqlens, T, IS_VARLEN)
    i_hk = i_h // (H // Hg)
    s_offsets, s_mask = state_tile(i_n, i_h, i_v, H, K, V, BK, BV, STATE_V_FIRST)
    b_st = tl.zeros([BV, BK], dtype=tl.float32)  # S^T
    if USE_H0:
        b_st = tl.trans(tl.load(h0 + s_offsets, mask=s_mask, other=0).to(tl.float32))
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    causal_t = o_t[:, None] <= o_t[None, :]  # [j, i]: j <= i
    q += (bos * Hg + i_hk) * K
    k += (bos * Hg + i_hk) * K
    w += (bos * H + i_h) * K
    u += (bos * H + i_h) * V
    o += (bos * H + i_h) * V
    gc += bos * H + i_h
    for i_c in range(tl.cdiv(seq_len, BT)):
        r = (i_c * BT + o_t).to(tl.int64)
        m_t = r < seq_len
        m_kt = m_k[:, None] & m_t[None, :]
        m_vt = m_v[:, None] & m_t[None, :]
        b_qt = tl.load(q + r[None, :] * (Hg * K) + o_k[:, None], mask=m_kt, other=0)  # [BK, BT]
        b_k = tl.load(k + r[:, None] * (Hg * K) + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0)
        b_wt = tl.load(w + r[None, :] * (H * K) + o_k[:, None], mask=m_kt, other=0)  # [BK, BT]
        b_ut = tl.load(u + r[None, :] * (H * V) + o_v[:, None], mask=m_vt, other=0).to(tl.float32)
        b_g = tl.load(gc + r * H, mask=m_t, other=0).to(tl.float32)
        last = (tl.minimum(i_c * BT + BT, seq_len) - 1).to(tl.int64)
        g_last = tl.load(gc + last * H).to(tl.float32)
        b_sx = b_st.to(b_wt.dtype)
        b_vt = b_ut - tl.dot(b_sx, b_wt, input_precision=DOT_PRECISION)  # v'^T [BV, BT]
        b_ot = tl.dot(b_sx, b_qt, input_precision=DOT_PRECISION) * tl.exp(b_g)[None, :]
        b_at = tl.dot(b_k, b_qt, input_precision=DOT_PRECISION)  # [j, i] = <k_j, q_i>
        b_at = b_at * tl.exp(tl.where(causal_t, b_g[None, :] - b_g[:, None], float("-inf")))
        b_ot += tl.dot(b_vt.to(b_wt.dtype), b_at.to(b_wt.dtype), input_precision=DOT_PRECISION)
        tl.store(o + r[None, :] * (H * V) + o_v[:, None], (b_ot * scale).to(o.dtype.element_ty), mask=m_vt)
        b_vd = (b_vt * tl.exp(g_last - b_g)[None, :]).to(b_k.dtype)
        b_st = b_st * tl.exp(g_last) + tl.dot(b_vd, b_k, input_precision=DOT_PRECISION)
    if STORE_FINAL:
        tl.store(ht + s_offsets, tl.trans(b_st), mask=s_mask)


SHAPES = {"headline": (8, 4096, 16, 32, 128), "T32768": (1, 32768, 16, 32, 128),
          "B4T8192": (4, 8192, 16, 32, 128), "K256": (2, 4096, 16, 16, 256)}
CONFIGS = [(BV, w, s) for BV in (16, 32, 64) for w in (2, 4, 8) for s in (1, 2, 3)]


def main():
    import torch
    from triton.testing import do_bench

    from gdn_jax.chunk_launch import chunk_fwd_constexprs, chunk_fwd_grid
    from gdn_jax.kernels.chunk_fwd import gdn_chunk_fwd_kernel

    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="headline,T32768")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--configs", default="", help="BV:warps:stages,... (default: all)")
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
        w, u = (0.1 * rn(B, T, H, K)).bfloat16(), rn(B, T, H, V).bfloat16()
        a_ = torch.nn.functional.logsigmoid(rn(B, T, H))
        gc = a_.view(B, T // 64, 64, H).cumsum(2).view(B, T, H).contiguous()
        h0 = 0.1 * rn(B, H, K, V)
        dummy = torch.zeros(1, dtype=torch.int32, device="cuda")
        cx = chunk_fwd_constexprs(Hg, H, K, V, True, True, False, False, "tf32")
        ref = None
        for kernel_name, kernel in (("shipped", gdn_chunk_fwd_kernel.fn), ("transposed", chunk_fwd_transposed)):
            for BV, warps, stages in configs:
                o = torch.empty(B, T, H, V, device="cuda", dtype=torch.bfloat16)
                ht = torch.empty(B, H, K, V, device="cuda")

                def run():
                    kernel[chunk_fwd_grid(B, H, V, BV)](q, k, w, u, gc, h0, dummy, K ** -0.5, T, o, ht, **cx,
                                                        BV=BV, num_warps=warps, num_stages=stages)
                try:
                    run()
                    torch.cuda.synchronize()
                    ms = do_bench(run, warmup=25, rep=100, return_mode="median")
                except Exception as e:  # noqa: BLE001 (out of resources etc.: recorded)
                    rows.append(dict(shape=name, kernel=kernel_name, BV=BV, warps=warps, stages=stages,
                                     error=repr(e)[:200]))
                    continue
                if ref is None:
                    ref = (o.float().clone(), ht.clone())
                diff = max(float((o.float() - ref[0]).norm() / ref[0].norm()),
                           float((ht - ref[1]).norm() / ref[1].norm()))
                rows.append(dict(shape=name, kernel=kernel_name, BV=BV, warps=warps, stages=stages, ms=ms,
                                 rel_diff=diff))
                print(json.dumps(rows[-1]), flush=True)
    pathlib.Path(a.out, "chunk_fwd_probe.json").write_text(json.dumps(rows, indent=1))
    print("| shape | kernel | BV | warps | stages | ms | rel diff |\n| --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted((r for r in rows if "ms" in r), key=lambda r: (r["shape"], r["ms"]))[:40]:
        print(f"| {r['shape']} | {r['kernel']} | {r['BV']} | {r['warps']} | {r['stages']} | {r['ms']:.4f} | "
              f"{r['rel_diff']:.1e} |")


if __name__ == "__main__":
    main()
