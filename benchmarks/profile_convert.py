#!/usr/bin/env python3
"""Where `cgtrace convert` (or `compact`) spends its time and memory, stage by stage.

    python benchmarks/profile_convert.py IN.json                 # stage wall times + RSS
    python benchmarks/profile_convert.py IN.json --job compact   # the compact job's stages
    python benchmarks/profile_convert.py IN.json --cprofile      # plus cProfile (slower, top functions)
    python benchmarks/profile_convert.py --size 1M               # input from run.py's cache (generated if absent)

Runs the convert (or compact) job in-process (cyclic GC off, the C heap tuned, and the args helper where a core
is free, as the CLI does) with thin
timers around the pipeline's stage functions, looked up by name at run time; a stage whose
function no longer exists is reported as missing, not an error. Stage times are inclusive
(a nested stage is also inside its parent) and the timers cost nothing measurable (one call
per stage).
RSS is read from /proc/self/status after each stage: `rss` now, `hwm` the peak so far; the
system CPU time so far shows what page faults cost (on these VMs fresh memory is slow to touch).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import importlib
import os
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.environ.get("TREE") or str(Path(__file__).resolve().parent.parent))
# As the command line does before numpy loads: one OpenBLAS thread, so the args helper may fork.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# (label, module, attribute path, depth). Wrapped where the caller looks the name up.
STAGES = [
    ("read file (bytes)", "converter.inputs.kineto_reader", "read_input_bytes", 1),
    ("find traceEvents (locate_events)", "converter.inputs.kineto_reader", "locate_events", 1),
    ("read events piece by piece", "converter.inputs.kineto_reader", "_parse_in_pieces", 1),
    ("build model (event handlers; pieces decode before)", "converter.inputs.plain_events",
     "KinetoEvents.add_events", 2),
    ("finish (metadata + flows)", "converter.inputs.phase_handlers", "PhaseHandlers.finish", 2),
    ("bind flows", "converter.inputs.phase_handlers", "bind_flows", 3),
    ("compaction (compact)", "converter.jobs.runner", "compact", 1),
    ("waiting for the args helper's labels", "converter.outputs.args_accelerator", "BackgroundArgsEncoder.labels", 2),
    ("waiting for the args helper's encoding", "converter.outputs.args_accelerator", "BackgroundArgsEncoder.result",
     2),
    ("launch attribution (launch_args)", "converter.jobs.runner", "launch_args", 1),
    ("why idle, queue depth (add_wait_counters)", "converter.jobs.runner", "add_wait_counters", 1),
    ("find PP blocks", "converter.jobs.runner", "find_blocks", 1),
    ("rank-local PP arrows", "converter.jobs.runner", "link_rank_local", 1),
    ("layout (separate_overlaps)", "converter.jobs.runner", "separate_overlaps", 1),
    ("write (PerfettoWriter.write)", "converter.outputs.perfetto_writer", "PerfettoWriter.write", 1),
    ("descriptors", "converter.outputs.perfetto_writer", "PerfettoWriter._write_descriptors", 2),
    ("flow ids (FlowFields)", "converter.outputs.perfetto_writer", "FlowFields", 2),
    ("close", "converter.outputs.perfetto_writer", "PerfettoWriter.close", 1),
    ("summary", "converter.jobs.runner", "trace_summary", 1),
]

_records: list[tuple[str, float, int, int, float]] = []


def _rss_kb() -> tuple[int, int]:
    rss = hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


def _timed(label, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            rss, hwm = _rss_kb()
            _records.append((label, dt, rss, hwm, resource.getrusage(resource.RUSAGE_SELF).ru_stime))
    return wrapper


class _DecoderProxy:
    def __init__(self, decoder, label):
        self._decoder = decoder
        self.decode = _timed(label, decoder.decode)


def install_timers() -> list[str]:
    missing = []
    for label, module_name, path, _ in STAGES:
        try:
            owner = importlib.import_module(module_name)
            *parents, name = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            target = getattr(owner, name)
        except (ImportError, AttributeError):
            missing.append(f"{label} ({module_name}.{path})")
            continue
        if path.endswith(".decode"):
            # A msgspec Decoder attribute: replace the decoder object with a proxy.
            holder = importlib.import_module(module_name)
            for parent in parents[:-1]:
                holder = getattr(holder, parent)
            setattr(holder, parents[-1], _DecoderProxy(owner, label))
        else:
            setattr(owner, name, _timed(label, target))
    return missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("input", nargs="?", type=Path)
    parser.add_argument("--size", help="use run.py's cached input of this size (1M events, 100MB, ...), generating it if absent")
    parser.add_argument("--job", choices=("convert", "compact"), default="convert")
    parser.add_argument("--cprofile", action="store_true", help="also run under cProfile and print the top")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--sort", default="tottime", help="pstats sort key for the top list (tottime, cumulative)")
    parser.add_argument("--dump", type=Path, help="write the cProfile stats here (for snakeviz etc.)")
    args = parser.parse_args()
    if args.input is None and not args.size:
        parser.error("pass IN or --size")
    if args.size:
        from run import DEFAULT_OUT, InputCache, parse_size
        meta = InputCache(DEFAULT_OUT, 0).get(parse_size(args.size), 0)
        args.input = Path(meta["paths"][0])

    missing = install_timers()
    from converter.heap import reuse_freed_memory_after_reads
    from converter.jobs.runner import JobOptions, run_job

    size = args.input.stat().st_size
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.perfetto-trace"
        profiler = cProfile.Profile() if args.cprofile else None
        gc.disable()
        reuse_freed_memory_after_reads()
        t0 = time.perf_counter()
        if profiler:
            profiler.enable()
        summary = run_job(args.input, out, JobOptions(compact=args.job == "compact", overwrite=True, args_strategy="auto"))
        if profiler:
            profiler.disable()
        total = time.perf_counter() - t0
        gc.enable()
    rss, hwm = _rss_kb()

    print(f"input {args.input} ({size / 1e6:.0f} MB, {summary.get('events_read')} events)"
          f"{' under cProfile' if profiler else ''}")
    print(f"total {args.job} {total:.2f} s = {size / 1e6 / total:.1f} MB/s; peak RSS {hwm / 1024:.0f} MiB "
          f"= {hwm * 1024 / size:.2f} x input\n")
    print("| stage | s | % of total | calls | RSS after MiB | peak so far MiB | system CPU s so far |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    top_level = 0.0
    for label, _, _, depth in STAGES:
        calls = [r for r in _records if r[0] == label]
        if not calls:
            continue
        dt = sum(r[1] for r in calls)
        if depth == 1:
            top_level += dt
        indent = "&nbsp;&nbsp;" * (depth - 1)
        print(f"| {indent}{label} | {dt:.2f} | {100 * dt / total:.0f}% | {len(calls)} | "
              f"{calls[-1][2] / 1024:.0f} | {calls[-1][3] / 1024:.0f} | {calls[-1][4]:.1f} |")
    print(f"| (outside the stages: path checks, output open, ...) | {total - top_level:.2f} | "
          f"{100 * (total - top_level) / total:.0f}% | | | | |")
    for m in missing:
        print(f"\nmissing stage: {m}")
    if profiler:
        stream = io.StringIO()
        stats = pstats.Stats(profiler, stream=stream)
        stats.sort_stats(args.sort).print_stats(args.top)
        print("\n" + stream.getvalue())
        if args.dump:
            stats.dump_stats(args.dump)
    return 0


if __name__ == "__main__":
    sys.exit(main())
