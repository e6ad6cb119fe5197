"""kernels/chunk_qk.py under Triton's interpreter (torch CPU tensors) against
its definition in float64: per chunk and value head ``Aqk[i, j] = (q_i . k_j)
exp(gc_i - gc_j)`` for ``j <= i``, zeros elsewhere, laid out as ``A``. The
walk's tests (tests/test_chunk_fwd_kernel.py) check the output it feeds;
these check the block itself, row by row; and the experiment that writes it
beside ``A`` in the A kernel (``kernels/fused_intra.py``,
``gdn_fwd_intra_A_qk_kernel``), both outputs against float64. float32 and
float16 (the interpreter cannot multiply bfloat16)."""
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the interpreter tests launch the kernels on torch CPU tensors")
if jax.default_backend() != "cpu":
    pytest.skip("interpreter tests run where JAX has no GPU (CI)", allow_module_level=True)
assert os.environ.get("TRITON_INTERPRET") == "1", "conftest.py sets TRITON_INTERPRET=1 on CPU"

from gdn_jax.torch_launch import chunk_qk_torch, fwd_intra_A_qk_torch  # noqa: E402
from inputs import chunk_local_cumsum, per_step_gates  # noqa: E402
from numpy_reference import INTRA_TOL, a_support, fwd_intra_numpy, max_rel_err  # noqa: E402

TORCH = {"float32": torch.float32, "float16": torch.float16}
TOL = {"float32": 1e-5, "float16": 2e-3}


def qk_reference(q, k, gc, starts, T):
    """``Aqk [B, T, H, 64]`` in float64 from the definition; ``starts``: the
    sequences' first rows (one sequence per batch row without packing)."""
    B, _, Hg, K = q.shape
    H = gc.shape[2]
    out = np.zeros((B, T, H, 64))
    bounds = list(starts) + [T]
    for b in range(B):
        for s, e in zip(bounds[:-1], bounds[1:]):
            for c0 in range(s, e, 64):
                rows = np.arange(c0, min(c0 + 64, e))
                for h in range(H):
                    hk = h // (H // Hg)
                    g = gc[b, rows, h]
                    # exponents above the diagonal (dropped by tril) as 0: strong gates overflow there
                    a = q[b, rows, hk] @ k[b, rows, hk].T * np.exp(np.tril(g[:, None] - g[None, :]))
                    out[b, rows, h, :len(rows)] = np.tril(a)
    return out


def run(dtype, B, T, Hg, H, K, cu=None, seed=0, config=None, with_A=False, sum_g=False):
    """``with_A``: the A kernel writing the block beside ``A`` (``beta`` drawn
    too); ``sum_g``: the kernel given the per-step gates (:func:`per_step_gates`),
    which it sums itself, the reference their float64 chunk-local sums."""
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    q, k = (unit(rng.standard_normal((B, T, Hg, K))) for _ in range(2))
    a = -np.logaddexp(0, -3 * rng.standard_normal((B, T, H)))  # logsigmoid, strong gates included
    starts = [0] if cu is None else list(cu[:-1])
    if sum_g:
        a = per_step_gates(rng, B, T, H).astype(np.float64)  # float32 values, as the kernel reads them
    gc = chunk_local_cumsum(a, starts)
    td = TORCH[dtype]
    t = lambda x, d=td: torch.from_numpy(np.ascontiguousarray(x)).to(d)  # noqa: E731
    cut = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    if with_A:
        beta = 1 / (1 + np.exp(-rng.standard_normal((B, T, H))))
        A, out = fwd_intra_A_qk_torch(t(q), t(k), t(gc, torch.float32), t(beta, torch.float32), cut,
                                      autotune=False, dot_precision="ieee", config=config)
        v = np.ones((B, T, H, 1))  # fwd_intra_numpy's u, w are not compared
        A_ref = fwd_intra_numpy(t(k).double().numpy(), v, gc, beta, cu)[2]
        assert max_rel_err(A.double().numpy(), A_ref, B, T, cu) <= INTRA_TOL[dtype]["A"]
        off = ~a_support(B, T, cu)[:, :, None, :]
        assert (np.broadcast_to(off, A.shape) <= (A.double().numpy() == 0)).all(), "A off its support"
    else:
        out = chunk_qk_torch(t(q), t(k), t(a if sum_g else gc, torch.float32), cut, autotune=False,
                             dot_precision="ieee", config=config, sum_g=sum_g)
    assert out.dtype == td and out.shape == (B, T, H, 64)
    got = out.double().numpy()
    ref = qk_reference(*(t(x).double().numpy() for x in (q, k)), gc, starts, T)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) <= TOL[dtype] * np.linalg.norm(ref)
    # the upper triangle and the columns past a partial chunk's rows are exact zeros
    assert (got[ref == 0] == 0).all()


