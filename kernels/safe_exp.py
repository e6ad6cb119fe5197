"""Small ``@triton.jit`` helpers shared by the kernels."""
import triton
import triton.language as tl


@triton.jit
def safe_exp(x):
    """``exp(x)`` where ``x <= 0``, else 0 (guards the gate factor against overflow)."""
    return tl.exp(tl.where(x <= 0, x, float("-inf")))
