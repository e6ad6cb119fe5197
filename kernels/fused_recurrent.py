"""The GDN forward one token at a time, with the state on chip: decode and short prefills.

Written from docs/math.md's per-token recurrence. One program per (sequence,
value head, block of ``BV`` value columns) loads its state tile ``S [K, BV]``
once (float32 in registers, whatever the stored dtype), runs the sequence's
tokens in order::

    S    = exp(a_t) S
    v'_t = beta_t (v_t - S^T k_t)
    S    = S + k_t v'_t^T
    o_t  = S^T (scale q_t)

and stores the tile once. The options of :mod:`gdn_jax.options` are fused in:
q/k L2-normalised (``x / sqrt(sum(x * x) + 1e-6)``), the gate from its raw
input (``a = -exp(A_log[h]) * softplus(g + dt_bias[h])``), beta from logits
(``sigmoid``, ``2 sigmoid`` with ``NEG_EIGVAL``).

The state is the memory traffic of a decode step (q, k, v are a few hundred
bytes a token): each program reads and writes its tile with one masked
access each, contiguous along the state's last dim (``V`` for ``[.., K, V]``
states, ``K`` for ``STATE_V_FIRST`` ``[.., V, K]`` ones; the tile in
registers is ``[K, BV]`` in both, and Triton lays the access out along the
contiguous dim). ``BV`` and the warps per program are the autotuned configs.

States: ``h0`` holds the initial states, ``[N, H, K, V]`` or, with
``USE_POOL``, a pool ``[P, H, K, V]`` whose row ``state_indices[n]`` is
sequence ``n``'s (an index outside ``[0, P)`` marks a sequence that owns no
row: it starts from zeros and writes nothing). ``IN_PLACE`` writes the final
state back through ``h0`` (the JAX launch aliases it to an output); otherwise
``STORE_FINAL`` writes it to ``ht``.

Program ids: axis 0 only, the V block fastest, then the value head, then the
sequence (programs that read the same q/k rows run side by side). Offsets of
rows and states are 64-bit. Plain pointer arithmetic with masks. Parameter
order follows jax-triton: inputs, the scalars, the outputs, the constexprs.
"""
import triton
import triton.language as tl

from .chunk_fwd import program_heads, state_tile

L2NORM_EPS = tl.constexpr(1e-6)


def _configs():
    """``(BV, num_warps)`` with 16 to 64 state values per thread at ``K = 128``
    (fewer leave the SM short of loads in flight, more spill), from
    flash-linear-attention's ``BV = 8`` on one warp to the whole state on 8."""
    pairs = [(8, 1), (8, 2), (16, 1), (16, 2), (16, 4), (32, 2), (32, 4), (32, 8), (64, 4),
             (64, 8), (128, 8)]
    return [triton.Config({"BV": BV}, num_warps=w, num_stages=2) for BV, w in pairs]


@triton.jit
def l2_normalized(x, ON: tl.constexpr):
    """``x / sqrt(sum(x * x) + 1e-6)`` where ``ON``, else ``x``."""
    if ON:
        x = x * tl.rsqrt(tl.sum(x * x) + L2NORM_EPS)
    return x


@triton.jit
def token_inputs(p_q, p_k, p_v, p_g, p_beta, m_k, m_v, live):
    """One token's ``q, k [BK]``, ``v [BV]``, gate and beta in float32 (zeros where not ``live``)."""
    # tl.where, not m_k & live: triton 3.9's interpreter makes a mask of another
    # dtype from a vector & a scalar, and refuses it
    m_k = tl.where(live, m_k, False)
    m_v = tl.where(live, m_v, False)
    b_q = tl.load(p_q, mask=m_k, other=0).to(tl.float32)
    b_k = tl.load(p_k, mask=m_k, other=0).to(tl.float32)
    b_v = tl.load(p_v, mask=m_v, other=0).to(tl.float32)
    b_a = tl.load(p_g, mask=live, other=0).to(tl.float32)
    b_beta = tl.load(p_beta, mask=live, other=0).to(tl.float32)
    return b_q, b_k, b_v, b_a, b_beta


