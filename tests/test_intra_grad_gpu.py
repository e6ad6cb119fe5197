"""``jax.grad`` of ``fwd_intra`` on its Triton paths (NVIDIA GPU): the
``custom_vjp`` whose backward runs the WY kernel with ``A``'s cotangent
(gdn_jax/intra_bwd.py), against ``jax.grad`` of the float64 jnp reference (on
the CPU), gradient by gradient, at docs/math.md's tolerances: every dtype,
fixed length and packed, GQA, T not a multiple of 64, no gate. Skipped
without a CUDA GPU."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from gdn_jax.backend import cuda_available
from inputs import make_inputs
from numpy_reference import rel_err
from test_intra_grad import differentiable, float64_grads, pairing

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU as JAX's default backend"),
]

TOL = {"float32": 5e-3, "float16": 1e-2, "bfloat16": 3e-2}  # docs/math.md, each gradient


def check(dtype, impl, B, T, Hg, H, K=128, V=128, cu=None, use_g=True, seed=0, record=None):
    k, v, g, beta = make_inputs(seed, B, T, Hg, H, K, V, dtype=dtype, use_g=use_g, cu_seqlens=cu)
    rng = np.random.default_rng(seed + 1)
    # the cotangents in the outputs' dtypes, as a model's loss gives them
    cts = [jnp.asarray(rng.standard_normal(s), dtype) for s in ((B, T, H, K), (B, T, H, V), (B, T, H, 64))]
    cu_j = None if cu is None else jnp.asarray(cu, jnp.int32)
    args = (k, v, g, beta) if use_g else (k, v, beta)
    fwd = differentiable(gdn_jax.fwd_intra, use_g, cu_seqlens=cu_j, impl=impl)
    got = jax.jit(jax.grad(pairing(fwd, cts), argnums=range(len(args))))(*args)
    want = float64_grads(k, v, g, beta, [np.asarray(c.astype(jnp.float32)) for c in cts], cu_j)
    errs = {}
    for name, a, w in zip(["k", "v", "g", "beta"] if use_g else ["k", "v", "beta"], got, want):
        assert a.dtype == {"k": k, "v": v, "g": g, "beta": beta}[name].dtype, name
        errs[name] = rel_err(np.asarray(a.astype(jnp.float32), np.float64), w)
    if record is not None:
        record("intra grad", dtype, errs)
    assert all(e < TOL[dtype] for e in errs.values()), errs


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("impl", ["auto", "split", "triton"])
def test_fixed_length(dtype, impl, record_errors):
    check(dtype, impl, 2, 1000, 2, 8, seed=1, record=record_errors)


@pytest.mark.parametrize("dtype", list(TOL))
def test_packed(dtype, record_errors):
    check(dtype, "auto", 1, 1000, 2, 4, cu=[0, 0, 1, 63, 64, 300, 1000], seed=2, record=record_errors)


@pytest.mark.parametrize("B,T,Hg,H,K,V", [(1, 1, 1, 1, 128, 128), (2, 4096, 4, 8, 128, 128), (1, 130, 1, 2, 256, 256),
                                          (1, 200, 2, 2, 96, 40)])
def test_shapes(B, T, Hg, H, K, V, record_errors):
    check("bfloat16", "auto", B, T, Hg, H, K, V, seed=3, record=record_errors)


def test_float32_past_128_keys(record_errors):
    """The backward in jnp there (the WY kernel's tiles do not fit shared memory)."""
    check("float32", "auto", 1, 200, 1, 2, 256, 256, seed=5, record=record_errors)


def test_without_gate(record_errors):
    check("bfloat16", "auto", 2, 300, 2, 4, use_g=False, seed=4, record=record_errors)
