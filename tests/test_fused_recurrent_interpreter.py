"""kernels/fused_recurrent.py itself, run by Triton's interpreter on torch CPU
tensors (TRITON_INTERPRET=1, set by conftest.py where there is no GPU),
against the float64 NumPy decode (tests/decode_reference.py)."""
import os

import numpy as np
import pytest

import jax

if jax.default_backend() != "cpu":
    pytest.skip(
        "interpreter tests run where JAX has no GPU (CI); on a GPU machine run "
        "JAX_PLATFORMS=cpu pytest tests/test_fused_recurrent_interpreter.py",
        allow_module_level=True,
    )
assert os.environ.get("TRITON_INTERPRET") == "1", "conftest.py sets TRITON_INTERPRET=1 on CPU"
torch = pytest.importorskip("torch", reason="the interpreter launches the kernel on torch CPU tensors")

from decode_reference import OPTIONS, check_decode, decode_inputs, decode_numpy, owners  # noqa: E402
from gdn_jax.torch_launch import fused_recurrent_torch  # noqa: E402

TOL = 2e-5


def tt(x, dtype=None):
    """A NumPy array as a torch CPU tensor (``dtype`` a torch dtype), None as None."""
    if x is None:
        return None
    t = torch.from_numpy(np.array(x))
    return t if dtype is None else t.to(dtype)


def run(x, *, options="none", dtype=torch.float32, state_dtype=torch.float32, cu=None, idx=None,
        v_first=False, with_h0=True, final=True, scale=None, record=None, tol=TOL):
    """The kernel on ``decode_inputs`` ``x`` against float64; returns the
    launch's ``(o, final, initial_state tensor)``."""
    kw = dict(OPTIONS[options])
    args = {n: x[n] for n in ("q", "k", "v", "g", "beta")}
    if kw.get("use_gate_in_kernel"):
        args["A_log"] = x["A_log"]
        args["dt_bias"] = kw.pop("dt_bias", x["dt_bias"])
    h0 = x["initial_state"] if with_h0 else None
    if h0 is not None and v_first:
        h0 = np.swapaxes(h0, -1, -2).copy()
    h0_t = tt(h0, state_dtype)
    ref = decode_numpy(**args, **kw, scale=scale, initial_state=None if h0_t is None else h0_t.float().numpy(),
                       cu_seqlens=cu, state_indices=idx, state_v_first=v_first)
    owned = None if idx is None else tt(np.array([-1 if r is None else r
                                                  for r in owners(idx, h0.shape[0])], np.int32))
    torch_args = {n: tt(a, dtype if n in ("q", "k", "v") else None) for n, a in args.items()}
    o, out = fused_recurrent_torch(
        **torch_args, initial_state=h0_t, cu_seqlens=tt(cu), state_indices=owned, scale=scale,
        output_final_state=final, state_v_first=v_first, autotune=False, **kw)
    errs = check_decode(o.float().numpy(), None if out is None else out.float().numpy(), ref, tol,
                        cu_seqlens=cu)
    if record is not None:
        record("interpreter fused_recurrent", str(dtype).split(".")[-1], errs)
    return o, out, h0_t


@pytest.mark.parametrize("T,Hg,H", [(1, 2, 2), (5, 1, 4), (3, 2, 4)])
def test_fixed_length(T, Hg, H, record_errors):
    run(decode_inputs(T, 2, T, Hg, H, 16, 8), record=record_errors)


def test_head_dims_past_one_tile(record_errors):
    """K, V not powers of two, V over two 32-wide blocks: the masked tails."""
    run(decode_inputs(1, 2, 3, 1, 2, 24, 40), record=record_errors)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_option(name, record_errors):
    run(decode_inputs(2, 2, 3, 1, 2, 16, 8, raw=name != "none"), options=name, record=record_errors)


def test_scale():
    run(decode_inputs(3, 1, 2, 1, 1, 16, 8), scale=0.3)


def test_in_place_and_out_of_place():
    """With an initial state the final state is that tensor, written in place;
    without one a fresh float32 state; without output_final_state nothing."""
    x = decode_inputs(4, 2, 2, 1, 2, 16, 8)
    o, out, h0 = run(x)
    assert out is h0
    _, fresh, _ = run(x, with_h0=False)
    assert fresh.dtype == torch.float32 and fresh.shape == (2, 2, 16, 8)
    _, none, h0 = run(x, final=False)
    assert none is None
    np.testing.assert_array_equal(h0.numpy(), x["initial_state"])  # read only


def test_state_v_first():
    run(decode_inputs(5, 2, 3, 1, 2, 16, 8), v_first=True)


def test_packed():
    cu = np.array([0, 0, 1, 5, 5, 9], np.int32)
    run(decode_inputs(6, 1, 9, 2, 4, 16, 8, N=5), cu=cu)


@pytest.mark.parametrize("idx", [[6, 2, 0, 5], [3, 1, 3, 1], [-1, 4, -1, 0]],
                         ids=["permuted", "repeated", "padding"])
@pytest.mark.parametrize("v_first", [False, True])
def test_pool(idx, v_first):
    P = 7
    x = decode_inputs(7, 4, 2, 2, 4, 16, 8, pool=P)
    _, out, _ = run(x, idx=np.array(idx, np.int32), v_first=v_first, options="all")
    pool = np.swapaxes(x["initial_state"], -1, -2) if v_first else x["initial_state"]
    for r in sorted(set(range(P)) - set(idx)):  # rows not named: bit-identical
        np.testing.assert_array_equal(out[r].numpy(), pool[r])


def test_pool_packed():
    cu = np.array([0, 2, 2, 6], np.int32)
    run(decode_inputs(8, 1, 6, 2, 2, 16, 8, pool=5), cu=cu, idx=np.array([4, 0, 2], np.int32))


def test_float16_inputs(record_errors):
    run(decode_inputs(9, 2, 3, 1, 2, 16, 8), dtype=torch.float16, tol=5e-3, record=record_errors)


@pytest.mark.parametrize("state_dtype,tol", [(torch.bfloat16, 1e-2), (torch.float16, 5e-3)])
def test_low_precision_state(state_dtype, tol):
    x = decode_inputs(10, 2, 3, 1, 2, 16, 8, pool=4)
    _, out, _ = run(x, state_dtype=state_dtype, idx=np.array([3, 0], np.int32), tol=tol)
    assert out.dtype == state_dtype
    np.testing.assert_array_equal(out[1:3].float().numpy(),
                                  torch.from_numpy(x["initial_state"][1:3]).to(state_dtype).float().numpy())


def test_every_autotune_config(monkeypatch):
    """Every config the autotuner may pick (the interpreter runs the fixed one,
    ``gdn_jax.autotune.UNTUNED``) computes the same function."""
    import gdn_jax.autotune as autotune
    from gdn_jax.autotune import config_kwargs
    from gdn_jax.kernels.fused_recurrent import gdn_fused_recurrent_kernel

    x = decode_inputs(11, 2, 2, 1, 2, 16, 40, pool=3)
    for config in gdn_fused_recurrent_kernel.configs:
        monkeypatch.setitem(autotune.UNTUNED, "fused_recurrent", config_kwargs(config))
        run(x, idx=np.array([2, 0], np.int32), options="all")
