"""The convert job end to end: read -> model -> layout -> write, plus the summary users see."""

from __future__ import annotations

from pathlib import Path

from typing import Optional

from .compaction import compact
from .errors import CgtraceError
from .lanes import load_lane_rules
from .layout import separate_overlaps
from .model import Trace
from .output import atomic_output, check_output_path
from .perfetto_writer import PerfettoWriter
from .pp import find_blocks, link_rank_local, pp_rank_of
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
    _check_paths(input_path, output_path, overwrite)
    trace = read_trace(input_path, strict=strict)
    return _write(trace, input_path, output_path, overwrite, trace_summary(trace))


def compact_file(input_path: Path, output_path: Path, overwrite: bool = False, strict: bool = False,
                 lanes_file: Optional[Path] = None) -> dict:
    """Convert and repack GPU slices into semantic lanes, with rank-local PP arrows."""
    rules = load_lane_rules(lanes_file)
    _check_paths(input_path, output_path, overwrite)
    trace = read_trace(input_path, strict=strict)
    summary = trace_summary(trace)
    summary.update(compact(trace, rules))
    pp_rank, pp_rank_source, _ = pp_rank_of(trace.metadata)
    summary.update(pp_rank=pp_rank, pp_rank_source=pp_rank_source)
    summary.update(link_rank_local(trace, find_blocks(trace, rules)))
    summary["flows"] = len(trace.flows)
    return _write(trace, input_path, output_path, overwrite, summary)


def _check_paths(input_path: Path, output_path: Path, overwrite: bool) -> None:
    check_output_path(output_path, overwrite)
    if output_path.exists() and input_path.exists() and output_path.samefile(input_path):
        raise CgtraceError(f"{output_path}: is the input file; choose another output path with -o")


def _write(trace: Trace, input_path: Path, output_path: Path, overwrite: bool, summary: dict) -> dict:
    summary["overlaps_moved"] = separate_overlaps(trace)
    summary["tracks"] = len(trace.tracks) + len(trace.processes)
    summary["slices"] = sum(1 for s in trace.slices if not s.is_instant)
    with atomic_output(output_path, overwrite) as stream:
        writer = PerfettoWriter(stream)
        writer.write(trace)
        writer.close()
    summary.update(input=str(input_path), output=str(output_path), output_bytes=output_path.stat().st_size)
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
