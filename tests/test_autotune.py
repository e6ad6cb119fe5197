"""gdn_jax.autotune: one config per launch, timed once per launch signature
(CPU: a stand-in launch whose configs differ in run time)."""
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton

import gdn_jax
from gdn_jax import autotune
from gdn_jax.chunk_indices import padding_row

CONFIGS = [triton.Config({"BK": bk}, num_warps=w, num_stages=3) for bk, w in [(32, 2), (64, 1), (64, 4)]]
DELAY_S = {(32, 2): 0.004, (64, 1): 0.0, (64, 4): 0.002}  # config (64, 1) is the fastest


def slow_launch(traced):
    """A launch whose run time depends on the config; records each trace."""
    def launch(ops, BK, num_warps, num_stages):
        traced.append((BK, num_warps))
        x = ops[0]
        delay = DELAY_S[(BK, num_warps)]
        return jax.pure_callback(lambda a: (time.sleep(delay), a)[1], jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return launch


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(autotune, "_CHOSEN", {})
    monkeypatch.delenv("GDN_JAX_AUTOTUNE", raising=False)
    monkeypatch.setenv("GDN_JAX_CACHE_DIR", str(tmp_path / "store"))


def test_a_new_process_takes_the_stored_choice_without_timing(monkeypatch, tmp_path):
    traced = []
    ops = (jnp.ones((4, 8), jnp.bfloat16), 8)
    first = autotune.chosen_config("A", CONFIGS, ops, slow_launch(traced), "sig", T=8)
    assert (tmp_path / "store" / "autotune.json").is_file()
    n = len(traced)
    monkeypatch.setattr(autotune, "_CHOSEN", {})  # a new process
    assert autotune.chosen_config("A", CONFIGS, ops, slow_launch(traced), "sig", T=8) == first
    assert len(traced) == n  # read, not timed
    with autotune.without_timing():  # a stored choice serves the partitioned op too
        monkeypatch.setattr(autotune, "_CHOSEN", {})
        assert autotune.chosen_config("A", CONFIGS, ops, slow_launch(traced), "sig", T=8) == first
    monkeypatch.setattr(autotune, "_CHOSEN", {})
    autotune.chosen_config("A", CONFIGS[1:], ops, slow_launch(traced), "sig", T=8)
    assert len(traced) > n  # other candidates: timed again


def test_a_stored_choice_outside_the_candidates_or_a_bad_file_is_timed_again(monkeypatch, tmp_path):
    from gdn_jax import autotune_store

    traced = []
    ops = (jnp.ones((4, 8), jnp.bfloat16), 8)
    candidates = [autotune.config_kwargs(c) for c in CONFIGS]
    key = ("A", "sig", jax.devices()[0].device_kind, ("bfloat16",))
    autotune_store.save(key, candidates, dict(BK=128, num_warps=1, num_stages=3))
    assert autotune_store.lookup(key, candidates) is None
    assert autotune.chosen_config("A", CONFIGS, ops, slow_launch(traced), "sig", T=8)["BK"] == 64
    assert traced and autotune_store.lookup(key, candidates)["BK"] == 64  # overwritten
    (tmp_path / "store" / "autotune.json").write_text("{not json")
    assert autotune_store.lookup(key, candidates) is None


def test_the_fixed_config_after_failures_is_not_stored(tmp_path):
    def failing(ops, **kw):
        raise ValueError("out of resources")

    with pytest.warns(RuntimeWarning, match="no config of kernel .A. could be timed"):
        assert autotune.chosen_config("A", CONFIGS, (jnp.ones(3),), failing, "sig", T=3) == autotune.UNTUNED["A"]
    assert not (tmp_path / "store" / "autotune.json").exists()


def test_no_file_with_an_empty_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("GDN_JAX_CACHE_DIR", "")
    monkeypatch.chdir(tmp_path)
    autotune.chosen_config("A", CONFIGS, (jnp.ones(3),), slow_launch([]), "sig", T=3)
    assert list(tmp_path.iterdir()) == []


def test_picks_the_fastest_config_once_per_key():
    traced = []
    ops = (jnp.ones((4, 8), jnp.bfloat16), 8)
    first = autotune.chosen_config("A", CONFIGS, ops, slow_launch(traced), "sig", T=8)
    assert first == dict(BK=64, num_warps=1, num_stages=3)
    assert sorted(set(traced)) == sorted((c.kwargs["BK"], c.num_warps) for c in CONFIGS)
    n = len(traced)
    assert autotune.chosen_config("A", CONFIGS, ops, slow_launch(traced), "sig", T=8) == first
    assert len(traced) == n  # cached: not timed again
    autotune.chosen_config("A", CONFIGS, (jnp.ones((4, 16), jnp.bfloat16), 16), slow_launch(traced), "sig", T=16)
    assert len(traced) == n  # a new length: the kernels' autotune keys leave it out
    autotune.chosen_config("A", CONFIGS, (jnp.ones((4, 16), jnp.float16), 16), slow_launch(traced), "sig", T=16)
    assert len(traced) == 2 * n  # a new dtype is timed
    autotune.chosen_config("A", CONFIGS, ops, slow_launch(traced), "other constexprs", T=8)
    assert len(traced) == 3 * n  # and new constexprs


def test_timed_eagerly_inside_jit_on_stand_ins():
    traced, seen = [], []

    def f(x, cu):
        seen.append(autotune.chosen_config("A", CONFIGS, (x, cu, 8), slow_launch(traced), "sig", T=8))
        return x

    jax.jit(f)(jnp.ones((4, 8), jnp.float32), jnp.array([0, 3, 8], jnp.int32))
    assert seen == [dict(BK=64, num_warps=1, num_stages=3)]


def test_each_timed_call_runs_every_launch():
    """The barrier between launches keeps XLA from merging or dropping them."""
    executed = []

    def launch(ops, **kw):
        x = ops[0]
        return jax.pure_callback(lambda a: (executed.append(1), a)[1], jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    run = autotune.repeated(launch, (jnp.ones(3), 3), [0], {})
    jax.block_until_ready(run(jnp.ones(3)))
    assert len(executed) == autotune.LAUNCHES_PER_CALL


def test_no_timing_inside_without_timing():
    """Inside autotune.without_timing (the partitioned op): a key timed before
    keeps its config, a new one gets the fixed config, nothing is timed."""
    traced = []
    ops = (jnp.ones((4, 8), jnp.bfloat16), 8)
    first = autotune.chosen_config("A", CONFIGS, ops, slow_launch(traced), "sig", T=8)
    n = len(traced)
    with autotune.without_timing():
        assert not autotune.timing_allowed()
        assert autotune.chosen_config("A", CONFIGS, ops, slow_launch(traced), "sig", T=8) == first
        new = autotune.chosen_config("A", CONFIGS, ops, slow_launch(traced), "new", T=8)
        assert new == autotune.UNTUNED["A"]
    assert len(traced) == n and autotune.timing_allowed()


def test_fixed_config_without_timing(monkeypatch):
    monkeypatch.setenv("GDN_JAX_AUTOTUNE", "0")
    traced = []
    config = autotune.chosen_config("fused", CONFIGS, (jnp.ones(3),), slow_launch(traced), "sig", T=3)
    assert config == autotune.UNTUNED["fused"] and traced == []


def test_a_config_that_fails_is_skipped_and_none_running_falls_back_to_the_fixed_one():
    def launch(ops, BK, num_warps, num_stages):
        if BK == 32:
            raise ValueError("out of resources")
        return ops[0] * 2

    assert autotune.fastest(CONFIGS, (jnp.ones(3),), launch)[0]["BK"] == 64

    def failing(ops, **kw):
        raise ValueError("out of resources")

    with pytest.warns(RuntimeWarning, match="(?s)no config of kernel .A. could be timed.*out of resources"):
        assert autotune.chosen_config("A", CONFIGS, (jnp.ones(3),), failing, "sig", T=3) == autotune.UNTUNED["A"]


def test_configs_compiled_in_threads_pick_the_same_and_report_failures(monkeypatch):
    monkeypatch.setattr(autotune, "COMPILE_IN_THREADS", True)
    traced = []
    ops = (jnp.ones((4, 8), jnp.bfloat16), 8)
    runs = autotune.compiled_runs(CONFIGS, ops, slow_launch(traced), [0], [ops[0]])
    assert [kw["BK"] for kw, _ in runs] == [32, 64, 64]
    assert all(isinstance(run, jax.stages.Compiled) for _, run in runs)  # compiled ahead
    assert autotune.fastest(CONFIGS, ops, slow_launch(traced))[0] == dict(BK=64, num_warps=1, num_stages=3)

    def launch(ops, BK, num_warps, num_stages):
        if BK == 32:
            raise ValueError("out of resources")
        return ops[0] * 2

    runs = autotune.compiled_runs(CONFIGS, ops, launch, [0], [ops[0]])
    assert not isinstance(runs[0][1], jax.stages.Compiled)  # left to fail on the caller's thread
    assert autotune.fastest(CONFIGS, ops, launch)[0]["BK"] == 64


def test_stand_ins_for_traced_offsets_are_valid_offsets():
    T, n_rows = 300, gdn_jax.chunk_indices.cdiv(300, 64) + 4
    got = []

    def f(k, beta, cu, ci):
        got.extend(autotune.stand_ins((k, beta, cu, ci, jnp.zeros((1,), jnp.int32), T), T))
        return k

    k = jnp.ones((1, T, 2, 16), jnp.bfloat16)
    beta = jnp.ones((1, T, 2), jnp.float32)
    cu = jnp.array([0, 5, 5, 100, T], jnp.int32)
    jax.jit(f)(k, beta, cu, gdn_jax.chunk_indices.chunk_indices_in_graph(cu, T))
    k_, beta_, cu_, ci_, dummy, T_ = got
    for real, stand_in in [(k, k_), (beta, beta_)]:
        assert (stand_in.shape, stand_in.dtype) == (real.shape, real.dtype)
        x = np.asarray(stand_in, np.float32)
        assert np.all(x > 0) and np.all(x <= 1) and np.std(x) > 0
    cu_ = np.asarray(cu_)
    assert cu_.shape == (5,) and cu_[0] == 0 and cu_[-1] == T and np.all(np.diff(cu_) >= 0)
    ci_ = np.asarray(ci_)
    real = np.asarray(gdn_jax.prepare_chunk_indices(cu_))
    assert ci_.shape == (n_rows, 2) and ci_.dtype == np.int32
    np.testing.assert_array_equal(ci_[: len(real)], real)
    np.testing.assert_array_equal(ci_[len(real):], np.tile(padding_row(T, 64), (n_rows - len(real), 1)))
    assert (np.asarray(dummy) == 0).all() and T_ == T  # concrete operands kept


STAND_INS_UNDER_A_PERSISTENT_CACHE = """
import sys, jax, jax.numpy as jnp
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
from gdn_jax import autotune
jax.jit(lambda x: (jax.block_until_ready(autotune.stand_ins([x], 4096)), x)[1]).trace(
    jax.ShapeDtypeStruct((1, 4096, 8, 128), jnp.bfloat16))
"""


def test_stand_ins_compile_no_executable_as_large_as_their_values(tmp_path):
    """A 4M-value stand-in: each executable it compiled stays far below its 8 MB
    (``jax.random`` here held its counters as constants: 23 MB for 16M values,
    minutes of the persistent cache's compression per kernel at B=8 T=4096)."""
    subprocess.run([sys.executable, "-c", STAND_INS_UNDER_A_PERSISTENT_CACHE, str(tmp_path)], check=True,
                   env={**os.environ, "JAX_PLATFORMS": "cpu"})
    sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    assert sizes, "the persistent cache stored no executable: the check saw nothing"
    assert max(sizes.values()) < 100_000, sizes


def test_fixed_configs_by_dtype_programs_and_environment(monkeypatch):
    bf16, f32 = jnp.zeros(1, jnp.bfloat16), jnp.zeros(1, jnp.float32)
    assert autotune.untuned("chunk_fwd", (bf16, f32)) == autotune.UNTUNED["chunk_fwd"]
    assert autotune.untuned("chunk_fwd", (bf16, f32), programs=64) == autotune.UNTUNED["chunk_fwd"]
    many = autotune.untuned("chunk_fwd", (bf16, f32), programs=256)
    assert many == autotune.UNTUNED_MANY_PROGRAMS["chunk_fwd"][1] != autotune.UNTUNED["chunk_fwd"]
    # float32 keeps the narrow V block at any width (BV=64 does not fit shared memory)
    assert autotune.untuned("chunk_fwd", (f32,), programs=256) == autotune.UNTUNED["chunk_fwd"]
    # float32's own fixed config where the common one asks too much shared memory
    assert autotune.untuned("chunk_bwd_walk", (f32,)) == autotune.UNTUNED_FLOAT32["chunk_bwd_walk"] \
        != autotune.untuned("chunk_bwd_walk", (bf16, f32)) == autotune.UNTUNED["chunk_bwd_walk"]
    # the WY backward's own fixed config at K = 256, from the launch's K constexpr
    assert autotune.untuned("wy_bwd", (bf16,), key_dim=256) == autotune.UNTUNED_WIDE_KEYS["wy_bwd"][1] \
        != autotune.untuned("wy_bwd", (bf16,), key_dim=128) == autotune.UNTUNED["wy_bwd"]
    monkeypatch.setenv("GDN_JAX_AUTOTUNE", "0")
    wide = autotune.chosen_config("wy_bwd", [], (bf16,), None, (("H", 16), ("K", 256), ("V", 256)), T=64)
    assert wide == autotune.UNTUNED_WIDE_KEYS["wy_bwd"][1]
    monkeypatch.setenv("GDN_JAX_FIXED_CONFIGS", '{"chunk_fwd": {"BV": 16, "num_warps": 8}}')
    assert autotune.untuned("chunk_fwd", (bf16,), programs=256) == {"BV": 16, "num_warps": 8}
    assert autotune.untuned("wy_bwd", (bf16,)) == autotune.UNTUNED["wy_bwd"]
    monkeypatch.setenv("GDN_JAX_FIXED_CONFIGS", '["BV", 16]')
    with pytest.raises(ValueError, match="GDN_JAX_FIXED_CONFIGS must be a JSON object"):
        autotune.untuned("chunk_fwd", (bf16,))
