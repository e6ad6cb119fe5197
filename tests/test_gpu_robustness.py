"""GPU robustness: tensors past 2^31 elements, B * H past the 65535 grid limit,
NaN isolation, determinism, many packed sequences. Skipped without a CUDA GPU."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from gdn_jax.backend import cuda_available
from inputs import as_f64, make_inputs, many_sequences
from isolation import check_nan_isolation
from numpy_reference import check_against_numpy, fwd_intra_numpy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU as JAX's default backend"),
]


def fwd(k, v, g, beta, cu=None, impl="triton"):
    return jax.jit(lambda k, v, g, beta, cu: gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu, impl=impl))(
        k, v, g, beta, cu)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def big_inputs(B, T, H, D, seed=0):
    """bf16 k, v on the device without a host copy (a NumPy draw would take minutes)."""
    kk, kv, kb, ka = jax.random.split(jax.random.key(seed), 4)
    k = jax.random.normal(kk, (B, T, H, D), jnp.bfloat16)
    k32 = k.astype(jnp.float32)  # fused under jit: no float32 copy of the whole tensor
    k = (k32 * jax.lax.rsqrt(jnp.sum(k32 * k32, axis=-1, keepdims=True))).astype(jnp.bfloat16)
    v = jax.random.normal(kv, (B, T, H, D), jnp.bfloat16)
    beta = jax.nn.sigmoid(jax.random.normal(kb, (B, T, H), jnp.float32))
    a = 0.3 * jax.random.uniform(ka, (B, T, H), jnp.float32)  # per-step gate sizes
    return k, v, -a, beta


def check_slice(outs, k, v, g, beta, b, s, e, heads):
    """Rows [s, e) (one whole sequence or whole chunks of one) of batch row b,
    value heads `heads`, against the float64 reference of that slice alone."""
    sl = lambda x: x[b:b + 1, s:e][:, :, heads]  # noqa: E731
    ref = fwd_intra_numpy(*as_f64(sl(k), sl(v), sl(g), sl(beta)))
    return check_against_numpy([sl(o) for o in outs], ref, "bfloat16", 1, e - s)


def chunk_gates(a, starts):
    """A valid chunk-local cumulative gate without a long float32 cumsum:
    g = -(j + 1) * a, j the row inside its 64-chunk (chunks counted from each
    sequence start), a in (0, 0.3) per (row, token, head)."""
    pos = jnp.arange(a.shape[1])
    st = jnp.asarray(starts)
    seq_start = st[jnp.searchsorted(st, pos, side="right") - 1]
    j = (pos - seq_start) % 64
    return -(j[None, :, None] + 1).astype(jnp.float32) * (0.05 * a / 0.3)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["packed", "fixed"])
def test_past_2_31_elements(layout, record_errors):
    H, D = 32, 128
    if layout == "packed":  # B = 1, T = 2^20: bos * H * D reaches 2^32
        B, T = 1, 2**20
        cu = [0, 1000, T - 130, T]
    else:  # B = 2: the second row starts at bos = T, bos * H * D > 2^31
        B, T = 2, 2**19 + 37
        cu = None
    assert B * T * H * D > 2**31
    k, v, a, beta = big_inputs(B, T, H, D)
    g = chunk_gates(-a, [0] if cu is None else cu[:-1])
    outs = fwd(k, v, g, beta, None if cu is None else jnp.asarray(cu, jnp.int32))
    jax.block_until_ready(outs)
    heads = slice(H - 2, H)
    if cu is None:
        last = (T // 64) * 64  # last full-chunk boundary; check the last two chunks + tail
        errs = check_slice(outs, k, v, g, beta, B - 1, last - 64, T, heads)
        check_slice(outs, k, v, g, beta, 0, 0, 130, heads)
    else:
        errs = check_slice(outs, k, v, g, beta, 0, cu[-2], cu[-1], heads)
        check_slice(outs, k, v, g, beta, 0, 0, 1000, heads)
    record_errors("gpu>2^31", "bfloat16", errs)


def test_batch_times_heads_past_grid_limit(record_errors):
    B, T, Hg, H, D = 4096, 40, 8, 32, 32  # B * H = 131072 > 65535
    k, v, g, beta = make_inputs(0, B, T, Hg, H, D, D, "bfloat16")
    outs = fwd(k, v, g, beta)
    ref = fwd(k, v, g, beta, impl="reference")
    for o, r in zip(outs, ref):
        np.testing.assert_allclose(np.asarray(o.astype(jnp.float32)), np.asarray(r.astype(jnp.float32)),
                                   rtol=0.05, atol=0.02)
    rows = slice(B - 3, B)
    sub = [x[rows] for x in (k, v, g, beta)]
    errs = check_against_numpy([o[rows] for o in outs], fwd_intra_numpy(*as_f64(*sub)), "bfloat16", 3, T)
    record_errors("gpu grid", "bfloat16", errs)


@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_nan_isolation(poison):
    check_nan_isolation(fwd, poison, "bfloat16")


def test_deterministic_across_calls_and_autotuning():
    k, v, g, beta = make_inputs(3, 2, 1000, 4, 8, 128, 128, "bfloat16")
    first = fwd(k, v, g, beta)  # a new jit: compiles and autotunes
    again = fwd(k, v, g, beta)  # another new jit: autotunes again
    f = jax.jit(lambda *a: gdn_jax.fwd_intra(*a, impl="triton"))
    same1, same2 = f(k, v, g, beta), f(k, v, g, beta)
    for outs in (again, same1, same2):
        for a, b in zip(first, outs):
            np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)))


def test_thousand_random_sequences(record_errors):
    cu = many_sequences(4, max_len=130)
    T = int(cu[-1])
    k, v, g, beta = make_inputs(5, 1, T, 1, 2, 64, 64, "bfloat16", cu_seqlens=list(cu))
    outs = fwd(k, v, g, beta, jnp.asarray(cu))
    ref = fwd_intra_numpy(*as_f64(k, v, g, beta), cu_seqlens=cu)
    record_errors("gpu 1000seq", "bfloat16", check_against_numpy(outs, ref, "bfloat16", 1, T, list(cu)))
    for n in [1, 2, 3, 4, 700]:  # a few sequences run alone give the same bits
        s, e = int(cu[n]), int(cu[n + 1])
        alone = fwd(k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e])
        for a, b in zip(outs, alone):
            np.testing.assert_array_equal(np.asarray(a[:, s:e].astype(jnp.float32)),
                                          np.asarray(b.astype(jnp.float32)))
