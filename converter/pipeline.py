"""The convert job end to end: read -> model -> layout -> write, plus the summary users see."""

from __future__ import annotations

from pathlib import Path

from .layout import separate_overlaps
from .model import Trace
from .output import atomic_output, check_output_path
from .perfetto_writer import PerfettoWriter
from .reader import read_trace

PERFETTO_SUFFIX = ".perfetto-trace"


def default_output_path(input_path: Path, tag: str = "") -> Path:
    """`trace.json.gz` -> `trace<tag>.perfetto-trace` beside the input."""
    name = input_path.name
    for suffix in (".gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return input_path.with_name(f"{name}{tag}{PERFETTO_SUFFIX}")


def convert_file(input_path: Path, output_path: Path, overwrite: bool = False, strict: bool = False) -> dict:
    """Convert one Kineto JSON trace losslessly; returns the summary."""
    check_output_path(output_path, overwrite)
    trace = read_trace(input_path, strict=strict)
    overlaps_moved = separate_overlaps(trace)
    with atomic_output(output_path, overwrite) as stream:
        writer = PerfettoWriter(stream)
        writer.write(trace)
        writer.close()
    summary = trace_summary(trace)
    summary.update(input=str(input_path), output=str(output_path), overlaps_moved=overlaps_moved,
                   output_bytes=output_path.stat().st_size)
    return summary


def trace_summary(trace: Trace) -> dict:
    instants = sum(1 for s in trace.slices if s.is_instant)
    return {
        "events_read": trace.events_read,
        "events_skipped": sum(trace.skipped.values()),
        "skipped_by_reason": dict(sorted(trace.skipped.items())),
        "slices": len(trace.slices) - instants,
        "instants": instants,
        "counter_samples": len(trace.counters),
        "flows": len(trace.flows),
        "flows_unbound": trace.unbound_flows,
        "processes": len(trace.processes),
        "threads": len(trace.threads),
        "tracks": len(trace.tracks) + len(trace.processes),
    }
