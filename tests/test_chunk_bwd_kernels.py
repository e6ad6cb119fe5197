"""The backward kernels (kernels/chunk_bwd_walk.py, chunk_bwd_local.py,
wy_bwd.py, with the forward walk's recompute) under Triton's interpreter on
torch CPU tensors, chained as the GPU path chains them
(gdn_jax.torch_launch.chunk_bwd_torch), against ``jax.grad`` of the float64
per-token recurrence. float32 and float16 (the interpreter cannot multiply
bfloat16; tests/test_chunk_grad_gpu.py covers it on the GPU)."""
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the interpreter tests launch the kernels on torch CPU tensors")
if jax.default_backend() != "cpu":
    pytest.skip("interpreter tests run where JAX has no GPU (CI)", allow_module_level=True)
assert os.environ.get("TRITON_INTERPRET") == "1", "conftest.py sets TRITON_INTERPRET=1 on CPU"

import jax.numpy as jnp  # noqa: E402

from gdn_jax.torch_launch import chunk_bwd_torch, fwd_intra_torch  # noqa: E402
from inputs import chunk_local_cumsum  # noqa: E402
from numpy_reference import rel_err  # noqa: E402
from test_chunk_grad import ARGS, draw, float64_grads  # noqa: E402

TORCH = {"float32": torch.float32, "float16": torch.float16}
TOL = {"float32": 1e-5, "float16": 1e-2}  # docs/math.md: gradients within 1e-2 in fp16


def run(dtype, B, T, Hg, H, K, V, cu=None, seed=0, gate_scale=1.0, **forms):
    N = B if cu is None else len(cu) - 1
    x, (do, dht) = draw(seed, B, T, Hg, H, K, V, N, gate_scale)
    td, f32 = TORCH[dtype], torch.float32
    t = lambda a, d=td: torch.from_numpy(np.ascontiguousarray(a)).to(d)  # noqa: E731
    # the reference on the inputs as the kernels saw them (q, k, v rounded to dtype)
    x = {a: (t(x[a]).double().numpy() if a in "qkv" else x[a]) for a in ARGS}
    cut = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    gc = chunk_local_cumsum(x["g"].astype(np.float32), [0] if cu is None else list(cu[:-1]))
    _, _, A = fwd_intra_torch(t(x["k"]), t(x["v"]), t(gc, f32), t(x["beta"], f32), cu_seqlens=cut,
                              autotune=False, dot_precision="ieee", path="split")
    dq, dk, dv, da, db, dh0 = chunk_bwd_torch(t(x["q"]), t(x["k"]), t(x["v"]), t(gc, f32), t(x["beta"], f32),
                                               A, t(x["initial_state"], f32), t(do), t(dht, f32), cut,
                                               scale=K ** -0.5, dot_precision="ieee", **forms)
    cu_j = None if cu is None else jnp.asarray(cu, jnp.int32)
    got = [dq.numpy(), dk.numpy(), dv.numpy(), da.numpy(), db.numpy(), dh0.numpy()]
    want = float64_grads(x, (t(do).double().numpy(), dht), cu_j)
    for name, g, w in zip(ARGS, got, want):
        e = rel_err(np.asarray(g, np.float64), w)
        assert e < TOL[dtype], f"d{name}: {e:.2e}"


@pytest.mark.parametrize("dtype", list(TORCH))
@pytest.mark.parametrize("B,T,Hg,H", [(2, 130, 2, 4), (1, 64, 1, 1), (1, 1, 1, 2), (2, 330, 1, 2)])
def test_fixed_length(dtype, B, T, Hg, H):
    run(dtype, B, T, Hg, H, 32, 16, seed=T)


def test_packed():
    run("float32", 1, 200, 2, 4, 32, 16, cu=[0, 0, 1, 70, 200], seed=3)


