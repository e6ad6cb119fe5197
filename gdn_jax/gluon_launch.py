"""Launch of ``kernels/gluon_intra.py`` (the warp-specialized Gluon kernel,
``impl="gluon"``) from JAX through jax-triton 0.4.

The kernel runs on Hopper (compute capability 9.x: warpgroup MMA, TMA,
``setmaxnreg``) and takes one case, the headline's: fixed-length
bfloat16 ``k``/``v`` with ``K = V = 128`` and ``T`` a multiple of 64
(:func:`input_mismatch` says why). :func:`input_mismatch` and
:func:`environment_missing` say why a call cannot take it; ``impl="auto"``
then runs the split path.

jax-triton 0.4.1 launches Gluon kernels, with two faults this module
mends (:func:`compile_gluon_as_triton_does`). The kernel's TMA descriptors
are made here, as jax-triton ``TensorDescriptor`` arguments that jaxlib
encodes per launch (:func:`fwd_intra_gluon`): descriptors made on the
device would live in global scratch, which jaxlib allocates per launch with
``cuMemAllocAsync``, a call that cannot enter XLA's CUDA graphs.
"""
from __future__ import annotations

import functools
import importlib
import re
import warnings

import jax
import jax.numpy as jnp

from . import backend
from .chunk_indices import cdiv

# Registers per thread: the kernel (maxnreg; 12 warps x 168 fill the SM's
# 64 K), the builder partition and the second w/u partition (setmaxnreg; the
# first w/u partition, the default one, gets what is left: 3 x 168 - 216 - 144
# = 144, as read from the compiled kernel).
# Chosen on the H200 (triton 3.6.0, headline shape, torch do_bench): 216 / 144
# 0.378 ms; 208 / 136 0.378; 224 / 144 0.384; 224 / 136 0.388; 232 / 144 0.391;
# 208 / 144, 216 / 136 and 216 / 152 0.436 to 0.439 (ptxas spills do not rank them).
MAXNREG = 168
REGS = dict(BUILDER_REGS=216, WU_REGS=144)
WARPS = 4  # per partition; the launch has 12 (ttg.total-num-warps)
# The w/u partitions' copies: True, TMA loads and stores (descriptors made
# here); False, cp.async loads (rows past T zero-filled) and stores staged in
# shared memory, which take any T but ran 0.41 against 0.38 ms (H200, headline shape).
TMA = True


def input_mismatch(k, v, g, beta, cu_seqlens) -> str | None:
    """Why the Gluon kernel cannot take these ``fwd_intra`` inputs (shapes as
    :func:`gdn_jax.fwd_intra`), or None when it can."""
    B, T, Hg, K = k.shape
    V = v.shape[3]
    if cu_seqlens is not None:
        return "it takes fixed-length batches, got cu_seqlens (a packed batch)"
    if k.dtype != jnp.bfloat16 or v.dtype != jnp.bfloat16:
        return f"it takes bfloat16 k and v, got {k.dtype} and {v.dtype}"
    if K != 128 or V != 128:
        return f"it takes head dims K = V = 128, got K={K}, V={V}"
    return rows_mismatch(B, T, TMA)


def rows_mismatch(B: int, T: int, tma: bool) -> str | None:
    """Why a launch with ``tma`` (the kernel's ``TMA``) cannot take ``B``
    batch rows of ``T``, or None when it can (either launcher checks this)."""
    if tma and T % 64:
        return (f"it takes T a multiple of 64, got T={T} (a partial chunk's TMA loads read the next "
                f"batch row, where a NaN would leak through 0 * NaN, and its TMA stores write there)")
    if tma and B * T >= 2**31:
        return f"it takes B * T < 2**31 rows (int32 TMA coordinates), got {B * T}"
    return None


