"""Launch of the ``kernels/`` Triton sources from JAX through ``jax_triton.triton_call``.

Works with jax-triton 0.3.1 (``out_shape=``, no ``None`` operands, cannot be
imported without a GPU jaxlib) and 0.4.x (``out_type=``). jax_triton is
imported on first use only, so ``import gdn_jax`` works on a CPU-only host.
"""
from __future__ import annotations

import functools
import inspect
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from .autotune import autotune_enabled, chosen_config, timing_allowed
from .backend import compute_capability_major
from .chunk_indices import cdiv, padded_chunk_rows
from .validate import check_kernel_dtypes

BC = 16  # sub-block rows of the fused kernels (4 x 16 = 64)


def head_fastest_grid(NT: int, H: int, B: int) -> tuple[int, int]:
    """Grid of every kernel but the seed's kkt_solve: (chunk, value head) pairs
    with the head fastest, so GQA heads of one key head run side by side; batch rows."""
    return (NT * H, B)


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


# The seed's kernel (kernels/kkt_solve.py) keeps the seed's source, which
# builds its tiles with tl.make_block_ptr: triton 3.9 removed block pointers
# (compiling the kernel raises "Block pointers have been removed in favor of
# the tensor descriptor API"; importing the module still works).
SEED_TRITON_BELOW = (3, 9)


def triton_version() -> tuple[int, int]:
    """``(major, minor)`` of the installed triton."""
    import triton

    return tuple(int(n) for n in re.match(r"(\d+)\.(\d+)", triton.__version__).groups())


def seed_triton_missing() -> str | None:
    """Why the installed triton cannot compile the seed's kernel, naming the
    triton it needs, or None where it can."""
    if triton_version() < SEED_TRITON_BELOW:
        return None
    import triton

    need = ".".join(map(str, SEED_TRITON_BELOW))
    return (f"the seed's own kernel (kernels/kkt_solve.py) uses tl.make_block_ptr, removed in "
            f"triton {need}: it needs triton >= 3.6 and < {need}, this is triton {triton.__version__}")


def check_seed_triton(op: str) -> None:
    """For ``impl="seed"``: RuntimeError where the installed triton cannot
    compile the seed's kernel (:func:`seed_triton_missing`), before any launch."""
    missing = seed_triton_missing()
    if missing:
        raise RuntimeError(f"{op}: impl='seed' cannot run here: {missing}; impl='split', 'triton' "
                           f"or 'auto' run the same math on triton 3.6 to 3.9")


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
def _out_keyword() -> str:
    params = inspect.signature(jax_triton().triton_call).parameters
    return "out_type" if "out_type" in params else "out_shape"


def triton_call(*args, out, zeroed=False, input_output_aliases=None, **kwargs):
    """``jax_triton.triton_call`` with the output spec under the keyword this
    jax-triton version takes (0.4 renamed ``out_shape`` to ``out_type``).

    ``zeroed=True``: the one output ``out`` starts as zeros (the kernel
    writes part of it), through ``zeroed_outputs``. ``input_output_aliases``
    (``{operand index: output index}``): those outputs are their operands'
    buffers, written in place (see :func:`aliased_outputs_are_parameters` for
    how the kernel's parameters meet them). jax-triton 0.4 deprecates both for
    ``Ref`` operands, but in JAX 0.11 a ``Ref`` cannot pass
    ``custom_partitioning`` ("Cannot lower jaxpr with effects") or
    ``custom_jvp`` ("No state discharge rule implemented for primitive:
    custom_jvp_call"), both of which wrap the launches (:mod:`gdn_jax.sharding`):
    so they stay, and their deprecation warnings, about this internal choice,
    are not passed on.
    """
    extra = {}
    if zeroed:
        extra["zeroed_outputs"] = (0,)
    if input_output_aliases:
        extra["input_output_aliases"] = dict(input_output_aliases)
    with warnings.catch_warnings():
        for what in ("zeroed_outputs", "input_output_aliases"):
            warnings.filterwarnings("ignore", message=f"{what} is deprecated",
                                    category=DeprecationWarning)
        return jax_triton().triton_call(*args, **{_out_keyword(): out}, **extra, **kwargs)


def float32_scalar(x):
    """``x`` as a scalar operand that reaches the kernel as float32: a Python
    float on jax-triton 0.4 (which deprecates ``np.float32`` scalars), an
    ``np.float32`` on 0.3 (which passes a Python float as float64)."""
    return float(x) if _out_keyword() == "out_type" else np.float32(x)


def aliased_outputs_are_parameters() -> bool:
    """Whether an output aliased to an operand also takes a pointer parameter
    of its own: jax-triton 0.3 passes every output after the operands, aliased
    ones included; 0.4 binds the operands to the kernel's parameters in order
    and gives the outputs not aliased the parameters left over (an aliased
    output is its operand's parameter). jaxlib hands those parameters the
    operands' buffers, then the results' in order (aliased results included),
    so a launch with aliases orders its results unaliased first."""
    return _out_keyword() == "out_shape"


