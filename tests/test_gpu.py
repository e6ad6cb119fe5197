"""The Triton path on an NVIDIA GPU against the float64 NumPy reference (at
docs/math.md's tolerances) and the jnp reference. Skipped where JAX has no CUDA GPU."""
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from gdn_jax.backend import cuda_available
from gdn_jax.triton_launch import seed_triton_missing
from inputs import as_f64, make_inputs
from numpy_reference import INTRA_TOL, check_against_numpy, fwd_intra_numpy, max_rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU as JAX's default backend"),
]

K = V = 128
DTYPES = ["float32", "bfloat16", "float16"]


@pytest.fixture(params=["triton", "split", "seed"])
def impl(request):
    """Every test runs every Triton path: the one kernel, the split (A kernel,
    then w/u) and the seed's two kernels (not on triton >= 3.9)."""
    if request.param == "seed" and seed_triton_missing():
        pytest.skip(seed_triton_missing())
    return request.param


@functools.partial(jax.jit, static_argnames="impl")
def run(k, v, g, beta, cu_seqlens=None, impl="triton"):
    return gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu_seqlens, impl=impl)


def assert_bit_equal(a, b):
    np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)))


def check(impl, dtype, k, v, g, beta, cu=None, record=None):
    B, T = k.shape[:2]
    cu_arr = None if cu is None else jnp.asarray(cu, jnp.int32)
    outs = run(k, v, g, beta, cu_arr, impl=impl)
    ref = fwd_intra_numpy(*as_f64(k, v, g, beta), cu_seqlens=cu)
    errs = check_against_numpy(outs, ref, dtype, B, T, cu)
    # The jnp reference (float32 math, rounded once to the dtype) as the yardstick:
    jref = run(k, v, g, beta, cu_arr, impl="reference")
    for name, o, r in zip("wuA", outs, jref):
        r64 = np.asarray(r.astype(jnp.float32), np.float64)
        e = max_rel_err(np.asarray(o.astype(jnp.float32)), r64, B, T, cu)
        assert e <= INTRA_TOL[dtype][name], f"{name} vs jnp reference: {e:.3g}"
    if record is not None:
        record(f"gpu {impl}", dtype, errs)
    return outs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,ratio", [(1, 1), (63, 2), (64, 4), (65, 1), (1000, 2), (4096, 4)])
def test_fixed_length(impl, dtype, T, ratio, record_errors):
    B, Hg = 2, 2
    check(impl, dtype, *make_inputs(T + ratio, B, T, Hg, Hg * ratio, K, V, dtype), record=record_errors)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ratio", [1, 2, 4])
def test_gqa_and_no_gate(impl, dtype, ratio, record_errors):
    for use_g in (True, False):
        check(impl, dtype, *make_inputs(ratio, 1, 300, 4, 4 * ratio, K, V, dtype, use_g=use_g),
              record=record_errors)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("KV", [(256, 256), (96, 160), (64, 32)], ids=lambda kv: f"K{kv[0]}V{kv[1]}")
def test_head_dims(impl, dtype, KV, record_errors):
    """Head dims other than 128: two 128-wide w/u column tiles (256), masked
    tail columns (96, 160), tiles narrower than 64."""
    check(impl, dtype, *make_inputs(KV[1], 1, 200, 2, 4, *KV, dtype), record=record_errors)


VARLEN = [
    [0, 1, 1, 64, 65, 130, 193, 1193],  # lengths 1, 0, 63, 1, 65, 63, 1000
    [0, 0, 700, 700, 1300, 1300],  # empty first, middle and last
    [0, 4096],  # all tokens in one sequence
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cu", VARLEN, ids=["mixed", "empties", "one"])
def test_varlen_traced(impl, dtype, cu, record_errors):
    check(impl, dtype, *make_inputs(len(cu), 1, cu[-1], 2, 4, K, V, dtype, cu_seqlens=cu), cu=cu,
          record=record_errors)


def test_varlen_concrete_equals_traced_and_per_sequence(impl):
    cu = VARLEN[0]
    k, v, g, beta = make_inputs(9, 1, cu[-1], 2, 4, K, V, "bfloat16", cu_seqlens=cu)
    cu_arr = jnp.asarray(cu, jnp.int32)
    traced = run(k, v, g, beta, cu_arr, impl=impl)
    concrete = gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu_arr, impl=impl)
    for a, b in zip(traced, concrete):
        assert_bit_equal(a, b)
    for s, e in zip(cu[:-1], cu[1:]):
        if e > s:
            alone = run(k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], impl=impl)
            for a, b in zip(traced, alone):
                assert_bit_equal(a[:, s:e], b)


