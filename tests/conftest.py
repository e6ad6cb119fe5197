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


import pytest  # noqa: E402

_ERRORS = collections.defaultdict(float)


@pytest.fixture
def record_errors():
    """Keeps the largest error per (test file, dtype, output) for the summary."""

    def record(kind, dtype, errs):
        for name, e in errs.items():
            key = (kind, dtype, name)
            _ERRORS[key] = max(_ERRORS[key], e)

    return record


def pytest_terminal_summary(terminalreporter):
    if _ERRORS:
        terminalreporter.section("largest relative errors vs float64 (per sequence)")
        for (kind, dtype, name), e in sorted(_ERRORS.items()):
            terminalreporter.write_line(f"{kind:12s} {dtype:9s} {name}: {e:.3e}")
