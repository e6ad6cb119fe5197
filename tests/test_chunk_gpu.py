"""chunk_gated_delta_rule on the Triton path (NVIDIA GPU) against the float64
per-token recurrence, at the accuracy docs/math.md gives: every dtype, fixed
length and packed, GQA ratios, head dims, T not a multiple of 64, with and
without an initial state, every option. Skipped without a CUDA GPU."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from gdn_jax.backend import cuda_available
from inputs import many_sequences
from numpy_reference import gdn_recurrence_numpy, rel_err, sequences

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU as JAX's default backend"),
]

# docs/math.md: relative Frobenius error per sequence, o and the final state
TOL = {"float32": 3e-3, "float16": 5e-3, "bfloat16": 1e-2}
DT = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}
STATIC = ("output_final_state", "impl", "use_qk_l2norm_in_kernel", "use_gate_in_kernel",
          "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "state_v_first")


@functools.partial(jax.jit, static_argnames=STATIC)
def forward(q, k, v, g, beta, h0, cu, A_log=None, dt_bias=None, **kwargs):
    return gdn_jax.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu,
                                          A_log=A_log, dt_bias=dt_bias, output_final_state=True,
                                          **kwargs)


def draw(seed, B, T, Hg, H, K, V, dtype, N, h0=True):
    """Inputs as docs/math.md's accuracy table: unit q and k, beta =
    sigmoid(normal), a = logsigmoid(normal), normal v; q, k, v rounded to
    dtype (the reference gets the rounded values)."""
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    q, k = unit(rng.standard_normal((B, T, Hg, K))), unit(rng.standard_normal((B, T, Hg, K)))
    v = rng.standard_normal((B, T, H, V))
    a = -np.logaddexp(0, -rng.standard_normal((B, T, H)))
    beta = 1 / (1 + np.exp(-rng.standard_normal((B, T, H))))
    S0 = rng.standard_normal((N, H, K, V)).astype(np.float32) if h0 else None
    q, k, v = (jnp.asarray(x, DT[dtype]) for x in (q, k, v))
    return q, k, v, a.astype(np.float32), beta.astype(np.float32), S0


def up(*xs):
    return [np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in xs]


def check(dtype, q, k, v, a, beta, S0, cu=None, ref_inputs=None, record=None, **kwargs):
    """The Triton path against float64, per sequence: o and the final state."""
    B, T = q.shape[:2]
    cu_arr = None if cu is None else jnp.asarray(cu, jnp.int32)
    v_first = kwargs.get("state_v_first", False)
    h0 = None if S0 is None else (np.swapaxes(S0, -1, -2) if v_first else S0)
    o, final = forward(q, k, v, a, beta, h0, cu_arr, **kwargs)
    assert o.dtype == q.dtype and final.dtype == jnp.float32
    o, final = up(o, final)
    final = np.swapaxes(final, -1, -2) if v_first else final
    rq, rk, ra, rb = ref_inputs or (q, k, a, beta)
    o_ref, f_ref = gdn_recurrence_numpy(*up(rq, rk, v), ra, rb, h0=S0, cu_seqlens=cu)
    assert np.isfinite(o).all() and np.isfinite(final).all()
    errs = dict(o=max((rel_err(o[b, s:e], o_ref[b, s:e]) for b, s, e in sequences(B, T, cu)),
                      default=0.0),
                final=max(rel_err(final[n], f_ref[n]) for n in range(len(f_ref))))
    for name, e in errs.items():
        assert e <= TOL[dtype], f"{name}: {e:.3g} > {TOL[dtype]:.3g}"
    if cu is not None:  # an empty sequence keeps its initial state (zeros without one)
        for n in np.flatnonzero(np.diff(cu) == 0):
            np.testing.assert_array_equal(final[n], 0 if S0 is None else S0[n])
    if record is not None:
        record("gpu chunk", dtype, errs)
    return errs


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("T,Hg,H,h0", [(1, 2, 2, True), (63, 2, 4, False), (1000, 2, 16, True),
                                       (4096, 4, 8, True), (130, 1, 4, False)])
def test_fixed_length(dtype, T, Hg, H, h0, record_errors):
    """GQA ratios 1, 2, 8, 2, 4; T = 1, 63, 1000 (not multiples of 64), 4096
    (bf16 there takes the Gluon fwd_intra on Hopper), 130."""
    B = 2
    check(dtype, *draw(T + H, B, T, Hg, H, 128, 128, dtype, B, h0), record=record_errors)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("K,V", [(64, 64), (256, 256), (64, 256), (256, 128)])
def test_head_dims(dtype, K, V, record_errors):
    check(dtype, *draw(K + V, 1, 300, 2, 4, K, V, dtype, 1), record=record_errors)


VARLEN = [
    np.array([0, 0, 1, 64, 65, 130, 193, 1193, 1193], np.int32),  # empty, 1, 63, 1, 65, 63, 1000, empty
    np.array([0, 4096], np.int32),
]


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("cu", VARLEN, ids=["mixed", "one"])
def test_varlen(dtype, cu, record_errors):
    check(dtype, *draw(len(cu), 1, int(cu[-1]), 2, 4, 128, 128, dtype, len(cu) - 1), cu=cu,
          record=record_errors)


def test_1000_sequences(record_errors):
    cu = many_sequences(3, n=1000)
    check("bfloat16", *draw(5, 1, int(cu[-1]), 2, 4, 64, 64, "bfloat16", 1000), cu=cu,
          record=record_errors)


def test_varlen_without_initial_state_and_traced_equals_concrete():
    cu = VARLEN[0]
    args = draw(6, 1, int(cu[-1]), 2, 4, 128, 128, "bfloat16", len(cu) - 1, h0=False)
    check("bfloat16", *args, cu=cu)
    q, k, v, a, beta, _ = args
    traced = forward(q, k, v, a, beta, None, jnp.asarray(cu))
    concrete = gdn_jax.chunk_gated_delta_rule(q, k, v, a, beta, cu_seqlens=cu, output_final_state=True)
    for x, y in zip(traced, concrete):
        np.testing.assert_array_equal(np.asarray(x.astype(jnp.float32)), np.asarray(y.astype(jnp.float32)))


def _l2(x):
    x = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


@pytest.mark.parametrize("option", ["l2norm", "gate", "beta_sigmoid", "neg_eigval", "v_first", "all"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_options(option, dtype, record_errors):
    B, T, Hg, H, K, V = 2, 200, 2, 4, 128, 128
    rng = np.random.default_rng(40)
    q, k, v, a, beta, S0 = draw(41, B, T, Hg, H, K, V, dtype, B)
    kwargs, ref = {}, dict(q=q, k=k, a=a, beta=beta)
    if option in ("l2norm", "all"):
        q, k = (jnp.asarray(rng.standard_normal(x.shape), x.dtype) for x in (q, k))
        kwargs.update(use_qk_l2norm_in_kernel=True)
        ref.update(q=_l2(q), k=_l2(k))
    if option in ("gate", "all"):
        raw = rng.standard_normal((B, T, H)).astype(np.float32)
        A_log = np.log(rng.uniform(0.1, 2.0, H)).astype(np.float32)
        dt_bias = rng.standard_normal(H).astype(np.float32)
        kwargs.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
        a, ref["a"] = raw, -np.exp(A_log) * np.logaddexp(0, raw + dt_bias)
    if option in ("beta_sigmoid", "neg_eigval", "all"):
        logits = rng.standard_normal((B, T, H)).astype(np.float32)
        neg = option != "beta_sigmoid"
        kwargs.update(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg)
        beta, ref["beta"] = logits, (2 if neg else 1) / (1 + np.exp(-logits.astype(np.float64)))
    if option in ("v_first", "all"):
        kwargs.update(state_v_first=True)
    check(dtype, q, k, v, a, beta, S0, ref_inputs=(ref["q"], ref["k"], ref["a"], ref["beta"]),
          record=record_errors, **kwargs)


@pytest.mark.parametrize("impl", ["triton", "split", "seed"])
def test_every_intra_path(impl):
    check("bfloat16", *draw(50, 2, 300, 2, 4, 128, 128, "bfloat16", 2), impl=impl)


def test_vmap_folds_into_one_launch():
    draws = [draw(60 + e, 2, 130, 2, 4, 128, 128, "bfloat16", 2) for e in range(3)]
    q, k, v, a, beta, S0 = (jnp.stack(x) for x in zip(*draws))
    f = jax.jit(jax.vmap(lambda *x: gdn_jax.chunk_gated_delta_rule(
        *x[:5], initial_state=x[5], output_final_state=True)))
    o, final = f(q, k, v, a, beta, S0)
    for e, d in enumerate(draws):
        o_e, f_e = forward(*d, None)
        np.testing.assert_array_equal(np.asarray(o[e].astype(jnp.float32)), np.asarray(o_e.astype(jnp.float32)))
        np.testing.assert_array_equal(np.asarray(final[e]), np.asarray(f_e))


def test_float64_runs_the_jnp_path():
    """One dtype policy on every backend: float64 is taken (by the jnp path) here too."""
    with jax.enable_x64(True):
        q, k, v, a, beta, S0 = draw(70, 1, 100, 1, 2, 32, 16, "float32", 1)
        args = [jnp.asarray(x, jnp.float64) for x in (q, k, v, a, beta, S0)]
        o, final = gdn_jax.chunk_gated_delta_rule(*args[:5], initial_state=args[5], output_final_state=True)
        assert o.dtype == jnp.float64
        o_ref, f_ref = gdn_recurrence_numpy(*args[:5], h0=S0)
        assert rel_err(o, o_ref) < 1e-10 and rel_err(final, f_ref) < 1e-10


@pytest.mark.slow
def test_past_2_31_elements():
    """o [1, T, 32, 128] with T = 2^19 + 2^16 (2.4e9 elements) packed in 4096-row
    sequences: the last sequences, whose rows sit past 2^31 elements, against
    float64 alone."""
    T, H, Hg, K = 2 ** 19 + 2 ** 16, 32, 16, 128
    cu = np.arange(0, T + 1, 4096, dtype=np.int32)
    key = jax.random.split(jax.random.key(0), 5)
    unit = lambda x: x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True))  # noqa: E731
    q = unit(jax.random.normal(key[0], (1, T, Hg, K))).astype(jnp.bfloat16)
    k = unit(jax.random.normal(key[1], (1, T, Hg, K))).astype(jnp.bfloat16)
    v = jax.random.normal(key[2], (1, T, H, K), jnp.bfloat16)
    a = jax.nn.log_sigmoid(jax.random.normal(key[3], (1, T, H)))
    beta = jax.nn.sigmoid(jax.random.normal(key[4], (1, T, H)))
    o, final = forward(q, k, v, a, beta, None, jnp.asarray(cu))
    assert o.size > 2 ** 31
    for n in (len(cu) - 2, len(cu) - 3):
        s, e = int(cu[n]), int(cu[n + 1])
        o_ref, f_ref = gdn_recurrence_numpy(*up(q[:, s:e], k[:, s:e], v[:, s:e], a[:, s:e], beta[:, s:e]))
        assert rel_err(up(o[:, s:e])[0], o_ref) < TOL["bfloat16"]
        assert rel_err(up(final[n])[0], f_ref[0]) < TOL["bfloat16"]
