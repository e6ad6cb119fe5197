"""Which implementation ``impl="auto"`` runs: Triton on a CUDA GPU, jnp elsewhere."""
from __future__ import annotations

import functools

import jax


@functools.cache
def cuda_available() -> bool:
    """True when JAX's default backend is an NVIDIA GPU (CUDA, not ROCm)."""
    if jax.default_backend() != "gpu":
        return False
    version = str(getattr(jax.devices()[0].client, "platform_version", "")).lower()
    return "rocm" not in version


def fastest_triton_path(H: int, Hg: int, varlen: bool) -> str:
    """The faster of the two Triton paths, as measured on an H200 (README, speed):
    the seed's two kernels for fixed-length input with GQA (``H > Hg``: their
    chunk-major grid runs the value heads of one key head close enough together
    to share ``k`` in L2; 1.02x to 1.11x faster at B=8, T=1024..8192, Hg=16,
    H=32), the one-kernel path otherwise (packed varlen with GQA, no GQA:
    0.61x to 0.98x of the seed path's time)."""
    return "seed" if not varlen and H > Hg else "triton"


def resolve_impl(op: str, impl: str, *, H: int = 1, Hg: int = 1, varlen: bool = False) -> str:
    """``"triton"``, ``"seed"`` or ``"reference"`` for the ``impl`` the user
    asked for: ``"auto"`` is the fastest path here (on an NVIDIA GPU the faster
    Triton path for ``H`` value heads, ``Hg`` key heads and (packed) varlen
    input, :func:`fastest_triton_path`; elsewhere the jnp reference)."""
    if impl == "auto":
        return fastest_triton_path(H, Hg, varlen) if cuda_available() else "reference"
    if impl in ("triton", "split", "seed") and not cuda_available():
        raise RuntimeError(
            f"{op}: impl={impl!r} needs an NVIDIA GPU as JAX's default backend, but "
            f"JAX runs on {jax.default_backend()!r}; use impl='auto' or impl='reference'"
        )
    return impl
