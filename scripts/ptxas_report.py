"""Registers, spills and shared memory of every kernel of the package's paths for sm_90a, without a GPU.

    python scripts/ptxas_report.py [--K 128] [--H 32] [--Hg 16] [--layouts fixed,varlen]
                                   [--only NAME] [--json OUT.json]
    python scripts/ptxas_report.py --compare A.json B.json ...   # side by side, compiles nothing

Compiles each autotuning config of every kernel in :data:`KERNELS` (and the
Gluon kernel's one launch) at one shape with the installed triton's own
compiler for an sm_90 target (no GPU or driver needed) and runs the ptxas that
ships with that triton (``-v``) on the PTX. A kernel that this triton cannot
compile gets a row with the reason (the seed's kernel on triton >= 3.9).
Registers per thread fix occupancy: 255 registers x 128 threads leave room
for 2 programs (8 warps) per SM. Run it in one environment per triton version
(docs/triton_versions.md), each with ``--json``, then ``--compare`` the files.

"PTX" is a hash of the PTX without debug lines: configs with the same hash
compile to the same code (num_stages does not change these kernels). The
last column is the zlib-compressed size of the config's PTX and TTIR:
jax-triton 0.3.1 ships every config's PTX and TTIR in the custom call's
opaque string, and jaxlib's legacy handler hashes and compares that whole
string on every call to find its cached kernel, so host time per call grows
with the sum of this column over a kernel's configs.

A new kernel is one entry of :data:`KERNELS`: :func:`triton_kernel` with its
``kernels/`` module, its name, the types of its runtime parameters and the
values of its constexprs (the autotuning configs' are added), each a function
of the :class:`Shape`; a kernel without ``triton.autotune`` also gets
``configs=[triton.Config({...}, num_warps=...)]``, the launcher's. For instance::

    "chunk_fwd": triton_kernel(
        "chunk_fwd", "chunk_fwd_kernel", lambda s: dict(q=BF, k=BF, v=BF, h=BF, g=F32, **WORK, o=BF, scale="fp32"),
        lambda s: dict(**s.heads, V=s.K, BV=64, USE_G=True, IS_VARLEN=s.varlen)),
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import os
import re
import subprocess
import tempfile
import warnings
import zlib

from gdn_jax.chunk_bwd_launch import value_blocks
from gdn_jax.chunk_launch import chunk_fwd_constexprs, chunk_qk_block
from gdn_jax.fused_recurrent_launch import fused_recurrent_constexprs
from gdn_jax.triton_launch import BC, _block, wu_blocks

BF, F32, I32 = "*bf16", "*fp32", "*i32"
WORK = dict(cu_seqlens=I32, chunk_indices=I32, T="i32")  # the chunk kernels' work list and length


@dataclasses.dataclass(frozen=True)
class Shape:
    """The launch the kernels are compiled for: head dims ``K = V``, value
    heads ``H``, key heads ``Hg``, packed sequences (``varlen``) or not; bf16
    ``k``/``v``, float32 ``g``/``beta``, ``g`` on, tf32 dots (sm_90)."""
    K: int = 128
    H: int = 32
    Hg: int = 16
    varlen: bool = False
    dtype: str = BF  # q, k, v, do (and the tensors kept in their dtype) of the chunk kernels

    @property
    def itemsize(self) -> int:
        return {BF: 2, F32: 4}[self.dtype]

    @property
    def heads(self) -> dict:
        return dict(H=self.H, Hg=self.Hg, K=self.K, BT=64)

    @property
    def flags(self) -> dict:
        return dict(USE_G=True, IS_VARLEN=self.varlen, DOT_PRECISION="tf32")


def triton_kernel(module: str, name: str, types, constexprs, configs=None):
    """A :data:`KERNELS` entry: the ``@triton.jit`` (or autotuned) kernel
    ``name`` of ``kernels/<module>.py``. ``types(shape)``: the runtime
    parameters' types (``"*bf16"``, ``"i32"``, ...; any order),
    ``constexprs(shape)``: the constexprs' values but the configs', ``configs``
    the ``triton.Config`` s to compile (default: the autotuner's). Returns
    ``shape -> [(config label, compile thunk)]``."""
    def compiles(shape: Shape):
        kernel = getattr(importlib.import_module(f"gdn_jax.kernels.{module}"), name)
        fn = getattr(kernel, "fn", kernel)
        out = []
        for config in configs or kernel.configs:
            label = config_label(dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages))
            out.append((label, lambda config=config: compile_triton(
                fn, types(shape), {**constexprs(shape), **config.kwargs}, config)))
        return out
    return compiles


def config_label(kwargs: dict) -> str:
    """A row's config column: ``kwargs`` of a launch (constexprs, ``num_warps``, ``num_stages``)."""
    rest = {k: v for k, v in kwargs.items() if k not in ("num_warps", "num_stages")}
    return ", ".join([*(f"{k}={v}" for k, v in sorted(rest.items())),
                      f"warps={kwargs['num_warps']}", f"stages={kwargs.get('num_stages', 3)}"])


def compile_triton(fn, types: dict, constexprs: dict, config):
    """``fn`` compiled for sm_90 with the given parameter types and constexprs
    (each parameter must have one or the other)."""
    import triton
    from triton.backends.compiler import GPUTarget

    missing = [p.name for p in fn.params if p.name not in (constexprs if p.is_constexpr else types)]
    assert not missing, f"{fn.__name__}: no type or value for {missing}"
    # Pointers 16-byte aligned, as both launchers specialize them (Triton's JIT
    # for torch tensors, jax-triton for XLA buffers): without this hint every
    # load and store compiles to one element per instruction.
    aligned = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in types.items() if t.startswith("*")}
    src = triton.compiler.ASTSource(
        fn=fn, signature={n: "constexpr" if n in constexprs else types[n] for n in fn.arg_names},
        constexprs={(fn.arg_names.index(n),): v for n, v in constexprs.items()}, attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=config.num_warps, num_stages=config.num_stages))


