"""The autotuner's choices kept on disk, so that a new process does not time
the configs again (compiling every config of every kernel took about two
minutes for the first forward + backward on the H200).

One JSON file, ``$GDN_JAX_CACHE_DIR/autotune.json`` (default
``~/.cache/gdn_jax``; ``GDN_JAX_CACHE_DIR=""`` keeps nothing on disk). An
entry is keyed by the launch's key (kernel name, constexprs, device kind,
dtypes), the kernel's candidate configs, the versions of gdn-jax, jax,
jax-triton and triton, and a hash of the kernels' sources: a change to any
of them times again. A stored choice that is not among the kernel's current
configs is ignored. Writes replace the file atomically (a temporary file,
then ``os.replace``), merged with what other processes stored meanwhile; a
file that cannot be read or written is ignored (the choice is then timed,
as without a store). To time again, delete the file.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import pathlib
import tempfile

FILE = "autotune.json"


def store_path() -> pathlib.Path | None:
    """The store's file, or None where ``GDN_JAX_CACHE_DIR`` is set empty."""
    folder = os.environ.get("GDN_JAX_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "gdn_jax"))
    return pathlib.Path(folder) / FILE if folder else None


@functools.cache
def _environment() -> tuple:
    """The versions and the kernels' source hash that every entry's key holds."""
    versions = []
    for dist in ("gdn-jax", "jax", "jax-triton", "triton"):
        try:
            versions.append(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            versions.append(None)
    kernels = pathlib.Path(__file__).parent / "kernels"
    if not kernels.is_dir():  # a source checkout: kernels/ beside the package
        kernels = pathlib.Path(__file__).parents[1] / "kernels"
    digest = hashlib.sha256()
    for path in sorted(kernels.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return tuple(versions) + (digest.hexdigest()[:16],)


def entry_key(key, candidates) -> str:
    """The store's key of a launch key and its candidate configs (kwargs dicts)."""
    return repr((key, [sorted(c.items()) for c in candidates], _environment()))


def _read(path: pathlib.Path) -> dict:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def lookup(key, candidates) -> dict | None:
    """The stored choice for ``key`` among ``candidates``, or None."""
    path = store_path()
    if path is None:
        return None
    chosen = _read(path).get(entry_key(key, candidates))
    return chosen if chosen in candidates else None


def save(key, candidates, chosen: dict) -> None:
    """Stores ``chosen`` for ``key`` (merged with the file as it is now)."""
    path = store_path()
    if path is None:
        return
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = _read(path)
        entries[entry_key(key, candidates)] = chosen
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
            tmp = f.name
            json.dump(entries, f, indent=0)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
