"""chunk_gated_delta_rule on the jnp path against the per-token recurrence, its
options, and its errors (CPU; the GPU path is tests/test_chunk_gpu.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy_reference import rel_err as rel

import gdn_jax
from test_naive_recurrent import gdn_numpy, make_inputs

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


@pytest.mark.parametrize("cu", [None, np.array([0, 1, 66, 140], np.int32)], ids=["fixed", "varlen"])
def test_float64_is_float64_throughout(cu):
    """float64 inputs stay float64 on every step (gates included): the error
    against the float64 loop is float64 rounding, not float32's."""
    rng = np.random.default_rng(17)
    B = 2 if cu is None else 1
    args = [np.asarray(x, np.float64) for x in make_inputs(rng, B, 140, 1, 2, 16, 8)]
    h0 = rng.standard_normal((B if cu is None else 3, 2, 16, 8))
    with jax.enable_x64(True):
        o, final = chunk_gated_delta_rule(*args, initial_state=h0, output_final_state=True,
                                          cu_seqlens=cu)
        assert o.dtype == jnp.float64 and final.dtype == jnp.float64
    o_ref, final_ref = gdn_numpy(*args, h0=h0, cu_seqlens=cu)
    assert rel(o, o_ref) < 1e-12 and rel(final, final_ref) < 1e-12


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


# --------------------------------------------------------------------------- options

def _softplus(x):
    return np.logaddexp(0.0, x)


def _l2(x):
    return x / np.sqrt((x.astype(np.float64) ** 2).sum(-1, keepdims=True) + 1e-6)


@pytest.mark.parametrize("option", ["l2norm", "gate", "gate_no_bias", "beta_sigmoid",
                                    "neg_eigval", "v_first", "all"])
def test_option_matches_float64_recurrence(option):
    """Each option against the float64 loop fed the inputs the option describes
    (docs/math.md's table), written here from the formulas."""
    rng = np.random.default_rng(20)
    B, T, Hg, H, K, V = 2, 90, 2, 4, 16, 8
    q, k, v, g, beta = make_inputs(rng, B, T, Hg, H, K, V)
    h0 = rng.standard_normal((B, H, K, V)).astype(np.float32)
    kwargs, ref_args = {}, dict(q=q, k=k, g=g, beta=beta)
    if option in ("l2norm", "all"):
        q, k = 3 * q, 0.5 * k + 0.1  # not unit rows
        kwargs.update(use_qk_l2norm_in_kernel=True)
        ref_args.update(q=_l2(q), k=_l2(k))
    if option in ("gate", "gate_no_bias", "all"):
        raw = rng.standard_normal((B, T, H)).astype(np.float32)
        A_log = np.log(rng.uniform(0.1, 2.0, H)).astype(np.float32)
        dt_bias = None if option == "gate_no_bias" else rng.standard_normal(H).astype(np.float32)
        kwargs.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
        g = raw
        ref_args["g"] = -np.exp(A_log) * _softplus(raw + (0 if dt_bias is None else dt_bias))
    if option in ("beta_sigmoid", "neg_eigval", "all"):
        logits = rng.standard_normal((B, T, H)).astype(np.float32)
        neg = option != "beta_sigmoid"
        kwargs.update(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg)
        beta = logits
        ref_args["beta"] = (2 if neg else 1) / (1 + np.exp(-logits.astype(np.float64)))
    v_first = option in ("v_first", "all")
    state = np.swapaxes(h0, -1, -2) if v_first else h0
    o, final = chunk_jit(q, k, v, g, beta, initial_state=state, output_final_state=True,
                         state_v_first=v_first, **kwargs)
    o_ref, final_ref = gdn_numpy(ref_args["q"], ref_args["k"], v, ref_args["g"], ref_args["beta"],
                                 h0=h0)
    assert rel(o, o_ref) < 1e-4
    assert final.shape == state.shape
    assert rel(np.swapaxes(final, -1, -2) if v_first else final, final_ref) < 1e-4