def gluon_kernel(shape: Shape):
    """The :data:`KERNELS` entry of the Gluon kernel (``kernels/gluon_intra.py``,
    ``impl="gluon"``): its one launch config, compiled as
    :func:`gdn_jax.gluon_launch.compile_offline` does; fixed length and ``K =
    V = 128`` only (none for other shapes)."""
    from gdn_jax import gluon_launch

    if shape.varlen or shape.K != 128:
        return []
    _, _, constexprs, maxnreg = gluon_launch.launch_args(8, 4096, shape.Hg, shape.H, 128, 128, 132)
    label = (f"TMA={constexprs['TMA']}, warps=3x{gluon_launch.WARPS}, maxnreg={maxnreg}, builder/w-u regs="
             f"{constexprs['BUILDER_REGS']}/{constexprs['WU_REGS']}")
    return [(label, lambda: gluon_launch.compile_offline(Hg=shape.Hg, H=shape.H))]


def gluon_walk_kernel(shape: Shape):
    """The :data:`KERNELS` entry of the backward's reverse walk in Gluon
    (``kernels/gluon_bwd_walk.py``): its one launch config, compiled as
    :func:`gdn_jax.chunk_bwd_gluon.compile_offline` does; ``K = 128`` only."""
    from gdn_jax import chunk_bwd_gluon

    if shape.K != 128 or shape.dtype == F32:
        return []
    dtype = {BF: "bfloat16", "*fp16": "float16"}[shape.dtype]
    return [(f"BV={chunk_bwd_gluon.BV}, warps=4", lambda: chunk_bwd_gluon.compile_offline(
        dtype, shape.varlen, H=shape.H, Hg=shape.Hg))]


def gluon_storing_walk_kernel(shape: Shape):
    """The :data:`KERNELS` entry of the forward's storing walk in Gluon
    (``kernels/gluon_fwd_walk.py``): its one launch config, compiled as
    :func:`gdn_jax.chunk_fwd_gluon.compile_offline` does; ``K = 128``, fixed
    length only."""
    from gdn_jax import chunk_fwd_gluon

    if shape.K != 128 or shape.dtype == F32 or shape.varlen:
        return []
    dtype = {BF: "bfloat16", "*fp16": "float16"}[shape.dtype]
    return [(f"BV={chunk_fwd_gluon.BV}, warps=4", lambda: chunk_fwd_gluon.compile_offline(
        dtype, H=shape.H, Hg=shape.Hg))]


def gluon_per_chunk_kernel(shape: Shape):
    """The :data:`KERNELS` entry of the backward's per-chunk kernel in Gluon
    (``kernels/gluon_bwd_local.py``): its one launch config, compiled as
    :func:`gdn_jax.chunk_bwd_local_gluon.compile_offline` does; ``K = V =
    128`` only."""
    from gdn_jax import chunk_bwd_local_gluon

    if shape.K != 128 or shape.dtype == F32:
        return []
    dtype = {BF: "bfloat16", "*fp16": "float16"}[shape.dtype]
    return [("BK=64, warps=4, persistent", lambda: chunk_bwd_local_gluon.compile_offline(
        dtype, shape.varlen, H=shape.H, Hg=shape.Hg))]


