#!/usr/bin/env python3
"""cgtrace compact and the reference script on the same real-shaped traces, in one run.

    python benchmarks/vs_reference.py --sizes 100MB                    # every corpus trace
    python benchmarks/vs_reference.py --sizes 100MB,1GB --only hta_nccl_a100 --repeat 3

Inputs come from benchmarks/corpus.py (built here when missing). Each tool runs `--repeat`
times per input (best wall time kept) through run.py's measuring helper, so peak memory is
the process tree's. Prints a Markdown table with the ratios (reference / cgtrace: speed-up
and memory saved); JSON goes to benchmarks/out/results/vs_reference-<time>.json. Skips,
saying so, when ../shared/reference is absent.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.corpus import DEFAULT_OUT as CORPUS  # noqa: E402  (after the path set-up above)
from benchmarks.corpus import build  # noqa: E402
from benchmarks.run import MB, find_cgtrace, machine_info, measure  # noqa: E402

REFERENCE = REPO.parent / "shared" / "reference" / "compact_cuda_graph_trace.py"
RESULTS = REPO / "benchmarks" / "out" / "results"


def best_of(argv: list[str], repeat: int, timeout: Optional[float]) -> dict:
    """The fastest successful run, with the largest peak memory any run reached."""
    runs = [measure(argv, timeout) for _ in range(repeat)]
    ok = [run for run in runs if run["rc"] == 0]
    if not ok:
        return {"error": (runs[-1]["stderr"].strip().splitlines() or ["no message"])[-1]}
    best = min(ok, key=lambda run: run["wall_s"])
    peak_kb = max(max(run["peak_rss_kb"], run.get("tree_rss_sampled_kb", 0)) for run in ok)
    return {"wall_s": best["wall_s"], "cpu_s": best["user_s"] + best["sys_s"], "peak_mb": peak_kb * 1024 / MB,
            "load1": max(run["load1_after"] for run in ok)}


def compare(entry: dict, cgtrace: list[str], repeat: int, timeout: Optional[float], work: Path) -> dict:
    source = entry["path"]
    ours = best_of([*cgtrace, "compact", source, "-o", str(work / "cgtrace.perfetto-trace"), "--overwrite", "-q"],
                   repeat, timeout)
    theirs = best_of([sys.executable, str(REFERENCE), source, "-o", str(work / "reference.json"), "--overwrite"],
                     repeat, timeout)
    row = {**entry, "cgtrace": ours, "reference": theirs}
    if "error" not in ours and "error" not in theirs:
        row["speedup"] = theirs["wall_s"] / ours["wall_s"]
        row["memory_ratio"] = theirs["peak_mb"] / ours["peak_mb"]
    return row


def markdown(rows: list[dict], machine: dict) -> str:
    lines = [f"Machine: {machine.get('cpu', '?')}, {machine.get('nproc', '?')} cores, commit "
             f"{machine.get('commit', '?')}; best of the runs; peak = process tree's RSS.", "",
             "| trace (tiled) | MB | cgtrace s | MB/s | cgtrace peak MB | peak / input | reference s | "
             "reference peak MB | speed-up | memory saved |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for row in rows:
        ours, theirs = row["cgtrace"], row["reference"]
        mb = row["bytes"] / MB
        cells = [row["name"], f"{mb:.0f}"]
        cells += [f"failed: {ours['error']}", "", "", ""] if "error" in ours else \
            [f"{ours['wall_s']:.2f}", f"{mb / ours['wall_s']:.1f}", f"{ours['peak_mb']:.0f}",
             f"{ours['peak_mb'] / mb:.2f}"]
        cells += [f"failed: {theirs['error']}", ""] if "error" in theirs else \
            [f"{theirs['wall_s']:.2f}", f"{theirs['peak_mb']:.0f}"]
        cells += [f"{row['speedup']:.2f}x", f"{row['memory_ratio']:.2f}x"] if "speedup" in row else ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100MB")
    parser.add_argument("--only", default="", help="comma-separated corpus source names (default: all)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run")
    parser.add_argument("--cgtrace", help="the cgtrace executable (default: this checkout's)")
    args = parser.parse_args(argv)
    if not REFERENCE.exists():
        print(f"vs_reference: {REFERENCE.name} is absent (../shared/reference); nothing to compare", file=sys.stderr)
        return 0
    entries = build(args.sizes.split(","), [n for n in args.only.split(",") if n], CORPUS)
    work = REPO / "benchmarks" / "out" / "vs_reference"
    work.mkdir(parents=True, exist_ok=True)
    cgtrace = find_cgtrace(args.cgtrace)
    rows = []
    for entry in entries:
        rows.append(compare(entry, cgtrace, args.repeat, args.timeout, work))
        print(markdown(rows[-1:], {}).splitlines()[-1], file=sys.stderr, flush=True)
    machine = machine_info()
    print(markdown(rows, machine))
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"vs_reference-{stamp}.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
