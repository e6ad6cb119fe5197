"""The jnp reference (gdn_jax.reference.fwd_intra_reference) against the
float64 NumPy implementation written from docs/math.md."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax.reference import fwd_intra_reference
from inputs import as_f64, make_inputs, many_sequences
from isolation import check_nan_isolation
from numpy_reference import check_against_numpy, fwd_intra_numpy

# The reference computes in float32 (HIGHEST precision): far tighter than INTRA_TOL.
TIGHT = {"w": 1e-5, "u": 1e-5, "A": 1e-5}


@pytest.mark.parametrize("T", [1, 63, 64, 65, 130])
@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("use_g", [True, False])
def test_fixed_length(T, ratio, use_g, record_errors):
    B, Hg, K, V = 2, 1, 32, 16
    k, v, g, beta = make_inputs(T * 10 + ratio, B, T, Hg, Hg * ratio, K, V, use_g=use_g)
    outs = fwd_intra_reference(k, v, g, beta)
    ref = fwd_intra_numpy(*as_f64(k, v, g, beta))
    record_errors("reference", "float32", check_against_numpy(outs, ref, "float32", B, T, tol=TIGHT))


CU = [
    [0, 1, 1, 64, 130],  # length 1, empty, 63, 66
    [0, 0, 65, 65, 130, 131, 131],  # empty first, middle, last
    [0, 200],  # all tokens in one sequence
]


@pytest.mark.parametrize("cu", CU)
@pytest.mark.parametrize("traced", [False, True])
def test_varlen(cu, traced, record_errors):
    T, Hg, H, K, V = cu[-1], 2, 4, 32, 32
    k, v, g, beta = make_inputs(len(cu), 1, T, Hg, H, K, V, cu_seqlens=cu)
    cu_arr = jnp.asarray(cu, jnp.int32)
    if traced:
        outs = jax.jit(lambda *a, cu: fwd_intra_reference(*a, cu_seqlens=cu))(k, v, g, beta, cu=cu_arr)
    else:
        outs = fwd_intra_reference(k, v, g, beta, cu_seqlens=cu_arr)
    ref = fwd_intra_numpy(*as_f64(k, v, g, beta), cu_seqlens=cu)
    record_errors("reference", "float32", check_against_numpy(outs, ref, "float32", 1, T, cu, tol=TIGHT))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_inputs(dtype):
    """bf16/fp16 inputs: float32 math, outputs rounded once to the input dtype."""
    B, T, Hg, H, K, V = 1, 100, 2, 4, 32, 32
    k, v, g, beta = make_inputs(7, B, T, Hg, H, K, V, dtype)
    outs = fwd_intra_reference(k, v, g, beta)
    assert [o.dtype for o in outs] == [k.dtype, v.dtype, k.dtype]
    ref = fwd_intra_numpy(*as_f64(k, v, g, beta))
    eps = float(jnp.finfo(k.dtype).eps)
    check_against_numpy(outs, ref, dtype, B, T, tol=dict.fromkeys("wuA", eps))


def test_varlen_equals_each_sequence_alone():
    cu = [0, 5, 5, 70, 200]
    k, v, g, beta = make_inputs(3, 1, 200, 2, 4, 16, 16, cu_seqlens=cu)
    packed = fwd_intra_reference(k, v, g, beta, cu_seqlens=jnp.asarray(cu, jnp.int32))
    for s, e in zip(cu[:-1], cu[1:]):
        if e == s:
            continue
        alone = fwd_intra_reference(k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e])
        for p, a in zip(packed, alone):
            np.testing.assert_allclose(p[:, s:e], a, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_nan_isolation(poison):
    check_nan_isolation(lambda k, v, g, beta, cu: fwd_intra_reference(k, v, g, beta, cu_seqlens=cu), poison)


def test_thousand_random_sequences(record_errors):
    cu = many_sequences(13, max_len=100)
    T = int(cu[-1])
    k, v, g, beta = make_inputs(14, 1, T, 1, 2, 16, 16, cu_seqlens=list(cu))
    outs = jax.jit(lambda *a, cu: fwd_intra_reference(*a, cu_seqlens=cu))(k, v, g, beta, cu=jnp.asarray(cu))
    ref = fwd_intra_numpy(*as_f64(k, v, g, beta), cu_seqlens=cu)
    record_errors("reference", "float32", check_against_numpy(outs, ref, "float32", 1, T, list(cu), tol=TIGHT))