@functools.cache
def environment_missing() -> str | None:
    """Why this machine cannot run the Gluon kernel from JAX, or None:
    it needs a compute capability 9.x GPU, a triton with Gluon's Hopper ops,
    jax-triton >= 0.4 (Gluon launches) and, with ``TMA``, a jaxlib that
    passes TMA descriptors to Triton kernels. Read once per process."""
    return gluon_environment_missing("gluon_intra", TMA)


@functools.cache
def gluon_environment_missing(module: str, tma: bool) -> str | None:
    """Why this machine cannot run the Gluon kernel of ``kernels/<module>.py``
    from JAX, or None (:func:`environment_missing`'s checks; ``tma``: the
    kernel takes TMA descriptors). Read once per process."""
    if not backend.cuda_available():
        return f"it needs an NVIDIA GPU, JAX runs on {jax.default_backend()!r}"
    if backend.compute_capability_major() != 9:
        return f"it needs a Hopper GPU (compute capability 9.x), got {jax.devices()[0].compute_capability}"
    try:
        importlib.import_module(f"{__package__}.kernels.{module}")
        triton_lib = importlib.import_module("jax_triton.triton_lib")
    except ImportError as e:
        return f"it needs triton with Gluon and jax-triton >= 0.4: {e}"
    if not hasattr(getattr(triton_lib, "TritonFunction", None), "_compile_kernel"):
        return "it needs jax-triton >= 0.4 (Gluon launches)"
    if tma and not hasattr(triton_lib.triton_kernel_call_lib, "create_tma_descriptor_parameter"):
        return "it needs a jaxlib that passes TMA descriptors to Triton kernels (create_tma_descriptor_parameter)"
    return None


def gluon_fits(k, v, g, beta, cu_seqlens) -> bool:
    """Whether ``impl="auto"`` may run these inputs on the Gluon kernel here."""
    return input_mismatch(k, v, g, beta, cu_seqlens) is None and environment_missing() is None


def check_gluon(op: str, k, v, g, beta, cu_seqlens) -> None:
    """For ``impl="gluon"``: RuntimeError where this machine cannot run the
    kernel, ValueError where the inputs do not fit it, each saying why."""
    missing = environment_missing()
    if missing:
        raise RuntimeError(f"{op}: impl='gluon' cannot run here: {missing}; use impl='split' or impl='auto'")
    mismatch = input_mismatch(k, v, g, beta, cu_seqlens)
    if mismatch:
        raise ValueError(f"{op}: impl='gluon' (the warp-specialized kernel) {mismatch}; use impl='split' "
                         f"(the same math, any input) or impl='auto'")


def launch_args(B: int, T: int, Hg: int, H: int, K: int, V: int, n_sm: int, **overrides):
    """``(grid, scalars, constexprs, maxnreg)`` of a launch: one CTA per SM (at
    most one per task), the scalars ``T, n_tasks, NTC``, the constexprs
    and the register limit. ``overrides`` replace constexprs (``MODE``,
    ``BUILDER_REGS``, ``WU_REGS``, ``TMA``: the probe's ablations, splits
    and variants) or ``maxnreg``."""
    NTC = cdiv(T, 64)
    n_tasks = B * NTC * H
    maxnreg = overrides.pop("maxnreg", MAXNREG)
    constexprs = dict(H=H, Hg=Hg, K=K, V=V, MODE=0, TMA=TMA, **REGS)
    constexprs.update(overrides)
    return (min(n_tasks, n_sm), ), (T, n_tasks, NTC), constexprs, maxnreg