@triton.autotune(
    configs=_configs(),
    key=["H", "Hg", "K", "V", "BK", "USE_H0", "STORE_FINAL", "IN_PLACE", "IS_VARLEN", "USE_POOL",
         "STATE_V_FIRST"],
)
@triton.jit(do_not_specialize=["T", "P"])
def gdn_fused_recurrent_kernel(
    q,
    k,
    v,
    g,
    beta,
    A_log,
    dt_bias,
    cu_seqlens,
    state_indices,
    h0,
    scale,
    T,
    P,
    o,
    ht,
    H: tl.constexpr,
    Hg: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_H0: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    IN_PLACE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    USE_POOL: tl.constexpr,
    STATE_V_FIRST: tl.constexpr,
    L2NORM_Q: tl.constexpr,
    L2NORM_K: tl.constexpr,
    GATE_IN_KERNEL: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    BETA_SIGMOID: tl.constexpr,
    NEG_EIGVAL: tl.constexpr,
):
    i_v, i_h, i_n, i_hk, bos, seq_len = program_heads(cu_seqlens, T, H, Hg, V, BV, IS_VARLEN)

    if USE_POOL:
        row = tl.load(state_indices + i_n).to(tl.int64)
        owns = (row >= 0) & (row < P)
        s_offsets, s_mask = state_tile(tl.where(owns, row, 0), i_h, i_v, H, K, V, BK, BV,
                                       STATE_V_FIRST)
        s_mask = tl.where(owns, s_mask, False)  # not s_mask & owns: see token_inputs
    else:
        s_offsets, s_mask = state_tile(i_n, i_h, i_v, H, K, V, BK, BV, STATE_V_FIRST)
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_s = tl.load(h0 + s_offsets, mask=s_mask, other=0).to(tl.float32)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    # The sequence's first row, at this program's heads.
    p_q = q + (bos * Hg + i_hk) * K + o_k
    p_k = k + (bos * Hg + i_hk) * K + o_k
    p_v = v + (bos * H + i_h) * V + o_v
    p_o = o + (bos * H + i_h) * V + o_v
    p_g = g + bos * H + i_h
    p_beta = beta + bos * H + i_h
    if GATE_IN_KERNEL:
        b_decay_rate = -tl.exp(tl.load(A_log + i_h).to(tl.float32))
        b_dt_bias = 0.0
        if HAS_DT_BIAS:
            b_dt_bias = tl.load(dt_bias + i_h).to(tl.float32)

    # Each token's inputs are loaded while the one before is computed (the
    # loads past the last token are masked off: no memory traffic).
    b_q, b_k, b_v, b_a, b_beta = token_inputs(p_q, p_k, p_v, p_g, p_beta, m_k, m_v, seq_len > 0)
    for i_t in range(0, seq_len):
        p_q += Hg * K
        p_k += Hg * K
        p_v += H * V
        p_g += H
        p_beta += H
        n_q, n_k, n_v, n_a, n_beta = token_inputs(p_q, p_k, p_v, p_g, p_beta, m_k, m_v,
                                                  i_t + 1 < seq_len)
        b_q = l2_normalized(b_q, L2NORM_Q) * scale
        b_k = l2_normalized(b_k, L2NORM_K)
        if GATE_IN_KERNEL:  # -exp(A_log) * softplus(raw + dt_bias)
            x = b_a + b_dt_bias
            b_a = b_decay_rate * (tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))))
        if BETA_SIGMOID:
            b_beta = tl.sigmoid(b_beta)
            if NEG_EIGVAL:
                b_beta = 2.0 * b_beta

        b_s = b_s * tl.exp(b_a)
        b_vn = b_beta * (b_v - tl.sum(b_s * b_k[:, None], 0))
        b_s += b_k[:, None] * b_vn[None, :]
        b_o = tl.sum(b_s * b_q[:, None], 0)
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_v)
        p_o += H * V
        b_q, b_k, b_v, b_a, b_beta = n_q, n_k, n_v, n_a, n_beta

    if STORE_FINAL:
        if IN_PLACE:
            tl.store(h0 + s_offsets, b_s.to(h0.dtype.element_ty), mask=s_mask)
        else:
            tl.store(ht + s_offsets, b_s.to(ht.dtype.element_ty), mask=s_mask)
