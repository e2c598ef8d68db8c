#!/usr/bin/env python3
"""A merge of real-shaped ranks against compacting the same ranks one by one, in one run.

    python benchmarks/merge_vs_compact.py --sizes 1GB              # the 8 DLRM ranks, 1 GB in all
    python benchmarks/merge_vs_compact.py --sizes 200MB --repeat 1

The rank set comes from `corpus.py --rank-sets` (built here when missing). `cgtrace merge
DIR` runs with its defaults; then `cgtrace compact` runs on each rank in turn. Both go
through run.py's measuring helper (CPU of the whole process tree, peak = the tree's RSS), best
wall time of `--repeat` runs. The ratio that matters is CPU: a merge does a compact's work
per rank plus pairing arrows and concatenating parts, so it should cost little more than the
compacts of the same bytes. JSON goes to benchmarks/out/results/merge_vs_compact-<time>.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.corpus import DEFAULT_OUT as CORPUS  # noqa: E402  (after the path set-up above)
from benchmarks.corpus import build_rank_sets  # noqa: E402
from benchmarks.run import MB, find_cgtrace  # noqa: E402
from benchmarks.vs_reference import best_of, publish, table_head  # noqa: E402


def compare(entry: dict, cgtrace: list[str], repeat: int, timeout: Optional[float], work: Path) -> dict:
    ranks = sorted(Path(entry["path"]).glob("rank*_trace.json"))
    merged = best_of([*cgtrace, "merge", entry["path"], "-o", str(work / "merged.perfetto-trace"), "--overwrite",
                      "-q"], repeat, timeout)
    compacts = [best_of([*cgtrace, "compact", str(rank), "-o", str(work / "rank.perfetto-trace"), "--overwrite", "-q"],
                        repeat, timeout) for rank in ranks]
    row = {**entry, "ranks": len(ranks), "merge": merged, "compacts": compacts}
    failed = [run["error"] for run in (merged, *compacts) if "error" in run]
    if failed:
        row["error"] = failed[0]
        return row
    row["compacts_total"] = {"wall_s": sum(run["wall_s"] for run in compacts),
                             "cpu_s": sum(run["cpu_s"] for run in compacts),
                             "peak_mb": max(run["peak_mb"] for run in compacts)}
    row["cpu_ratio"] = merged["cpu_s"] / row["compacts_total"]["cpu_s"]
    return row


def markdown(rows: list[dict], machine: dict) -> str:
    lines = table_head(machine, "CPU and peak are the process tree's", ["rank set"],
                       ["ranks", "MB", "merge wall s", "merge CPU s", "merge MB/s", "merge peak MB", "peak / input",
                        "compacts wall s", "compacts CPU s", "merge CPU / compacts CPU"])
    for row in rows:
        mb = row["bytes"] / MB
        if "error" in row:
            lines.append(f"| {row['name']} | {row['ranks']} | {mb:.0f} | failed: {row['error']} |")
            continue
        merged, compacts = row["merge"], row["compacts_total"]
        lines.append(f"| {row['name']} {row['size']} | {row['ranks']} | {mb:.0f} | {merged['wall_s']:.2f} | "
                     f"{merged['cpu_s']:.2f} | {mb / merged['wall_s']:.1f} | {merged['peak_mb']:.0f} | "
                     f"{merged['peak_mb'] / mb:.2f} | {compacts['wall_s']:.2f} | {compacts['cpu_s']:.2f} | "
                     f"{row['cpu_ratio']:.2f} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1GB", help="total sizes of the rank set (MB = 10^6 bytes)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run")
    parser.add_argument("--cgtrace", help="the cgtrace executable (default: this checkout's)")
    args = parser.parse_args(argv)
    entries = build_rank_sets(args.sizes.split(","), CORPUS)
    if not entries:
        print("merge_vs_compact: ../shared/traces/dlrm_8ranks is absent; nothing to merge", file=sys.stderr)
        return 0
    work = REPO / "benchmarks" / "out" / "merge_vs_compact"
    work.mkdir(parents=True, exist_ok=True)
    cgtrace = find_cgtrace(args.cgtrace)
    publish("merge_vs_compact", [compare(entry, cgtrace, args.repeat, args.timeout, work) for entry in entries],
            markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