def test_vmap_folds_examples_into_one_launch(impl):
    """``jax.vmap`` of every Triton path (jax-triton itself has no vmap rule):
    fixed length and packed, each example equal to its own launch, bit for
    bit (the same kernels and configs on the same rows)."""
    def assert_same(batched, alone, e):
        for a, b in zip(batched, alone):
            assert_bit_equal(a[e], b)

    draws = [make_inputs(20 + e, 2, 130, 2, 4, K, V, "bfloat16") for e in range(3)]
    k, v, g, beta = (jnp.stack(x) for x in zip(*draws))
    batched = jax.jit(jax.vmap(lambda *a: gdn_jax.fwd_intra(*a, impl=impl)))(k, v, g, beta)
    for e, d in enumerate(draws):
        assert_same(batched, run(*d, impl=impl), e)
    cus = [VARLEN[0], [0, 0, 700, 700, 1000, 1193, 1193, 1193], [0] + [1193] * 7]  # 7 segments each
    draws = [make_inputs(30 + e, 1, 1193, 2, 4, K, V, "bfloat16", cu_seqlens=cu) for e, cu in enumerate(cus)]
    k, v, g, beta = (jnp.stack(x) for x in zip(*draws))
    cu = jnp.asarray(cus, jnp.int32)
    batched = jax.jit(jax.vmap(lambda *a: gdn_jax.fwd_intra(*a[:4], cu_seqlens=a[4], impl=impl)))(
        k, v, g, beta, cu)
    for e, d in enumerate(draws):
        assert_same(batched, run(*d, cu[e], impl=impl), e)


def test_float64_rejected(impl):
    with jax.enable_x64(True):
        k, v, g, beta = (None if x is None else x.astype(jnp.float64)
                         for x in make_inputs(0, 1, 10, 1, 1, 16, 16))
        with pytest.raises(TypeError, match="`k` in bfloat16, float16 or float32, got float64"):
            gdn_jax.fwd_intra(k, v, g, beta, impl=impl)
        gdn_jax.fwd_intra(k, v, g, beta, impl="reference")  # the reference takes float64


def test_launch_passes_no_deprecated_jax_triton_argument(impl):
    """jax-triton 0.4 deprecates ``out_shape=`` and ``zeroed_outputs=`` (the
    seed path's zeroed ``A``, kept on purpose: ``triton_launch.triton_call``):
    a fresh trace of every path passes no such warning on to the user.
    Whether the zeroing works is checked by the tests above (they compare
    ``A`` whole, its upper blocks with zeros)."""
    k, v, g, beta = make_inputs(7, 1, 130, 2, 4, K, V, "bfloat16")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.block_until_ready(jax.jit(lambda *a: gdn_jax.fwd_intra(*a, impl=impl))(k, v, g, beta))
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
            if issubclass(w.category, DeprecationWarning) and "gdn_jax" in w.filename]
    assert not ours, ours


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_kernel_path_agrees_with_seed_path(dtype):
    """Both Triton paths compute A in float32 and round it to k's dtype before
    w and u, so they differ only by float32 summation order and the rounding it
    flips: within docs/math.md's tolerances of each other, whatever float64 says."""
    if seed_triton_missing():
        pytest.skip(seed_triton_missing())
    cu = VARLEN[0]
    k, v, g, beta = make_inputs(11, 1, cu[-1], 2, 8, K, V, dtype, cu_seqlens=cu)
    cu_arr = jnp.asarray(cu, jnp.int32)
    fused, seed = run(k, v, g, beta, cu_arr, impl="triton"), run(k, v, g, beta, cu_arr, impl="seed")
    for name, a, b in zip("wuA", fused, seed):
        a64, b64 = (np.asarray(x.astype(jnp.float32), np.float64) for x in (a, b))
        e = max_rel_err(a64, b64, 1, cu[-1], cu)
        assert e <= INTRA_TOL[dtype][name], f"{name}: one-kernel vs seed path {e:.3g}"
