#!/usr/bin/env python3
"""How hostile inputs' cost grows: each case at n and 4n (issue 58), timed as the command line
runs it. Linear work grows about 4x; more than 5x is the sign of a quadratic.

    .venv/bin/python benchmarks/hostile_scaling.py                        # every case
    .venv/bin/python benchmarks/hostile_scaling.py --cases not-json --n 100000

Cases: `not-json`, a trace whose first event's ts is NaN, n events (`report`, refused);
`cut-like-string`, a valid trace of 20,000 events with one args string of n `},{` across the
first piece's end (`convert`); `report-steps` and `diff-steps`, a GPU trace of n ProfilerSteps of
10 kernels each (`report`, `diff` of it with itself); `report-pipeline`, a generated 2-rank
pipeline of n steps, merged first (not timed), then reported. Prints JSON: CPU seconds of the
command at n and 4n, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from converter.generator import write_pp_run  # noqa: E402

PIECE_BYTES = 1 << 20  # the reader's default piece


def _kernels(count: int, first: int = 0) -> list[dict]:
    return [{"name": f"k{i}", "cat": "kernel", "ph": "X", "ts": 10 * i, "dur": 5, "pid": 0, "tid": 7,
             "args": {"stream": 7, "grid": [i, 1, 1]}} for i in range(first, first + count)]


def not_json(n: int, folder: Path) -> tuple[Path, list[str]]:
    rest = json.dumps(_kernels(n, first=1))[1:-1]
    path = folder / f"not_json_{n}.json"
    path.write_text('{"traceEvents":[{"name":"k0","cat":"kernel","ph":"X","ts":NaN,"dur":5,"pid":0,"tid":7},'
                    + rest + "]}")
    return path, ["report", str(path)]


def cut_like_string(n: int, folder: Path) -> tuple[Path, list[str]]:
    before = _kernels(PIECE_BYTES // len(json.dumps(_kernels(1, first=10_000))))
    long_one = {"name": "long", "cat": "cpu_op", "ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 1,
                "args": {"text": "},{" * n}}
    path = folder / f"cut_like_string_{n}.json"
    path.write_text(json.dumps({"traceEvents": [*before, long_one, *_kernels(20_000 - len(before), len(before))]}))
    return path, ["convert", str(path), "-q", "--overwrite", "-o", str(folder / "out.perfetto-trace")]


def _many_steps(n: int, folder: Path) -> Path:
    events: list[dict] = []
    for step in range(n):
        events.append({"name": f"ProfilerStep#{step}", "cat": "user_annotation", "ph": "X", "ts": 100 * step,
                       "dur": 90, "pid": 1, "tid": 1})
        events += [{"name": f"k{k}", "cat": "kernel", "ph": "X", "ts": 100 * step + 1 + 8 * k, "dur": 5, "pid": 0,
                    "tid": 7, "args": {"device": 0, "stream": 7}} for k in range(10)]
    path = folder / f"steps_{n}.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def report_steps(n: int, folder: Path) -> tuple[Path, list[str]]:
    path = _many_steps(n, folder)
    return path, ["report", str(path), "--format", "json"]


def diff_steps(n: int, folder: Path) -> tuple[Path, list[str]]:
    path = _many_steps(n, folder)
    return path, ["diff", str(path), str(path), "--format", "json"]


def report_pipeline(n: int, folder: Path) -> tuple[Path, list[str]]:
    ranks = write_pp_run(folder / f"ranks_{n}", pp_size=2, steps=n, seed=1, graphs_per_step=1, kernels_per_replay=2,
                         microbatches=2)
    merged = folder / f"pipeline_{n}.perfetto-trace"
    subprocess.run([sys.executable, "-m", "converter.cli", "merge", str(ranks[0].parent), "-o", str(merged), "-q",
                    "--overwrite"], cwd=REPO, capture_output=True, check=True)
    return merged, ["report", str(merged), "--format", "json"]


CASES: dict[str, tuple[Callable[[int, Path], tuple[Path, list[str]]], int]] = {
    "not-json": (not_json, 25_000),
    "cut-like-string": (cut_like_string, 4_000),
    "report-steps": (report_steps, 1_000),
    "diff-steps": (diff_steps, 1_000),
    "report-pipeline": (report_pipeline, 200),
}


def cpu_seconds(arguments: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "converter.cli", *arguments], cwd=REPO, capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--n", type=int, help="the smaller size (default: each case's own)")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.cases.split(","):
            make, default_n = CASES[name]
            n = args.n or default_n
            seconds = [cpu_seconds(make(size, Path(scratch))[1]) for size in (n, 4 * n)]
            results[name] = {"n": n, "cpu_s": [round(s, 3) for s in seconds], "ratio": round(seconds[1] / seconds[0], 2)}
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
