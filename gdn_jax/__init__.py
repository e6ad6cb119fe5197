"""gdn-jax: the fused Triton GPU path of the Gated DeltaNet chunked forward, from JAX.

Public API:

- :func:`fwd_intra` (``w, u, A`` of every 64-row chunk; Triton on an NVIDIA GPU,
  plain jnp elsewhere),
- :func:`chunk_gated_delta_rule` (the whole chunked GDN forward on top of
  ``fwd_intra``),
- :func:`fused_recurrent_gated_delta_rule` (the forward one token at a time,
  for decode: the state, or a pool of states, updated in place),
- :func:`prepare_chunk_indices` (chunk work list of a packed batch),
- :func:`checkify_cu_seqlens` (checks of a traced ``cu_seqlens`` under
  ``jax.experimental.checkify``),
- :mod:`gdn_jax.reference` (plain-jnp references: ``fwd_intra_reference``,
  ``naive_recurrent_gated_delta_rule``).
"""
from . import reference
from .chunk import chunk_gated_delta_rule
from .chunk_indices import prepare_chunk_indices
from .fused_recurrent import fused_recurrent_gated_delta_rule
from .intra import fwd_intra
from .validate import checkify_cu_seqlens

__all__ = ["fwd_intra", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule",
           "prepare_chunk_indices", "checkify_cu_seqlens", "reference"]
__version__ = "0.1.0"
