"""The repository's scripts outside the package (``examples/``,
``benchmarks/``) imported as modules, for the tests."""
from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_module(relpath):
    """The file ``relpath`` (from the repository root, or an absolute path) as a
    fresh module named after it."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
