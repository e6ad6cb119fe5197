"""The Triton kernel source itself, run by Triton's interpreter on torch CPU
tensors (TRITON_INTERPRET=1, set by conftest.py where there is no GPU),
against the float64 NumPy reference."""
import os

import numpy as np
import pytest

import jax

if jax.default_backend() != "cpu":
    pytest.skip(
        "interpreter tests run where JAX has no GPU (CI); on a GPU machine run "
        "JAX_PLATFORMS=cpu pytest tests/test_kernels_interpreter.py",
        allow_module_level=True,
    )
assert os.environ.get("TRITON_INTERPRET") == "1", "conftest.py sets TRITON_INTERPRET=1 on CPU"

# The interpreter launches the kernels on torch CPU tensors: without torch this
# module skips (pip install -e '.[interpreter]', a CPU build is enough).
torch = pytest.importorskip(
    "torch", reason="the interpreter tests launch the Triton kernels on torch CPU tensors; "
    "install torch (CPU build: pip install torch --index-url https://download.pytorch.org/whl/cpu)")

from gdn_jax.torch_launch import fwd_intra_torch  # noqa: E402
from gdn_jax.triton_launch import seed_triton_missing  # noqa: E402
from inputs import as_f64, chunk_local_cumsum, make_inputs, per_step_gates  # noqa: E402
from numpy_reference import INTRA_TOL, a_support, check_against_numpy, fwd_intra_numpy, max_rel_err  # noqa: E402
from repo_files import load_module  # noqa: E402

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def to_torch(x, dtype):
    return None if x is None else torch.from_numpy(np.asarray(x, np.float32).copy()).to(dtype)


# The seed's two kernels, the one-kernel path, and its A kernel then w/u (the
# split path).
PATHS = {"seed": dict(path="seed"), "one-kernel": dict(path="fused"), "split": dict(path="split")}


def run(dtype, B, T, Hg, H, K, V, use_g=True, cu=None, seed=0, path=None, chunk_indices=None):
    if path["path"] == "seed" and seed_triton_missing():  # triton >= 3.9: impl="seed" raises
        pytest.skip(seed_triton_missing())
    k, v, g, beta = make_inputs(seed, B, T, Hg, H, K, V, dtype, use_g=use_g, cu_seqlens=cu)
    td = TORCH_DTYPES[dtype]
    outs = fwd_intra_torch(
        to_torch(k, td), to_torch(v, td), to_torch(g, torch.float32), to_torch(beta, torch.float32),
        cu_seqlens=None if cu is None else torch.tensor(cu, dtype=torch.int32),
        chunk_indices=None if chunk_indices is None else torch.from_numpy(chunk_indices),
        autotune=False, dot_precision="ieee", **path,
    )
    outs = [o.float().numpy() for o in outs]
    ref = fwd_intra_numpy(*as_f64(k, v, g, beta), cu_seqlens=cu)
    return outs, ref


# No bfloat16 here: Triton's interpreter stores bfloat16 as uint16 and its
# `tl.dot` multiplies the bit patterns (measured: A off by 1e10; upstream
# triton-lang/triton#11584, "we just don't support it yet"). bfloat16 runs in
# the GPU tests (tests/test_gpu.py).
@pytest.mark.parametrize(
    "dtype,B,T,Hg,H,use_g",
    [
        ("float32", 2, 65, 1, 2, True),
        ("float32", 1, 64, 2, 4, False),
        ("float32", 1, 1, 1, 4, True),
        ("float16", 1, 130, 1, 1, True),
        ("float16", 1, 63, 2, 2, True),
    ],
)
@pytest.mark.parametrize("path", PATHS)
def test_fixed_length(dtype, B, T, Hg, H, use_g, path, record_errors):
    outs, ref = run(dtype, B, T, Hg, H, 32, 16, use_g=use_g, seed=T, path=PATHS[path])
    tol = {"w": 1e-5, "u": 1e-5, "A": 1e-5} if dtype == "float32" else None
    record_errors(f"interpreter {path}", dtype, check_against_numpy(outs, ref, dtype, B, T, tol=tol))


