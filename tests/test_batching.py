"""``jax.vmap`` of the Triton paths (gdn_jax/batching.py), without a GPU: the
fold rule run on the jnp reference, which is made to refuse batched inputs
as jax-triton's launch does, against a Python loop over the examples."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from gdn_jax import sharding
from gdn_jax.batching import split_arrays, vmappable
from gdn_jax.reference import fwd_intra_jnp
from inputs import make_inputs
from stand_ins import unbatchable

Hg, H, K, V = 2, 4, 32, 16


def reference(k, v, g, beta, cu=None):
    """One example through the jnp reference (exact host chunk list)."""
    return gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu, impl="reference")


def stacked(per_example):
    return [np.stack([np.asarray(o[i]) for o in per_example]) for i in range(3)]


def assert_outputs_close(got, want):
    for name, a, b in zip("wuA", got, want):
        np.testing.assert_allclose(np.asarray(a), b, rtol=2e-5, atol=2e-6, err_msg=name)


def examples(n, B, T, use_g=True, cus=None):
    """``n`` examples' ``k, v, g, beta`` stacked on a new leading axis."""
    draws = [make_inputs(10 + e, B, T, Hg, H, K, V, use_g=use_g,
                         cu_seqlens=None if cus is None else cus[e]) for e in range(n)]
    return [None if draws[0][i] is None else jnp.stack([d[i] for d in draws]) for i in range(4)]


RESULTS = ("bthk", "bthv", "btha")  # w, u, A


def fixed_op(use_g=True):
    """The jnp reference on ``k, v, [g], beta`` with the fold rule."""
    def fwd(*arrays):
        return fwd_intra_jnp(*split_arrays(arrays, use_g, False)[:4])
    return vmappable(unbatchable(fwd), ("btgk", "bthv") + ("bth",) * (1 + use_g), RESULTS)


@pytest.mark.parametrize("use_g", [True, False])
def test_fixed_length_examples_fold_into_batch_rows(use_g):
    n, B, T = 3, 2, 100  # T not a multiple of 64
    k, v, g, beta = examples(n, B, T, use_g)
    arrays = [x for x in (k, v, g, beta) if x is not None]
    got = jax.jit(jax.vmap(fixed_op(use_g)))(*arrays)
    want = stacked([reference(k[e], v[e], None if g is None else g[e], beta[e]) for e in range(n)])
    assert_outputs_close(got, want)


def test_unbatched_argument_and_batch_axis_not_leading():
    n, B, T = 2, 1, 65
    k, v, g, beta = examples(n, B, T)
    shared_beta = beta[0]
    got = jax.vmap(fixed_op(), in_axes=(1, 0, 0, None))(jnp.moveaxis(k, 0, 1), v, g, shared_beta)
    want = stacked([reference(k[e], v[e], g[e], shared_beta) for e in range(n)])
    assert_outputs_close(got, want)


def test_nested_vmaps_fold_once_per_level():
    n1, n2, B, T = 2, 3, 1, 70
    k, v, g, beta = examples(n1 * n2, B, T)
    split = lambda x: x.reshape((n1, n2) + x.shape[1:])  # noqa: E731
    got = jax.vmap(jax.vmap(fixed_op()))(*map(split, (k, v, g, beta)))
    want = stacked([reference(k[e], v[e], g[e], beta[e]) for e in range(n1 * n2)])
    assert_outputs_close([o.reshape((n1 * n2,) + o.shape[2:]) for o in got], want)


def varlen_op():
    """The jnp reference on ``k, v, g, beta, cu_seqlens, chunk_indices`` with the fold rule."""
    def fwd(*arrays):
        k, v, g, beta, cu, ci = split_arrays(arrays, True, True)
        return fwd_intra_jnp(k, v, g, beta, cu_seqlens=cu, chunk_indices=ci)
    return vmappable(unbatchable(fwd), ("btgk", "bthv", "bth", "bth", "s", "ij"), RESULTS)


CUS = [np.array(c, np.int32) for c in (
    [0, 1, 1, 64, 130, 200],  # lengths 1, 0 (empty), 63, 66, 70
    [0, 0, 100, 165, 199, 200],  # empty first, length-1 last
    [0, 200, 200, 200, 200, 200],  # one sequence, then empty ones
)]


