"""Registers and spills of every kernel in kernels/ for sm_90, without a GPU.

    python scripts/ptxas_report.py [--K 128] [--H 32] [--Hg 16] [--varlen]

Compiles each autotuning config of the three kernels at one shape with
Triton's own compiler for an sm_90 target (no driver needed) and runs the
ptxas that ships with Triton (`-v`) on the PTX. Registers per thread fix
occupancy: 255 registers x 128 threads leave room for 2 programs (8 warps)
per SM. The local triton may differ from the GPU machine's.

"PTX" is a hash of the PTX without debug lines: configs with the same hash
compile to the same code (num_stages does not change these kernels). The
last column is the zlib-compressed size of the config's PTX and TTIR:
jax-triton 0.3.1 ships every config's PTX and TTIR in the custom call's
opaque string, and jaxlib's legacy handler hashes and compares that whole
string on every call to find its cached kernel, so host time per call grows
with the sum of this column over a kernel's configs.
"""
import argparse
import hashlib
import os
import re
import subprocess
import tempfile
import warnings
import zlib

import triton
from triton.backends.compiler import GPUTarget

from gdn_jax.fused_recurrent_launch import fused_recurrent_constexprs
from gdn_jax.kernels.fused_intra import gdn_fwd_intra_A_kernel, gdn_fwd_intra_fused_kernel
from gdn_jax.kernels.fused_recurrent import gdn_fused_recurrent_kernel
from gdn_jax.kernels.kkt_solve import chunk_gated_delta_rule_fwd_kkt_solve_kernel
from gdn_jax.kernels.recompute_w_u import recompute_w_u_fwd_kernel
from gdn_jax.triton_launch import BC, _block, wu_blocks

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def ptxas_info(autotuner, signature, constexprs, config):
    """``(registers, spill store bytes, shared bytes, PTX hash, zlib KB of PTX + TTIR)`` of one config."""
    fn = autotuner.fn
    constexprs = {**constexprs, **config.kwargs}
    # Pointers 16-byte aligned, as both launchers specialize them (Triton's JIT
    # for torch tensors, jax-triton for XLA buffers): without this hint every
    # load and store compiles to one element per instruction.
    aligned = {(fn.arg_names.index(name),): [["tt.divisibility", 16]]
               for name, ty in signature.items() if ty.startswith("*")}
    src = triton.compiler.ASTSource(
        fn=fn, signature={**signature, **{name: "constexpr" for name in constexprs}},
        constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()},
        attrs=aligned)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=config.num_warps, num_stages=config.num_stages))
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(compiled.asm["ptx"])
    out = subprocess.run([PTXAS, "--gpu-name", "sm_90a", "-v", f.name, "-o", os.devnull],
                         capture_output=True, text=True, check=True).stderr
    os.unlink(f.name)
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", out).group(1))
    code = compiled.asm["ptx"].split("\t.section\t.debug")[0]  # the DWARF sections name inlined helpers
    # ... and so do the $L__tmp labels that mark inlined scopes for them
    code = re.sub(r"^\s*//.*$|^\s*\.loc.*$|^\s*\.file.*$|^\$L__tmp\d+:$", "", code, flags=re.M)
    code = "\n".join(line for line in code.splitlines() if line.strip())
    ptx_hash = hashlib.sha1(code.encode()).hexdigest()[:8]
    packed_kb = len(zlib.compress((compiled.asm["ptx"] + compiled.asm["ttir"]).encode())) / 1024
    return regs, spills, compiled.metadata.shared, ptx_hash, packed_kb


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--K", type=int, default=128, help="K = V")
    p.add_argument("--H", type=int, default=32)
    p.add_argument("--Hg", type=int, default=16)
    p.add_argument("--varlen", action="store_true")
    p.add_argument("--only", default="", help="kernels whose name contains this")
    a = p.parse_args()
    warnings.filterwarnings("ignore", message="tl.make_block_ptr is deprecated")
    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    flags = dict(USE_G=True, IS_VARLEN=a.varlen, DOT_PRECISION="tf32")
    heads = dict(H=a.H, Hg=a.Hg, K=a.K, BT=64)
    runtime = dict(cu_seqlens=i32, chunk_indices=i32, T="i32")
    kernels = {
        "kkt_solve (seed)": (chunk_gated_delta_rule_fwd_kkt_solve_kernel,
                             dict(k=bf, g=f32, beta=f32, **runtime, A=bf), dict(**heads, BC=BC, **flags)),
        "recompute_w_u": (recompute_w_u_fwd_kernel,
                          dict(k=bf, v=bf, beta=f32, g=f32, A=bf, **runtime, w=bf, u=bf),
                          dict(**heads, V=a.K, **wu_blocks(a.K, a.K), **flags)),
        "one-kernel (fused_intra)": (gdn_fwd_intra_fused_kernel,
                                     dict(k=bf, v=bf, g=f32, beta=f32, **runtime, w=bf, u=bf, A=bf),
                                     dict(**heads, V=a.K, BC=BC, BV=_block(a.K), **flags)),
        "A kernel (split path)": (gdn_fwd_intra_A_kernel,
                                     dict(k=bf, g=f32, beta=f32, **runtime, A=bf),
                                     dict(**heads, BC=BC, **flags)),
        # decode: a float32 state pool updated in place, the options off
        "decode (fused_recurrent)": (
            gdn_fused_recurrent_kernel,
            dict(q=bf, k=bf, v=bf, g=f32, beta=f32, A_log=f32, dt_bias=f32, cu_seqlens=i32,
                 state_indices=i32, h0=f32, scale="fp32", T="i32", P="i32", o=bf, ht=f32),
            fused_recurrent_constexprs(
                a.Hg, a.H, a.K, a.K, use_h0=True, store_final=True, in_place=True,
                varlen=a.varlen, pool=True, v_first=False, l2norm_q=False, l2norm_k=False,
                gate=False, dt_bias=False, beta_sigmoid=False, neg_eigval=False)),
    }
    print(f"triton {triton.__version__}, sm_90a, bf16, K=V={a.K}, H={a.H}, Hg={a.Hg}, varlen={a.varlen}")
    print("| kernel | config | registers | spill stores (B) | shared (B) | PTX | PTX+TTIR zlib (KB) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, (kernel, signature, constexprs) in kernels.items():
        if a.only not in name:
            continue
        for config in kernel.configs:
            regs, spills, shared, ptx_hash, packed_kb = ptxas_info(kernel, signature, constexprs, config)
            cfg = ", ".join([*(f"{k}={v}" for k, v in config.kwargs.items()),
                             f"warps={config.num_warps}", f"stages={config.num_stages}"])
            print(f"| {name} | {cfg} | {regs} | {spills} | {shared} | {ptx_hash} | {packed_kb:.0f} |", flush=True)


if __name__ == "__main__":
    main()
