"""Host time per ``fwd_intra`` call against the size of the custom calls'
opaque strings, on the GPU machine.

    python benchmarks/host_cost.py [--out DIR]

Under jax-triton 0.3.x each launch is a legacy custom call whose opaque
string (``backend_config``) is the zlib'd proto of the kernel's PTX and TTIR,
and jaxlib's handler finds the loaded kernel by looking that whole string up
in a hash map on every call. If that lookup is what makes small calls
host-bound, host time grows with the string. Here each Triton path runs at a
one-chunk shape (a few microseconds of GPU work) and at B=4 T=2048 H=8,
beside a trivial jitted op. (Kernels with half the PTX, measured the same
way, took about the same host time: docs/performance.md.) One fixed config per kernel
(``GDN_JAX_AUTOTUNE=0``): nothing is timed while tracing. Prints a table,
writes ``host_cost.json`` under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re

os.environ.setdefault("GDN_JAX_AUTOTUNE", "0")

import jax  # noqa: E402

import gdn_jax  # noqa: E402
from bench_fwd_intra import jax_dispatch_ms, make_inputs, timed  # noqa: E402

SHAPES = {"one chunk": (1, 64, 1, 1, 128, 128), "B4T2048H8": (4, 2048, 8, 8, 128, 128)}
IMPLS = ("triton", "split", "seed")


def opaque_bytes(lowered_text: str) -> list[int]:
    """Byte length of the ``backend_config`` string of each Triton custom call
    of the lowered module (escapes ``\\XX`` and ``\\c`` count as one byte)."""
    return [len(re.sub(r"\\[0-9A-Fa-f]{2}|\\.", "x", body))
            for line in lowered_text.splitlines() if "custom_call @triton" in line
            for body in re.findall(r'backend_config = "((?:[^"\\]|\\.)*)"', line)]


def measure(shape, impl):
    """Opaque bytes, enqueue ms and wall ms per call of jitted ``fwd_intra``."""
    k, v, g, beta = make_inputs(*shape)
    f = jax.jit(lambda k, v, g, beta: gdn_jax.fwd_intra(k, v, g, beta, impl=impl))
    sizes = opaque_bytes(f.lower(k, v, g, beta).as_text())
    out = [None]
    wall, enqueue = timed(lambda: out.__setitem__(0, f(k, v, g, beta)),
                          lambda: jax.block_until_ready(out[0]), n_inner=200)
    return dict(opaque_bytes=sizes, enqueue_ms=enqueue, wall_ms=wall)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    import jax_triton
    rows = []
    trivial = jax_dispatch_ms()
    for shape_name, shape in SHAPES.items():
        for impl in IMPLS:
            rows.append(dict(shape=shape_name, impl=impl, **measure(shape, impl)))
            print(json.dumps(rows[-1]), flush=True)
    result = dict(jax=jax.__version__, jax_triton=jax_triton.__version__,
                  device=jax.devices()[0].device_kind, trivial_dispatch_ms=trivial, rows=rows)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_cost.json").write_text(json.dumps(result, indent=1))
    print(f"\njax {jax.__version__}, jax-triton {jax_triton.__version__}; trivial jitted op "
          f"{trivial:.4f} ms of host time per call")
    print("| shape | impl | opaque KB per launch | enqueue ms | wall ms |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        kb = " + ".join(f"{b / 1024:.0f}" for b in r["opaque_bytes"]) or "-"
        print(f"| {r['shape']} | {r['impl']} | {kb} | "
              f"{r['enqueue_ms']:.4f} | {r['wall_ms']:.4f} |")


if __name__ == "__main__":
    main()
