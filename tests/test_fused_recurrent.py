"""fused_recurrent_gated_delta_rule on its jnp path (the CPU default) against
the float64 NumPy decode: every option, GQA, packed, V-first, bf16 states,
state pools with repeated, skipped and padding rows, traced indices, jit with
donation, vmap, prefill + decode, and the errors."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from decode_reference import OPTIONS, check_decode, decode_inputs, decode_numpy
from gdn_jax.fused_recurrent import IMPLS, owned_state_indices

decode = jax.jit(gdn_jax.fused_recurrent_gated_delta_rule,
                 static_argnames=("output_final_state", "use_qk_l2norm_in_kernel",
                                  "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
                                  "allow_neg_eigval", "state_v_first", "impl"))
TOL = 2e-5  # float32 math against float64


def args_of(x, options=()):
    """The op's keyword arguments of ``decode_inputs`` and an option set:
    ``A_log`` and ``dt_bias`` only with the gate option (None where it says)."""
    kw = dict(OPTIONS[options] if isinstance(options, str) else options)
    args = {n: x[n] for n in ("q", "k", "v", "g", "beta")}
    if kw.get("use_gate_in_kernel"):
        args["A_log"] = x["A_log"]
        args["dt_bias"] = kw.pop("dt_bias", x["dt_bias"])
    return args, kw


@pytest.mark.parametrize("T", [1, 4, 17])
@pytest.mark.parametrize("Hg,H", [(2, 2), (1, 4)])
@pytest.mark.parametrize("with_h0", [True, False])
def test_matches_float64(T, Hg, H, with_h0):
    x = decode_inputs(T + H, 3, T, Hg, H, 16, 8, state=with_h0)
    h0 = x.get("initial_state")
    args, _ = args_of(x)
    o, final = decode(**args, initial_state=h0, output_final_state=True)
    assert o.shape == (3, T, H, 8) and o.dtype == jnp.float32
    assert final.shape == (3, H, 16, 8) and final.dtype == jnp.float32
    check_decode(o, final, decode_numpy(**args, initial_state=h0), TOL)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_option(name):
    x = decode_inputs(3, 2, 5, 2, 4, 16, 8, raw=name != "none")
    args, kw = args_of(x, name)
    o, final = decode(**args, **kw, initial_state=x["initial_state"], output_final_state=True)
    ref = decode_numpy(**args, **kw, initial_state=x["initial_state"])
    check_decode(o, final, ref, TOL)


def test_traced_scale_with_l2norm():
    """A traced scale goes into q after its normalisation, not before."""
    x = decode_inputs(4, 1, 3, 1, 2, 16, 8, raw=True)
    args, kw = args_of(x, "l2norm")
    o, final = jax.jit(lambda s: gdn_jax.fused_recurrent_gated_delta_rule(
        **args, **kw, scale=s, initial_state=x["initial_state"], output_final_state=True))(0.3)
    check_decode(o, final, decode_numpy(**args, **kw, scale=0.3, initial_state=x["initial_state"]),
                 TOL)


@pytest.mark.parametrize("traced", [False, True])
def test_packed(traced):
    cu = np.array([0, 0, 1, 5, 5, 12], np.int32)  # empty, 1, 4, empty, 7 tokens
    x = decode_inputs(5, 1, 12, 2, 4, 16, 8, N=len(cu) - 1)
    args, _ = args_of(x)
    o, final = decode(**args, initial_state=x["initial_state"], output_final_state=True,
                      cu_seqlens=jnp.asarray(cu) if traced else cu)
    check_decode(o, final, decode_numpy(**args, initial_state=x["initial_state"], cu_seqlens=cu),
                 TOL, cu_seqlens=cu)
    np.testing.assert_array_equal(final[0], x["initial_state"][0])  # empty: its state as it was


@pytest.mark.parametrize("pool", [False, True])
def test_state_v_first(pool):
    x = decode_inputs(6, 2, 3, 1, 2, 16, 8, pool=5 if pool else None)
    args, _ = args_of(x)
    idx = np.array([4, 1], np.int32) if pool else None
    h0 = np.swapaxes(x["initial_state"], -1, -2).copy()  # [.., V, K]
    o, final = decode(**args, initial_state=h0, state_indices=idx, output_final_state=True,
                      state_v_first=True)
    assert final.shape == h0.shape
    check_decode(o, final, decode_numpy(**args, initial_state=h0, state_indices=idx,
                                        state_v_first=True), TOL)
    o_k, final_k = decode(**args, initial_state=x["initial_state"], state_indices=idx,
                          output_final_state=True)
    np.testing.assert_allclose(o, o_k, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.swapaxes(final, -1, -2), final_k, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype,tol", [(jnp.bfloat16, 1e-2), (jnp.float16, 5e-3)])
def test_low_precision_state(dtype, tol):
    """bfloat16 / float16 states: read, computed in float32, written back in their dtype."""
    x = decode_inputs(7, 2, 4, 2, 4, 16, 8, pool=6)
    args, _ = args_of(x)
    pool = jnp.asarray(x["initial_state"], dtype)
    idx = np.array([5, 0], np.int32)
    o, final = decode(**args, initial_state=pool, state_indices=idx, output_final_state=True)
    assert final.dtype == dtype
    check_decode(o, final, decode_numpy(**args, initial_state=pool, state_indices=idx), tol)
    np.testing.assert_array_equal(np.asarray(final[1:5], np.float32), np.asarray(pool[1:5], np.float32))


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 1e-2), ("float16", 5e-3)])
def test_low_precision_inputs(dtype, tol):
    x = decode_inputs(8, 2, 3, 1, 2, 16, 8)
    args, _ = args_of(x)
    args = {n: a.astype(dtype) if n in "qkv" else a for n, a in args.items()}
    o, final = decode(**args, initial_state=x["initial_state"], output_final_state=True)
    assert o.dtype == dtype and final.dtype == jnp.float32
    check_decode(o, final, decode_numpy(**args, initial_state=x["initial_state"]), tol)


POOL_INDICES = {
    "permuted": [6, 2, 0, 5],  # rows 1, 3, 4 skipped
    "repeated": [3, 1, 3, 1],  # sequences 2, 3 repeat rows of 0, 1: they run as padding
    "padding": [-1, 4, -1, 0],
}


@pytest.mark.parametrize("case", list(POOL_INDICES))
@pytest.mark.parametrize("traced", [False, True])
def test_pool(case, traced):
    P = 7
    idx = np.array(POOL_INDICES[case], np.int32)
    x = decode_inputs(9, 4, 3, 2, 4, 16, 8, pool=P)
    args, _ = args_of(x, "all")
    args.update(A_log=x["A_log"], dt_bias=x["dt_bias"])
    pool = jnp.asarray(x["initial_state"])
    o, final = decode(**args, **OPTIONS["all"], initial_state=pool, output_final_state=True,
                      state_indices=jnp.asarray(idx) if traced else idx)
    assert final.shape == pool.shape
    ref = decode_numpy(**args, **OPTIONS["all"], initial_state=pool, state_indices=idx)
    check_decode(o, final, ref, TOL)
    named = {int(i) for i in idx if 0 <= i < P}
    for r in sorted(set(range(P)) - named):  # rows not named: bit-identical
        np.testing.assert_array_equal(np.asarray(final[r]), np.asarray(pool[r]))


def test_pool_index_past_the_pool_under_jit_owns_no_row():
    P = 3
    x = decode_inputs(10, 2, 2, 1, 2, 16, 8, pool=P)
    args, _ = args_of(x)
    o, final = decode(**args, initial_state=x["initial_state"], output_final_state=True,
                      state_indices=jnp.array([7, 1], jnp.int32))
    check_decode(o, final, decode_numpy(**args, initial_state=x["initial_state"],
                                        state_indices=[-1, 1]), TOL)


def test_pool_with_packed_sequences():
    cu = np.array([0, 2, 2, 6], np.int32)
    idx = np.array([2, 0, 5], np.int32)
    x = decode_inputs(11, 1, 6, 2, 2, 16, 8, pool=6)
    args, _ = args_of(x)
    o, final = decode(**args, initial_state=x["initial_state"], output_final_state=True,
                      cu_seqlens=jnp.asarray(cu), state_indices=jnp.asarray(idx))
    check_decode(o, final, decode_numpy(**args, initial_state=x["initial_state"], cu_seqlens=cu,
                                        state_indices=idx), TOL, cu_seqlens=cu)


def test_owned_state_indices():
    idx = jnp.array([3, -1, 3, 9, 0, 0, 2], jnp.int32)
    np.testing.assert_array_equal(owned_state_indices(idx, 4), [3, -1, -1, -1, 0, -1, 2])


def test_no_final_state():
    x = decode_inputs(12, 1, 2, 1, 1, 16, 8)
    args, _ = args_of(x)
    o, final = gdn_jax.fused_recurrent_gated_delta_rule(**args, initial_state=x["initial_state"])
    assert final is None
    check_decode(o, None, decode_numpy(**args, initial_state=x["initial_state"]), TOL)


def test_no_tokens_keeps_the_states():
    x = decode_inputs(13, 2, 0, 1, 2, 16, 8, pool=3)
    args, _ = args_of(x)
    o, final = gdn_jax.fused_recurrent_gated_delta_rule(
        **args, initial_state=x["initial_state"], state_indices=np.array([0, 2]),
        output_final_state=True)
    assert o.shape == (2, 0, 2, 8)
    np.testing.assert_array_equal(final, x["initial_state"])


def test_prefill_then_decode_equals_one_forward():
    """The chunked forward over a prompt, then decode steps one token at a time
    from its final state: the outputs and the state of one forward over all."""
    P_len, D = 70, 5
    x = decode_inputs(14, 2, P_len + D, 2, 4, 16, 8, raw=True)
    args, kw = args_of(x, "all")
    o_full, s_full = gdn_jax.chunk_gated_delta_rule(**args, **kw, output_final_state=True)
    part = lambda a, s, e: {n: (v[:, s:e] if np.ndim(v) >= 3 else v) for n, v in a.items()}  # noqa: E731
    o, state = gdn_jax.chunk_gated_delta_rule(**part(args, 0, P_len), **kw, output_final_state=True)
    outs = [o]
    for t in range(P_len, P_len + D):
        o_t, state = decode(**part(args, t, t + 1), **kw, initial_state=state,
                            output_final_state=True)
        outs.append(o_t)
    o = jnp.concatenate(outs, axis=1)
    check_decode(o, state, (np.asarray(o_full, np.float64), np.asarray(s_full, np.float64)), 1e-4)


def test_donated_state_under_jit():
    """jit with the pool donated computes what the call without donation does
    (on the GPU the kernel then writes the donated buffer itself:
    tests/test_fused_recurrent_gpu.py checks the compiled HLO)."""
    x = decode_inputs(15, 2, 1, 1, 2, 16, 8, pool=4)
    args, _ = args_of(x)
    idx = jnp.array([3, 0], jnp.int32)

    def step(pool, idx, q, k, v, g, beta):
        return gdn_jax.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, initial_state=pool, state_indices=idx, output_final_state=True)

    plain = jax.jit(step)(jnp.asarray(x["initial_state"]), idx, *args.values())
    pool = jnp.asarray(x["initial_state"])
    donated = jax.jit(step, donate_argnums=0)(pool, idx, *args.values())
    for a, b in zip(plain, donated):
        np.testing.assert_array_equal(a, b)
    assert pool.is_deleted() or jax.default_backend() == "cpu"  # CPU may ignore the donation


def test_vmap():
    """vmap over examples with their own pools, and over examples sharing one
    pool (each gets its own updated copy), against a loop."""
    n, P = 3, 5
    xs = [decode_inputs(20 + e, 2, 2, 1, 2, 16, 8, pool=P) for e in range(n)]
    stack = {name: np.stack([x[name] for x in xs]) for name in xs[0]}
    idx = np.array([[4, 0], [1, 1], [-1, 2]], np.int32)
    f = functools.partial(gdn_jax.fused_recurrent_gated_delta_rule, output_final_state=True)
    names = ("q", "k", "v", "g", "beta")
    got = jax.vmap(lambda *a: f(*a[:5], initial_state=a[5], state_indices=a[6]))(
        *(stack[m] for m in names), stack["initial_state"], idx)
    shared = jax.vmap(lambda *a: f(*a[:5], initial_state=xs[0]["initial_state"],
                                   state_indices=a[5]))(*(stack[m] for m in names), idx)
    for e, x in enumerate(xs):
        args = {m: x[m] for m in names}
        ref = decode_numpy(**args, initial_state=x["initial_state"], state_indices=idx[e])
        check_decode(got[0][e], got[1][e], ref, TOL)
        ref = decode_numpy(**args, initial_state=xs[0]["initial_state"], state_indices=idx[e])
        check_decode(shared[0][e], shared[1][e], ref, TOL)


def test_grad_through_reference():
    x = decode_inputs(16, 1, 3, 1, 2, 8, 4)
    args, _ = args_of(x)

    def loss(v, h0):
        o, s = gdn_jax.fused_recurrent_gated_delta_rule(**{**args, "v": v}, initial_state=h0,
                                                        output_final_state=True, impl="reference")
        return (o ** 2).sum() + (s ** 2).sum()

    dv, dh0 = jax.grad(loss, (0, 1))(args["v"], x["initial_state"])
    eps = 1e-3
    e = np.zeros_like(args["v"])
    e[0, 1, 1, 2] = eps
    fd = (loss(args["v"] + e, x["initial_state"]) - loss(args["v"] - e, x["initial_state"])) / (2 * eps)
    np.testing.assert_allclose(dv[0, 1, 1, 2], fd, rtol=2e-2)
    assert np.isfinite(np.asarray(dh0)).all()


def test_impl_without_gpu():
    if gdn_jax.backend.cuda_available():
        pytest.skip("checks the behaviour without a GPU")
    x = decode_inputs(17, 1, 1, 1, 1, 16, 8)
    args, _ = args_of(x)
    with pytest.raises(RuntimeError, match="impl='triton' needs an NVIDIA GPU"):
        gdn_jax.fused_recurrent_gated_delta_rule(**args, impl="triton")
    auto = gdn_jax.fused_recurrent_gated_delta_rule(**args, initial_state=x["initial_state"])
    ref = gdn_jax.fused_recurrent_gated_delta_rule(**args, initial_state=x["initial_state"],
                                                   impl="reference")
    np.testing.assert_array_equal(auto[0], ref[0])
    assert IMPLS == ("auto", "triton", "reference")


def _bad(**over):
    x = decode_inputs(18, 2, 1, 1, 2, 16, 8, pool=4)
    args, _ = args_of(x)
    kw = dict(**args, initial_state=x["initial_state"], state_indices=np.array([0, 3], np.int32),
              output_final_state=True)
    kw.update(over)
    return kw


BAD = [
    ("indices without a pool", dict(initial_state=None), ValueError,
     ["`state_indices` names rows of a state pool", "`initial_state`"]),
    ("float indices", dict(state_indices=np.array([0.0, 1.0])), TypeError,
     ["`state_indices`", "integer", "float64"]),
    ("indices shape", dict(state_indices=np.array([0, 1, 2], np.int32)), ValueError,
     ["`state_indices`", "[N] = (2,)", "(3,)", "N = B"]),
    ("index past the pool", dict(state_indices=np.array([0, 4], np.int32)), ValueError,
     ["`state_indices[1]` = 4", "P = 4", "-1"]),
    ("pool rank", dict(initial_state=np.zeros((4, 2, 16), np.float32)), ValueError,
     ["`initial_state`", "rank 4", "[P, H, K, V]"]),
    ("pool shape", dict(initial_state=np.zeros((4, 2, 8, 16), np.float32)), ValueError,
     ["`initial_state`", "(P, 2, 16, 8)", "(4, 2, 8, 16)"]),
    ("pool V-first shape", dict(initial_state=np.zeros((4, 2, 16, 8), np.float32),
                                state_v_first=True), ValueError, ["[P, H, V, K]", "(P, 2, 8, 16)"]),
    ("empty pool", dict(initial_state=np.zeros((0, 2, 16, 8), np.float32),
                        state_indices=np.array([-1, -1], np.int32)), ValueError, ["P >= 1"]),
    ("int pool", dict(initial_state=np.zeros((4, 2, 16, 8), np.int32)), TypeError,
     ["`initial_state`", "int32"]),
    ("state shape", dict(state_indices=None, initial_state=np.zeros((3, 2, 16, 8), np.float32)),
     ValueError, ["`initial_state`", "(2, 2, 16, 8)", "N = B"]),
    ("impl", dict(impl="split"), ValueError, ["`impl`", "('auto', 'triton', 'reference')"]),
    ("A_log without gate", dict(A_log=np.zeros(2, np.float32)), ValueError, ["use_gate_in_kernel"]),
    ("gate without A_log", dict(use_gate_in_kernel=True), TypeError, ["`A_log`"]),
    ("neg eigval alone", dict(allow_neg_eigval=True), ValueError, ["use_beta_sigmoid_in_kernel"]),
    ("q dtype", dict(q=np.zeros((2, 1, 1, 16), np.float16)), TypeError, ["`q`", "dtype of `k`"]),
    ("cu with B > 1", dict(cu_seqlens=np.array([0, 1], np.int32)), ValueError, ["B must be 1"]),
]


@pytest.mark.parametrize("what,over,exc,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input(what, over, exc, words):
    with pytest.raises(exc) as info:
        gdn_jax.fused_recurrent_gated_delta_rule(**_bad(**over))
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


def test_traced_output_final_state_is_an_error():
    kw = _bad()
    kw.pop("output_final_state")
    with pytest.raises(TypeError, match="`output_final_state` must be a Python bool"):
        jax.jit(lambda f: gdn_jax.fused_recurrent_gated_delta_rule(**kw, output_final_state=f))(True)


@pytest.fixture
def jnp_launch(monkeypatch):
    """The Triton path without a GPU: its launch replaced by the jnp
    recurrence, which refuses batched inputs as jax-triton does (so that
    vmap must take the op's fold rule, gdn_jax/batching.py)."""
    from gdn_jax import fused_recurrent as fr

    def launch(q, k, v, g, beta, A_log, dt_bias, h0, cu, idx, *, scale, output_final_state,
               state_v_first, l2norm_q, l2norm_k, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
               allow_neg_eigval):
        static = fr.RecurrentStatic(False, scale, fr.Options(
            l2norm_k, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
            state_v_first), l2norm_k and not l2norm_q, (A_log is not None) + (dt_bias is not None),
            h0 is not None, idx is not None, output_final_state, cu is not None, 1)
        arrays = [x for x in (q, k, v, g, beta, A_log, dt_bias, h0, idx, cu) if x is not None]

        @jax.custom_batching.custom_vmap
        def call(*arrays):
            return fr._reference(static, *fr._split(static, arrays))

        @call.def_vmap
        def refuse(*_):
            raise NotImplementedError("no batching rule, as in jax-triton")

        out = call(*arrays)
        return out[0], (out[1] if output_final_state else None)

    monkeypatch.setattr(fr, "fused_recurrent_triton", launch)
    monkeypatch.setattr(fr, "runs_triton", lambda *a: True)
    fr._triton_op.cache_clear()
    yield
    fr._triton_op.cache_clear()


def test_vmap_folds_the_triton_launch(jnp_launch):
    """Examples with their own pools (stacked, indices shifted, A_log shared)
    and packed examples, folded into one call; against a loop."""
    n, P = 3, 5
    xs = [decode_inputs(30 + e, 2, 3, 2, 2, 16, 8, pool=P, raw=True) for e in range(n)]
    stack = {name: np.stack([x[name] for x in xs]) for name in xs[0]}
    idx = np.array([[4, 0], [1, 1], [-1, 2]], np.int32)
    gate = dict(A_log=xs[0]["A_log"], dt_bias=xs[0]["dt_bias"])
    f = functools.partial(gdn_jax.fused_recurrent_gated_delta_rule, **OPTIONS["all"], **gate,
                          output_final_state=True)
    names = ("q", "k", "v", "g", "beta")
    got = jax.jit(jax.vmap(lambda *a: f(*a[:5], initial_state=a[5], state_indices=a[6])))(
        *(stack[m] for m in names), stack["initial_state"], idx)
    cu = np.array([0, 1, 3], np.int32)
    packed = jax.vmap(lambda *a: f(*a[:5], initial_state=a[5], cu_seqlens=cu))(
        *(stack[m][:, :1] for m in names), stack["initial_state"][:, :2])
    for e, x in enumerate(xs):
        args = {m: x[m] for m in names}
        ref = decode_numpy(**args, **OPTIONS["all"], **gate, initial_state=x["initial_state"],
                           state_indices=idx[e])
        check_decode(got[0][e], got[1][e], ref, TOL)
        ref = decode_numpy(**{m: a[:1] for m, a in args.items()}, **OPTIONS["all"], **gate,
                           initial_state=x["initial_state"][:2], cu_seqlens=cu)
        check_decode(packed[0][e], packed[1][e], ref, TOL, cu_seqlens=cu)


def test_vmap_of_the_triton_launch_over_per_head_parameters_is_an_error(jnp_launch):
    x = decode_inputs(40, 1, 1, 1, 2, 16, 8, raw=True)
    args, kw = args_of(x, "gate")
    with pytest.raises(ValueError, match="jax.lax.map"):
        jax.vmap(lambda a: gdn_jax.fused_recurrent_gated_delta_rule(**{**args, "A_log": a}, **kw))(
            np.stack([x["A_log"]] * 2))


def test_grid_past_cuda_limits_is_a_clear_error():
    """Checked before any launch, so this runs on CPU too."""
    from gdn_jax.fused_recurrent_launch import check_fused_recurrent_grid

    check_fused_recurrent_grid(2**20, 32, 128)
    with pytest.raises(ValueError, match="over CUDA's grid limit"):
        check_fused_recurrent_grid(2**23, 32, 128)