def compile_gluon_as_triton_does():
    """Two jax-triton 0.4.1 fixes for Gluon kernels, by wrapping
    ``TritonFunction._compile_kernel`` (idempotent; Triton kernels pass as before):

    - it lowers a Gluon kernel with ``make_ttir`` and ``make_ttgir``, the
      passes for Triton kernels (layouts chosen again, shared memory allocated
      again: 249920 bytes for this kernel, over the H200's 232448), where
      ``triton.compile`` runs ``gluon_to_ttgir``: a Gluon kernel gets a copy of
      the backend whose ``make_ttir`` passes the module through and whose
      ``make_ttgir`` is ``gluon_to_ttgir``;
    - it launches ``num_warps`` warps, where a warp-specialized kernel needs
      all its partitions' (``ttg.total-num-warps``, 12 here; 4 gave
      CUDA_ERROR_INVALID_VALUE): the kernel object is made again with that count.
    """
    import copy

    from jax_triton import triton_lib
    from triton.experimental.gluon._runtime import GluonJITFunction

    compile_kernel = triton_lib.TritonFunction._compile_kernel
    if getattr(compile_kernel, "gluon_stages", False):
        return

    def _compile_kernel(self, spec, gpu_target, backend, backend_options):
        if not isinstance(self.fn, GluonJITFunction):
            return compile_kernel(self, spec, gpu_target, backend, backend_options)
        gluon_backend = copy.copy(backend)
        gluon_backend.make_ttir = lambda mod, metadata, options, capability: mod
        gluon_backend.make_ttgir = backend.gluon_to_ttgir
        kernel, ttir, options, res = compile_kernel(self, spec, gpu_target, gluon_backend, backend_options)
        total = re.search(r'"?ttg.total-num-warps"?\s*=\s*(\d+)', res.ttgir)
        if total and int(total.group(1)) != backend_options["num_warps"]:
            args = [res.name, int(total.group(1)), backend_options["num_ctas"], res.shared_mem_bytes, res.binary,
                    ttir, gpu_target.arch if isinstance(gpu_target.arch, int) else 0]
            if res.global_scratch_size is not None:  # jaxlib > 0.11.0 (compile_kernel checked)
                args += [res.global_scratch_size, res.global_scratch_align]
            kernel = triton_lib.triton_kernel_call_lib.TritonKernel(*args)
        return kernel, ttir, options, res

    _compile_kernel.gluon_stages = True
    triton_lib.TritonFunction._compile_kernel = _compile_kernel


def sm_count() -> int:
    """Streaming multiprocessors of JAX's first device (132, an H100's or
    H200's, where the device does not say): the programs of a persistent
    launch, one an SM."""
    return getattr(jax.devices()[0], "core_count", 132)


def fwd_intra_gluon(k, v, g, beta):
    """``(w, u, A)`` of fixed-length inputs by the Gluon kernel (shapes as
    :func:`gdn_jax.fwd_intra`; the inputs passed :func:`input_mismatch`).
    ``g`` None runs with zeros; ``g`` and ``beta`` go in as float32."""
    import jax_triton as jt

    from .kernels.gluon_intra import gdn_fwd_intra_gluon_kernel

    compile_gluon_as_triton_does()
    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    g = jnp.zeros((B, T, H), jnp.float32) if g is None else g.astype(jnp.float32)
    grid, scalars, constexprs, maxnreg = launch_args(B, T, Hg, H, K, V, sm_count())
    A = jax.ShapeDtypeStruct((B, T, H, 64), k.dtype)
    call = functools.partial(jt.triton_call, kernel=gdn_fwd_intra_gluon_kernel, grid=grid, num_warps=WARPS,
                             backend_options={"maxnreg": maxnreg}, **constexprs)
    inputs = (k, v, g, beta.astype(jnp.float32))
    w_type, u_type = jax.ShapeDtypeStruct((B, T, H, K), k.dtype), jax.ShapeDtypeStruct((B, T, H, V), v.dtype)
    if not constexprs["TMA"]:  # no descriptors: the *_desc parameters get k, v, k, v (unused)
        return call(*inputs, k, v, k, v, *scalars, out_type=(w_type, u_type, A))
    # TMA descriptors of 2D views, encoded by jaxlib at each launch. w and u are
    # written through theirs only: uninitialized buffers (lax.empty, no fill)
    # aliased to the outputs; the kernel's w, u pointer parameters get k, v
    # (used only by partial chunks, which input_mismatch excludes).
    tile = tile_layout()
    w_buf, u_buf = jax.lax.empty((B * T, H * K), k.dtype), jax.lax.empty((B * T, H * V), v.dtype)
    descs = dict(k_desc=(k.reshape(B * T, Hg * K), K), v_desc=(v.reshape(B * T, H * V), V), w_desc=(w_buf, 64),
                 u_desc=(u_buf, 64))
    descs = {n: jt.TensorDescriptor.from_array(x, (64, cols), layout=tile) for n, (x, cols) in descs.items()}
    # The results as (A, w, u): jaxlib hands the kernel's pointer parameters the
    # operands' buffers and then the results' in order, aliased ones included
    # (ordered w, u, A, the A parameter would get w's buffer). The
    # aliased operands are the descriptors, at their parameters' positions (all
    # parameters before them are arrays).
    params = gdn_fwd_intra_gluon_kernel.arg_names
    aliases = {params.index("w_desc"): 1, params.index("u_desc"): 2}
    out = (A, jax.ShapeDtypeStruct(w_buf.shape, k.dtype), jax.ShapeDtypeStruct(u_buf.shape, v.dtype))
    with warnings.catch_warnings():  # deprecated in jax-triton 0.4 for Refs, which descriptors do not take
        warnings.simplefilter("ignore", DeprecationWarning)
        A, w, u = call(*inputs, *descs.values(), *scalars, k, v, out_type=out, input_output_aliases=aliases)
    return w.reshape(w_type.shape), u.reshape(u_type.shape), A


