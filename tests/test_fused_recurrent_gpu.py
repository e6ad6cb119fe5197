"""fused_recurrent_gated_delta_rule on an NVIDIA GPU (kernels/fused_recurrent.py
through jax-triton) against the float64 NumPy decode at docs/math.md's tolerances:
every dtype, state dtype and layout, pools with repeated, skipped and padding
rows (the rows not named bit-identical), packed, GQA, options, the state
updated in place under donation (compiled HLO), vmap, 64-bit offsets, and a
chunked prefill + decode steps against one forward. Skipped without a GPU.

    python -m pytest -q tests/test_fused_recurrent_gpu.py

Launches take the fixed config (GDN_JAX_AUTOTUNE=0: one compile per kernel
variant) except in the tests of the autotuned configs.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from decode_reference import OPTIONS, check_decode, decode_inputs, decode_numpy
from gdn_jax.backend import cuda_available
from repo_files import load_module

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU as JAX's default backend"),
]

K = V = 128
MATH_TOL = {"float32": 3e-3, "float16": 5e-3, "bfloat16": 1e-2}  # o and final state vs float64
STATIC = ("output_final_state", "use_qk_l2norm_in_kernel", "use_gate_in_kernel",
          "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "state_v_first", "impl")
decode = jax.jit(gdn_jax.fused_recurrent_gated_delta_rule, static_argnames=STATIC)


@pytest.fixture(autouse=True)
def fixed_config(request, monkeypatch):
    """Fixed configs, except in the autotuner's test (timing on even where the
    environment turned it off for the whole run)."""
    monkeypatch.setenv("GDN_JAX_AUTOTUNE", "1" if "autotuned" in request.node.name else "0")


def inputs(seed, B, T, Hg, H, dtype, *, options="none", pool=None, N=None, state_dtype="float32",
           v_first=False):
    """``(kwargs of the op, kwargs of decode_numpy)``: q, k, v in ``dtype``,
    the state in ``state_dtype`` (V-first where asked)."""
    x = decode_inputs(seed, B, T, Hg, H, K, V, pool=pool, N=N, raw=options != "none")
    kw = dict(OPTIONS[options])
    args = {n: jnp.asarray(x[n], dtype if n in ("q", "k", "v") else jnp.float32)
            for n in ("q", "k", "v", "g", "beta")}
    if kw.get("use_gate_in_kernel"):
        args["A_log"] = jnp.asarray(x["A_log"])
        args["dt_bias"] = kw.pop("dt_bias", jnp.asarray(x["dt_bias"]))
    h0 = x["initial_state"]
    if v_first:
        h0 = np.swapaxes(h0, -1, -2)
    args["initial_state"] = jnp.asarray(h0, state_dtype)
    kw["state_v_first"] = v_first
    return {**args, **kw}, {**args, **kw}


def run(args, ref_args, tol, cu=None, idx=None, impl="triton", fn=decode):
    o, final = fn(**args, output_final_state=True, impl=impl,
                      cu_seqlens=None if cu is None else jnp.asarray(cu, jnp.int32),
                      state_indices=None if idx is None else jnp.asarray(idx, jnp.int32))
    assert o.dtype == args["v"].dtype and final.dtype == args["initial_state"].dtype
    assert final.shape == args["initial_state"].shape
    errs = check_decode(o, final, decode_numpy(**ref_args, cu_seqlens=cu, state_indices=idx), tol,
                        cu_seqlens=cu)
    return o, final, errs


def assert_rows_untouched(final, pool, idx):
    for r in sorted(set(range(pool.shape[0])) - set(int(i) for i in idx)):
        np.testing.assert_array_equal(np.asarray(final[r].astype(jnp.float32)),
                                      np.asarray(pool[r].astype(jnp.float32)), err_msg=f"row {r}")


IDX = np.array([9, 2, 9, -1, 0, 5], np.int32)  # repeated 9, padding, rows 1, 3, 4, 6, 7, 8 skipped


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("v_first", [False, True], ids=["k_major", "v_first"])
def test_pool_every_dtype_and_layout(dtype, state_dtype, v_first, record_errors):
    args, ref = inputs(1, len(IDX), 3, 2, 4, dtype, options="all", pool=10, state_dtype=state_dtype,
                       v_first=v_first)
    tol = max(MATH_TOL[dtype], 5e-3 if state_dtype == "bfloat16" else 0)
    _, final, errs = run(args, ref, tol, idx=IDX)
    assert_rows_untouched(final, args["initial_state"], IDX)
    record_errors(f"gpu decode {state_dtype} state", dtype, errs)


@pytest.mark.parametrize("B,T", [(1, 1), (5, 1), (3, 4), (2, 16)])
@pytest.mark.parametrize("Hg,H", [(2, 2), (2, 8)])
def test_fixed_length_and_gqa(B, T, Hg, H, record_errors):
    args, ref = inputs(B + T, B, T, Hg, H, "bfloat16")
    record_errors("gpu decode", "bfloat16", run(args, ref, MATH_TOL["bfloat16"])[2])


@pytest.mark.parametrize("name", [n for n in OPTIONS if n != "all"])
def test_every_option(name, record_errors):
    args, ref = inputs(3, 3, 2, 2, 4, "bfloat16", options=name)
    record_errors(f"gpu decode {name}", "bfloat16", run(args, ref, MATH_TOL["bfloat16"])[2])


def test_packed_and_packed_pool(record_errors):
    cu = np.array([0, 0, 1, 17, 17, 20], np.int32)  # empty, 1, 16, empty, 3 tokens
    args, ref = inputs(4, 1, 20, 2, 4, "bfloat16", N=5)
    _, final, errs = run(args, ref, MATH_TOL["bfloat16"], cu=cu)
    np.testing.assert_array_equal(np.asarray(final[0]), np.asarray(args["initial_state"][0]))
    args, ref = inputs(5, 1, 20, 2, 4, "bfloat16", pool=8)
    idx = np.array([7, 0, 3, 3, -1], np.int32)
    _, final, errs = run(args, ref, MATH_TOL["bfloat16"], cu=cu, idx=idx)
    assert_rows_untouched(final, args["initial_state"], idx)
    record_errors("gpu decode packed", "bfloat16", errs)


def test_fresh_state_and_no_final_state():
    args, ref = inputs(6, 2, 3, 2, 4, "float32")
    h0 = args.pop("initial_state")
    ref.pop("initial_state")
    o, final = decode(**args, output_final_state=True, impl="triton")
    assert final.dtype == jnp.float32
    check_decode(o, final, decode_numpy(**ref), MATH_TOL["float32"])
    o, none = decode(**args, initial_state=h0, impl="triton")
    assert none is None
    check_decode(o, None, decode_numpy(**ref, initial_state=h0), MATH_TOL["float32"])


def _pool_step():
    def step(pool, idx, q, k, v, g, beta):
        return gdn_jax.fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=pool,
                                                        state_indices=idx, output_final_state=True)
    return step


def test_in_place_under_donation():
    """With the pool donated the compiled step aliases it from parameter to
    result through the kernel: no copy of it, no temporary of its size; the
    rows not named keep their values. Without donation XLA copies it once."""
    args, ref = inputs(7, 4, 1, 2, 4, "bfloat16", pool=16)
    pool = args["initial_state"]
    idx = jnp.array([3, 15, 0, 8], jnp.int32)
    ops = [args[n] for n in ("q", "k", "v", "g", "beta")]
    copies_of = load_module("benchmarks/bench_decode.py").array_writes
    donated = jax.jit(_pool_step(), donate_argnums=0).lower(pool, idx, *ops).compile()
    hlo = donated.as_text()
    assert copies_of(hlo, pool) == 0, hlo
    assert "output_to_operand_aliasing" in hlo and "input_output_alias" in hlo
    memory = donated.memory_analysis()
    if memory is not None:
        assert memory.temp_size_in_bytes < pool.nbytes // 4, memory
    plain = jax.jit(_pool_step()).lower(pool, idx, *ops).compile().as_text()
    assert copies_of(plain, pool) >= 1  # the caller's pool kept
    expected = np.asarray(pool)
    o, final = donated(jnp.array(pool), idx, *ops)  # a copy of the pool is donated
    check_decode(o, final, decode_numpy(**ref, state_indices=np.asarray(idx)), MATH_TOL["bfloat16"])
    assert_rows_untouched(final, expected, np.asarray(idx))


def test_repeated_decode_steps_in_place():
    """Ten donated steps, each on the last's pool, equal ten steps of the jnp path."""
    args, ref = inputs(8, 3, 1, 2, 4, "bfloat16", pool=5)
    idx = jnp.array([4, 1, 2], jnp.int32)
    ops = [args[n] for n in ("q", "k", "v", "g", "beta")]
    step = jax.jit(_pool_step(), donate_argnums=0)
    pool, ref_pool = jnp.array(args["initial_state"]), args["initial_state"]
    for _ in range(10):
        o, pool = step(pool, idx, *ops)
        o_ref, ref_pool = gdn_jax.fused_recurrent_gated_delta_rule(
            *ops, initial_state=ref_pool, state_indices=idx, output_final_state=True,
            impl="reference")
    check_decode(o, pool, (np.asarray(o_ref, np.float64), np.asarray(ref_pool, np.float64)),
                 MATH_TOL["bfloat16"])


