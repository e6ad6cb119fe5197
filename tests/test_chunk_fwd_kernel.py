"""kernels/chunk_fwd.py under Triton's interpreter (torch CPU tensors), after
the split path's fwd_intra kernels, against the float64 per-token recurrence.
The interpreter cannot multiply bfloat16 (tests/test_kernels_interpreter.py
says why): float32 and float16 here, bfloat16 in tests/test_chunk_gpu.py."""
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the interpreter tests launch the kernels on torch CPU tensors")
if jax.default_backend() != "cpu":
    pytest.skip("interpreter tests run where JAX has no GPU (CI)", allow_module_level=True)
assert os.environ.get("TRITON_INTERPRET") == "1", "conftest.py sets TRITON_INTERPRET=1 on CPU"

from gdn_jax.torch_launch import chunk_fwd_torch, fwd_intra_torch  # noqa: E402
from inputs import chunk_local_cumsum, per_step_gates  # noqa: E402
from numpy_reference import gdn_recurrence_numpy, max_rel_err, rel_err  # noqa: E402

TORCH = {"float32": torch.float32, "float16": torch.float16}
TOL = {"float32": 1e-5, "float16": 5e-3}


def draw(seed, B, T, Hg, H, K, V, cu=None, h0=True):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    q = unit(rng.standard_normal((B, T, Hg, K)))
    k = unit(rng.standard_normal((B, T, Hg, K)))
    v = rng.standard_normal((B, T, H, V))
    a = -np.logaddexp(0, -rng.standard_normal((B, T, H)))  # logsigmoid
    beta = 1 / (1 + np.exp(-rng.standard_normal((B, T, H))))
    N = B if cu is None else len(cu) - 1
    S0 = rng.standard_normal((N, H, K, V)) if h0 else None
    return [x.astype(np.float32) for x in (q, k, v, a, beta)], None if S0 is None else S0.astype(np.float32)


def run(dtype, B, T, Hg, H, K, V, cu=None, h0=True, v_first=False, final=True, seed=0, config=None,
        from_A=False, sum_g=False):
    """The walk after the split path's kernels, on their ``w, u``, or (``from_A``)
    after the ``A`` kernel alone on ``A``, ``v`` and ``beta``, against the
    float64 recurrence. ``sum_g``: the kernels given the per-step gates
    (:func:`per_step_gates`), which they sum themselves (the A kernel and
    chunk_qk with ``from_A``; the split path's w/u kernel takes their sums)."""
    (q, k, v, a, beta), S0 = draw(seed, B, T, Hg, H, K, V, cu, h0)
    if sum_g:
        a = per_step_gates(np.random.default_rng(seed + 1), B, T, H)
    gc = chunk_local_cumsum(a, [0] if cu is None else list(cu[:-1]))
    td = TORCH[dtype]
    t = lambda x, d=td: torch.from_numpy(np.ascontiguousarray(x)).to(d)  # noqa: E731
    cut = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    gates = t(a if sum_g else gc, torch.float32)  # what the walk (and the A kernel, from_A) reads
    w, u, A = fwd_intra_torch(t(k), t(v), gates if from_A else t(gc, torch.float32), t(beta, torch.float32),
                              cu_seqlens=cut, autotune=False, dot_precision="ieee",
                              path="A" if from_A else "split", sum_g=sum_g and from_A)
    if from_A:
        w, u = A, t(v)
    state = None if S0 is None else t(np.swapaxes(S0, -1, -2) if v_first else S0, torch.float32)
    o, ht, h, vn = chunk_fwd_torch(t(q), t(k), w, u, gates, state, cut, scale=K ** -0.5,
                                   output_final_state=final, state_v_first=v_first, autotune=False,
                                   store_h=True, store_v=True, config=config, dot_precision="ieee",
                                   beta=t(beta, torch.float32) if from_A else None, sum_g=sum_g)
    # the reference on the inputs as the kernels saw them (rounded to dtype)
    up = [t(x).float().numpy() for x in (q, k, v)]
    o_ref, f_ref, vn_ref, h_ref = gdn_recurrence_numpy(*up, a, beta, h0=S0, cu_seqlens=cu, chunk_states=True)
    assert o.dtype == td
    assert max_rel_err(o.float().numpy(), o_ref, B, T, cu) < TOL[dtype]
    # what the backward recomputes: v' and the state entering every chunk
    assert max_rel_err(vn.float().numpy(), vn_ref, B, T, cu) < TOL[dtype]
    assert h.shape[0] >= len(h_ref)
    if len(h_ref):
        assert rel_err(h.float().numpy()[:len(h_ref)], h_ref) < TOL[dtype]
    if final:
        ht = ht.numpy()
        assert rel_err(np.swapaxes(ht, -1, -2) if v_first else ht, f_ref) < TOL[dtype]
    else:
        assert ht is None