def tile_layout():
    """The shared-memory layout of the kernel's TMA tiles (``TILE``), for
    descriptors made by a launcher."""
    from .kernels.gluon_intra import TILE

    return TILE.value


def compile_offline(B=8, T=4096, Hg=16, H=32, K=128, V=128, *, capability=90, divisible=(), **overrides):
    """The kernel compiled for ``sm_{capability}a`` without a GPU (the
    installed triton's own compiler and ptxas): the ``CompiledKernel``
    (``.asm["ptx"]``, ``.asm["cubin"]``, ``.metadata.shared``). ``overrides``
    as in :func:`launch_args`. ``divisible``: the scalars (of ``T``,
    ``n_tasks``, ``NTC``) compiled as known multiples of 16, as Triton's
    launcher specializes them (jax-triton gives none)."""
    from .kernels.gluon_intra import gdn_fwd_intra_gluon_kernel as fn

    _, _, constexprs, maxnreg = launch_args(B, T, Hg, H, K, V, 132, **overrides)
    desc = {n: f"tensordesc<bf16[64,{cols}],{tile_layout()!r}>" if constexprs["TMA"] else "*bf16"
            for n, cols in (("k_desc", K), ("v_desc", V), ("w_desc", 64), ("u_desc", 64))}
    sig = dict(k="*bf16", v="*bf16", g="*fp32", beta="*fp32", **desc, T="i32", n_tasks="i32", NTC="i32",
               w="*bf16", u="*bf16", A="*bf16")
    return compile_gluon_offline(fn, sig, constexprs, dict(num_warps=WARPS, maxnreg=maxnreg),
                                 capability=capability, divisible=divisible)


def compile_gluon_offline(fn, signature: dict, constexprs: dict, options: dict, *, capability=90, divisible=()):
    """Gluon kernel ``fn`` compiled for ``sm_{capability}a`` without a GPU (the
    installed triton's compiler and ptxas): ``signature`` the runtime
    parameters' types, pointers (and the scalars in ``divisible``) taken as
    multiples of 16; ``options`` as ``triton.compile`` takes them."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    src = GluonASTSource(
        fn=fn, signature={**signature, **{n: "constexpr" for n in constexprs}},
        constexprs={(fn.arg_names.index(n),): v for n, v in constexprs.items()},
        attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items()
               if t[0] == "*" or n in divisible})
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