@pytest.mark.parametrize("path", PATHS)
def test_head_dims_past_one_tile(path, record_errors):
    """K and V that are not powers of two and span several column tiles (the
    w/u kernel's are up to 128 wide, the one kernel's 64): the masked tail
    columns of w and u."""
    outs, ref = run("float32", 1, 70, 1, 2, 96, 160, seed=5, path=PATHS[path])
    record_errors(f"interpreter {path} K96 V160", "float32",
                  check_against_numpy(outs, ref, "float32", 1, 70,
                                      tol={"w": 1e-5, "u": 1e-5, "A": 1e-5}))


@pytest.mark.parametrize("cu", [[0, 1, 1, 64, 130], [0, 0, 70, 70]])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("path", PATHS)
def test_varlen(cu, dtype, path, record_errors):
    outs, ref = run(dtype, 1, cu[-1], 2, 4, 32, 32, cu=cu, seed=len(cu), path=PATHS[path])
    tol = {"w": 1e-5, "u": 1e-5, "A": 1e-5} if dtype == "float32" else None
    record_errors(f"interpreter {path}", dtype,
                  check_against_numpy(outs, ref, dtype, 1, cu[-1], cu, tol=tol))


@pytest.mark.parametrize("path", PATHS)
def test_padded_work_list(path, record_errors):
    """The work list ``chunk_indices_in_graph`` builds inside ``jax.jit``: the
    real chunks, then padding rows (chunk ``cdiv(T, 64)`` of sequence 0),
    which every kernel must skip (on the GPU only the JAX launch builds it)."""
    from gdn_jax.chunk_indices import chunk_indices_in_graph

    cu = [0, 1, 1, 64, 130]
    ci = np.asarray(chunk_indices_in_graph(jax.numpy.asarray(cu, jax.numpy.int32), cu[-1], 64))
    assert len(ci) > 4 and (ci[4:] == (0, 3)).all()  # padding rows past the 4 real chunks
    outs, ref = run("float32", 1, cu[-1], 2, 4, 32, 16, cu=cu, seed=7, path=PATHS[path], chunk_indices=ci)
    record_errors(f"interpreter {path} padded work list", "float32",
                  check_against_numpy(outs, ref, "float32", 1, cu[-1], cu,
                                      tol={"w": 1e-5, "u": 1e-5, "A": 1e-5}))


@pytest.mark.parametrize("dtype,B,T,Hg,H,cu", [
    ("float32", 2, 130, 2, 4, None), ("float32", 1, 63, 1, 8, None),
    ("float32", 1, 200, 2, 4, [0, 0, 1, 70, 70, 200]), ("float16", 1, 200, 2, 4, [0, 0, 1, 70, 70, 200])])
def test_A_kernel_sums_per_step_gates(dtype, B, T, Hg, H, cu, record_errors):
    """``SUM_G`` (path "A", the whole forward's first kernel): given the
    per-step gates, weak to strong, the kernel sums them within each chunk
    itself; ``A`` against the float64 reference on their chunk-local sums,
    fixed and packed (empty and one-row sequences, T not a multiple of 64)."""
    k, v, _, beta = make_inputs(T + H, B, T, Hg, H, 32, 16, dtype, use_g=False, cu_seqlens=cu)
    a = per_step_gates(np.random.default_rng(T + H), B, T, H)
    gc = chunk_local_cumsum(a.astype(np.float64), [0] if cu is None else cu[:-1])
    td = TORCH_DTYPES[dtype]
    _, _, A = fwd_intra_torch(to_torch(k, td), to_torch(v, td), torch.from_numpy(a), to_torch(beta, torch.float32),
                              cu_seqlens=None if cu is None else torch.tensor(cu, dtype=torch.int32),
                              autotune=False, dot_precision="ieee", path="A", sum_g=True)
    A = A.double().numpy()
    kk, vv, bb = as_f64(k, v, beta)
    err = max_rel_err(A, fwd_intra_numpy(kk, vv, gc, bb, cu_seqlens=cu)[2], B, T, cu)
    record_errors("interpreter A SUM_G", dtype, {"A": err})
    assert np.isfinite(A).all()
    assert err <= (1e-5 if dtype == "float32" else INTRA_TOL[dtype]["A"])
    off = ~a_support(B, T, cu)[:, :, None, :]
    assert (np.broadcast_to(off, A.shape) <= (A == 0)).all(), "A is not zero off its support"


