"""``fwd_intra``'s backward kernel (kernels/wy_bwd.py with ``DA_IN``: the
cotangents of ``w``, ``u`` and ``A``) under Triton's interpreter on torch CPU
tensors (gdn_jax.torch_launch.wy_bwd_torch), against ``jax.grad`` of the
float64 jnp reference of ``fwd_intra``. float32 and float16 (the interpreter
cannot multiply bfloat16; tests/test_intra_grad_gpu.py covers it on the GPU)."""
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the interpreter tests launch the kernels on torch CPU tensors")
if jax.default_backend() != "cpu":
    pytest.skip("interpreter tests run where JAX has no GPU (CI)", allow_module_level=True)
assert os.environ.get("TRITON_INTERPRET") == "1", "conftest.py sets TRITON_INTERPRET=1 on CPU"

import jax.numpy as jnp  # noqa: E402

from gdn_jax.torch_launch import fwd_intra_torch, wy_bwd_torch  # noqa: E402
from inputs import make_inputs  # noqa: E402
from numpy_reference import rel_err  # noqa: E402
from test_intra_grad import float64_grads  # noqa: E402

TORCH = {"float32": torch.float32, "float16": torch.float16}
TOL = {"float32": 1e-5, "float16": 1e-2}


def run(dtype, B, T, Hg, H, K, V, cu=None, seed=0):
    k, v, g, beta = make_inputs(seed, B, T, Hg, H, K, V, cu_seqlens=cu)
    rng = np.random.default_rng(seed + 1)
    td = TORCH[dtype]
    t = lambda a, d=td: torch.from_numpy(np.array(a, np.float32)).to(d)  # noqa: E731
    # what the kernels see: k, v and the cotangents rounded to dtype
    k, v = (jnp.asarray(t(x).float().numpy()) for x in (k, v))
    cts = [t(rng.standard_normal(s)) for s in ((B, T, H, K), (B, T, H, V), (B, T, H, 64))]
    cut = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    gt, bt = t(g, torch.float32), t(beta, torch.float32)
    _, _, A = fwd_intra_torch(t(k), t(v), gt, bt, cu_seqlens=cut, autotune=False, dot_precision="ieee",
                              path="split")
    dk, dv, dbeta, dg = wy_bwd_torch(t(k), t(v), bt, gt, A, *cts, cut, dot_precision="ieee")
    dk = dk.float().view(B, T, Hg, H // Hg, K).sum(3)  # a key head's value heads
    want = float64_grads(k, v, g, beta, [c.float().numpy() for c in cts], None if cu is None else jnp.asarray(cu))
    for name, got, w in zip(["k", "v", "g", "beta"], [dk, dv, dg, dbeta], want):
        e = rel_err(got.double().numpy(), w)
        assert e < TOL[dtype], f"d{name}: {e:.2e}"


@pytest.mark.parametrize("dtype", list(TORCH))
@pytest.mark.parametrize("B,T,Hg,H", [(2, 130, 2, 4), (1, 64, 1, 1), (1, 1, 1, 2)])
def test_fixed_length(dtype, B, T, Hg, H):
    run(dtype, B, T, Hg, H, 32, 16, seed=T)


def test_packed():
    run("float32", 1, 200, 2, 4, 32, 16, cu=np.array([0, 0, 1, 70, 200], np.int32), seed=3)


def test_head_dims_not_powers_of_two():
    """K = 96 (one masked tile of 128), V = 40."""
    run("float32", 1, 150, 1, 2, 96, 40, cu=np.array([0, 1, 70, 150], np.int32), seed=4)
