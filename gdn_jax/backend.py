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
    """``"triton"`` or ``"reference"`` for the ``impl`` the user asked for."""
    if impl == "auto":
        return "triton" if cuda_available() else "reference"
    if impl == "triton" and not cuda_available():
        raise RuntimeError(
            f"{op}: impl='triton' needs an NVIDIA GPU as JAX's default backend, but "
            f"JAX runs on {jax.default_backend()!r}; use impl='auto' or impl='reference'"
        )
    return impl
