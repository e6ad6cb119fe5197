"""The public API: shapes, dtypes, jit, concrete and traced cu_seqlens, g=None,
GQA, impl selection and every bad-input error."""
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from inputs import DTYPES, make_inputs


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_shapes_and_dtypes(dtype):
    B, T, Hg, H, K, V = 2, 65, 2, 4, 32, 16
    k, v, g, beta = make_inputs(0, B, T, Hg, H, K, V, dtype)
    w, u, A = gdn_jax.fwd_intra(k, v, g, beta)
    assert (w.shape, u.shape, A.shape) == ((B, T, H, K), (B, T, H, V), (B, T, H, 64))
    assert (w.dtype, u.dtype, A.dtype) == (k.dtype, v.dtype, k.dtype)


def test_jit_equals_eager_and_g_none():
    k, v, g, beta = make_inputs(1, 1, 100, 1, 2, 16, 16)
    for gg in (g, None):
        eager = gdn_jax.fwd_intra(k, v, gg, beta)
        jitted = jax.jit(gdn_jax.fwd_intra)(k, v, gg, beta)
        for a, b in zip(eager, jitted):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    no_gate = gdn_jax.fwd_intra(k, v, None, beta)
    zero_gate = gdn_jax.fwd_intra(k, v, jnp.zeros_like(g), beta)
    for a, b in zip(no_gate, zero_gate):  # g=None means every exp factor is 1
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_traced_and_concrete_cu_seqlens_agree():
    cu = [0, 3, 3, 70, 140]
    k, v, g, beta = make_inputs(2, 1, 140, 2, 4, 16, 16, cu_seqlens=cu)
    cu = jnp.asarray(cu, jnp.int32)
    concrete = gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu)
    traced = jax.jit(lambda cu: gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu))(cu)
    explicit = gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu,
                                 chunk_indices=gdn_jax.prepare_chunk_indices(cu))
    for a, b, c in zip(concrete, traced, explicit):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_gqa_shares_key_heads():
    """With H = 2 Hg, value heads 2j and 2j+1 read key head j."""
    k, v, g, beta = make_inputs(3, 1, 70, 2, 4, 16, 8)
    w, u, A = gdn_jax.fwd_intra(k, v, g, beta)
    for h in range(4):
        wh, uh, Ah = gdn_jax.fwd_intra(k[:, :, h // 2:h // 2 + 1], v[:, :, h:h + 1],
                                       g[:, :, h:h + 1], beta[:, :, h:h + 1])
        np.testing.assert_allclose(w[:, :, h:h + 1], wh, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(A[:, :, h:h + 1], Ah, rtol=1e-6, atol=1e-6)


def test_empty_inputs():
    k, v, g, beta = make_inputs(4, 2, 0, 1, 2, 16, 8)
    w, u, A = gdn_jax.fwd_intra(k, v, g, beta)
    assert (w.shape, u.shape, A.shape) == ((2, 0, 2, 16), (2, 0, 2, 8), (2, 0, 2, 64))


def test_numpy_inputs_accepted():
    k, v, g, beta = (np.asarray(x) for x in make_inputs(5, 1, 10, 1, 1, 16, 16))
    w, _, _ = gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=np.array([0, 4, 10], np.int32))
    assert isinstance(w, jax.Array)


@pytest.mark.parametrize("B,T,H,path", [
    (8, 4096, 32, "split"),  # the headline shape: 16384 programs
    (3, 4096, 16, "split"),  # 3072 programs
    (2, 4096, 16, "triton"),  # 2048 programs (K=V=256 in the benchmark): the one kernel
    (4, 2048, 8, "triton"),  # 1024 programs
    (1, 1, 1, "triton"),
])
def test_auto_picks_the_measured_fastest_triton_path(monkeypatch, B, T, H, path):
    monkeypatch.setattr(gdn_jax.backend, "cuda_available", lambda: True)
    assert gdn_jax.backend.impl_for(B, T, H) == path
    assert gdn_jax.backend.resolve_impl("fwd_intra", "auto", programs=-(-T // 64) * H * B) == path
    for impl in ("gluon", "triton", "split", "seed", "reference"):  # an explicit choice is kept
        assert gdn_jax.backend.impl_for(B, T, H, impl) == impl
    # where the inputs fit the Gluon kernel, it takes the split path's launches
    assert gdn_jax.backend.impl_for(B, T, H, gluon=True) == ("gluon" if path == "split" else path)


def test_auto_counts_the_programs_of_the_call(monkeypatch):
    """fwd_intra passes chunks x value heads x batch rows (the packed work list's
    length for varlen) to the choice of path."""
    seen = []
    monkeypatch.setattr(gdn_jax.backend, "resolve_impl",
                        lambda op, impl, programs, gluon: seen.append(programs) or "reference")
    k, v, g, beta = make_inputs(7, 2, 130, 1, 3, 16, 16)
    gdn_jax.fwd_intra(k, v, g, beta)
    k, v, g, beta = make_inputs(8, 1, 130, 1, 3, 16, 16)
    gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=np.array([0, 1, 65, 130], np.int32))
    assert seen == [3 * 3 * 2, 4 * 3]


def test_impl_selection_without_gpu():
    if gdn_jax.backend.cuda_available():
        pytest.skip("checks the behaviour without a GPU")
    k, v, g, beta = make_inputs(6, 1, 10, 1, 1, 16, 16)
    for impl in ("gluon", "triton", "split", "seed"):
        with pytest.raises(RuntimeError, match=f"impl='{impl}' needs an NVIDIA GPU"):
            gdn_jax.fwd_intra(k, v, g, beta, impl=impl)
    auto = gdn_jax.fwd_intra(k, v, g, beta)
    ref = gdn_jax.fwd_intra(k, v, g, beta, impl="reference")
    for a, b in zip(auto, ref):
        np.testing.assert_array_equal(a, b)


def test_import_does_not_import_jax_triton():
    code = "import sys, gdn_jax; gdn_jax.fwd_intra; print('jax_triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- bad input: (description, kwargs changes, exception, words the message must hold)
def _args(**over):
    k, v, g, beta = make_inputs(7, 1, 20, 2, 4, 16, 8)
    args = dict(k=k, v=v, g=g, beta=beta)
    args.update(over)
    return args


f32 = jnp.float32
BAD = [
    ("k rank", dict(k=jnp.ones((20, 2, 16))), ValueError, ["`k`", "rank 4", "(20, 2, 16)"]),
    ("v rank", dict(v=jnp.ones((1, 20, 4))), ValueError, ["`v`", "rank 4"]),
    ("beta rank", dict(beta=jnp.ones((1, 20))), ValueError, ["`beta`", "rank 3"]),
    ("g rank", dict(g=jnp.ones((1, 20, 4, 1))), ValueError, ["`g`", "rank 3"]),
    ("v T", dict(v=jnp.ones((1, 21, 4, 8))), ValueError, ["`v`", "(1, 21, 4, 8)"]),
    ("v B", dict(v=jnp.ones((2, 20, 4, 8))), ValueError, ["`v`", "B, T"]),
    ("beta H", dict(beta=jnp.ones((1, 20, 3))), ValueError, ["`beta`", "(1, 20, 4)", "(1, 20, 3)"]),
    ("g T", dict(g=jnp.ones((1, 19, 4))), ValueError, ["`g`", "(1, 20, 4)"]),
    ("H % Hg", dict(v=jnp.ones((1, 20, 3, 8)), beta=jnp.ones((1, 20, 3)), g=None), ValueError,
     ["H = v.shape[2] = 3", "Hg = k.shape[2] = 2"]),
    ("int k", dict(k=jnp.ones((1, 20, 2, 16), jnp.int32)), TypeError, ["`k`", "int32"]),
    ("complex v", dict(v=jnp.ones((1, 20, 4, 8), jnp.complex64)), TypeError, ["`v`", "complex64"]),
    ("int beta", dict(beta=jnp.ones((1, 20, 4), jnp.int32)), TypeError, ["`beta`", "int32"]),
    ("v dtype", dict(v=jnp.ones((1, 20, 4, 8), jnp.bfloat16)), TypeError, ["`v`", "bfloat16", "float32"]),
    ("beta missing", dict(beta=None), TypeError, ["`beta` is required"]),
    ("chunk_size", dict(chunk_size=32), ValueError, ["`chunk_size`", "32", "64"]),
    ("cu float", dict(cu_seqlens=jnp.array([0.0, 20.0])), TypeError, ["`cu_seqlens`", "float32"]),
    ("cu rank", dict(cu_seqlens=jnp.array([[0, 20]])), ValueError, ["`cu_seqlens`", "rank 1", "(1, 2)"]),
    ("cu short", dict(cu_seqlens=jnp.array([0])), ValueError, ["`cu_seqlens`", "at least 2"]),
    ("cu start", dict(cu_seqlens=jnp.array([1, 20])), ValueError, ["`cu_seqlens[0]` must be 0", "got 1"]),
    ("cu decreasing", dict(cu_seqlens=jnp.array([0, 12, 5, 20])), ValueError,
     ["non-decreasing", "cu_seqlens[1]=12", "cu_seqlens[2]=5"]),
    ("cu end", dict(cu_seqlens=jnp.array([0, 5, 19])), ValueError, ["`cu_seqlens[-1]` must equal T=20", "19"]),
    ("chunk_indices without cu", dict(chunk_indices=jnp.zeros((1, 2), jnp.int32)), ValueError,
     ["`chunk_indices`", "`cu_seqlens` is None"]),
    ("chunk_indices shape", dict(cu_seqlens=jnp.array([0, 20]), chunk_indices=jnp.zeros((1, 3), jnp.int32)),
     ValueError, ["`chunk_indices`", "[NT, 2]", "(1, 3)"]),
    ("chunk_indices dtype", dict(cu_seqlens=jnp.array([0, 20]), chunk_indices=jnp.zeros((1, 2))),
     TypeError, ["`chunk_indices`", "float32"]),
    ("impl", dict(impl="cuda"), ValueError, ["`impl`", "'cuda'"]),
]


@pytest.mark.parametrize("what,over,exc,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input(what, over, exc, words):
    with pytest.raises(exc) as info:
        gdn_jax.fwd_intra(**_args(**over))
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


def test_cu_seqlens_needs_batch_one():
    k, v, g, beta = make_inputs(8, 2, 20, 1, 1, 16, 8)
    with pytest.raises(ValueError, match="batch size B must be 1, got B=2"):
        gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=jnp.array([0, 20]))


def test_float64_rejected_on_triton_path():
    from gdn_jax.validate import check_kernel_dtypes

    with pytest.raises(TypeError, match="`k` in bfloat16, float16 or float32, got float64"):
        check_kernel_dtypes("fwd_intra", k=np.ones((1, 2, 1, 16)))


def test_numpy_cu_seqlens_under_jit():
    cu = np.array([0, 4, 4, 20], np.int32)
    k, v, g, beta = make_inputs(9, 1, 20, 1, 2, 16, 8, cu_seqlens=list(cu))
    jitted = jax.jit(lambda *a: gdn_jax.fwd_intra(*a, cu_seqlens=cu))(k, v, g, beta)
    eager = gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu)
    for a, b in zip(jitted, eager):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cu,message", [
    ([0, 5, 20], None),
    ([1, 5, 20], "cu_seqlens[0] must be 0, got 1"),
    ([0, 12, 5, 20], "non-decreasing; first decrease after index 1"),
    ([0, 5, 19], "cu_seqlens[-1] must equal T=20, got 19"),
])
def test_checkify_traced_cu_seqlens(cu, message):
    from jax.experimental import checkify

    k, v, g, beta = make_inputs(10, 1, 20, 1, 2, 16, 8)

    def f(k, v, g, beta, cu):
        gdn_jax.checkify_cu_seqlens(cu, k.shape[1])
        return gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu)

    err, _ = jax.jit(checkify.checkify(f))(k, v, g, beta, jnp.asarray(cu, jnp.int32))
    if message is None:
        err.throw()
    else:
        with pytest.raises(checkify.JaxRuntimeError, match=re.escape(message)):
            err.throw()


@pytest.mark.parametrize("path,B,H,where", [
    ("triton", 65536, 1, "batch rows B"),
    ("split", 65536, 1, "batch rows B"),
    ("seed", 65536, 1, "batch rows B"),
    ("seed", 1, 65536, "value heads H"),
])
def test_grid_past_cuda_limits_is_a_clear_error(path, B, H, where, monkeypatch):
    """Checked before any launch, so this runs on CPU too (on any triton: the
    seed's own check of the triton version is tested in test_triton_launch.py)."""
    from gdn_jax import triton_launch
    from gdn_jax.triton_launch import fwd_intra_triton

    monkeypatch.setattr(triton_launch, "triton_version", lambda: (3, 8))

    k = jnp.ones((B, 1, 1, 16), jnp.bfloat16)
    v = jnp.ones((B, 1, H, 16), jnp.bfloat16)
    beta = jnp.ones((B, 1, H), jnp.float32)
    with pytest.raises(ValueError, match=f"along {where}, over CUDA's limit of 65535"):
        fwd_intra_triton(k, v, None, beta, path=path)