@pytest.mark.parametrize("B,T,cu", [(1, 70, None), (2, 70, None), (1, 150, [0, 1, 70, 150])])
def test_head_dims_past_one_block(B, T, cu):
    """K = 96 (two K blocks of 64 in the per-chunk kernel, a masked tail), V = 40;
    batch rows and packed sequences (the K blocks share axis 0 with chunks and heads)."""
    run("float32", B, T, 1, 2, 96, 40, cu=cu, seed=4)


def test_strong_gates_in_a_partial_chunk():
    """Gates of -16 softplus per step: the padding rows of a partial chunk stay out of the exponents."""
    run("float32", 1, 100, 1, 2, 32, 16, seed=6, gate_scale=16.0)


@pytest.mark.parametrize("B,T,cu", [(2, 70, None), (1, 150, [0, 1, 70, 150])])
def test_value_columns_past_one_block(B, T, cu):
    """V = 160 in float32: the per-chunk and WY kernels' sums over V run over
    two blocks of 128 columns (chunk_bwd_launch.value_blocks), the second masked."""
    run("float32", B, T, 1, 2, 32, 160, cu=cu, seed=7)


@pytest.mark.parametrize("qk_in", [True, False])
def test_walks_on_rebuilt_w_u(qk_in):
    """The walks' other forms (``FROM_A`` off: ``w, u`` rebuilt by
    ``recompute_w_u``; ``QK_IN`` off: the reverse walk forms ``q k^T``),
    packed with a partial chunk."""
    run("float32", 1, 150, 1, 2, 32, 16, cu=[0, 1, 70, 150], seed=8, qk_in=qk_in, from_A=False)


def test_reverse_walk_forming_qk():
    """``QK_IN`` off with ``FROM_A`` on (the walks read ``A``)."""
    run("float32", 2, 100, 1, 2, 32, 16, seed=9, qk_in=False)


def test_per_chunk_kernel_in_narrower_key_blocks():
    """The per-chunk kernel's ``BK`` at 16 (four K blocks at K = 64, the
    launch's ``dg`` rows per block summed), packed with a partial chunk."""
    configs = {"chunk_bwd_local": dict(num_warps=4, num_stages=2, BK=16)}
    run("float32", 1, 150, 1, 2, 64, 16, cu=[0, 1, 70, 150], seed=11, configs=configs)


@pytest.mark.parametrize("dtype", list(TORCH))
def test_value_blocks_in_a_pipelined_loop(dtype):
    """The per-chunk and WY kernels' sums over V in blocks of 16 columns (V =
    40: three blocks, the last masked) as a loop Triton software-pipelines
    (``V_STAGES=2``), packed with empty and one-row sequences."""
    configs = {name: dict(V_STAGES=2, BV=16, num_warps=4, num_stages=2) for name in ("chunk_bwd_local", "wy_bwd")}
    run(dtype, 1, 150, 1, 2, 32, 40, cu=[0, 0, 1, 70, 150], seed=12, configs=configs)


@pytest.mark.parametrize("qk_in,from_A", [(True, True), (False, True), (True, False), (False, False)])
def test_reverse_walk_transposed(qk_in, from_A):
    """The reverse walk's transposed form (``TRANSPOSED``: ``dS^T`` on chip),
    each input form, packed with empty and one-row sequences, V = 40 in
    three blocks of 16 columns (the last masked)."""
    configs = {"chunk_bwd_walk": dict(BV=16, TRANSPOSED=True, num_warps=4, num_stages=2)}
    run("float32", 1, 150, 1, 2, 32, 40, cu=[0, 0, 1, 70, 150], seed=13, configs=configs, qk_in=qk_in,
        from_A=from_A)


@pytest.mark.parametrize("dtype", list(TORCH))
def test_reverse_walk_transposed_fixed_length(dtype):
    """The transposed reverse walk on fixed-length rows, GQA 2, T not a multiple of 64."""
    configs = {"chunk_bwd_walk": dict(BV=16, TRANSPOSED=True, num_warps=4, num_stages=2)}
    run(dtype, 2, 130, 1, 2, 32, 32, seed=14, configs=configs)