def gluon_wy_kernel(shape: Shape):
    """The :data:`KERNELS` entry of the backward's WY kernel in Gluon
    (``kernels/gluon_wy_bwd.py``), as :func:`gluon_per_chunk_kernel`."""
    from gdn_jax import chunk_bwd_local_gluon

    if shape.K != 128 or shape.dtype == F32:
        return []
    dtype = {BF: "bfloat16", "*fp16": "float16"}[shape.dtype]
    return [("warps=4, persistent", lambda: chunk_bwd_local_gluon.compile_offline_wy(
        dtype, shape.varlen, H=shape.H, Hg=shape.Hg))]


# The SUM_G of the A kernel, the walk and chunk_qk (g: the per-step gates, summed in the kernel): the
# whole forward launches them with True (gdn_jax.chunk_bwd.core_forward), the split path and the
# backward with False. The rows compile False; set True to see the forward's.
SUM_G = False

KERNELS = {  # row name: shape -> [(config label, compile thunk)]; one entry per kernel
    "kkt_solve (seed)": triton_kernel(
        "kkt_solve", "chunk_gated_delta_rule_fwd_kkt_solve_kernel",
        lambda s: dict(k=BF, g=F32, beta=F32, **WORK, A=BF), lambda s: dict(**s.heads, BC=BC, **s.flags)),
    "recompute_w_u": triton_kernel(
        "recompute_w_u", "recompute_w_u_fwd_kernel",
        lambda s: dict(k=s.dtype, v=s.dtype, beta=F32, g=F32, A=s.dtype, **WORK, w=s.dtype, u=s.dtype),
        lambda s: dict(**s.heads, V=s.K, **wu_blocks(s.K, s.K), **s.flags)),
    "one-kernel (fused_intra)": triton_kernel(
        "fused_intra", "gdn_fwd_intra_fused_kernel",
        lambda s: dict(k=BF, v=BF, g=F32, beta=F32, **WORK, w=BF, u=BF, A=BF),
        lambda s: dict(**s.heads, V=s.K, BC=BC, BV=_block(s.K), **s.flags)),
    "A kernel (split path)": triton_kernel(
        "fused_intra", "gdn_fwd_intra_A_kernel",
        lambda s: dict(k=BF, g=F32, beta=F32, **WORK, A=BF),
        lambda s: dict(**s.heads, BC=BC, **s.flags, SUM_G=SUM_G)),
    "A kernel with the output block (experiment)": triton_kernel(
        "fused_intra", "gdn_fwd_intra_A_qk_kernel",
        lambda s: dict(q=BF, k=BF, g=F32, beta=F32, **WORK, A=BF, Aqk=BF),
        lambda s: dict(**s.heads, BC=BC, **s.flags)),
    "gluon_intra (impl='gluon')": gluon_kernel,
    **{name: triton_kernel(
        "chunk_fwd", "gdn_chunk_fwd_kernel",
        lambda s: dict(q=s.dtype, k=s.dtype, w=s.dtype, u=s.dtype, gc=F32, beta=F32, qk=s.dtype, h0=F32,
                       cu_seqlens=I32, chunk_offsets=I32, scale="fp32", T="i32", o=s.dtype, ht=F32, h=s.dtype,
                       v_new=s.dtype),
        lambda s, from_A=from_A: dict(**chunk_fwd_constexprs(s.Hg, s.H, s.K, s.K, True, True, s.varlen, False,
                                                             "tf32"),
                                      WRITE_O=True, STORE_H=False, STORE_V=False, FROM_A=from_A, SUM_G=SUM_G))
       for name, from_A in (("chunk walk (chunk_fwd)", False),
                            ("chunk walk from A (chunk_fwd, FROM_A)", True))},
    "chunk output block (chunk_qk)": triton_kernel(
        "chunk_qk", "gdn_chunk_qk_kernel",
        lambda s: dict(q=s.dtype, k=s.dtype, gc=F32, cu_seqlens=I32, chunk_indices=I32, T="i32", Aqk=s.dtype),
        lambda s: dict(H=s.H, Hg=s.Hg, K=s.K, BT=64, BK=chunk_qk_block(s.K), IS_VARLEN=s.varlen,
                       DOT_PRECISION="tf32", SUM_G=SUM_G)),
    "backward reverse walk (chunk_bwd_walk)": triton_kernel(
        "chunk_bwd_walk", "gdn_chunk_bwd_walk_kernel",
        lambda s: dict(q=s.dtype, k=s.dtype, w=s.dtype, beta=F32, gc=F32, do=s.dtype, qk=s.dtype, dht=F32,
                       cu_seqlens=I32, chunk_offsets=I32, scale="fp32", T="i32", dv=s.dtype, dh=s.dtype,
                       dh0=F32),
        lambda s: dict(H=s.H, Hg=s.Hg, K=s.K, V=s.K, BT=64, BK=s.K, USE_DHT=True, IS_VARLEN=s.varlen,
                       DOT_PRECISION="tf32", QK_IN=True, FROM_A=True)),
    "forward walk storing the states in Gluon (gluon_fwd_walk)": gluon_storing_walk_kernel,
    "backward reverse walk in Gluon (gluon_bwd_walk)": gluon_walk_kernel,
    "backward per chunk in Gluon (gluon_bwd_local)": gluon_per_chunk_kernel,
    "backward WY in Gluon (gluon_wy_bwd)": gluon_wy_kernel,
    "backward per chunk (chunk_bwd_local)": triton_kernel(
        "chunk_bwd_local", "gdn_chunk_bwd_local_kernel",
        lambda s: dict(q=s.dtype, k=s.dtype, v_new=s.dtype, gc=F32, do=s.dtype, dv=s.dtype, h=s.dtype,
                       dh=s.dtype, cu_seqlens=I32, chunk_indices=I32, scale="fp32", T="i32", dq=s.dtype,
                       dk=s.dtype, dw=s.dtype, dg=F32),
        lambda s: dict(H=s.H, Hg=s.Hg, K=s.K, V=s.K, BT=64, BK=min(64, s.K), BV=value_blocks(s.K, s.K, s.itemsize)[0],
                       V_STAGES=value_blocks(s.K, s.K, s.itemsize)[2],
                       IS_VARLEN=s.varlen, DOT_PRECISION="tf32")),
    **{name: triton_kernel(
        "wy_bwd", "gdn_wy_bwd_kernel",
        lambda s: dict(k=s.dtype, v=s.dtype, beta=F32, gc=F32, A=s.dtype, dw=s.dtype, du=s.dtype, dA=s.dtype,
                       dg_in=F32, cu_seqlens=I32, chunk_indices=I32, T="i32", dk=s.dtype, dv=s.dtype, dbeta=F32,
                       dg=F32),
        # the chunk backward's launch adds the per-chunk kernel's dgc shares (one per K block of 64)
        lambda s, da_in=da_in: dict(H=s.H, Hg=s.Hg, K=s.K, V=s.K, BT=64, BK=s.K,
                                    BV=value_blocks(s.K, s.K, s.itemsize)[1],
                                    V_STAGES=value_blocks(s.K, s.K, s.itemsize)[2],
                                    IS_VARLEN=s.varlen, DOT_PRECISION="tf32", DA_IN=da_in,
                                    NK_IN=0 if da_in else -(-s.K // 64), REV_CUMSUM=not da_in))
       for name, da_in in (("backward WY (wy_bwd)", False), ("fwd_intra's backward (wy_bwd, DA_IN)", True))},
    "decode (fused_recurrent)": triton_kernel(
        "fused_recurrent", "gdn_fused_recurrent_kernel",
        lambda s: dict(q=BF, k=BF, v=BF, g=F32, beta=F32, A_log=F32, dt_bias=F32, cu_seqlens=I32,
                       state_indices=I32, h0=F32, scale="fp32", T="i32", P="i32", o=BF, ht=F32),
        lambda s: fused_recurrent_constexprs(
            s.Hg, s.H, s.K, s.K, use_h0=True, store_final=True, in_place=True, varlen=s.varlen, pool=True,
            v_first=False, l2norm_q=False, l2norm_k=False, gate=False, dt_bias=False, beta_sigmoid=False,
            neg_eigval=False)),
}


def ptx_code_hash(ptx: str) -> str:
    """Hash of the PTX without debug lines and comments."""
    code = ptx.split("\t.section\t.debug")[0]  # the DWARF sections name inlined helpers
    # ... and so do the $L__tmp labels that mark inlined scopes for them
    code = re.sub(r"^\s*//.*$|^\s*\.loc.*$|^\s*\.file.*$|^\$L__tmp\d+:$", "", code, flags=re.M)
    code = "\n".join(line for line in code.splitlines() if line.strip())
    return hashlib.sha1(code.encode()).hexdigest()[:8]


def triton_ptxas() -> str:
    """The ptxas that this triton runs for sm_90: its bundled ``ptxas`` (CUDA
    12.8 or 12.9) up to triton 3.8, ``ptxas-blackwell`` (CUDA 13.4) from 3.9."""
    from triton.backends.nvidia import compiler

    return compiler.get_ptxas(90).path


def ptxas_info(compiled) -> dict:
    """Registers, spill store bytes (``ptxas -v`` for sm_90a on the PTX, with
    :func:`triton_ptxas`), shared bytes, PTX hash and zlib KB of PTX + TTIR of
    a compiled kernel."""
    ptxas = triton_ptxas()
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(compiled.asm["ptx"])
    try:
        run = subprocess.run([ptxas, "--gpu-name", "sm_90a", "-v", f.name, "-o", os.devnull],
                             capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if run.returncode:
        raise RuntimeError(f"{os.path.basename(ptxas)}: {run.stderr.strip()}")
    out = run.stderr
    ttir = compiled.asm.get("ttir", "")
    return dict(registers=int(re.search(r"Used (\d+) registers", out).group(1)),
                spills=int(re.search(r"(\d+) bytes spill stores", out).group(1)),
                shared=compiled.metadata.shared, ptx=ptx_code_hash(compiled.asm["ptx"]),
                zlib_kb=round(len(zlib.compress((compiled.asm["ptx"] + ttir).encode())) / 1024))


def failure(e: Exception) -> str:
    """The reason a compile failed, in one line (a CompilationError's last)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else type(e).__name__)[:200]


def report(shapes, only: str):
    """Rows (dicts) of every config of every kernel whose name contains ``only``, printed as they come."""
    import triton

    warnings.filterwarnings("ignore", message="tl.make_block_ptr is deprecated")
    version = subprocess.run([triton_ptxas(), "--version"], capture_output=True, text=True).stdout
    ptxas = re.search(r"release ([\d.]+)", version).group(1)
    print(f"triton {triton.__version__} (ptxas {ptxas}), sm_90a, bf16, K=V={shapes[0].K}, H={shapes[0].H}, "
          f"Hg={shapes[0].Hg}")
    print("| kernel | config | layout | registers | spill stores (B) | shared (B) | PTX | PTX+TTIR zlib (KB) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for shape in shapes:
        layout = "varlen" if shape.varlen else "fixed"
        for name, compiles in KERNELS.items():
            if only not in name:
                continue
            for label, compile_ in compiles(shape):
                row = dict(kernel=name, config=label, layout=layout)
                try:
                    row.update(ptxas_info(compile_()))
                    cells = [row[c] for c in ("registers", "spills", "shared", "ptx", "zlib_kb")]
                except Exception as e:  # noqa: BLE001 (recorded: this triton cannot compile it)
                    row["error"] = failure(e)
                    cells = [f"not compiled: {row['error']}", "", "", "", ""]
                rows.append(row)
                print("| " + " | ".join(map(str, [name, label, layout, *cells])) + " |", flush=True)
    return dict(triton=triton.__version__, ptxas=ptxas, shape=dataclasses.asdict(shapes[0]), rows=rows)


def compare(paths):
    """Markdown table of registers / spill stores / shared bytes per kernel,
    config and layout, one column group per report (``--json`` files)."""
    runs = [json.loads(open(p).read()) for p in paths]
    keys = []
    for run in runs:
        keys += [k for k in ((r["kernel"], r["config"], r["layout"]) for r in run["rows"]) if k not in keys]
    by_key = [{(r["kernel"], r["config"], r["layout"]): r for r in run["rows"]} for run in runs]
    head = [f"triton {run['triton']} (ptxas {run.get('ptxas', '?')})" for run in runs]
    print("Each cell: registers per thread / spill stores (bytes) / shared memory (bytes).\n")
    print("| kernel | config | layout | " + " | ".join(head) + " |")
    print("|" + " --- |" * (3 + len(runs)))
    for key in keys:
        cells = []
        for rows in by_key:
            r = rows.get(key)
            cells.append("-" if r is None else f"not compiled ({r['error']})" if "error" in r
                         else f"{r['registers']} / {r['spills']} / {r['shared']}")
        print("| " + " | ".join([*key, *cells]) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--K", type=int, default=128, help="K = V")
    p.add_argument("--H", type=int, default=32)
    p.add_argument("--Hg", type=int, default=16)
    p.add_argument("--layouts", default="fixed,varlen", help="fixed, varlen or both (comma-separated)")
    p.add_argument("--only", default="", help="kernels whose name contains this")
    p.add_argument("--json", metavar="OUT", help="also write the rows to this JSON file")
    p.add_argument("--compare", nargs="+", metavar="JSON", help="print these reports side by side, compile nothing")
    a = p.parse_args()
    if a.compare:
        return compare(a.compare)
    layouts = a.layouts.split(",")
    assert set(layouts) <= {"fixed", "varlen"}, a.layouts
    shapes = [Shape(a.K, a.H, a.Hg, layout == "varlen") for layout in layouts]
    result = report(shapes, a.only)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
