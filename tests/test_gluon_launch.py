"""gdn_jax/gluon_launch.py without a GPU: which inputs and machines the Gluon
kernel takes, the errors of ``impl="gluon"``, what ``impl="auto"`` is told,
and the kernel source compiled for sm_90a by the installed triton (Gluon
kernels do not run under TRITON_INTERPRET=1; GPU parity: test_gluon_gpu.py)."""
import json
import os
import re
import subprocess
import sys

import jax.numpy as jnp
import pytest

import gdn_jax
from gdn_jax import gluon_launch
from inputs import make_inputs


def fitting(B=2, T=128, Hg=2, H=4, seed=0):
    return make_inputs(seed, B, T, Hg, H, 128, 128, "bfloat16")


@pytest.mark.parametrize("change,reason", [
    (dict(dtype="float32"), "it takes bfloat16 k and v, got float32 and float32"),
    (dict(dtype="float16"), "it takes bfloat16 k and v, got float16 and float16"),
    (dict(K=64), "it takes head dims K = V = 128, got K=64, V=128"),
    (dict(V=256), "it takes head dims K = V = 128, got K=128, V=256"),
    (dict(T=1000, tma=True), "it takes T a multiple of 64, got T=1000"),
    (dict(T=1, tma=True), "it takes T a multiple of 64, got T=1"),
    (dict(cu=True), "it takes fixed-length batches, got cu_seqlens"),
])
def test_input_mismatch_names_what_does_not_fit(change, reason, monkeypatch):
    monkeypatch.setattr(gluon_launch, "TMA", change.get("tma", gluon_launch.TMA))
    shape = dict(B=1, T=128, Hg=2, H=4, K=128, V=128)
    shape.update({n: x for n, x in change.items() if n in shape})
    k, v, g, beta = make_inputs(1, *shape.values(), change.get("dtype", "bfloat16"))
    cu = jnp.array([0, 64, shape["T"]], jnp.int32) if change.get("cu") else None
    assert gluon_launch.input_mismatch(k, v, g, beta, cu).startswith(reason)


def test_without_tma_partial_chunks_fit(monkeypatch):
    """The kernel's cp.async variant (``gluon_launch.TMA = False``)
    zero-fills rows past T, so it takes any T; launches pass it."""
    monkeypatch.setattr(gluon_launch, "TMA", False)
    for T in (1, 63, 1000):
        assert gluon_launch.input_mismatch(*make_inputs(6, 2, T, 2, 4, 128, 128, "bfloat16"), None) is None
    assert gluon_launch.launch_args(2, 1000, 2, 4, 128, 128, 132)[2]["TMA"] is False


def test_input_mismatch_none_where_the_kernel_fits():
    for B, T, Hg, H in [(1, 64, 1, 1), (2, 128, 2, 4), (3, 4096, 16, 32)]:
        k, v, g, beta = make_inputs(2, B, min(T, 256), Hg, H, 128, 128, "bfloat16")
        assert gluon_launch.input_mismatch(k, v, g, beta, None) is None
        assert gluon_launch.input_mismatch(k, v, None, beta, None) is None  # no gate: zeros


def test_environment_missing_without_gpu():
    if gdn_jax.backend.cuda_available():
        pytest.skip("checks the behaviour without a GPU")
    assert gluon_launch.environment_missing() == "it needs an NVIDIA GPU, JAX runs on 'cpu'"
    assert not gluon_launch.gluon_fits(*fitting(), None)


def test_impl_gluon_errors_say_why(monkeypatch):
    monkeypatch.setattr(gdn_jax.backend, "cuda_available", lambda: True)
    monkeypatch.setattr(gluon_launch, "environment_missing", lambda: "it needs a Hopper GPU, got 8.0")
    with pytest.raises(RuntimeError, match=r"impl='gluon' cannot run here: it needs a Hopper GPU, got 8.0; "
                                           r"use impl='split'"):
        gdn_jax.fwd_intra(*fitting(), impl="gluon")
    monkeypatch.setattr(gluon_launch, "environment_missing", lambda: None)
    monkeypatch.setattr(gluon_launch, "TMA", True)
    k, v, g, beta = make_inputs(3, 2, 1000, 2, 4, 128, 128, "bfloat16")
    with pytest.raises(ValueError, match=r"impl='gluon' \(the warp-specialized kernel\) it takes T a multiple "
                                         r"of 64, got T=1000 .*; use impl='split'"):
        gdn_jax.fwd_intra(k, v, g, beta, impl="gluon")


