"""The convert job end to end: read -> model -> layout -> write, plus the summary users see."""

from __future__ import annotations

from pathlib import Path

from typing import Optional

from . import progress
from .background_args import cores_to_spare
from .compaction import compact
from .errors import CgtraceError
from .lanes import load_lane_rules
from .layout import separate_overlaps
from .model import Trace
from .output import atomic_output, check_output_path
from .json_writer import ChromeJsonWriter
from .perfetto_writer import PerfettoWriter
from .pp import find_blocks, link_rank_local, pp_rank_of
from .reader import read_trace
from .window import Window, cut, step_ranges, window_bounds

PERFETTO_SUFFIX = ".perfetto-trace"
SUFFIXES = {"perfetto": PERFETTO_SUFFIX, "json": ".json"}


def default_output_path(input_path: Path, tag: str = "", output_format: str = "perfetto") -> Path:
    """`trace.json.gz` -> `trace<tag>.perfetto-trace` (or `.json`) beside the input."""
    name = input_path.name
    for suffix in (".gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return input_path.with_name(f"{name}{tag}{SUFFIXES[output_format]}")


def convert_file(input_path: Path, output_path: Path, overwrite: bool = False, strict: bool = False,
                 window: Optional[Window] = None, split_steps: bool = False) -> dict:
    """Convert one Kineto JSON trace losslessly; returns the summary."""
    _check_paths(input_path, output_path, overwrite)
    trace = read_trace(input_path, strict=strict, encode_args_ahead=cores_to_spare())
    summary = trace_summary(trace)
    trace = _windowed(trace, window, input_path, summary)
    return _write(trace, input_path, output_path, overwrite, summary, split_steps)


def compact_file(input_path: Path, output_path: Path, overwrite: bool = False, strict: bool = False,
                 lanes_file: Optional[Path] = None, window: Optional[Window] = None,
                 split_steps: bool = False, output_format: str = "perfetto") -> dict:
    """Convert and repack GPU slices into semantic lanes, with rank-local PP arrows."""
    rules = load_lane_rules(lanes_file)
    _check_paths(input_path, output_path, overwrite)
    trace = read_trace(input_path, strict=strict,
                       encode_args_ahead=output_format == "perfetto" and cores_to_spare())
    summary = trace_summary(trace)
    trace = _windowed(trace, window, input_path, summary)
    summary.update(compact(trace, rules))
    pp_rank, pp_rank_source, _ = pp_rank_of(trace.metadata)
    summary.update(pp_rank=pp_rank, pp_rank_source=pp_rank_source)
    summary.update(link_rank_local(trace, find_blocks(trace, rules)))
    summary["flows"] = len(trace.flows)
    return _write(trace, input_path, output_path, overwrite, summary, split_steps, output_format)


def _windowed(trace: Trace, window: Optional[Window], input_path: Path, summary: dict) -> Trace:
    if window is None:
        return trace
    trace, cut_summary = cut(trace, *window_bounds(trace, window, str(input_path)))
    summary.update(cut_summary)
    summary.update(trace_summary(trace))
    return trace


def _check_paths(input_path: Path, output_path: Path, overwrite: bool) -> None:
    check_output_path(output_path, overwrite)
    if output_path.exists() and input_path.exists() and output_path.samefile(input_path):
        raise CgtraceError(f"{output_path}: is the input file; choose another output path with -o")


def _write(trace: Trace, input_path: Path, output_path: Path, overwrite: bool, summary: dict,
           split_steps: bool = False, output_format: str = "perfetto") -> dict:
    summary["overlaps_moved"] = separate_overlaps(trace)
    summary["tracks"] = len(trace.tracks) + len(trace.processes)
    progress.report(f"writing {len(trace.slices)} slices")
    summary["slices"] = sum(1 for s in trace.slices if not s.is_instant)
    if split_steps:
        summary["steps"] = _write_steps(trace, input_path, output_path, overwrite, output_format)
        summary.update(input=str(input_path))
        return summary
    summary.update(_write_file(trace, output_path, overwrite, output_format))
    summary.update(input=str(input_path), output=str(output_path), output_bytes=output_path.stat().st_size)
    return summary


def _write_file(trace: Trace, output_path: Path, overwrite: bool, output_format: str = "perfetto") -> dict:
    """Write one file; the JSON writer reports how it placed times and arrows."""
    with atomic_output(output_path, overwrite) as stream:
        if output_format == "json":
            return ChromeJsonWriter(stream).write(trace)
        writer = PerfettoWriter(stream)
        writer.write(trace)
        writer.close()
    return {}


def _write_steps(trace: Trace, input_path: Path, output_path: Path, overwrite: bool,
                 output_format: str) -> list[dict]:
    """One file per ProfilerStep, `<output stem>_step<N>.perfetto-trace` (or `.json`)."""
    ranges = step_ranges(trace)
    if not ranges:
        raise CgtraceError(f"{input_path}: no ProfilerStep#N slices, so it cannot be split by step; "
                           "use --window START:END instead")
    suffix = SUFFIXES[output_format]
    stem = output_path.name[: -len(suffix)] if output_path.name.endswith(suffix) else output_path.stem
    paths = {step: output_path.with_name(f"{stem}_step{step}{suffix}") for step in sorted(ranges)}
    for path in paths.values():
        check_output_path(path, overwrite)
    written = []
    for step, path in paths.items():
        step_trace, cut_summary = cut(trace, *ranges[step])
        _write_file(step_trace, path, overwrite, output_format)
        written.append({"step": step, "output": str(path), "slices": len(step_trace.slices),
                        "flows": len(step_trace.flows), "output_bytes": path.stat().st_size,
                        "flows_dropped_by_window": cut_summary["flows_dropped_by_window"]})
    return written


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
