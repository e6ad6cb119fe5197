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


def resolve_impl(op: str, impl: str) -> str:
    """``"triton"``, ``"seed"`` or ``"reference"`` for the ``impl`` the user
    asked for: ``"auto"`` is the fastest path here (the one-kernel Triton path
    on an NVIDIA GPU, else the jnp reference)."""
    if impl == "auto":
        return "triton" if cuda_available() else "reference"
    if impl in ("triton", "seed") and not cuda_available():
        raise RuntimeError(
            f"{op}: impl={impl!r} needs an NVIDIA GPU as JAX's default backend, but "
            f"JAX runs on {jax.default_backend()!r}; use impl='auto' or impl='reference'"
        )
    return impl