@pytest.mark.parametrize("env", [None, "no GPU"])
def test_auto_is_told_whether_the_kernel_fits(monkeypatch, env):
    """fwd_intra passes gluon=True to the choice of path exactly where the
    inputs fit and the machine runs the kernel."""
    seen = []
    monkeypatch.setattr(gluon_launch, "environment_missing", lambda: env)
    monkeypatch.setattr(gdn_jax.backend, "resolve_impl",
                        lambda op, impl, programs, gluon: seen.append(gluon) or "reference")
    gdn_jax.fwd_intra(*fitting())
    gdn_jax.fwd_intra(*make_inputs(4, 2, 128, 2, 4, 128, 128, "float32"))
    gdn_jax.fwd_intra(*make_inputs(5, 2, 100, 2, 4, 128, 128, "bfloat16"))  # a partial chunk
    gdn_jax.fwd_intra(*make_inputs(5, 2, 128, 2, 4, 64, 128, "bfloat16"))
    gdn_jax.fwd_intra(*fitting(), impl="split")
    assert seen == [env is None, False, env is None and not gluon_launch.TMA, False, False]


_COMPILE = """
import json, sys
from gdn_jax import gluon_launch
c = gluon_launch.compile_offline(**json.loads(sys.argv[1]))
m = c.metadata
print(json.dumps(dict(num_warps=m.num_warps, shared=m.shared, scratch=m.global_scratch_size,
                      descriptors=len(m.tensordesc_meta or ()), ptx=c.asm["ptx"])))
"""


def compile_offline(**kw):
    """:func:`gluon_launch.compile_offline` in a fresh process without
    ``TRITON_INTERPRET``: this process runs the other kernels under Triton's
    interpreter, which rebinds ``triton.language`` functions while it runs
    them (a device function's call rebinds them for good, triton 3.9), and a
    compile after that goes through the interpreter's builder."""
    env = {n: v for n, v in os.environ.items() if n != "TRITON_INTERPRET"}
    if "divisible" in kw:
        kw["divisible"] = list(kw["divisible"])
    out = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(kw)], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("tma", [True, False])
def test_kernel_compiles_for_sm90(tma):
    """The Gluon source through the installed triton's compiler and ptxas, for
    sm_90a: 12 warps (three partitions of 4), its shared memory within the
    H200's 227 KB, no global scratch (so no per-launch allocation under
    jaxlib); TMA copies through the four descriptor parameters, or (``TMA``
    off) cp.async and stores from registers."""
    c = compile_offline(TMA=tma)
    assert c["num_warps"] == 12
    assert c["shared"] <= 232448
    assert not c["scratch"]
    assert c["descriptors"] == (4 if tma else 0)
    assert ".target sm_90a" in c["ptx"]
    assert "setmaxnreg" in c["ptx"] and "wgmma" in c["ptx"]
    assert ("cp.async.bulk.tensor" in c["ptx"]) == tma


def test_both_launchers_compile_the_same_kernel():
    """With TMA the kernel says ``T % 16 == 0`` itself, so the specialization
    Triton's launcher gives ``T = 4096`` (a multiple of 16) and jax-triton
    does not changes nothing: the same PTX. (Without it the two compiled
    apart, 5808 and 6120 SASS instructions under triton 3.6, sm_90a.)"""
    def code(ptx):
        """The PTX without its debug info, which names the source files: a
        compile that Triton's cache holds from another checkout names that one's."""
        return re.sub(r"^\s*\.file\s.*$", "", ptx.split("\t.section\t.debug")[0], flags=re.M)

    jax_like = compile_offline(TMA=True)["ptx"]
    torch_like = compile_offline(TMA=True, divisible=("T", "n_tasks", "NTC"))["ptx"]
    assert code(jax_like) == code(torch_like)


def test_jax_launch_aliases_the_descriptor_parameters():
    """The JAX launch aliases the operands at the ``w_desc``, ``u_desc``
    positions to its results 1 and 2: every parameter before them is an
    array operand, and ``A`` is the one parameter it leaves to jax-triton."""
    from gdn_jax.kernels.gluon_intra import gdn_fwd_intra_gluon_kernel as kernel

    params = kernel.arg_names
    assert params[:8] == ["k", "v", "g", "beta", "k_desc", "v_desc", "w_desc", "u_desc"]
    assert params[8:14] == ["T", "n_tasks", "NTC", "w", "u", "A"]


def test_launch_args_one_cta_per_sm_at_most_one_per_task():
    grid, scalars, constexprs, maxnreg = gluon_launch.launch_args(8, 4096, 16, 32, 128, 128, 132)
    assert grid == (132,) and scalars == (4096, 8 * 64 * 32, 64)
    assert constexprs == dict(H=32, Hg=16, K=128, V=128, MODE=0, TMA=gluon_launch.TMA, BUILDER_REGS=216,
                              WU_REGS=144)
    assert maxnreg == 168
    assert gluon_launch.launch_args(1, 64, 1, 3, 128, 128, 132)[0] == (3,)
    _, _, constexprs, maxnreg = gluon_launch.launch_args(1, 64, 1, 3, 128, 128, 132, MODE=1, maxnreg=160)
    assert constexprs["MODE"] == 1 and maxnreg == 160
