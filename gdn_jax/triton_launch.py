"""Launch of the ``kernels/`` Triton sources from JAX through ``jax_triton.triton_call``.

Works with jax-triton 0.3.1 (``out_shape=``, no ``None`` operands, cannot be
imported without a GPU jaxlib) and 0.4.x (``out_type=``). jax_triton is
imported on first use only, so ``import gdn_jax`` works on a CPU-only host.
"""
from __future__ import annotations

import functools
import inspect
import os

import jax
import jax.numpy as jnp

from .chunk_indices import cdiv
from .validate import check_kernel_dtypes, is_traced

BC = 16  # sub-block rows of the fused kernels (4 x 16 = 64)


def fused_grid(NT: int, H: int, B: int) -> tuple[int, int]:
    """Grid of the one-kernel path: (chunk, value head) pairs with the head
    fastest, so GQA heads of one key head run side by side; batch rows."""
    return (NT * H, B)


# One fixed config per kernel for launches that skip the autotuner: Triton's
# interpreter (it cannot benchmark) and GDN_JAX_AUTOTUNE=0 (quick GPU test
# runs: one compile per kernel instead of one per config), and varlen launches
# with traced offsets under jax-triton >= 0.4 (may_autotune). The fused config
# is what the autotuner picked on the H200 at the headline shape.
UNTUNED = {
    "kkt_solve": dict(BK=64, num_warps=4),
    "recompute_w_u": dict(num_warps=4, num_stages=3),
    "fused": dict(BK=64, num_warps=2, num_stages=3),
    "A": dict(BK=64, num_warps=2),
}


def autotune_enabled() -> bool:
    """False when the environment sets ``GDN_JAX_AUTOTUNE=0``."""
    return os.environ.get("GDN_JAX_AUTOTUNE", "1") != "0"


def tuned_or_fixed(kernel, name: str, autotune: bool):
    """``(kernel, config kwargs)``: the autotuned kernel as it is, or its inner
    ``JITFunction`` with the fixed config ``UNTUNED[name]``."""
    return (kernel, {}) if autotune else (kernel.fn, UNTUNED[name])


GRID_LIMITS = (2**31 - 1, 65535, 65535)  # CUDA's largest grid, per dimension


def check_grid(path: str, grid, names) -> None:
    """ValueError where a launch grid passes CUDA's limits, naming the dim."""
    for n, limit, name in zip(grid, GRID_LIMITS, names):
        if n > limit:
            raise ValueError(
                f"fwd_intra: impl={path!r} launches {n} programs along {name}, over CUDA's "
                f"limit of {limit} for that grid dimension; split the call (e.g. over batch "
                f"rows), or pack the rows into one sequence with cu_seqlens"
            )


@functools.cache
def jax_triton():
    """The jax_triton module, or a RuntimeError saying why it cannot be used."""
    try:
        import jax_triton as jt
    except ImportError as e:
        raise RuntimeError(
            "gdn_jax: the Triton path needs jax-triton and a CUDA-enabled jaxlib "
            f"(pip install jax-triton 'jax[cuda13]'); importing jax_triton failed: {e}"
        ) from e
    return jt


@functools.cache
def autotunes_at_initialize() -> bool:
    """True for jax-triton >= 0.4, whose XLA FFI handler (jaxlib's
    ``triton_kernel_call_ffi``) autotunes while the executable is initialized,
    before any op of the graph has run: the candidate configs are launched on
    the operand buffers as they are then. Jit parameters hold their data by
    then; arrays computed in the graph (the chunk indices of a traced
    ``cu_seqlens``) hold garbage, and a kernel that indexes memory with them
    faults (CUDA_ERROR_ILLEGAL_ADDRESS, measured with 0.4.1). jax-triton 0.3
    autotunes on the first execution, in stream order, on real data."""
    version = jax_triton().__version__.split(".")
    return (int(version[0]), int(version[1])) >= (0, 4)


def may_autotune(*index_arrays) -> bool:
    """Whether a launch may hand jax-triton its autotuned kernel: not with
    ``GDN_JAX_AUTOTUNE=0``, and not where jax-triton autotunes at
    initialization (:func:`autotunes_at_initialize`) while an operand used
    for addressing (``cu_seqlens``, chunk indices) is traced, since it may be
    computed in the graph. Such launches take the fixed config ``UNTUNED``."""
    traced = any(is_traced(a) for a in index_arrays if a is not None)
    return autotune_enabled() and not (traced and autotunes_at_initialize())


@functools.cache
def _out_keyword() -> str:
    params = inspect.signature(jax_triton().triton_call).parameters
    return "out_type" if "out_type" in params else "out_shape"


