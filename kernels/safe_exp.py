"""Small ``@triton.jit`` helpers shared by the kernels."""
import triton
import triton.language as tl


@triton.jit
def safe_exp(x):
    """``exp(x)`` where ``x <= 0``, else 0 (guards the gate factor against overflow)."""
    return tl.exp(tl.where(x <= 0, x, float("-inf")))


# log2(e): g in base 2 (g LOG2E) makes exp(g_i - g_j) one exp2 (safe_exp2)
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def safe_exp2(x):
    """``2^x`` where ``x <= 0``, else 0: :func:`safe_exp` of ``x ln 2``, for
    gates given in base 2 (``g log2(e)``). ``tl.exp2`` is one ``ex2.approx.ftz``
    where ``tl.exp`` also scales its argument and guards against subnormal
    results (results below 2^-126 flush to zero here)."""
    return tl.exp2(tl.where(x <= 0, x, float("-inf")))


@triton.jit
def causal_decay(b_g, m_t, BT: tl.constexpr):
    """``[BT, BT]``: ``exp(g_i - g_j)`` for ``j <= i`` on the chunk's rows ``i``
    that ``m_t`` keeps, else 0 (``b_g [BT]``, the chunk-local cumulative log
    gates). Rows past the end stay out of the exponent: their gate reads as
    0, and ``exp(0 - g_j)`` overflows on strong gates."""
    o_t = tl.arange(0, BT)
    return tl.exp(tl.where((o_t[:, None] >= o_t[None, :]) & m_t[:, None], b_g[:, None] - b_g[None, :],
                           float("-inf")))
