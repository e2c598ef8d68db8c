#!/usr/bin/env python3
"""cgtrace compact on 1, 2, ... cores (`taskset`) against `orjson.loads` of the same bytes on
as many cores, on real-shaped traces, interleaved in one run.

    python benchmarks/read_scaling.py --sizes 100MB                     # every corpus trace, 1 and 2 cores
    python benchmarks/read_scaling.py --sizes 100MB --only hta_nccl_a100 --cores 1,2,4 --repeat 5

Inputs come from benchmarks/corpus.py (built here when missing). Round by round, each trace
on each core count runs once: `orjson.loads` of its bytes (read first, the parse timed alone
in a fresh process), `cgtrace compact --jobs 1` (the trace read in one process) and `cgtrace
compact --jobs <cores>` (its pieces read by a worker per core, inputs/piece_workers.py); so a
burst of load on a shared machine falls on all of them alike. Best wall time of `--repeat`
rounds, and the largest peak memory (the process tree's RSS, sampled: run.py's measure).
Prints a Markdown table; JSON goes to benchmarks/out/results/read_scaling-<time>.json.
"""

from __future__ import annotations

import argparse
import compileall
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.corpus import DEFAULT_OUT as CORPUS  # noqa: E402  (after the path set-up above)
from benchmarks.corpus import build  # noqa: E402
from benchmarks.run import MB, find_cgtrace, measure  # noqa: E402
from benchmarks.vs_reference import _ORJSON, publish, table_head  # noqa: E402

RUNS = ("orjson", "compact --jobs 1", "compact")  # the last with a read worker per core (--jobs <cores>)


def _cpus(cores: int) -> str:
    """The first `cores` CPUs this process may run on, as taskset takes them."""
    allowed = sorted(os.sched_getaffinity(0))
    if cores > len(allowed):
        raise SystemExit(f"read_scaling: --cores {cores}: only {len(allowed)} CPUs here")
    return ",".join(map(str, allowed[:cores]))


def this_checkout() -> list[str]:
    """This checkout's code (run.py's measure runs in the checkout), not an installed cgtrace's,
    its bytecode compiled first as an installed package's is."""
    compileall.compile_dir(str(REPO / "converter"), quiet=1)
    return [sys.executable, "-m", "converter.cli"]


def one_round(source: str, cores: int, cgtrace: list[str], work: Path, timeout: Optional[float]) -> dict[str, dict]:
    pinned = ["taskset", "-c", _cpus(cores)]
    output = str(work / "compact.perfetto-trace")
    loads = subprocess.run([*pinned, sys.executable, "-c", _ORJSON, source], capture_output=True, text=True,
                           check=True)
    runs = {"orjson": {"wall_s": float(loads.stdout), "rc": 0}}
    for name, extra in (("compact --jobs 1", ["--jobs", "1"]), ("compact", ["--jobs", str(cores)])):
        runs[name] = measure([*pinned, *cgtrace, "compact", source, "-o", output, "--overwrite", "-q", *extra], timeout)
    return runs


def _peak_mb(runs: list[dict], key: str) -> float:
    return max((r.get(key, 0) for r in runs if r["rc"] == 0), default=0) * 1024 / MB


def markdown(rows: list[dict], machine: dict) -> str:
    lines = table_head(machine, "interleaved rounds; peak RSS = the process tree's summed RSS, sampled every 0.1 s "
                                "(pages shared since a fork count once per process); peak PSS = the same pages "
                                "shared out, sampled every 1 s; MB = 10^6 bytes",
                       ["trace (tiled)"], ["MB", "cores", "orjson.loads s", "one process s", "one / orjson",
                                           "workers s", "workers / orjson", "speed-up", "peak RSS MB one / workers",
                                           "peak PSS MB one / workers"])
    for row in rows:
        runs = row["runs"]
        best = {name: min((r["wall_s"] for r in runs[name] if r["rc"] == 0), default=None) for name in RUNS}
        orjson, one, workers = best["orjson"], best["compact --jobs 1"], best["compact"]
        if orjson is None or one is None or workers is None:
            lines.append(f"| {row['name']} | {row['bytes'] / MB:.0f} | {row['cores']} | failed |" + " |" * 7)
            continue
        rss = [max(_peak_mb(runs[name], "peak_rss_kb"), _peak_mb(runs[name], "tree_rss_sampled_kb"))
               for name in RUNS[1:]]
        pss = [_peak_mb(runs[name], "tree_pss_sampled_kb") for name in RUNS[1:]]
        lines.append(f"| {row['name']} | {row['bytes'] / MB:.0f} | {row['cores']} | {orjson:.2f} | {one:.2f} | "
                     f"{one / orjson:.2f}x | {workers:.2f} | {workers / orjson:.2f}x | {one / workers:.2f}x | "
                     f"{rss[0]:.0f} / {rss[1]:.0f} | {pss[0]:.0f} / {pss[1]:.0f} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100MB")
    parser.add_argument("--only", default="", help="comma-separated corpus source names (default: all)")
    parser.add_argument("--cores", default="1,2", help="comma-separated core counts (taskset)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best of them is kept")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run")
    parser.add_argument("--cgtrace", help="the cgtrace executable (default: this checkout's, as python -m)")
    args = parser.parse_args(argv)
    work = REPO / "benchmarks" / "out" / "read_scaling"
    work.mkdir(parents=True, exist_ok=True)
    cgtrace = find_cgtrace(args.cgtrace) if args.cgtrace else this_checkout()
    core_counts = [int(c) for c in args.cores.split(",")]
    entries = build(args.sizes.split(","), [n for n in args.only.split(",") if n], CORPUS)
    rows = [{**entry, "cores": cores, "runs": {name: [] for name in RUNS}}
            for entry in entries for cores in core_counts]
    for _ in range(args.repeat):
        for row in rows:
            for name, run in one_round(row["path"], row["cores"], cgtrace, work, args.timeout).items():
                row["runs"][name].append(run)
            print(markdown([row], {}).splitlines()[-1], file=sys.stderr, flush=True)
    publish("read_scaling", rows, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
