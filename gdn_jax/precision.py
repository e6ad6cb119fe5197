"""Compute precision of the plain-jnp paths."""
import jax
import jax.numpy as jnp

# jnp's default float32 matmul on a GPU is tf32; the references use full float32.
HIGHEST = jax.lax.Precision.HIGHEST


def compute_dtype(*dtypes) -> jnp.dtype:
    """float32, or float64 when an input is float64 (with x64 enabled)."""
    return jnp.promote_types(jnp.float32, jnp.result_type(*dtypes))