@functools.cache
def dot_precision() -> str:
    """``"tf32"`` on sm_80 and newer (the seed's ``is_tf32_supported``), else ``"ieee"``."""
    return "tf32" if compute_capability_major() >= 8 else "ieee"


def _block(n: int, widest: int = 64) -> int:
    """Tile width along a head dim: a power of two in [16, widest]."""
    return max(16, min(widest, 1 << (n - 1).bit_length()))


def wu_blocks(K: int, V: int) -> dict:
    """The w/u kernel's column tiles ``BK``, ``BV``: up to 128 wide (one tile
    per matrix at K = V = 128; 0.465 against 0.481 ms for 64-wide tiles,
    split path at the headline shape, H200, triton 3.6.0, torch do_bench)."""
    return dict(BK=_block(K, 128), BV=_block(V, 128))


def launch(name: str, kernel, operands, *, out, grid, tune_key=(), **kwargs):
    """One ``triton_call`` of the autotuned ``kernel`` (its inner ``JITFunction``)
    with the single config :func:`gdn_jax.autotune.chosen_config` picks for
    its constexprs (``kwargs``), dtypes and ``tune_key`` (hashable, more of the
    launch that the best config depends on); ``operands`` end with the scalar
    ``T``. ``grid``: a tuple, or a function of the launch's constexprs and
    config (as jax-triton takes it). A constexpr in the config (a
    ``GDN_JAX_FIXED_CONFIGS`` override's ``BV``, say) replaces the launch's."""
    def run(ops, **config):
        return triton_call(*ops, kernel=kernel.fn, out=out, grid=grid, **{**kwargs, **config})

    return run(operands, **chosen_config(name, kernel.configs, operands, run,
                                         tuple(sorted(kwargs.items())) + tuple(tune_key),
                                         T=operands[-1]))


# Launches of more rows (B * T) time their configs on a launch of this many
# rows, the headline shape's: the configs' keys leave out B and T
# (gdn_jax.autotune), and timing on stand-ins of the full size (a second copy
# of every operand and output) took minutes past 2^31 elements and then
# crashed the process (a segfault in the Python interpreter, H200, jax-triton 0.3.1,
# cause not found).
TIMING_ROWS = 32768


