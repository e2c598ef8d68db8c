#!/usr/bin/env python3
"""cgtrace convert and compact, the reference script and `orjson.loads`, on the same real-shaped traces, in one run.

    python benchmarks/vs_reference.py --sizes 100MB                    # every corpus trace
    python benchmarks/vs_reference.py --sizes 100MB,1GB --only hta_nccl_a100 --repeat 3
    python benchmarks/vs_reference.py --sizes 2GB --no-reference      # cgtrace alone
    python benchmarks/vs_reference.py --startup 20                    # start-up on a 16 KB trace

Inputs come from benchmarks/corpus.py (built here when missing). Each tool runs `--repeat`
times per input (best wall time kept) through run.py's measuring helper, so peak memory is
the process tree's. Prints a Markdown table per job: size, events (cgtrace's summary), bytes
per event, wall time, MB/s, events/s, peak memory, output / input, and for compact the
reference's time and peak with the ratios (reference / cgtrace: speed-up and memory saved)
and the floor of any Python reader: `orjson.loads` of the same bytes alone (read beforehand,
timed in its own process, best of `--repeat`) and cgtrace's wall time over it; JSON goes to benchmarks/out/results/vs_reference-<time>.json. The reference is skipped,
saying so, when ../shared/reference is absent or with --no-reference.

--startup N instead times what a small trace costs, where start-up is nearly all of it:
`cgtrace compact` and the reference on a 16 KB trace (../shared's hta_triton_small, else a
generated one), `python -c pass` (the interpreter's floor), `python -c 'import numpy'`
(the floor of anything built on numpy) and `python -c 'import numpy, msgspec'` (of cgtrace's
reader before any of its own code), N runs each, interleaved so
that load on the machine falls on all of them alike; median and fastest wall and CPU seconds,
with the load average.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.corpus import DEFAULT_OUT as CORPUS  # noqa: E402  (after the path set-up above)
from benchmarks.corpus import build  # noqa: E402
from benchmarks.run import MB, find_cgtrace, machine_info, measure  # noqa: E402

# orjson.loads of a file's bytes, timed alone (the bytes read first): what parsing costs any reader.
_ORJSON = ("import sys, time, orjson\ntext = open(sys.argv[1], 'rb').read()\nstart = time.perf_counter()\n"
           "orjson.loads(text)\nprint(time.perf_counter() - start)")
REFERENCE = REPO.parent / "shared" / "reference" / "compact_cuda_graph_trace.py"
SMALL_TRACE = REPO.parent / "shared" / "traces" / "hta_triton_small.json.gz"  # 16 KB of JSON
RESULTS = REPO / "benchmarks" / "out" / "results"


def best_of(argv: list[str], repeat: int, timeout: Optional[float]) -> dict:
    """The fastest successful run (with its JSON summary, where it printed one), with the
    largest peak memory any run reached."""
    runs = [measure(argv, timeout) for _ in range(repeat)]
    ok = [run for run in runs if run["rc"] == 0]
    if not ok:
        return {"error": (runs[-1]["stderr"].strip().splitlines() or ["no message"])[-1]}
    best = min(ok, key=lambda run: run["wall_s"])
    peak_kb = max(max(run["peak_rss_kb"], run.get("tree_rss_sampled_kb", 0)) for run in ok)
    try:
        summary = json.loads(best["stdout"])
    except ValueError:
        summary = {}
    return {"wall_s": best["wall_s"], "cpu_s": best["user_s"] + best["sys_s"], "peak_mb": peak_kb * 1024 / MB,
            "load1": max(run["load1_after"] for run in ok), "events": summary.get("events_read"),
            "output_bytes": summary.get("output_bytes")}


def orjson_seconds(path: str, repeat: int) -> float:
    """The best of `repeat` timings of orjson.loads of the file, each in a fresh process."""
    return min(float(subprocess.run([sys.executable, "-c", _ORJSON, path], capture_output=True, text=True,
                                    check=True).stdout) for _ in range(repeat))


def compare(entry: dict, job: str, cgtrace: list[str], reference: bool, repeat: int, timeout: Optional[float],
            work: Path) -> dict:
    source = entry["path"]
    ours = best_of([*cgtrace, job, source, "-o", str(work / "cgtrace.perfetto-trace"), "--overwrite"], repeat, timeout)
    row = {**entry, "job": job, "cgtrace": ours, "orjson_s": orjson_seconds(source, repeat)}
    if job == "compact" and reference:
        theirs = row["reference"] = best_of([sys.executable, str(REFERENCE), source, "-o", str(work / "reference.json"),
                                             "--overwrite"], repeat, timeout)
        if "error" not in ours and "error" not in theirs:
            row["speedup"] = theirs["wall_s"] / ours["wall_s"]
            row["memory_ratio"] = theirs["peak_mb"] / ours["peak_mb"]
    return row


def table_head(machine: dict, measured: str, text_columns: list[str], number_columns: list[str]) -> list[str]:
    """How every table of real-shaped figures starts: where and what was measured, then its
    header, text columns left-aligned and figures right-aligned."""
    return [f"Machine: {machine.get('cpu', '?')}, {machine.get('nproc', '?')} cores, commit "
            f"{machine.get('commit', '?')}; best of the runs; {measured}.", "",
            "| " + " | ".join(text_columns + number_columns) + " |",
            "|" + "---|" * len(text_columns) + "--:|" * len(number_columns)]


def markdown(rows: list[dict], machine: dict) -> str:
    lines = table_head(machine, "peak = process tree's RSS; MB = 10^6 bytes", ["job", "trace (tiled)"],
                       ["MB", "events", "B/event", "cgtrace s", "MB/s", "events/s", "peak MB", "peak / input",
                        "output / input", "orjson.loads s", "cgtrace / orjson", "reference s", "reference peak MB",
                        "speed-up", "memory saved"])
    for row in rows:
        ours, theirs = row["cgtrace"], row.get("reference", {})
        mb = row["bytes"] / MB
        cells = [row["job"], row["name"], f"{mb:.0f}"]
        if "error" in ours:
            cells += [f"failed: {ours['error']}"] + [""] * 9
        else:
            events = ours["events"] or 0
            cells += [f"{events:,}", f"{row['bytes'] / events:.0f}" if events else "",
                      f"{ours['wall_s']:.2f}", f"{mb / ours['wall_s']:.1f}", f"{events / ours['wall_s']:,.0f}",
                      f"{ours['peak_mb']:.0f}", f"{ours['peak_mb'] / mb:.2f}",
                      f"{ours['output_bytes'] / row['bytes']:.2f}" if ours["output_bytes"] else "",
                      f"{row['orjson_s']:.2f}", f"{ours['wall_s'] / row['orjson_s']:.2f}x"]
        cells += [f"failed: {theirs['error']}", ""] if "error" in theirs else \
            [f"{theirs['wall_s']:.2f}", f"{theirs['peak_mb']:.0f}"] if theirs else ["", ""]
        cells += [f"{row['speedup']:.2f}x", f"{row['memory_ratio']:.2f}x"] if "speedup" in row else ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def small_trace(work: Path) -> Path:
    """The start-up input, as plain JSON: the shared 16 KB trace, else a generated one about as small."""
    path = work / "small.json"
    if SMALL_TRACE.exists():
        path.write_bytes(gzip.decompress(SMALL_TRACE.read_bytes()))
    else:
        from converter.generator import GeneratorConfig, write_trace

        write_trace(GeneratorConfig(seed=1, steps=1, graphs_per_step=2, kernels_per_replay=2, streams_per_graph=2),
                    path)
    return path


_ONE_BLAS_THREAD = "import os; os.environ['OPENBLAS_NUM_THREADS'] = '1'; "


def startup(runs: int, cgtrace: list[str], reference: bool, work: Path) -> list[dict]:
    """Each command run `runs` times, round by round (one run of each per round), so a burst of
    load on the machine falls on all of them; wall and CPU seconds (the child's user + system)."""
    source = small_trace(work)
    commands = {"python -c pass": [sys.executable, "-c", "pass"],
                # With one BLAS thread, as cgtrace imports it (cli/__init__.py): else OpenBLAS starts a thread per core.
                "python -c 'import numpy'": [sys.executable, "-c", _ONE_BLAS_THREAD + "import numpy"],
                # What every trace is read with, before any of cgtrace's own code.
                "python -c 'import numpy, msgspec'": [sys.executable, "-c", _ONE_BLAS_THREAD + "import numpy, msgspec"],
                "cgtrace compact": [*cgtrace, "compact", str(source), "-o", str(work / "small.perfetto-trace"),
                                    "--overwrite", "-q"]}
    if reference:
        commands["reference"] = [sys.executable, str(REFERENCE), str(source), "-o", str(work / "small_reference.json"),
                                 "--overwrite"]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    loads = [os.getloadavg()[0]]
    for _ in range(runs):
        for name, argv in commands.items():
            before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
            times[name].append((wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime))
    loads.append(os.getloadavg()[0])
    return [{"command": name, "bytes": source.stat().st_size, "runs": runs, "load1": max(loads),
             "wall_median_s": statistics.median(w for w, _ in pairs), "wall_min_s": min(w for w, _ in pairs),
             "cpu_median_s": statistics.median(c for _, c in pairs), "cpu_min_s": min(c for _, c in pairs)}
            for name, pairs in times.items()]


def startup_markdown(rows: list[dict], machine: dict) -> str:
    lines = table_head(machine, f"{rows[0]['runs']} runs each, interleaved, on {rows[0]['bytes']:,} bytes of JSON; "
                                f"load average up to {max(r['load1'] for r in rows):.1f}", ["command"],
                       ["wall median s", "wall fastest s", "CPU median s", "CPU fastest s"])
    lines[0] = lines[0].replace("; best of the runs", "")
    lines += [f"| {r['command']} | {r['wall_median_s']:.3f} | {r['wall_min_s']:.3f} | {r['cpu_median_s']:.3f} | "
              f"{r['cpu_min_s']:.3f} |" for r in rows]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100MB")
    parser.add_argument("--only", default="", help="comma-separated corpus source names (default: all)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run")
    parser.add_argument("--cgtrace", help="the cgtrace executable (default: this checkout's)")
    parser.add_argument("--jobs", default="convert,compact", help="cgtrace jobs, comma-separated")
    parser.add_argument("--no-reference", action="store_true", help="cgtrace alone")
    parser.add_argument("--startup", type=int, metavar="N", help="time start-up instead: N runs of each on 16 KB")
    args = parser.parse_args(argv)
    reference = REFERENCE.exists() and not args.no_reference
    if not REFERENCE.exists():
        print(f"vs_reference: {REFERENCE.name} is absent (../shared/reference); cgtrace alone", file=sys.stderr)
    work = REPO / "benchmarks" / "out" / "vs_reference"
    work.mkdir(parents=True, exist_ok=True)
    cgtrace = find_cgtrace(args.cgtrace)
    if args.startup:
        publish("startup", startup(args.startup, cgtrace, reference, work), startup_markdown)
        return 0
    entries = build(args.sizes.split(","), [n for n in args.only.split(",") if n], CORPUS)
    rows = []
    for entry in entries:
        for job in args.jobs.split(","):
            rows.append(compare(entry, job, cgtrace, reference, args.repeat, args.timeout, work))
            print(markdown(rows[-1:], {}).splitlines()[-1], file=sys.stderr, flush=True)
    publish("vs_reference", rows, markdown)
    return 0


def publish(name: str, rows: list[dict], table: Callable[[list[dict], dict], str]) -> None:
    """The table on stdout, with the machine; every figure in RESULTS/<name>-<time>.json."""
    machine = machine_info()
    print(table(rows, machine))
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"{name}-{stamp}.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