def test_vmap_folds_into_one_launch():
    n = 3
    draws = [inputs(20 + e, 2, 2, 2, 4, "bfloat16", pool=4)[0] for e in range(n)]
    names = ("q", "k", "v", "g", "beta", "initial_state")
    stacked = [jnp.stack([d[m] for d in draws]) for m in names]
    idx = jnp.array([[3, 0], [1, 1], [-1, 2]], jnp.int32)
    f = jax.jit(jax.vmap(lambda *a: gdn_jax.fused_recurrent_gated_delta_rule(
        *a[:5], initial_state=a[5], state_indices=a[6], output_final_state=True)))
    hlo = f.lower(*stacked, idx).compile().as_text()
    assert sum("custom-call(" in line and "triton" in line for line in hlo.splitlines()) == 1, hlo
    o, final = f(*stacked, idx)
    for e, d in enumerate(draws):
        o_e, final_e = decode(**d, state_indices=idx[e], output_final_state=True)
        np.testing.assert_array_equal(np.asarray(o[e], np.float32), np.asarray(o_e, np.float32))
        np.testing.assert_array_equal(np.asarray(final[e]), np.asarray(final_e))


def test_pool_past_2_31_elements():
    """A bfloat16 pool of more than 2^31 elements: its last rows read and
    written at 64-bit offsets."""
    H, P = 32, 4100  # P * H * K * V > 2^31
    x = decode_inputs(9, 3, 2, 16, H, K, V, pool=3)
    args = {n: jnp.asarray(x[n], jnp.bfloat16 if n in "qkv" else jnp.float32)
            for n in ("q", "k", "v", "g", "beta")}
    rows = np.array([P - 1, 5, P - 3], np.int32)
    pool = jnp.zeros((P, H, K, V), jnp.bfloat16).at[rows].set(jnp.asarray(x["initial_state"],
                                                                          jnp.bfloat16))
    assert pool.size > 2**31
    step = jax.jit(lambda pool, idx: gdn_jax.fused_recurrent_gated_delta_rule(
        **args, initial_state=pool, state_indices=idx, output_final_state=True), donate_argnums=0)
    o, pool = step(pool, jnp.asarray(rows))
    ref = decode_numpy(**args, initial_state=np.asarray(jnp.asarray(x["initial_state"], jnp.bfloat16),
                                                        np.float32))
    check_decode(o, np.asarray(pool[rows]), ref, MATH_TOL["bfloat16"])
    assert not bool(jnp.any(pool[P - 2] != 0))


