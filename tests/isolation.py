"""NaN/Inf isolation check shared by the reference (CPU) and Triton (GPU) tests."""
import jax.numpy as jnp
import numpy as np

from inputs import make_inputs


def _f32(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32))


def check_nan_isolation(run, poison, dtype="float32"):
    """``run(k, v, g, beta, cu_seqlens)`` -> (w, u, A). A NaN or Inf in one
    packed sequence (or batch row) must leave every other one bit-identical."""
    cu = [0, 70, 200, 333]
    k, v, g, beta = make_inputs(11, 1, 333, 2, 4, 64, 64, dtype, cu_seqlens=cu)
    cu = jnp.asarray(cu, jnp.int32)
    clean = run(k, v, g, beta, cu)
    dirty = run(k.at[0, 100, 1, 3].set(poison), v.at[0, 150, 2, 0].set(poison),
                g.at[0, 120, 0].set(poison), beta.at[0, 199, 3].set(poison), cu)
    for c, d in zip(map(_f32, clean), map(_f32, dirty)):
        for s, e in [(0, 70), (200, 333)]:  # the sequences without the poison
            np.testing.assert_array_equal(c[:, s:e], d[:, s:e])
        assert not np.isfinite(d[:, 70:200]).all()
    k, v, g, beta = make_inputs(12, 3, 100, 2, 4, 64, 64, dtype)
    clean = run(k, v, g, beta, None)
    dirty = run(k.at[1, 5, 0, 0].set(poison), v, g, beta, None)
    for c, d in zip(map(_f32, clean), map(_f32, dirty)):
        np.testing.assert_array_equal(c[[0, 2]], d[[0, 2]])
        assert not np.isfinite(d[1]).all()
