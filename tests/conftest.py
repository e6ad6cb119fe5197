"""Test setup. Where JAX has no GPU, the Triton kernels are imported under the
Triton interpreter (TRITON_INTERPRET=1 must be set before `triton.jit` runs),
so that tests/test_kernels_interpreter.py runs the kernel source on the CPU."""
import collections
import os
import sys

import jax

sys.path.insert(0, os.path.dirname(__file__))

if jax.default_backend() == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The autotuner's choices stay in the test processes unless the environment
# names a folder (scripts/device_run.sh does, so that its test processes share
# them); tests/test_autotune.py gives the store a folder of its own.
os.environ.setdefault("GDN_JAX_CACHE_DIR", "")


import pytest  # noqa: E402

from stand_ins import (chunk_kernel_as_reference, gpu_path_as_reference,  # noqa: E402,F401
                       solve_by_matmuls, triton_launch_as_reference)


@pytest.fixture
def record_errors(request):
    """Attaches {output: error} of a check to the test's report (this survives
    pytest-xdist); the terminal summary prints the largest per dtype."""

    def record(kind, dtype, errs):
        request.node.user_properties.append(("errors", (kind, dtype, dict(errs))))

    return record


def pytest_terminal_summary(terminalreporter):
    largest = collections.defaultdict(float)
    for reports in terminalreporter.stats.values():
        for rep in reports:
            for name, value in getattr(rep, "user_properties", ()):
                if name == "errors" and getattr(rep, "when", "call") == "call":
                    kind, dtype, errs = value
                    for out, e in errs.items():
                        largest[kind, dtype, out] = max(largest[kind, dtype, out], e)
    if largest:
        terminalreporter.section("largest relative errors vs float64 (per sequence)")
        for (kind, dtype, out), e in sorted(largest.items()):
            terminalreporter.write_line(f"{kind:12s} {dtype:9s} {out}: {e:.3e}")
