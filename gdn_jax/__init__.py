"""gdn-jax: the fused Triton GPU path of the Gated DeltaNet chunked forward, from JAX.

Public API:

- :func:`fwd_intra` (``w, u, A`` of every 64-row chunk; Triton on an NVIDIA GPU,
  plain jnp elsewhere),
- :func:`prepare_chunk_indices` (chunk work list of a packed batch),
- :mod:`gdn_jax.reference` (plain-jnp references).
"""
from . import reference
from .chunk_indices import prepare_chunk_indices
from .intra import fwd_intra

__all__ = ["fwd_intra", "prepare_chunk_indices", "reference"]
__version__ = "0.1.0"