def triton_call(*args, out, **kwargs):
    """``jax_triton.triton_call`` with the output spec under the keyword this
    jax-triton version takes (0.4 renamed ``out_shape`` to ``out_type``)."""
    return jax_triton().triton_call(*args, **{_out_keyword(): out}, **kwargs)


@functools.cache
def dot_precision() -> str:
    """``"tf32"`` on sm_80 and newer (the seed's ``is_tf32_supported``), else ``"ieee"``."""
    major = int(str(jax.devices()[0].compute_capability).split(".")[0])
    return "tf32" if major >= 8 else "ieee"


def _block(n: int) -> int:
    """Tile width along a head dim: a power of two in [16, 64]."""
    return max(16, min(64, 1 << (n - 1).bit_length()))


def fwd_intra_triton(k, v, g, beta, *, cu_seqlens=None, chunk_size=64, chunk_indices=None,
                     path="fused"):
    """``fwd_intra`` through jax-triton: ``path="fused"`` runs the one-kernel
    path of ``kernels/fused_intra.py``; ``path="seed"`` the seed's fused
    kkt+solve kernel, then the w/u kernel.

    Inputs are assumed checked (:func:`gdn_jax.validate.check_fwd_intra_args`),
    and with ``cu_seqlens`` both it and ``chunk_indices`` int32 jax arrays
    (:func:`gdn_jax.chunk_indices.varlen_work_list`); shapes and dtypes as
    :func:`gdn_jax.fwd_intra`.
    """
    check_kernel_dtypes("fwd_intra", k=k, v=v, g=g, beta=beta)
    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    BT = chunk_size
    w_type = jax.ShapeDtypeStruct((B, T, H, K), k.dtype)
    u_type = jax.ShapeDtypeStruct((B, T, H, V), v.dtype)
    A_type = jax.ShapeDtypeStruct((B, T, H, BT), k.dtype)

    is_varlen = cu_seqlens is not None
    NT = chunk_indices.shape[0] if is_varlen else cdiv(T, BT)
    if B * T * H == 0 or NT == 0:
        return tuple(jnp.zeros(t.shape, t.dtype) for t in (w_type, u_type, A_type))
    if path == "fused":
        grid = fused_grid(NT, H, B)
        check_grid("triton", grid, ("chunks * value heads (NT * H)", "batch rows B"))
    else:
        grid = (NT, H, B)  # chunks, value heads, batch rows
        check_grid("seed", grid, ("chunks NT", "value heads H", "batch rows B"))

    # jax-triton 0.3 takes no None operand: an unused pointer gets a 1-element
    # dummy, and USE_G / IS_VARLEN tell the kernel not to read it.
    dummy = jnp.zeros((1,), jnp.int32)
    g_arg = dummy if g is None else g
    cu_arg = cu_seqlens if is_varlen else dummy
    ci_arg = chunk_indices if is_varlen else dummy
    flags = dict(USE_G=g is not None, IS_VARLEN=is_varlen, DOT_PRECISION=dot_precision())
    tune = may_autotune(cu_seqlens, chunk_indices)

    if path == "fused":
        from .kernels.fused_intra import gdn_fwd_intra_fused_kernel

        kernel, config = tuned_or_fixed(gdn_fwd_intra_fused_kernel, "fused", tune)
        return triton_call(
            k, v, g_arg, beta, cu_arg, ci_arg, T,
            kernel=kernel,
            out=(w_type, u_type, A_type),
            grid=grid,
            H=H, Hg=Hg, K=K, V=V, BT=BT, BC=BC, BV=_block(V), **flags, **config,
        )

    from .kernels.kkt_solve import chunk_gated_delta_rule_fwd_kkt_solve_kernel
    from .kernels.recompute_w_u import recompute_w_u_fwd_kernel

    kernel, config = tuned_or_fixed(chunk_gated_delta_rule_fwd_kkt_solve_kernel, "kkt_solve", tune)
    A = triton_call(
        k, g_arg, beta, cu_arg, ci_arg, T,
        kernel=kernel,
        out=A_type,
        grid=grid,
        zeroed_outputs=(0,),  # the kernel writes the lower blocks only, as in the seed
        H=H, Hg=Hg, K=K, BT=BT, BC=BC, **flags, **config,
    )
    kernel, config = tuned_or_fixed(recompute_w_u_fwd_kernel, "recompute_w_u", tune)
    w, u = triton_call(
        k, v, beta, g_arg, A, cu_arg, ci_arg, T,
        kernel=kernel,
        out=(w_type, u_type),
        grid=grid,
        H=H, Hg=Hg, K=K, V=V, BT=BT, BK=_block(K), BV=_block(V), **flags, **config,
    )
    return w, u, A
