"""chunk_gated_delta_rule against the per-token recurrence (CPU) and Triton against jnp (GPU)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy_reference import rel_err as rel
from test_naive_recurrent import gdn_numpy, make_inputs

from gdn_jax.backend import cuda_available
from gdn_jax.chunk import chunk_gated_delta_rule
from gdn_jax.naive_recurrent import naive_recurrent_gated_delta_rule

chunk_jit = jax.jit(chunk_gated_delta_rule, static_argnames=("output_final_state", "impl"))
naive_jit = jax.jit(naive_recurrent_gated_delta_rule, static_argnames=("output_final_state",))


@pytest.mark.parametrize("T,Hg,H,with_h0", [
    (1, 2, 2, False), (63, 2, 4, True), (65, 2, 2, True), (130, 2, 4, False), (130, 1, 1, True),
])
def test_matches_naive(T, Hg, H, with_h0):
    rng = np.random.default_rng(T + H)
    B, K, V = 2, 16, 8
    args = make_inputs(rng, B, T, Hg, H, K, V)
    h0 = rng.standard_normal((B, H, K, V)).astype(np.float32) if with_h0 else None
    o, final = chunk_jit(*args, initial_state=h0, output_final_state=True)
    o_ref, final_ref = naive_jit(*args, initial_state=h0, output_final_state=True)
    assert o.shape == (B, T, H, V) and o.dtype == jnp.float32
    assert final.shape == (B, H, K, V) and final.dtype == jnp.float32
    assert rel(o, o_ref) < 1e-4
    assert rel(final, final_ref) < 1e-4


def test_eager_matches_float64_loop():
    rng = np.random.default_rng(7)
    args = make_inputs(rng, 1, 70, 1, 2, 8, 4)
    o, final = chunk_gated_delta_rule(*args, scale=0.5)
    assert final is None
    assert rel(o, gdn_numpy(*args, scale=0.5)[0]) < 1e-4


def test_bf16_close_to_float32_recurrence():
    rng = np.random.default_rng(8)
    q, k, v, g, beta = make_inputs(rng, 1, 100, 2, 4, 16, 8, dtype=jnp.bfloat16)
    o, _ = chunk_jit(q, k, v, g, beta)
    assert o.dtype == jnp.bfloat16
    up = [x.astype(jnp.float32) for x in (q, k, v)]
    o_ref, _ = naive_jit(*up, g, beta)
    assert rel(o, o_ref) < 2e-2


CU = np.array([0, 0, 1, 70, 200, 203], np.int32)  # empty, length 1, 69, 130, 3


def _varlen_case():
    rng = np.random.default_rng(9)
    Hg, H, K, V = 1, 2, 16, 8
    args = make_inputs(rng, 1, int(CU[-1]), Hg, H, K, V)
    h0 = rng.standard_normal((len(CU) - 1, H, K, V)).astype(np.float32)
    return args, h0


@pytest.mark.parametrize("traced", [False, True])
def test_varlen_equals_each_sequence_alone(traced):
    args, h0 = _varlen_case()
    if traced:
        o, final = chunk_jit(*args, initial_state=h0, output_final_state=True,
                             cu_seqlens=jnp.asarray(CU))
    else:  # concrete cu_seqlens (a NumPy constant) inside jit: the exact chunk list
        o, final = jax.jit(lambda *a, h: chunk_gated_delta_rule(
            *a, initial_state=h, output_final_state=True, cu_seqlens=CU))(*args, h=h0)
    for n, (a, e) in enumerate(zip(CU[:-1], CU[1:])):
        if a == e:
            np.testing.assert_array_equal(final[n], h0[n])
            continue
        o_n, f_n = chunk_jit(*(x[:, a:e] for x in args), initial_state=h0[n:n + 1],
                             output_final_state=True)
        assert rel(o[:, a:e], o_n) < 1e-5, n
        assert rel(final[n], f_n[0]) < 1e-5, n


def test_varlen_nan_stays_in_its_sequence():
    args, h0 = _varlen_case()
    q, k, v, g, beta = args
    bad = v.copy()
    bad[0, 100, 1, 3] = np.nan  # inside sequence 3 = tokens [70, 200)
    cu = jnp.asarray(CU)
    o, final = chunk_jit(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    o_bad, final_bad = chunk_jit(q, k, bad, g, beta, initial_state=h0, output_final_state=True,
                                 cu_seqlens=cu)
    assert np.isnan(np.asarray(final_bad[3])).any()
    keep = np.r_[0:70, 200:203]
    np.testing.assert_array_equal(np.asarray(o_bad)[:, keep], np.asarray(o)[:, keep])
    for n in (0, 1, 2, 4):
        np.testing.assert_array_equal(final_bad[n], final[n])


def test_split_with_state_equals_one_call():
    rng = np.random.default_rng(10)
    B, T, Hg, H, K, V = 2, 150, 2, 4, 16, 8
    args = make_inputs(rng, B, T, Hg, H, K, V)
    h0 = rng.standard_normal((B, H, K, V)).astype(np.float32)
    o, final = chunk_jit(*args, initial_state=h0, output_final_state=True)
    o1, s1 = chunk_jit(*(x[:, :70] for x in args), initial_state=h0, output_final_state=True)
    o2, s2 = chunk_jit(*(x[:, 70:] for x in args), initial_state=s1, output_final_state=True)
    assert rel(jnp.concatenate([o1, o2], axis=1), o) < 1e-5
    assert rel(s2, final) < 1e-5


@pytest.mark.parametrize("change,exc,needle", [
    (lambda a: {**a, "q": a["q"][:, :, :1]}, ValueError, "`q`"),
    (lambda a: {**a, "k": a["k"][None]}, ValueError, "`k` must have rank 4"),
    (lambda a: {**a, "v": a["v"][:, :, :3]}, ValueError, "multiple of the key heads"),
    (lambda a: {**a, "beta": a["beta"][..., :1]}, ValueError, "`beta`"),
    (lambda a: {**a, "g": None}, TypeError, "`g`"),
    (lambda a: {**a, "q": a["q"].astype(jnp.bfloat16)}, TypeError, "`q` must have the dtype of `k`"),
    (lambda a: {**a, "cu_seqlens": np.array([0, 2, 4], np.int32)}, ValueError, "B must be 1"),
    (lambda a: {**a, "initial_state": np.zeros((2, 4, 8, 5), np.float32)}, ValueError,
     "`initial_state`"),
    (lambda a: {**a, "impl": "cuda"}, ValueError, "`impl`"),
    (lambda a: {**a, "scale": np.ones(2)}, ValueError, "`scale`"),
])
def test_bad_inputs(change, exc, needle):
    rng = np.random.default_rng(11)
    q, k, v, g, beta = make_inputs(rng, 2, 4, 2, 4, 8, 4)
    kwargs = change(dict(q=q, k=k, v=v, g=g, beta=beta))
    with pytest.raises(exc, match=needle):
        chunk_gated_delta_rule(**kwargs)


def test_bad_cu_seqlens_values():
    rng = np.random.default_rng(12)
    args = make_inputs(rng, 1, 10, 1, 1, 8, 4)
    with pytest.raises(ValueError, match=r"cu_seqlens\[-1\]"):
        chunk_gated_delta_rule(*args, cu_seqlens=np.array([0, 4, 9], np.int32))


# --------------------------------------------------------------------------- GPU

gpu = pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU (jax-triton)")
TOL = {jnp.float32: 2e-3, jnp.bfloat16: 2e-2}


def _triton_vs_reference(dtype, T, cu=None, jit_cu=False):
    rng = np.random.default_rng(T)
    B = 1 if cu is not None else 2
    Hg, H, K, V = 2, 4, 128, 128
    q, k, v, g, beta = make_inputs(rng, B, T, Hg, H, K, V, dtype=dtype)
    N = B if cu is None else len(cu) - 1
    h0 = 0.1 * rng.standard_normal((N, H, K, V)).astype(np.float32)
    cu = None if cu is None else (jnp.asarray(cu) if jit_cu else np.asarray(cu))
    o, final = chunk_jit(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                         cu_seqlens=cu, impl="triton")
    assert o.dtype == dtype
    up = [jnp.asarray(x).astype(jnp.float32) for x in (q, k, v)]  # bf16-rounded inputs
    o_ref, final_ref = chunk_jit(*up, g, beta, initial_state=h0, output_final_state=True,
                                 cu_seqlens=cu, impl="reference")
    assert bool(jnp.isfinite(o.astype(jnp.float32)).all())
    assert rel(o, o_ref) < TOL[dtype], rel(o, o_ref)
    assert rel(final, final_ref) < TOL[dtype], rel(final, final_ref)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("T", [1000, 4096])
def test_triton_matches_reference(dtype, T):
    _triton_vs_reference(dtype, T)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("jit_cu", [False, True])
def test_triton_matches_reference_varlen(dtype, jit_cu):
    _triton_vs_reference(dtype, 4096, cu=[0, 1, 700, 700, 2050, 4096], jit_cu=jit_cu)
