"""``impl="gluon"`` (the warp-specialized Gluon kernel) on a Hopper GPU
against the float64 NumPy reference at docs/math.md's tolerances and the jnp
reference (``test_gpu.check``), the split path, and ``impl="auto"``. Skipped
where the kernel cannot run (no Hopper GPU, jax-triton < 0.4, a jaxlib
without TMA descriptor parameters: the skip reason says which)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from gdn_jax.backend import cuda_available
from gdn_jax import gluon_launch
from gdn_jax.gluon_launch import environment_missing
from inputs import make_inputs
from test_gpu import assert_bit_equal, check, run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available() or environment_missing() is not None,
                       reason=f"the Gluon kernel cannot run here: {environment_missing()}"),
]


PARTIAL = [] if gluon_launch.TMA else [(2, 1000, 2, 4), (3, 65, 1, 2), (2, 1, 2, 2), (1, 4095, 4, 8)]


@pytest.mark.parametrize("B,T,Hg,H", [(1, 64, 1, 1), (2, 128, 2, 4), (3, 1024, 4, 16), (2, 4096, 2, 8),
                                      (1, 192, 3, 3), *PARTIAL])
@pytest.mark.parametrize("use_g", [True, False])
def test_against_float64(B, T, Hg, H, use_g, record_errors):
    """GQA ratios 1 to 4, one to several tasks per CTA, fewer tasks than SMs
    (one task in all) and more (2 x 64 x 8 = 1024 on 132 SMs), without a gate;
    without TMA also partial last chunks (T = 1000, 65, 1, 4095)."""
    check("gluon", "bfloat16", *make_inputs(T + H, B, T, Hg, H, 128, 128, "bfloat16", use_g=use_g),
          record=record_errors)


def test_close_to_split_path_at_a_large_launch():
    """B=4 T=4096 Hg=16 H=32 (8192 tasks): the difference to the split path
    stays within the two paths' rounding (beta folded into A, or into v and
    k first: ~6e-3 of the largest value at the headline shape, H200)."""
    args = make_inputs(11, 4, 4096, 16, 32, 128, 128, "bfloat16")
    for name, a, b in zip("wuA", run(*args, impl="gluon"), run(*args, impl="split")):
        a, b = np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32))
        assert np.abs(a - b).max() <= 1e-2 * np.abs(b).max(), name


@pytest.mark.parametrize("T", [256, *([200] if not gluon_launch.TMA else [])])
def test_batch_rows_do_not_leak(T):
    """A NaN in one batch row leaves the other rows' outputs as they were
    (T = 200: the partial last chunk's rows past T are not read)."""
    k, v, g, beta = make_inputs(12, 3, T, 2, 4, 128, 128, "bfloat16")
    clean = run(k, v, g, beta, impl="gluon")
    dirty = run(k.at[1].set(jnp.nan), v.at[1].set(jnp.inf), g, beta, impl="gluon")
    for a, b in zip(clean, dirty):
        assert_bit_equal(a[0::2], b[0::2])
        assert not np.isfinite(np.asarray(b[1].astype(jnp.float32))).all()


def test_auto_takes_it_for_split_sized_launches():
    """Past 2048 chunk-head programs, where ``"auto"`` would run the split
    path, it runs this kernel (bit-equal outputs to ``impl="gluon"``); up to
    2048, the one kernel."""
    assert gdn_jax.backend.impl_for(2, 1024, 32, gluon=True) == "triton"  # 2 x 16 x 32 = 1024 programs
    args = make_inputs(14, 8, 1024, 4, 32, 128, 128, "bfloat16")  # 8 x 16 x 32 = 4096 programs
    assert gdn_jax.backend.impl_for(8, 1024, 32, gluon=True) == "gluon"
    for a, b in zip(jax.jit(gdn_jax.fwd_intra)(*args), run(*args, impl="gluon")):
        assert_bit_equal(a, b)


def test_vmap_and_jit():
    """``jax.vmap`` folds the examples into the batch rows of one launch."""
    args = make_inputs(15, 6, 128, 2, 4, 128, 128, "bfloat16")
    per = [run(*(x[i:i + 2] for x in args), impl="gluon") for i in range(0, 6, 2)]
    stacked = [x.reshape(3, 2, *x.shape[1:]) for x in args]
    got = jax.jit(jax.vmap(lambda k, v, g, b: gdn_jax.fwd_intra(k, v, g, b, impl="gluon")))(*stacked)
    for n in range(3):
        for a, b in zip(got, per[n]):
            assert_bit_equal(a[n], b)


@pytest.mark.skipif(not gluon_launch.TMA, reason="without TMA the kernel takes any T")
def test_torch_launch_refuses_a_partial_chunk_with_tma():
    """With TMA the kernel takes ``T`` as a multiple of 64 (``T // 16 * 16``
    inside it, for the compiler): the torch launcher refuses T = 1000 rather
    than return wrong rows."""
    torch = pytest.importorskip("torch")
    from gdn_jax.torch_launch import fwd_intra_gluon_torch

    k, v, g, beta = (torch.from_dlpack(x) for x in make_inputs(13, 1, 1000, 1, 2, 128, 128, "bfloat16"))
    with pytest.raises(ValueError, match="T a multiple of 64, got T=1000"):
        fwd_intra_gluon_torch(k, v, g.float(), beta.float())
