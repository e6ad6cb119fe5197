"""The collectives of a compiled XLA program: what a sharded step communicates
(used by the sharding and context-parallel tests and bench_context_parallel)."""
from __future__ import annotations

import math
import re

KINDS = ("all-gather", "all-to-all", "collective-permute", "all-reduce", "reduce-scatter")
_INSTRUCTION = re.compile(rf"=\s*(.*?)\s({'|'.join(KINDS)})(-start)?\(")
_ARRAY = re.compile(r"([a-z]+\d*)\[([\d,]*)\]")
_BYTES = {"f64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s8": 1, "u8": 1, "pred": 1}


def collectives(hlo: str) -> list[tuple[str, str, list[int]]]:
    """``(kind, dtype, dims)`` of every result of every collective in the
    compiled HLO text ``hlo`` (a tuple result: each element)."""
    found = []
    for line in hlo.splitlines():
        hit = _INSTRUCTION.search(line)
        if hit:
            for dtype, dims in _ARRAY.findall(hit.group(1)):
                found.append((hit.group(2), dtype, [int(x) for x in dims.split(",") if x]))
    return found


def counts(hlo: str) -> dict:
    """``{kind: number of results}`` for every kind of :data:`KINDS`."""
    kinds = [kind for kind, _, _ in collectives(hlo)]
    return {kind: kinds.count(kind) for kind in KINDS}


def result_bytes(hlo: str) -> int:
    """Bytes of the results of every collective."""
    return sum(_BYTES.get(dtype, 4) * math.prod(dims) for _, dtype, dims in collectives(hlo))