@pytest.mark.parametrize("name", ["seed_neumann", "seed_interleaved", "fused_neumann",
                                  "split_neumann", "fused_rows", "split_rows", "wu_narrow",
                                  "split_substitution", "split_plain_dots", "fused_plain_dots",
                                  "split_gate_exp", "fused_gate_exp",
                                  "split_mask_before", "fused_mask_before",
                                  "split_gates_one_load", "fused_gates_one_load",
                                  "split_gates_split_late", "fused_gates_split_late"])
@pytest.mark.parametrize("use_g", [True, False])
def test_benchmark_kernel_variant(name, use_g, record_errors):
    """The benchmark's kernel variants that change how the diagonal blocks are
    inverted, how the gates are loaded or applied, the w/u tiles or the order
    of the dots' inner index compute the same function, with and without
    ``g`` (the other variants time only, or undo interpreter-safe changes and
    cannot run here)."""
    launch_path, replaced = load_module("benchmarks/bench_fwd_intra.py").kernel_variant(name)
    cu = [0, 1, 1, 64, 130]
    outs, ref = run("float32", 1, cu[-1], 2, 4, 32, 32, use_g=use_g, cu=cu, seed=3,
                    path=dict(path=launch_path, **replaced))
    tol = {"w": 1e-5, "u": 1e-5, "A": 1e-5}
    record_errors(f"interpreter {name}", "float32",
                  check_against_numpy(outs, ref, "float32", 1, cu[-1], cu, tol=tol))


def test_every_benchmark_variant_applies():
    """Each benchmark variant's source change still finds the kernel text it
    replaces (the timing-only ones cannot run here, but must still build)."""
    bench = load_module("benchmarks/bench_fwd_intra.py")
    for name, (_, stage) in bench.VARIANTS.items():
        (kernel,) = bench.kernel_variant(name)[1].values()
        assert kernel.fn.__name__ == bench.STAGES[stage][2], name


@pytest.mark.parametrize("path,kernel_name", [("seed", "kkt_solve"), ("fused", "fused"), ("split", "A")])
def test_every_autotune_tile_size(path, kernel_name, monkeypatch, record_errors):
    """Every BK the autotuner may pick computes the same function (the
    interpreter runs one fixed config, ``gdn_jax.autotune.UNTUNED``)."""
    import gdn_jax.autotune as launch
    from gdn_jax.kernels.fused_intra import gdn_fwd_intra_A_kernel, gdn_fwd_intra_fused_kernel
    from gdn_jax.kernels.kkt_solve import chunk_gated_delta_rule_fwd_kkt_solve_kernel

    kernel = {"kkt_solve": chunk_gated_delta_rule_fwd_kkt_solve_kernel, "fused": gdn_fwd_intra_fused_kernel,
              "A": gdn_fwd_intra_A_kernel}[kernel_name]
    tiles = sorted({c.kwargs["BK"] for c in kernel.configs})
    assert len(tiles) > 1
    cu = [0, 1, 64, 130]
    for BK in tiles:
        monkeypatch.setitem(launch.UNTUNED, kernel_name, {**launch.UNTUNED[kernel_name], "BK": BK})
        outs, ref = run("float32", 1, cu[-1], 2, 4, 96, 32, cu=cu, seed=BK, path=dict(path=path))
        record_errors(f"interpreter {path} BK={BK}", "float32",
                      check_against_numpy(outs, ref, "float32", 1, cu[-1], cu,
                                          tol={"w": 1e-5, "u": 1e-5, "A": 1e-5}))


def test_torch_launch_pins_given_configs():
    """``fwd_intra_torch(configs=...)`` launches the given config (the benchmark
    times torch with the configs JAX's autotuner chose), else the fixed one."""
    from gdn_jax.autotune import UNTUNED
    from gdn_jax.kernels.fused_intra import gdn_fwd_intra_A_kernel
    from gdn_jax.torch_launch import tuned_or_fixed

    pinned = dict(BK=32, num_warps=2, num_stages=2)
    assert tuned_or_fixed(gdn_fwd_intra_A_kernel, "A", True, {"A": pinned}) == (gdn_fwd_intra_A_kernel.fn, pinned)
    assert tuned_or_fixed(gdn_fwd_intra_A_kernel, "A", False, {"fused": pinned}) == (
        gdn_fwd_intra_A_kernel.fn, UNTUNED["A"])
    assert tuned_or_fixed(gdn_fwd_intra_A_kernel, "A", True) == (gdn_fwd_intra_A_kernel, {})
