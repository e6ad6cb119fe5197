"""Which implementation ``impl="auto"`` runs: Triton on a CUDA GPU, jnp elsewhere."""
from __future__ import annotations

import functools

import jax

from .validate import kernel_dtypes


@functools.cache
def cuda_available() -> bool:
    """True when JAX's default backend is an NVIDIA GPU (CUDA, not ROCm)."""
    if jax.default_backend() != "gpu":
        return False
    version = str(getattr(jax.devices()[0].client, "platform_version", "")).lower()
    return "rocm" not in version


@functools.cache
def compute_capability_major() -> int:
    """The major compute capability of JAX's first device (an NVIDIA GPU)."""
    return int(str(jax.devices()[0].compute_capability).split(".")[0])


# Programs per launch up to which the one kernel beats the split path.
ONE_KERNEL_MAX_PROGRAMS = 2048


def fastest_triton_path(programs: int) -> str:
    """The fastest Triton path for a launch of ``programs`` = chunks x value
    heads x batch rows (64-row chunks), as measured on an H200 (jax 0.11.2,
    jax-triton 0.4.1, triton 3.6.0, fixed configs, bf16, ms per call;
    docs/performance.md): the split path at 16384 programs (B=8, T=4096,
    Hg=16, H=32: 0.414 against the one kernel's 0.459) and at 4096 (B=8,
    T=1024: 0.111 against 0.122); the one kernel at 2048 (B=2, T=4096,
    H=Hg=16, K=V=256: 0.106 against 0.153) and at 1024 (B=4, T=2048, H=8:
    0.050 against 0.061, host-bound). Autotuned under jax-triton 0.3.1 the
    order is the same (at 16384, 2048 and 1024 programs: split 0.403, 0.116,
    0.056; one kernel 0.461, 0.105, 0.051). The crossover lies between 2048 and 4096 programs; 2048
    is the measured side."""
    return "triton" if programs <= ONE_KERNEL_MAX_PROGRAMS else "split"


def impl_for(B: int, T: int, H: int, impl: str = "auto", *, chunks: int | None = None,
             chunk_size: int = 64, op: str = "fwd_intra", gluon: bool = False) -> str:
    """The path :func:`gdn_jax.fwd_intra` runs for ``impl`` on ``B`` batch rows
    of ``T`` tokens with ``H`` value heads: :func:`resolve_impl` with the
    launch's programs, ``chunks x H x B``. ``chunks`` is the packed work
    list's length (``chunk_indices.shape[0]``), by default ``cdiv(T,
    chunk_size)``, the chunks of one row of a fixed-length batch. ``gluon``:
    the inputs fit the Gluon kernel and this machine runs it
    (:func:`gdn_jax.gluon_launch.gluon_fits`)."""
    chunks = -(-T // chunk_size) if chunks is None else chunks
    return resolve_impl(op, impl, programs=chunks * H * B, gluon=gluon)


def resolve_impl(op: str, impl: str, *, programs: int = 0, gluon: bool = False) -> str:
    """``"gluon"``, ``"triton"``, ``"split"``, ``"seed"`` or ``"reference"``
    for the ``impl`` the user asked for: ``"auto"`` is the fastest path here
    (on an NVIDIA GPU the fastest Triton path for a launch of ``programs``
    chunk-head programs, :func:`fastest_triton_path`, and the Gluon kernel in
    place of the split path where ``gluon``; elsewhere the jnp reference)."""
    if impl == "auto":
        if not cuda_available():
            return "reference"
        path = fastest_triton_path(programs)
        return "gluon" if path == "split" and gluon else path
    if impl in ("gluon", "triton", "split", "seed") and not cuda_available():
        raise RuntimeError(
            f"{op}: impl={impl!r} needs an NVIDIA GPU as JAX's default backend, but "
            f"JAX runs on {jax.default_backend()!r}; use impl='auto' or impl='reference'"
        )
    return impl


def runs_triton(op: str, impl: str, *arrays) -> bool:
    """Whether an op's Triton kernels run: ``"auto"`` on an NVIDIA GPU with
    kernel dtypes (float64 takes the jnp path on every backend), any Triton
    ``impl`` (which needs a GPU: :func:`resolve_impl` says so)."""
    if impl == "auto":
        return cuda_available() and kernel_dtypes(*arrays)
    return resolve_impl(op, impl) != "reference"