chunk_jit = jax.jit(chunk_gated_delta_rule, static_argnames=(
    "output_final_state", "impl", "use_qk_l2norm_in_kernel", "use_gate_in_kernel",
    "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "state_v_first"))


def test_traced_scale_equals_concrete():
    rng = np.random.default_rng(21)
    args = make_inputs(rng, 1, 70, 1, 2, 16, 8)
    traced = jax.jit(lambda s: chunk_gated_delta_rule(*args, scale=s)[0])(jnp.float32(0.3))
    assert rel(traced, gdn_numpy(*args, scale=0.3)[0]) < 1e-4


def test_given_chunk_indices():
    cu = np.array([0, 5, 70, 140], np.int32)
    rng = np.random.default_rng(22)
    args = make_inputs(rng, 1, 140, 1, 2, 16, 8)
    o, _ = chunk_gated_delta_rule(*args, cu_seqlens=cu,
                                  chunk_indices=gdn_jax.prepare_chunk_indices(cu))
    assert rel(o, gdn_numpy(*args, cu_seqlens=cu)[0]) < 1e-4


def test_one_dtype_policy(monkeypatch):
    """On a GPU, impl="auto" runs the kernels for bf16/fp16/fp32 and the jnp
    path for float64 (which the kernels do not take), as on CPU."""
    from gdn_jax import backend

    monkeypatch.setattr(backend, "cuda_available", lambda: True)
    x32, x64 = np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.float64)
    assert backend.runs_triton("op", "auto", x32, x32, x32)
    assert not backend.runs_triton("op", "auto", x64, x64, x64)
    assert not backend.runs_triton("op", "reference", x32, x32, x32)


def test_fwd_intra_float64_runs_the_reference_under_auto(monkeypatch):
    """fwd_intra alone follows the same policy: on a GPU, float64 under
    impl="auto" runs the jnp reference, not a launch that would refuse it."""
    from gdn_jax import backend, sharding

    monkeypatch.setattr(backend, "cuda_available", lambda: True)

    def no_launch(*args, **kwargs):
        raise AssertionError("the Triton launch ran on float64 inputs")

    monkeypatch.setattr(sharding, "fwd_intra_triton", no_launch)
    sharding._triton_op.cache_clear()
    with jax.enable_x64(True):
        rng = np.random.default_rng(25)
        k = jnp.asarray(rng.standard_normal((1, 70, 1, 8)))
        v = jnp.asarray(rng.standard_normal((1, 70, 2, 4)))
        g = -jnp.asarray(rng.random((1, 70, 2)))
        beta = jnp.asarray(rng.random((1, 70, 2)))
        w, u, A = gdn_jax.fwd_intra(k, v, g, beta)
        assert w.dtype == jnp.float64
    sharding._triton_op.cache_clear()


def test_output_final_state_must_be_static():
    rng = np.random.default_rng(23)
    args = make_inputs(rng, 1, 8, 1, 1, 8, 4)
    with pytest.raises(TypeError, match="`output_final_state` must be a Python bool"):
        jax.jit(lambda f: chunk_gated_delta_rule(*args, output_final_state=f))(True)


@pytest.mark.parametrize("kwargs,exc,needle", [
    (dict(use_gate_in_kernel=True), TypeError, "needs `A_log`"),
    (dict(use_gate_in_kernel=True, A_log=np.zeros(3, np.float32)), ValueError, "`A_log` must have shape"),
    (dict(A_log=np.zeros(4, np.float32)), ValueError, "use_gate_in_kernel=False"),
    (dict(use_gate_in_kernel=True, A_log=np.zeros(4, np.float32), dt_bias=np.zeros(4, np.int32)),
     TypeError, "`dt_bias` must be a float array"),
    (dict(allow_neg_eigval=True), ValueError, "needs use_beta_sigmoid_in_kernel"),
    (dict(state_v_first=True, initial_state=np.zeros((2, 4, 8, 4), np.float32)), ValueError,
     r"\[N, H, V, K\]"),
    (dict(chunk_indices=np.zeros((2, 2), np.int32)), ValueError, "`cu_seqlens` is None"),
])
def test_bad_options(kwargs, exc, needle):
    rng = np.random.default_rng(24)
    q, k, v, g, beta = make_inputs(rng, 2, 4, 2, 4, 8, 4)
    with pytest.raises(exc, match=needle):
        chunk_gated_delta_rule(q, k, v, g, beta, **kwargs)
