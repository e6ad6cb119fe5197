"""The repository's scripts outside the package (``examples/``,
``benchmarks/``) imported as modules, for the tests."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_module(relpath):
    """The file ``relpath`` (from the repository root, or an absolute path) as a
    fresh module named after it."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def refuses_without_a_gpu(script) -> bool:
    """Whether the script ``script`` (a path), run on JAX's CPU backend, exits
    non-zero saying it needs an NVIDIA GPU."""
    out = subprocess.run([sys.executable, str(script), "--out", "/tmp"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    return out.returncode != 0 and "needs an NVIDIA GPU" in out.stderr
