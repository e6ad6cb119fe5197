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


def fastest_triton_path(H: int, Hg: int) -> str:
    """The fastest Triton path, as measured on an H200 under ``jax.jit``
    (README, Speed): with GQA (``H > Hg``) the split path (0.577 ms at B=8,
    T=4096, Hg=16, H=32 and 0.659 ms packed, against the seed's 0.677 and
    0.791 and the one kernel's 0.730 and 0.788); without GQA the one-kernel
    path (0.145 ms at K=V=256 and 0.075 ms at B=4, T=2048, H=8, against the
    split's 0.148 and 0.078)."""
    return "split" if H > Hg else "triton"


def resolve_impl(op: str, impl: str, *, H: int = 1, Hg: int = 1) -> str:
    """``"triton"``, ``"split"``, ``"seed"`` or ``"reference"`` for the ``impl``
    the user asked for: ``"auto"`` is the fastest path here (on an NVIDIA GPU
    the fastest Triton path for ``H`` value heads and ``Hg`` key heads,
    :func:`fastest_triton_path`; elsewhere the jnp reference)."""
    if impl == "auto":
        return fastest_triton_path(H, Hg) if cuda_available() else "reference"
    if impl in ("triton", "split", "seed") and not cuda_available():
        raise RuntimeError(
            f"{op}: impl={impl!r} needs an NVIDIA GPU as JAX's default backend, but "
            f"JAX runs on {jax.default_backend()!r}; use impl='auto' or impl='reference'"
        )
    return impl
