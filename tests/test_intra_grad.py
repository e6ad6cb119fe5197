"""``jax.grad`` of ``fwd_intra`` on its Triton paths, without a GPU: the
``custom_vjp`` of gdn_jax/intra_bwd.py with both launches replaced by their
jnp forms (refusing vmap as jax-triton does), against ``jax.grad`` of the
float64 jnp reference. Also ``jax.vmap`` of it, traced ``cu_seqlens``, no gate,
and forward mode raising. The WY kernel itself is tested under the
interpreter (tests/test_intra_bwd_kernel.py) and on the GPU
(tests/test_intra_grad_gpu.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from gdn_jax.reference import fwd_intra_reference
from inputs import as_f64, make_inputs
from numpy_reference import rel_err

Hg, H, K, V = 2, 4, 32, 16


def cotangents(seed, B, T):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((B, T, H, K), (B, T, H, V), (B, T, H, 64))]


def pairing(fwd, cts):
    """``sum(w dw) + sum(u du) + sum(A dA)``: the loss whose gradient is the VJP of ``cts``."""
    def loss(*args):
        return sum(jnp.sum(o.astype(jnp.promote_types(o.dtype, jnp.float32)) * c.astype(o.dtype))
                   for o, c in zip(fwd(*args), cts))
    return loss


def differentiable(op, use_g, **kwargs):
    """``op(k, v, g, beta, **kwargs)`` as a function of ``k, v, g, beta``, or
    of ``k, v, beta`` without a gate (``g`` None)."""
    def fwd(k, v, *rest):
        g, beta = rest if use_g else (None, rest[0])
        return op(k, v, g, beta, **kwargs)
    return fwd


def float64_grads(k, v, g, beta, cts, cu=None):
    with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        args = [jnp.asarray(x, jnp.float64) for x in as_f64(k, v, g, beta) if x is not None]
        cts = [jnp.asarray(np.asarray(c), jnp.float64) for c in cts]
        fwd = differentiable(fwd_intra_reference, g is not None, cu_seqlens=cu)
        return [np.asarray(x) for x in jax.grad(pairing(fwd, cts), argnums=range(len(args)))(*args)]


def check(got, want, tol=1e-4):
    for name, a, b in zip("k v g beta".split() if len(got) == 4 else "k v beta".split(), got, want):
        assert a.shape == b.shape, name
        e = rel_err(np.asarray(a, np.float64), b)
        assert e < tol, f"d{name}: {e:.2e}"


@pytest.mark.parametrize("impl", ["auto", "split", "triton"])
@pytest.mark.parametrize("B,T", [(2, 130), (1, 64), (1, 1)])
def test_grad_on_the_triton_path(triton_launch_as_reference, impl, B, T):
    k, v, g, beta = make_inputs(B * 1000 + T, B, T, Hg, H, K, V)
    cts = cotangents(T, B, T)
    fwd = lambda k, v, g, beta: gdn_jax.fwd_intra(k, v, g, beta, impl=impl)  # noqa: E731
    got = jax.jit(jax.grad(pairing(fwd, cts), argnums=range(4)))(k, v, g, beta)
    assert [x.dtype for x in got] == [x.dtype for x in (k, v, g, beta)]
    check(got, float64_grads(k, v, g, beta, cts))


def test_grad_without_gate(triton_launch_as_reference):
    k, v, _, beta = make_inputs(7, 2, 70, Hg, H, K, V, use_g=False)
    cts = cotangents(7, 2, 70)
    fwd = lambda k, v, beta: gdn_jax.fwd_intra(k, v, None, beta, impl="split")  # noqa: E731
    got = jax.grad(pairing(fwd, cts), argnums=range(3))(k, v, beta)
    check(got, float64_grads(k, v, None, beta, cts))


def test_grad_packed_with_traced_cu_seqlens(triton_launch_as_reference):
    cu = np.array([0, 0, 1, 70, 200], np.int32)  # an empty and a one-token sequence
    k, v, g, beta = make_inputs(3, 1, 200, Hg, H, K, V, cu_seqlens=cu)
    cts = cotangents(3, 1, 200)

    @jax.jit
    def grads(k, v, g, beta, cu):
        fwd = lambda k, v, g, beta: gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu, impl="split")  # noqa: E731
        return jax.grad(pairing(fwd, cts), argnums=range(4))(k, v, g, beta)

    check(grads(k, v, g, beta, jnp.asarray(cu)), float64_grads(k, v, g, beta, cts, jnp.asarray(cu)))


def test_vmap_of_grad(triton_launch_as_reference):
    draws = [make_inputs(20 + e, 1, 90, Hg, H, K, V) for e in range(3)]
    cts = cotangents(5, 1, 90)
    fwd = lambda k, v, g, beta: gdn_jax.fwd_intra(k, v, g, beta, impl="split")  # noqa: E731
    grad = jax.grad(pairing(fwd, cts), argnums=range(4))
    got = jax.vmap(grad)(*(jnp.stack([d[i] for d in draws]) for i in range(4)))
    for e, d in enumerate(draws):
        check([x[e] for x in got], float64_grads(*d, cts))


def test_bf16_cotangents_come_back_in_the_inputs_dtypes(triton_launch_as_reference):
    k, v, g, beta = make_inputs(9, 1, 64, Hg, H, K, V, dtype="bfloat16")
    fwd = lambda k, v, g, beta: gdn_jax.fwd_intra(k, v, g, beta, impl="split")  # noqa: E731
    got = jax.grad(pairing(fwd, cotangents(9, 1, 64)), argnums=range(4))(k, v, g, beta)
    assert [x.dtype for x in got] == [jnp.bfloat16, jnp.bfloat16, jnp.float32, jnp.float32]


@pytest.mark.parametrize("impl", ["auto", "split"])
def test_forward_mode_on_a_triton_path_raises_naming_the_way_out(triton_launch_as_reference, impl):
    k, v, g, beta = make_inputs(3, 1, 70, Hg, H, K, V)
    with pytest.raises(NotImplementedError, match="Use impl='reference'"):
        jax.jvp(lambda k: gdn_jax.fwd_intra(k, v, g, beta, impl=impl), (k,), (k,))
    jax.jvp(lambda k: gdn_jax.fwd_intra(k, v, g, beta, impl="reference"), (k,), (k,))


def test_float32_past_128_keys_takes_the_jnp_backward(triton_launch_as_reference, monkeypatch):
    """The WY kernel's tiles do not fit shared memory in float32 at K = 256:
    the backward runs in jnp there (bfloat16 keeps the kernel)."""
    from gdn_jax import intra_bwd

    def no_kernel(*_):
        raise AssertionError("the WY kernel was launched")

    monkeypatch.setattr(intra_bwd, "intra_bwd_triton", no_kernel)
    intra_bwd._triton_op.cache_clear()
    k, v, g, beta = make_inputs(11, 1, 70, 1, 2, 256, 16)
    rng = np.random.default_rng(11)
    cts = [jnp.asarray(rng.standard_normal((1, 70, 2, d)), jnp.float32) for d in (256, 16, 64)]
    fwd = lambda k, v, g, beta: gdn_jax.fwd_intra(k, v, g, beta, impl="split")  # noqa: E731
    check(jax.grad(pairing(fwd, cts), argnums=range(4))(k, v, g, beta), float64_grads(k, v, g, beta, cts))
    with pytest.raises(AssertionError, match="the WY kernel was launched"):
        jax.grad(pairing(fwd, cts))(k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), g, beta)