def test_prefill_then_decode_equals_one_forward(record_errors):
    """The chunked forward (Triton) over a prompt, then decode steps (Triton)
    from its final state, against one chunked forward over all the tokens."""
    P_len, D = 100, 4
    args, _ = inputs(10, 2, P_len + D, 2, 4, "bfloat16", options="all")
    args.pop("initial_state")
    kw = {n: args.pop(n) for n in list(args) if n not in ("q", "k", "v", "g", "beta", "A_log",
                                                          "dt_bias")}
    chunk = jax.jit(gdn_jax.chunk_gated_delta_rule, static_argnames=STATIC)
    o_full, s_full = chunk(**args, **kw, output_final_state=True)
    cut = lambda s, e: {n: (a[:, s:e] if a.ndim >= 3 else a) for n, a in args.items()}  # noqa: E731
    o, state = chunk(**cut(0, P_len), **kw, output_final_state=True)
    outs = [o]
    for t in range(P_len, P_len + D):
        o_t, state = decode(**cut(t, t + 1), **kw, initial_state=state, output_final_state=True)
        outs.append(o_t)
    o = jnp.concatenate(outs, axis=1)
    errs = check_decode(o, state, (np.asarray(o_full, np.float64), np.asarray(s_full, np.float64)),
                        MATH_TOL["bfloat16"])
    record_errors("gpu prefill+decode vs forward", "bfloat16", errs)


def test_autotuned_config_at_decode_shapes():
    """The autotuner times every config at the launch's size class (batch 64
    and 1 here) and the chosen ones compute the same function."""
    from gdn_jax import autotune

    for B in (64, 1):
        args, ref = inputs(11, B, 1, 16, 32, "bfloat16", pool=B + 3)
        idx = np.arange(B, dtype=np.int32)[::-1] + 3
        run(args, ref, MATH_TOL["bfloat16"], idx=idx)
    picks = [cfg for key, cfg in autotune._CHOSEN.items() if key[0] == "fused_recurrent"]
    assert len(picks) >= 2, autotune._CHOSEN


@pytest.mark.parametrize("v_first", [False, True], ids=["k_major", "v_first"])
def test_every_config(v_first, monkeypatch):
    """Every config the autotuner may pick computes the same function."""
    from gdn_jax import autotune
    from gdn_jax.autotune import config_kwargs
    from gdn_jax.kernels.fused_recurrent import gdn_fused_recurrent_kernel

    args, ref = inputs(12, 3, 2, 2, 4, "bfloat16", options="all", pool=5, v_first=v_first)
    idx = np.array([4, 0, 2], np.int32)
    for config in gdn_fused_recurrent_kernel.configs:
        monkeypatch.setitem(autotune.UNTUNED, "fused_recurrent", config_kwargs(config))
        fresh = jax.jit(gdn_jax.fused_recurrent_gated_delta_rule, static_argnames=STATIC)
        run(args, ref, MATH_TOL["bfloat16"], idx=idx, fn=fresh)
