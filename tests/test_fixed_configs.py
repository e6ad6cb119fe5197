"""The fixed configs (``gdn_jax.autotune.untuned``: GDN_JAX_AUTOTUNE=0, and
the multi-device calls that cannot time) of the chunk form's kernels fit an
sm_90 program's shared memory for bf16 and float32 inputs, compiled offline
with the installed triton at K = V = 128 and 256 (no GPU needed). CI runs it on the
newest triton and on 3.6, the GPU machine's, which asks more shared memory of
some kernels (the per-chunk backward at 8 warps, float32: 233472 bytes on 3.6,
217088 on 3.9; at 256 float32 value columns in one block, 393216)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gdn_jax.chunk_launch import walk_kernel_fits
from repo_files import ROOT

pytest.importorskip("triton.backends.nvidia")

SM90_SHARED = 232448  # bytes one program may ask for on sm_90 (227 KB, CUDA's opt-in limit)
ROWS = {  # scripts/ptxas_report.py's row -> the kernel's name in gdn_jax.autotune
    "recompute_w_u": "recompute_w_u",
    "chunk walk (chunk_fwd)": "chunk_fwd",
    "chunk walk from A (chunk_fwd, FROM_A)": "chunk_fwd",
    "chunk output block (chunk_qk)": "chunk_qk",
    "backward reverse walk (chunk_bwd_walk)": "chunk_bwd_walk",
    "backward per chunk (chunk_bwd_local)": "chunk_bwd_local",
    "backward WY (wy_bwd)": "wy_bwd",
    "fwd_intra's backward (wy_bwd, DA_IN)": "wy_bwd",
}
DTYPES = ("bfloat16", "float32")
DIMS = (128, 256)

# The walk and the backward run where the walk's tiles fit (chunk_launch.walk_kernel_fits:
# not float32 at K = 256, which runs them in jnp); fwd_intra's w/u kernel runs everywhere.
CASES = [(row, dtype, K) for row in ROWS for dtype in DTYPES for K in DIMS
         if ROWS[row] == "recompute_w_u" or walk_kernel_fits(dtype, K)]

# Compiled in a fresh process without TRITON_INTERPRET (this one imported
# the kernels under the interpreter, whose functions do not compile).
_COMPILE = """
import json, sys
import jax.numpy as jnp
sys.path.insert(0, "scripts")
import ptxas_report as report
from gdn_jax.autotune import untuned
out = {}
for row, name, dtype, K in json.loads(sys.argv[1]):
    operands = (jnp.zeros(1, dtype), jnp.zeros(1, jnp.float32))
    pointer = {"bfloat16": report.BF, "float32": report.F32}[dtype]
    compiles = dict(report.KERNELS[row](report.Shape(K=K, dtype=pointer)))
    for programs in (1, 1024):  # few and many programs (autotune.UNTUNED_MANY_PROGRAMS)
        config = report.config_label(untuned(name, operands, programs, key_dim=K))
        out[f"{row}/{dtype}/{K}/{programs}"] = [
            config, compiles[config]().metadata.shared if config in compiles else sorted(compiles)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def shared_bytes():
    env = {n: v for n, v in os.environ.items() if n != "TRITON_INTERPRET"}
    cases = json.dumps([(row, ROWS[row], dtype, K) for row, dtype, K in CASES])
    out = subprocess.run([sys.executable, "-c", _COMPILE, cases], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("programs", [1, 1024])
@pytest.mark.parametrize("row, dtype, K", CASES)
def test_the_fixed_config_fits_shared_memory(shared_bytes, row, dtype, K, programs):
    config, shared = shared_bytes[f"{row}/{dtype}/{K}/{programs}"]
    assert isinstance(shared, int), f"{config} is not one of {row}'s autotuning configs: {shared}"
    assert shared <= SM90_SHARED, f"{row} {config}, {dtype}, K = V = {K}: {shared} bytes of shared memory"
