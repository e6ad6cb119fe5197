"""Where each kernel's warps wait: a summary of Nsight Compute's source page.

    ncu --import split.ncu-rep --page source --print-source sass --csv > split_source.csv
    python benchmarks/ncu_stalls.py split_source.csv [--top 12]

For every kernel in the CSV (a report of ``--set full``, which samples warp
stalls): the share of the stall samples per reason, the instruction classes
(SASS opcode without modifiers) that hold the most samples with their three
main reasons, and the share of samples in each tenth of the kernel's code,
in program order (which phase the time goes to). Standard library only.
"""
from __future__ import annotations

import argparse
import collections
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"


def kernels(rows):
    """``(name, header, instruction rows)`` per kernel of the CSV."""
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"] + [len(rows)]
    for a, b in zip(starts[:-1], starts[1:]):
        header = rows[a + 1]
        yield rows[a][1], header, [r for r in rows[a + 2:b] if len(r) == len(header)]


def opcode(sass: str) -> str:
    words = [w for w in sass.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"


def summary(name, header, data, top):
    col = {h: j for j, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(int(r[col[SAMPLES]] or 0) for r in data) or 1
    by_reason = collections.Counter()
    by_op = collections.defaultdict(collections.Counter)
    for r in data:
        for h in reasons:
            by_reason[h] += int(r[col[h]] or 0)
            by_op[opcode(r[col["Source"]])][h] += int(r[col[h]] or 0)
    lines = [f"{name}: {len(data)} instructions, {total} stall samples"]
    lines += [f"  {h:22s} {100 * v / total:5.1f}%" for h, v in by_reason.most_common(top)]
    lines.append("  by instruction class:")
    ops = sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))[:top]
    lines += [f"    {op:10s} {100 * sum(c.values()) / total:5.1f}%  "
              + ", ".join(f"{h[6:]} {100 * v / total:.1f}%" for h, v in c.most_common(3))
              for op, c in ops]
    lines.append("  by tenth of the code (program order):")
    tenth, acc = max(1, len(data) // 10), []
    for i in range(0, len(data), tenth):
        acc.append(sum(int(r[col[SAMPLES]] or 0) for r in data[i:i + tenth]))
    lines.append("    " + " ".join(f"{100 * a / total:.0f}%" for a in acc))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    print("\n\n".join(summary(*k, args.top) for k in kernels(rows)))


if __name__ == "__main__":
    main()