def time_configs_on_fewer_rows(k, v, g, beta, cu_seqlens, chunk_size, path, sum_g=False):
    """Past :data:`TIMING_ROWS` rows, choose this launch's configs on an
    abstract launch of at most that many (same heads, dims, dtypes and
    flags, so the same config keys): the real launch then finds them chosen."""
    B, T = k.shape[:2]
    if B * T <= TIMING_ROWS or not (autotune_enabled() and timing_allowed()):
        return
    rows = (max(1, min(B, TIMING_ROWS // T)), min(T, TIMING_ROWS))
    fewer = lambda x: None if x is None else jax.ShapeDtypeStruct(rows + x.shape[2:], x.dtype)  # noqa: E731
    work = {}
    if cu_seqlens is not None:  # stand-ins: segments spread over the rows, and their chunks
        work = dict(cu_seqlens=jax.ShapeDtypeStruct(cu_seqlens.shape, cu_seqlens.dtype),
                    chunk_indices=jax.ShapeDtypeStruct(
                        (padded_chunk_rows(rows[1], cu_seqlens.shape[0] - 1, chunk_size), 2), jnp.int32))
    jax.eval_shape(functools.partial(fwd_intra_triton, chunk_size=chunk_size, path=path, sum_g=sum_g),
                   *map(fewer, (k, v, g, beta)), **work)


def fwd_intra_triton(k, v, g, beta, *, cu_seqlens=None, chunk_size=64, chunk_indices=None,
                     path="triton", sum_g=False):
    """``fwd_intra`` through jax-triton, ``path`` as ``impl`` of
    :func:`gdn_jax.fwd_intra`: ``"gluon"`` runs the Gluon kernel of
    ``kernels/gluon_intra.py`` (:mod:`gdn_jax.gluon_launch`); ``"triton"`` the one-kernel path of
    ``kernels/fused_intra.py``; ``"split"`` its A kernel, then the
    w/u kernel of ``kernels/recompute_w_u.py``; ``"A"`` that A kernel alone,
    returning ``(A,)`` (for the walk that forms ``v'`` from ``A``); ``"seed"``
    the seed's fused kkt+solve kernel, then the same w/u kernel.

    Inputs are assumed checked (:func:`gdn_jax.validate.check_fwd_intra_args`),
    and with ``cu_seqlens`` both it and ``chunk_indices`` int32 jax arrays
    (:func:`gdn_jax.chunk_indices.varlen_work_list`); shapes and dtypes as
    :func:`gdn_jax.fwd_intra`. ``sum_g`` (path ``"A"`` only): ``g`` holds
    the per-step log gates ``[B, T, H]`` float32, which the kernel sums within
    each chunk itself (``SUM_G``), where ``g`` is otherwise their chunk-local
    cumulative sums.
    """
    if sum_g and path != "A":
        raise ValueError(f"fwd_intra: sum_g (per-step gates summed in the kernel) is the A kernel's "
                         f"(path 'A'), not path {path!r}'s")
    if path == "seed":
        check_seed_triton("fwd_intra")
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
        types = (A_type,) if path == "A" else (w_type, u_type, A_type)
        return tuple(jnp.zeros(t.shape, t.dtype) for t in types)
    if path == "gluon":  # the warp-specialized Gluon kernel (fixed length; gdn_jax.gluon_launch)
        from .gluon_launch import fwd_intra_gluon

        return fwd_intra_gluon(k, v, g, beta)
    head_fastest = head_fastest_grid(NT, H, B)  # every kernel but the seed's kkt_solve
    chunk_major = (NT, H, B)  # the seed's kkt_solve
    if path == "seed":
        check_grid(path, chunk_major, ("chunks NT", "value heads H", "batch rows B"))
    check_grid(path, head_fastest, ("chunks * value heads (NT * H)", "batch rows B"))
    time_configs_on_fewer_rows(k, v, g, beta, cu_seqlens, chunk_size, path, sum_g)

    # jax-triton 0.3 takes no None operand: an unused pointer gets a 1-element
    # dummy, and USE_G / IS_VARLEN tell the kernel not to read it.
    dummy = jnp.zeros((1,), jnp.int32)
    g_arg = dummy if g is None else g
    cu_arg = cu_seqlens if is_varlen else dummy
    ci_arg = chunk_indices if is_varlen else dummy
    flags = dict(USE_G=g is not None, IS_VARLEN=is_varlen, DOT_PRECISION=dot_precision())
    from .kernels.fused_intra import gdn_fwd_intra_A_kernel, gdn_fwd_intra_fused_kernel
    from .kernels.kkt_solve import chunk_gated_delta_rule_fwd_kkt_solve_kernel

    if path == "triton":
        return launch("fused", gdn_fwd_intra_fused_kernel, (k, v, g_arg, beta, cu_arg, ci_arg, T),
                      out=(w_type, u_type, A_type), grid=head_fastest,
                      H=H, Hg=Hg, K=K, V=V, BT=BT, BC=BC, BV=_block(V), **flags)
    if path in ("split", "A"):  # the A kernel stores A whole
        A = launch("A", gdn_fwd_intra_A_kernel, (k, g_arg, beta, cu_arg, ci_arg, T),
                   out=A_type, grid=head_fastest, H=H, Hg=Hg, K=K, BT=BT, BC=BC, **flags, SUM_G=sum_g)
        if path == "A":
            return (A,)
    else:
        A = launch("kkt_solve", chunk_gated_delta_rule_fwd_kkt_solve_kernel,
                   (k, g_arg, beta, cu_arg, ci_arg, T), out=A_type, grid=chunk_major,
                   zeroed=True,  # the kernel writes the lower blocks only, as in the seed
                   H=H, Hg=Hg, K=K, BT=BT, BC=BC, **flags)
    w, u = recompute_w_u_triton(k, v, g, beta, A, cu_seqlens, chunk_indices)
    return w, u, A


def recompute_w_u_triton(k, v, g, beta, A, cu_seqlens=None, chunk_indices=None):
    """``(w, u)`` from a stored ``A [B, T, H, 64]`` (``kernels/recompute_w_u.py``):
    the second stage of the split and seed paths, and the backward's recompute."""
    from .kernels.recompute_w_u import recompute_w_u_fwd_kernel

    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    is_varlen = cu_seqlens is not None
    NT = chunk_indices.shape[0] if is_varlen else cdiv(T, 64)
    dummy = jnp.zeros((1,), jnp.int32)
    flags = dict(USE_G=g is not None, IS_VARLEN=is_varlen, DOT_PRECISION=dot_precision())
    return launch("recompute_w_u", recompute_w_u_fwd_kernel,
                  (k, v, beta, dummy if g is None else g, A, cu_seqlens if is_varlen else dummy,
                   chunk_indices if is_varlen else dummy, T),
                  out=(jax.ShapeDtypeStruct((B, T, H, K), k.dtype),
                       jax.ShapeDtypeStruct((B, T, H, V), v.dtype)),
                  grid=head_fastest_grid(NT, H, B), H=H, Hg=Hg, K=K, V=V, BT=64, **wu_blocks(K, V),
                  **flags)
