"""One config per Triton launch: a kernel's autotuning configs timed once per
process and launch signature (constexprs and dtypes, as Triton's own autotune
key: not the batch or sequence length), before the graph that uses it is built.

Why not hand jax-triton the ``triton.autotune`` object itself (measured on the
H200, docs/performance.md):

- jax-triton 0.3 ships every config's compiled kernel in the custom call's
  opaque string, and jaxlib's legacy handler hashes and compares that string on
  every call: the one-kernel path's 6 configs cost 0.078 ms of host time per
  call against 0.059 ms with one config (B=4, T=2048, H=8), where torch's
  launch costs 0.050 ms.
- jax-triton 0.4 autotunes while the executable is initialized, launching the
  configs on the operand buffers before any op of the graph has run: chunk
  indices computed in the graph (traced ``cu_seqlens``) still hold garbage
  then, and the kernels fault (CUDA_ERROR_ILLEGAL_ADDRESS, measured with 0.4.1).

Here the configs are timed on stand-in operands of the launch's shapes and
dtypes (random floats; valid offsets for ``cu_seqlens`` and chunk indices;
a launch of more rows than ``triton_launch.TIMING_ROWS`` is timed at that many),
eagerly, even while a ``jax.jit`` trace is running; the graph then holds the
fastest config only. ``GDN_JAX_AUTOTUNE=0`` skips the timing and takes the
fixed config :data:`UNTUNED` (quick test runs: one compile per kernel).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import json
import os
import statistics
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from . import autotune_store
from .chunk_indices import chunk_offsets, padding_row, prepare_chunk_indices

# The fixed config per kernel when timing is off (GDN_JAX_AUTOTUNE=0, Triton's
# interpreter, which cannot time): the H200's picks at the headline shape,
# except kkt_solve (picked there: BK=32, 1 warp), whose fixed config stays the
# one the GPU tests' recorded errors of the seed path were measured with. The
# backward's per-chunk kernel at 4 warps (1.36 ms at B=8 T=4096 against 2.18
# at 8, though it spills there, docs/triton_versions.md; float32 at 8 warps
# asks 233472 bytes of shared memory of triton 3.6, past the H200's 232448),
# the WY kernel at 4 (1.04 ms against 1.57 at 8, though it spills 300 bytes
# there, docs/performance.md; at K = 256 see UNTUNED_WIDE_KEYS).
UNTUNED = {
    "kkt_solve": dict(BK=64, num_warps=4),
    "recompute_w_u": dict(num_warps=8, num_stages=3),
    "fused": dict(BK=64, num_warps=2, num_stages=3),
    "A": dict(BK=64, num_warps=1),
    "chunk_fwd": dict(BV=32, TRANSPOSED=False, num_warps=4, num_stages=2),
    "chunk_qk": dict(num_warps=2, num_stages=2),
    "chunk_bwd_walk": dict(BV=32, TRANSPOSED=False, num_warps=4, num_stages=2),
    "chunk_bwd_local": dict(num_warps=4, num_stages=2),
    "wy_bwd": dict(num_warps=4, num_stages=2),
    "fused_recurrent": dict(BV=32, num_warps=4, num_stages=2),
}
# ... for float32 inputs, where a kernel's fixed config above asks more shared
# memory than an sm_90 program has (the reverse walk at BV=32 reading A and
# chunk_qk's block: 238340 bytes on triton 3.6, past 232448) ...
UNTUNED_FLOAT32 = {
    "chunk_bwd_walk": dict(BV=16, TRANSPOSED=False, num_warps=4, num_stages=2),
}
# ... and where many programs run (a launch's ``("programs", N * H bucket)``
# tune key at or past the first number; not float32, whose tiles at BV=64 ask
# 246276 bytes of shared memory): the walk's pick at B=8 T=4096 and
# T=32768 in 8 sequences (the transposed form, BV=64), against the row form
# with BV=32 at one long sequence (docs/performance.md). The reverse walk
# stays in its row form there: its transposed form took 0.900 ms against
# 0.821 at B=8 T=4096 (H100, triton 3.6, under JAX; it spills at 4 warps).
UNTUNED_MANY_PROGRAMS = {
    "chunk_fwd": (128, dict(BV=64, TRANSPOSED=True, num_warps=4, num_stages=2)),
}


# ... for launches of K columns at or past the first number (the launch's
# ``K`` constexpr): the WY backward at 8 warps at K = V = 256 (0.322 ms
# against 0.653 at 4, B=2 T=4096 H=16, torch launch, bf16).
UNTUNED_WIDE_KEYS = {
    "wy_bwd": (256, dict(num_warps=8, num_stages=2)),
}


def fixed_config_overrides() -> dict:
    """``GDN_JAX_FIXED_CONFIGS``: a JSON object ``{kernel name: config kwargs}``, or ``{}``."""
    text = os.environ.get("GDN_JAX_FIXED_CONFIGS", "")
    try:
        overrides = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"GDN_JAX_FIXED_CONFIGS must be a JSON object {{kernel name: config kwargs}}, "
                         f"got {text!r}: {e}") from None
    if not isinstance(overrides, dict) or not all(isinstance(c, dict) for c in overrides.values()):
        raise ValueError(f"GDN_JAX_FIXED_CONFIGS must be a JSON object {{kernel name: config kwargs}}, "
                         f"got {text!r}")
    return overrides


def untuned(name: str, operands=(), programs: int | None = None, key_dim: int | None = None) -> dict:
    """The fixed config of kernel ``name`` for a launch of ``operands``:
    :data:`UNTUNED_WIDE_KEYS` where it has one and the launch's ``key_dim``
    (its ``K``) reaches it;
    :data:`UNTUNED_MANY_PROGRAMS` where it has one, the launch's ``programs``
    bucket reaches it and not every float operand is float32;
    :data:`UNTUNED_FLOAT32` where it has one and every float operand is
    float32; else :data:`UNTUNED`;
    ``GDN_JAX_FIXED_CONFIGS`` (JSON, ``{name: config kwargs}``) replaces
    them, to time one config against another."""
    override = fixed_config_overrides().get(name)
    if override is not None:
        return dict(override)
    floats = [x.dtype for x in operands if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]
    float32 = bool(floats) and all(d == jnp.float32 for d in floats)
    if name in UNTUNED_WIDE_KEYS and key_dim is not None and key_dim >= UNTUNED_WIDE_KEYS[name][0]:
        return dict(UNTUNED_WIDE_KEYS[name][1])
    if name in UNTUNED_MANY_PROGRAMS and programs is not None and not float32 \
            and programs >= UNTUNED_MANY_PROGRAMS[name][0]:
        return dict(UNTUNED_MANY_PROGRAMS[name][1])
    if float32 and name in UNTUNED_FLOAT32:
        return dict(UNTUNED_FLOAT32[name])
    return UNTUNED[name]

_CHOSEN: dict = {}  # (kernel name, constexprs, dtypes, device kind) -> config kwargs
_TIMING = contextvars.ContextVar("gdn_jax_autotune_timing", default=True)


def autotune_enabled() -> bool:
    """False when the environment sets ``GDN_JAX_AUTOTUNE=0``."""
    return os.environ.get("GDN_JAX_AUTOTUNE", "1") != "0"


def timing_allowed() -> bool:
    """False inside :func:`without_timing`."""
    return _TIMING.get()


@contextlib.contextmanager
def without_timing():
    """Launches traced inside take the config already chosen for their key, or
    the fixed one (:data:`UNTUNED`), and time nothing. For the partitioned op
    (:mod:`gdn_jax.sharding`): ``custom_partitioning`` traces the per-device
    function at the global shapes (stand-ins that large may not fit one
    device) and lowers it from inside XLA's partitioner, where running a
    computation is not safe."""
    token = _TIMING.set(False)
    try:
        yield
    finally:
        _TIMING.reset(token)


def config_kwargs(config) -> dict:
    """A ``triton.Config`` as the keyword arguments of one launch."""
    return dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)


STAND_IN_BLOCK = 1 << 20  # values drawn on the host per float stand-in, tiled to its shape


def stand_ins(operands, T: int, chunk_size: int = 64, seed: int = 0):
    """Concrete operands for timing a launch of ``operands``.

    Concrete arrays and Python scalars are kept. A traced float array becomes
    random values of its shape and dtype in ``[0.5, 1] / sqrt(last dim)`` (unit-size
    key rows, nothing that overflows in ``A``'s build), a block of at most
    :data:`STAND_IN_BLOCK` values drawn on the host and tiled on the device
    (``jax.random`` at these sizes compiled to executables that held their
    counters as constants: 23 MB for 16M values, and minutes of a persistent
    compilation cache's compression per kernel at B=8 T=4096; a kernel's time
    does not depend on its values); a traced int ``[N + 1]``
    array (``cu_seqlens``) ``N`` segments of about ``T / N`` rows, and a second
    one after it their chunk offsets (:func:`gdn_jax.chunk_indices.chunk_offsets`);
    a traced int ``[NT, 2]`` array (chunk indices) the chunks of those segments,
    cut or padded with skipped rows (:func:`gdn_jax.chunk_indices.padding_row`) to ``NT``.
    """
    with jax.ensure_compile_time_eval():  # concrete arrays, also inside a jax.jit trace
        rng = np.random.default_rng(seed)
        cu = None
        out = []
        for x in operands:
            if not isinstance(x, jax.core.Tracer):
                out.append(x)
            elif jnp.issubdtype(x.dtype, jnp.floating):  # moderate: no overflow in A's build
                u = rng.uniform(0.5, 1.0, min(x.size, STAND_IN_BLOCK)) / np.sqrt(max(x.shape[-1], 1))
                out.append(jnp.resize(jnp.asarray(u.astype(x.dtype)), x.shape))
            elif x.ndim == 1 and cu is not None and x.shape == cu.shape:
                out.append(jnp.asarray(chunk_offsets(cu, chunk_size), x.dtype))
            elif x.ndim == 1:
                cu = np.linspace(0, T, x.shape[0]).astype(np.int32)
                out.append(jnp.asarray(cu, x.dtype))
            else:
                cu_ = cu if cu is not None else np.array([0, T], np.int32)
                ci = np.asarray(prepare_chunk_indices(cu_, chunk_size))[: x.shape[0]]
                pad = np.tile(np.array(padding_row(T, chunk_size), np.int32), (x.shape[0] - len(ci), 1))
                out.append(jnp.asarray(np.concatenate([ci, pad]).reshape(x.shape), x.dtype))
    return out


LAUNCHES_PER_CALL = 10  # launches of one config per timed call
ROUNDS = 5  # timed calls per config, the configs taken in turn


def repeated(launch, operands, arrays, kwargs):
    """A jitted function of the arrays of ``operands`` (at positions ``arrays``)
    that launches the kernel :data:`LAUNCHES_PER_CALL` times, one after the
    other: an optimization barrier between launches makes each one's operands
    depend on the previous one's outputs (through one element of its first
    output, which the function returns), so XLA neither merges nor drops
    them. One dispatch per many launches: the timing is the GPU's, not the
    host's (a single launch per jitted call measured the host's dispatch at
    small shapes, and picked configs 3x slower on the GPU)."""
    def run(*arrs):
        firsts = []
        for _ in range(LAUNCHES_PER_CALL):
            ops = list(operands)
            for i, a in zip(arrays, arrs):
                ops[i] = a
            first = jax.tree.leaves(launch(ops, **kwargs))[0].reshape(-1)[:1]
            arrs, first = jax.lax.optimization_barrier((arrs, first))
            firsts.append(first)  # returned, so that no launch is dead code
        return firsts
    return jax.jit(run)


def call_ms(run, args) -> float:
    """Wall ms of one call of ``run(*args)`` until its outputs are ready."""
    t0 = time.perf_counter()
    jax.block_until_ready(run(*args))
    return (time.perf_counter() - t0) * 1e3


def chosen_config(name: str, configs, operands, launch, constexprs, T: int) -> dict:
    """Config kwargs for one launch of kernel ``name``.

    Args:
      name: the kernel's key in :data:`UNTUNED`.
      configs: its ``triton.Config`` candidates.
      operands: the launch's array operands and scalars (may be tracers).
      launch: ``launch(operands, **config_kwargs)`` runs the kernel.
      constexprs: hashable, the launch's constexprs (head counts and dims,
        flags); with the operands' dtypes and the device kind, the cache key.
        Batch rows and sequence length are left out, as in the kernels'
        ``triton.autotune`` keys: a new length reuses the config.
      T: rows of the packed batch (for stand-in ``cu_seqlens``).

    The first call for a key in a process takes the choice an earlier
    process stored for it (:mod:`gdn_jax.autotune_store`), or times every
    config on :func:`stand_ins` of this launch's shapes (a config that fails
    to compile is skipped), keeps the fastest and stores it; inside
    :func:`without_timing`, a key not chosen yet gets :data:`UNTUNED`.
    """
    keys = list(constexprs) if isinstance(constexprs, tuple) else []
    programs = keys[keys.index("programs") + 1] if "programs" in keys else None  # the tune key's bucket
    key_dim = dict(x for x in keys if isinstance(x, tuple) and len(x) == 2).get("K")
    fixed = functools.partial(untuned, name, operands, programs, key_dim)
    if not autotune_enabled():
        return fixed()
    key = (name, constexprs, jax.devices()[0].device_kind,
           tuple(str(x.dtype) for x in operands if hasattr(x, "shape")))
    candidates = [config_kwargs(c) for c in configs]
    if key not in _CHOSEN:
        stored = autotune_store.lookup(key, candidates)
        if stored is not None:
            _CHOSEN[key] = stored
    if not timing_allowed():
        return _CHOSEN.get(key, fixed())
    if key not in _CHOSEN:
        with jax.ensure_compile_time_eval():
            best, errors = fastest(configs, stand_ins(operands, T), launch)
        if best is None:
            best = untuned_after_failures(name, errors, fixed())
        else:
            autotune_store.save(key, candidates, best)
        _CHOSEN[key] = best
    return _CHOSEN[key]


# Python 3.11's ast.parse raises "AST constructor recursion depth mismatch"
# when threads parse at once (seen compiling Triton kernels in two threads).
COMPILE_IN_THREADS = sys.version_info >= (3, 12)


def compiled_runs(configs, operands, launch, arrays, args) -> list:
    """``[(config kwargs, run)]``: each config's :func:`repeated` function,
    compiled ahead in threads where that is safe (Python >= 3.12: 3.11's
    ``ast.parse``, which Triton's compile calls, fails in concurrent
    threads). Triton's and XLA's compilers release the GIL for much of their
    work: the walk's 4 row-form configs compile for sm_90a in 1.3 to 1.6 s
    on 2 threads against 2.7 to 3.2 s one after the other (triton 3.6,
    Python 3.12, three runs).
    A run whose compile failed in a thread (a thread sees none of the
    caller's JAX context managers) is left to compile on the first call, in
    the caller's thread, which reports its own error."""
    kwargs = [config_kwargs(c) for c in configs]
    pending = [(kw, repeated(launch, operands, arrays, kw)) for kw in kwargs]
    workers = min(len(pending), os.cpu_count() or 1, 8)
    if not COMPILE_IN_THREADS or workers < 2:
        return pending

    def compile_ahead(run):
        try:
            return run.lower(*args).compile()
        except Exception:  # noqa: BLE001 (compiled again on the caller's thread)
            return run

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        ahead = list(pool.map(compile_ahead, [run for _, run in pending]))
    return [(kwargs, run) for (kwargs, _), run in zip(pending, ahead)]


def fastest(configs, operands, launch):
    """``(config kwargs, errors)``: the config with the lowest median time of
    :data:`ROUNDS` timed calls of :func:`repeated` launches, the configs
    timed in turn (so that a drift of the GPU's clocks favours none), and
    each failed config's error. A config that fails (out of shared memory,
    say) is skipped; where none runs (the stand-ins, a second copy of the
    launch's operands and outputs, may not fit the device) the kwargs are
    None (:func:`chosen_config` then launches :data:`UNTUNED`, with
    :func:`untuned_after_failures`'s warning)."""
    arrays = [i for i, x in enumerate(operands) if hasattr(x, "shape")]
    args = [operands[i] for i in arrays]
    runs, errors = [], []
    for kwargs, run in compiled_runs(configs, operands, launch, arrays, args):
        try:
            call_ms(run, args)  # compiles where the threads did not; warms up
            runs.append((run, kwargs, []))
        except Exception as e:
            errors.append(f"{kwargs}: {type(e).__name__}: {e}")
    for _ in range(ROUNDS):
        for run, kwargs, times in runs:
            times.append(call_ms(run, args))
    if not runs:
        return None, errors
    return min(runs, key=lambda r: statistics.median(r[2]))[1], errors


def untuned_after_failures(name: str, errors, config: dict) -> dict:
    """The fixed ``config`` (:func:`untuned`), with a warning naming why no config could be timed."""
    warnings.warn(f"gdn_jax: no config of kernel {name!r} could be timed, launching the fixed "
                  f"config {config}:\n" + "\n".join(errors), RuntimeWarning, stacklevel=3)
    return config