@pytest.mark.parametrize("dtype", list(TORCH))
@pytest.mark.parametrize("B,T,Hg,H", [(2, 130, 2, 4), (1, 64, 1, 1), (1, 1, 1, 2), (1, 63, 1, 8)])
def test_fixed_length(dtype, B, T, Hg, H):
    run(dtype, B, T, Hg, H, 32, seed=T)


def test_packed_with_empty_and_one_row_sequences():
    run("float32", 1, 200, 2, 4, 32, cu=np.array([0, 0, 1, 70, 70, 200], np.int32), seed=3)


@pytest.mark.parametrize("K", [96, 256])
def test_head_dims(K):
    """K = 96: a masked tail in the 128-wide K tile; K = 256: two K blocks."""
    run("float32", 1, 70, 1, 2, K, seed=K)


@pytest.mark.parametrize("num_warps", [2, 4, 8])
def test_every_autotune_config(num_warps):
    run("float32", 1, 130, 1, 2, 32, cu=np.array([0, 5, 130], np.int32), seed=7,
        config=dict(num_warps=num_warps, num_stages=2))


@pytest.mark.parametrize("dtype", list(TORCH))
@pytest.mark.parametrize("B,T,Hg,H,cu", [(2, 130, 2, 4, None), (1, 63, 1, 8, None),
                                         (1, 200, 2, 4, np.array([0, 0, 1, 70, 70, 200], np.int32))])
def test_beside_A(dtype, B, T, Hg, H, cu):
    """The block and ``A`` from the A kernel's experiment, fixed and packed
    (empty and one-row sequences), GQA 2 and 8, T not a multiple of 64."""
    run(dtype, B, T, Hg, H, 32, cu=cu, seed=T + H, with_A=True)


@pytest.mark.parametrize("BK,num_warps", [(32, 1), (64, 2)])
def test_beside_A_configs(BK, num_warps):
    """K = 96 (a masked tail) at the configs that compile without spills (docs/performance.md)."""
    run("float32", 1, 130, 1, 2, 96, cu=np.array([0, 5, 130], np.int32), seed=11, with_A=True,
        config=dict(BK=BK, num_warps=num_warps))


@pytest.mark.parametrize("dtype,B,T,Hg,H,cu", [
    ("float32", 2, 130, 2, 4, None), ("float32", 1, 63, 1, 8, None),
    ("float32", 1, 200, 2, 4, np.array([0, 0, 1, 70, 70, 200], np.int32)),
    ("float16", 1, 200, 2, 4, np.array([0, 0, 1, 70, 70, 200], np.int32))])
def test_per_step_gates_summed_in_kernel(dtype, B, T, Hg, H, cu):
    """``SUM_G``: the per-step gates, weak to strong, summed in the kernel
    (fixed and packed with empty and one-row sequences, T not a multiple of
    64), against the block of their float64 chunk-local sums."""
    run(dtype, B, T, Hg, H, 32, cu=cu, seed=T + H + 1, sum_g=True)
