"""A Gluon walk's launcher module compiled for sm_90a offline, in a fresh
process (``tests/test_chunk_bwd_gluon.py``, ``test_chunk_fwd_gluon.py``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

# Shared memory of one program that runs alone on an sm_90 SM, and of one that
# lets two run there (233472 bytes, 1 KB of them reserved per program).
ONE_PER_SM = 233472 - 1024
TWO_PER_SM = 233472 // 2 - 1024

_COMPILE = """
import importlib, json, sys
c = getattr(importlib.import_module("gdn_jax." + sys.argv[1]), sys.argv[3])(*json.loads(sys.argv[2]))
print(json.dumps(dict(num_warps=c.metadata.num_warps, shared=c.metadata.shared,
                      scratch=c.metadata.global_scratch_size)))
"""


def compiled_in_fresh_process(module: str, args: list, function: str = "compile_offline") -> dict:
    """``num_warps``, ``shared`` and (global) ``scratch`` of
    ``gdn_jax.<module>.<function>(*args)``, run by the installed
    triton's compiler and ptxas in a fresh process without
    ``TRITON_INTERPRET`` (``test_gluon_launch`` says why) and with ``-P``
    (the installed package, kernels/ mapped into it, not the checkout's
    gdn_jax in the working directory)."""
    env = {n: v for n, v in os.environ.items() if n != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-P", "-c", _COMPILE, module, json.dumps(args), function],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.splitlines()[-1])