FROM_A = pytest.mark.parametrize("from_A", [False, True], ids=["wu", "from_A"])


@FROM_A
@pytest.mark.parametrize("dtype", list(TORCH))
@pytest.mark.parametrize("B,T,Hg,H,h0", [(2, 130, 2, 4, True), (1, 64, 1, 2, False), (1, 1, 1, 2, True),
                                         (1, 63, 1, 8, True)])
def test_fixed_length(dtype, B, T, Hg, H, h0, from_A):
    run(dtype, B, T, Hg, H, 32, 16, h0=h0, seed=T, from_A=from_A)


@FROM_A
def test_head_dims_not_powers_of_two_and_v_blocks(from_A):
    """K = 96 (a masked tail in the 128-wide K tile), V = 80 (three 32-wide or
    two 64-wide V blocks, the last one partial)."""
    run("float32", 1, 70, 1, 1, 96, 80, seed=5, from_A=from_A)


@FROM_A
@pytest.mark.parametrize("cu", [[0, 0, 1, 70, 200], [0, 200, 200]])
def test_varlen_v_first(cu, from_A):
    """Packed sequences (empty, length 1, partial chunks) with V-first states:
    an empty sequence's final state is its initial one."""
    run("float32", 1, cu[-1], 2, 4, 32, 16, cu=np.array(cu, np.int32), v_first=True, seed=len(cu),
        from_A=from_A)


def test_without_final_state():
    run("float32", 1, 70, 1, 2, 32, 16, final=False, seed=9)


@pytest.mark.parametrize("config", [pytest.param(dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages),
                                                 id=f"BV{c.kwargs['BV']}-w{c.num_warps}")
                                    for c in __import__("gdn_jax.kernels.chunk_fwd", fromlist=["x"])
                                    .gdn_chunk_fwd_kernel.configs])
@FROM_A
def test_every_autotune_config(config, from_A):
    """Every config the autotuner may pick (both formulations, every V block)
    computes the same function: packed, V-first, K and V past one block."""
    run("float32", 1, 200, 2, 4, 32, 160, cu=np.array([0, 0, 1, 70, 200], np.int32), v_first=True,
        seed=11, config=config, from_A=from_A)


@FROM_A
@pytest.mark.parametrize("transposed", [False, True], ids=["rows", "transposed"])
@pytest.mark.parametrize("B,T,cu", [(2, 130, None), (1, 200, [0, 0, 1, 70, 70, 200])])
def test_per_step_gates_summed_in_kernels(B, T, cu, transposed, from_A):
    """``SUM_G``: the per-step gates, weak to strong, summed within each chunk
    by the kernels (the walk in both formulations; from ``A``, the A kernel
    and chunk_qk too), fixed and packed (empty and one-row sequences, T not a
    multiple of 64), against the float64 recurrence on the gates themselves."""
    config = dict(BV=64 if transposed else 32, TRANSPOSED=transposed, num_warps=4, num_stages=2)
    run("float32", B, T, 2, 4, 32, 80, cu=None if cu is None else np.array(cu, np.int32), seed=T + 2,
        config=config, from_A=from_A, sum_g=True)