def test_packed_examples_concatenate_with_shifted_offsets():
    T = 200
    k, v, g, beta = examples(len(CUS), 1, T, cus=CUS)
    cu = jnp.stack(CUS)
    ci = jnp.stack([gdn_jax.prepare_chunk_indices(c) for c in CUS[:1]] * len(CUS))  # not used by the fold
    got = jax.jit(jax.vmap(varlen_op()))(k, v, g, beta, cu, ci)
    want = stacked([reference(k[e], v[e], g[e], beta[e], CUS[e]) for e in range(len(CUS))])
    assert_outputs_close(got, want)


def test_packed_examples_sharing_one_cu_seqlens():
    T, cu = 200, CUS[0]
    k, v, g, beta = examples(2, 1, T, cus=[cu, cu])
    ci = gdn_jax.prepare_chunk_indices(cu)
    got = jax.vmap(varlen_op(), in_axes=(0, 0, 0, 0, None, None))(k, v, g, beta, jnp.asarray(cu), ci)
    want = stacked([reference(k[e], v[e], g[e], beta[e], cu) for e in range(2)])
    assert_outputs_close(got, want)


@pytest.mark.parametrize("impl", ["auto", "triton", "split", "seed"])
def test_vmap_of_fwd_intra_on_the_triton_paths(triton_launch_as_reference, impl):
    n, B, T = 2, 2, 90
    k, v, g, beta = examples(n, B, T)
    got = jax.jit(jax.vmap(lambda *a: gdn_jax.fwd_intra(*a, impl=impl)))(k, v, g, beta)
    want = stacked([reference(k[e], v[e], g[e], beta[e]) for e in range(n)])
    assert_outputs_close(got, want)
    T = 200
    k, v, g, beta = examples(len(CUS), 1, T, cus=CUS)
    got = jax.vmap(lambda k, v, g, beta, cu: gdn_jax.fwd_intra(k, v, g, beta, cu_seqlens=cu, impl=impl))(
        k, v, g, beta, jnp.stack(CUS))
    want = stacked([reference(k[e], v[e], g[e], beta[e], CUS[e]) for e in range(len(CUS))])
    assert_outputs_close(got, want)


def test_the_stand_in_launch_refuses_vmap_without_the_rule(triton_launch_as_reference):
    """The yardstick of the test above: the replaced launch itself cannot be vmapped."""
    k, v, g, beta = examples(2, 1, 64)
    with pytest.raises(NotImplementedError, match="no batching rule"):
        jax.vmap(lambda *a: sharding.fwd_intra_triton(*a, cu_seqlens=None, chunk_size=64,
                                                      chunk_indices=None, path="split"))(k, v, g, beta)


def test_vmap_of_the_whole_forward_on_the_triton_path(chunk_kernel_as_reference):
    from test_naive_recurrent import make_inputs as gdn_inputs

    rng = np.random.default_rng(5)
    draws = [gdn_inputs(rng, 2, 90, Hg, H, K, V) for _ in range(2)]
    q, k, v, g, beta = (jnp.stack(x) for x in zip(*draws))
    h0 = jnp.asarray(rng.standard_normal((2, 2, H, K, V)), jnp.float32)
    f = lambda *a: gdn_jax.chunk_gated_delta_rule(*a[:5], initial_state=a[5], output_final_state=True,  # noqa: E731
                                                  impl="triton")
    o, final = jax.jit(jax.vmap(f))(q, k, v, g, beta, h0)
    for e, d in enumerate(draws):
        o_e, f_e = gdn_jax.chunk_gated_delta_rule(*d, initial_state=h0[e], output_final_state=True,
                                                  impl="reference")
        np.testing.assert_allclose(o[e], o_e, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(final[e], f_e, rtol=2e-5, atol=2e-6)
    cu = jnp.asarray([[0, 0, 70, 100, 180], [0, 180, 180, 180, 180]], jnp.int32)
    packed = [gdn_inputs(rng, 1, 180, Hg, H, K, V) for _ in range(2)]
    q, k, v, g, beta = (jnp.stack(x) for x in zip(*packed))
    h0 = jnp.asarray(rng.standard_normal((2, 4, H, K, V)), jnp.float32)
    f = lambda *a: gdn_jax.chunk_gated_delta_rule(*a[:5], initial_state=a[5], cu_seqlens=a[6],  # noqa: E731
                                                  output_final_state=True, impl="triton")
    o, final = jax.vmap(f)(q, k, v, g, beta, h0, cu)
    for e, d in enumerate(packed):
        o_e, f_e = gdn_jax.chunk_gated_delta_rule(*d, initial_state=h0[e], cu_seqlens=np.asarray(cu[e]),
                                                  output_final_state=True, impl="reference")
        np.testing.assert_allclose(o[e], o_e, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(final[e], f_e, rtol=2e-5, atol=2e-6)
