"""The one job sequence: read -> window -> compact -> PP arrows -> critical path -> layout ->
write -> verify.

convert and compact run it whole; a merge runs its first half per rank (`prepare`) and
writes each rank's part itself. Every option combination is checked here, once: a
combination that cannot be honoured is refused before anything is read or written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO, Optional, cast

import msgspec

from .. import kineto, progress
from ..engine.activity import add_busy_lanes
from ..engine.attribution import launch_args
from ..engine.compaction import compact
from ..engine.lane_grouping import ExportedLanes, RuleLanes
from ..engine.layout import separate_overlaps
from ..engine.memory import add_memory_counters
from ..engine.waits import add_wait_counters
from ..engine.pp import NO_PP, Block, BlockKey, find_blocks, link_rank_local
from ..engine.window import Window, cut, cut_to_steps, step_ranges, window_bounds
from ..errors import CgtraceError
from ..fileio.args_file import FileArgsStore
from ..fileio.atomic import GZIP_SUFFIX, AtomicFiles, check_output_path, write_failed
from ..heap import input_read, keep_to_the_end
from ..inputs.kineto_reader import read_trace
from ..inputs.source import json_size
from ..lane_rules import LaneRules, load_lane_rules
from ..model import ArgsStore, RankIdentity, Trace
from ..model.launch_keys import LaunchKeys
from ..outputs.perfetto_writer import PerfettoWriter
from ..tuning import DEFAULT_TUNING, Tuning
from .verify import Expected, verify_output

PERFETTO_SUFFIX = ".perfetto-trace"
PERFETTO_NAMES = (PERFETTO_SUFFIX, PERFETTO_SUFFIX + GZIP_SUFFIX)  # what a Perfetto output may be called
PROFILER_OUTPUT = (".json", ".json.gz")  # what our reader reads; anything else goes to trace_processor as it is
SUFFIXES = {"perfetto": PERFETTO_SUFFIX, "json": ".json"}
COMPACTED_TAG = "_compacted"  # what compact adds to an output's name (convert adds nothing)
# in-process: the main process keeps args in a temporary file and encodes them when writing;
# helper: a forked helper encodes them for Perfetto while the trace is read;
# auto: the helper where a core is free and the output is Perfetto (the command line's choice).
ARGS_STRATEGIES = ("in-process", "helper", "auto")


class JobOptions(msgspec.Struct, frozen=True):
    """What one job does, checked before anything is read (run_job, prepare)."""

    compact: bool = False
    lanes: LaneRules = msgspec.field(default_factory=load_lane_rules)  # parsed once, by whoever makes the options
    relane: bool = False  # lane by the rules also where the exporter already laned (kineto.INLINE_LANED)
    # compact: derive each step's critical path (engine/critical_path.py) and write it on rows of
    # its own; asked for, as it costs a real trace's compact as much again or more (docs/cli.md#compact)
    critical_path: bool = False
    strict: bool = False
    window: Optional[Window] = None
    split_steps: bool = False
    output_format: str = "perfetto"
    args_strategy: str = "in-process"
    overwrite: bool = False
    verify: bool = False
    tp_bin: Optional[str] = None
    # The command ends with this job: its model may be kept to the end instead of freed object
    # by object (heap.keep_to_the_end); never for a job followed by others or by a query.
    ends_command: bool = False
    tuning: Tuning = msgspec.field(default_factory=Tuning.for_this_machine)  # sizes, cores and memory, made once


class Prepared(msgspec.Struct):
    """A trace read, cut to its window and (for compact) laned, with its summary and PP blocks."""

    trace: Trace
    summary: dict[str, Any]
    header: kineto.RankHeader
    blocks: dict[BlockKey, Block] = msgspec.field(default_factory=dict)
    pp_annotations: str = NO_PP  # which annotations the blocks came from (engine.pp's schemes)


def default_output_path(input_path: Path, tag: str = "", output_format: str = "perfetto") -> Path:
    """`trace.json.gz` -> `trace<tag>.perfetto-trace` (or `.json`) beside the input."""
    name = input_path.name
    for suffix in (".gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return input_path.with_name(f"{name}{tag}{SUFFIXES[output_format]}")


def args_store(strategy: str, output_format: str = "perfetto", written_here: bool = False,
               compacts: bool = False, tuning: Tuning = DEFAULT_TUNING, json_bytes: Optional[int] = None) -> ArgsStore:
    """The args store a job reads into, by strategy (see ARGS_STRATEGIES); `written_here`: this
    process writes the output, so an args helper stays on to encode its packets; `compacts`:
    the job compacts, so an args helper labels the entries for it too; `json_bytes`: the
    input's size, where known (auto starts no helper for a small one)."""
    if strategy not in ARGS_STRATEGIES:
        raise CgtraceError(f"args strategy {strategy!r}: expected one of {', '.join(ARGS_STRATEGIES)}")
    if strategy == "in-process" or (strategy == "auto" and (
            output_format != "perfetto" or (json_bytes is not None and json_bytes < tuning.helper_min_json_bytes))):
        return FileArgsStore(tuning=tuning)
    # The helper's module (multiprocessing with it) is imported only for a job that may start one.
    from ..outputs.args_accelerator import accelerated_args_store, cores_to_spare

    if strategy == "helper" or cores_to_spare(tuning.cores):
        return accelerated_args_store(kineto.KERNEL_LABEL if compacts else None,
                                      encodes_packets=written_here and output_format == "perfetto", tuning=tuning)
    return FileArgsStore(tuning=tuning)


def run_job(input_path: Path, output_path: Path, options: JobOptions) -> dict[str, Any]:
    """convert (or, with `options.compact`, compact) one trace; returns the summary."""
    rules = options.lanes if options.compact else None
    if not options.split_steps:  # which step files it writes is known once it is read (_write_steps)
        check_output_path(output_path, options.overwrite, inputs=[input_path])
    prepared = prepare(input_path, options, rules, written_here=True)
    trace, summary = prepared.trace, prepared.summary
    if options.ends_command:
        keep_to_the_end(trace)
    if prepared.pp_annotations != NO_PP:
        summary.update(link_rank_local(trace, prepared.blocks))
        summary["flows"] = len(trace.flows)
    if options.compact and options.critical_path:
        summary["critical_path"] = _add_critical_path(trace)
    summary["overlaps_moved"] = separate_overlaps(trace, options.tuning)
    summary["tracks"] = len(trace.tracks) + len(trace.processes)
    summary["slices"] = len(trace.slices) - trace.instant_count()
    if options.split_steps:
        summary["steps"] = _write_steps(trace, input_path, output_path, options)
        summary.update(input=str(input_path))
        return summary
    with AtomicFiles(options.overwrite) as files:
        summary.update(_write_file(trace, files, output_path, options))
        verified = _commit(files, {output_path: _expected(trace)}, options)
    if verified:
        summary["verified"] = verified[output_path]
    summary.update(input=str(input_path), output=str(output_path), output_bytes=output_path.stat().st_size)
    return summary


def _add_critical_path(trace: Trace) -> dict[str, int]:
    """Each step's critical path within the trace, on rows of its own at the top; read before
    overlaps move, so the work graph's nodes keep their own lane or thread."""
    from ..engine.critical_path import add_path_tracks, critical_paths  # only a compact that asks loads them
    from ..engine.work_graph import rank_work

    progress.stage("finding each step's critical path")
    paths = critical_paths([rank_work(trace, with_partners=False)])
    return {"steps": len(paths), "segments": add_path_tracks(trace, None, paths, [trace.rank])}


def _add_memory(trace: Trace, summary: dict[str, Any]) -> None:
    """Each device's memory counters, where the trace holds [memory] events (engine/memory.py)."""
    tracks = add_memory_counters(trace)
    if tracks:  # a summary leaves out what does not apply
        summary["memory_counters"] = tracks


def prepare(input_path: Path, options: JobOptions, rules: Optional[LaneRules], written_here: bool = False,
            queue_rows: bool = True) -> Prepared:
    """Read, cut to the window and, given lane rules, compact and find the PP blocks;
    `written_here`: this process writes the output (see args_store); `queue_rows`: each GPU
    stream's queue depth counter too (engine/waits.py), which a merge leaves out."""
    trace = read_trace(input_path, strict=options.strict, args=args_store(
        options.args_strategy, options.output_format, written_here, compacts=rules is not None,
        tuning=options.tuning, json_bytes=json_size(input_path)), tuning=options.tuning)
    input_read()
    header = kineto.rank_header(trace.metadata, str(input_path))
    summary = trace_summary(trace)
    if rules is not None:  # before a window cuts launches away; the rows it keeps keep theirs
        trace.derived_args, summary["launch_attribution"] = launch_args(trace)
    if options.window is not None:
        cut_to = cut_to_steps if options.window.by_steps else cut
        trace, cut_summary = cut_to(trace, *window_bounds(trace, options.window, str(input_path)))
        summary.update(cut_summary)
        summary.update(trace_summary(trace))
    if header.rank is not None:
        # Written with the track roles, converted or compacted, so answers across many ranks'
        # traces name each rank, and two files of one rank are caught.
        trace.rank = RankIdentity(header.pp_rank if header.pp_group else header.rank, header.rank,
                                  in_pipeline=bool(header.pp_group))
    if rules is None:
        _add_memory(trace, summary)
        return Prepared(trace, summary, header)
    progress.stage(f"compacting {len(trace.slices)} slices")
    exported = kineto.inline_laned(trace.metadata) and not options.relane
    summary.update(compact(trace, rules, ExportedLanes(rules) if exported else RuleLanes(rules), options.tuning))
    summary["lanes_from"] = f"the trace's own lanes ({kineto.INLINE_LANED})" if exported else "lane rules"
    if options.output_format == "perfetto":  # lane rows' busy counters (activity.py says why)
        add_busy_lanes(trace)
        summary["wait_counters"] = add_wait_counters(trace, queue_rows)  # why each GPU is idle, its queues
    trace.launch_keys = LaunchKeys.none()  # read for the stages above; the write's peak needs none
    _add_memory(trace, summary)
    blocks, scheme = find_blocks(trace, rules, header.pp_rank)
    if scheme != NO_PP:  # a summary leaves out what does not apply
        summary.update(pp_rank=header.pp_rank, pp_rank_source=header.pp_rank_source, pp_annotations=scheme)
    return Prepared(trace, summary, header, blocks, scheme)


def write_trace(trace: Trace, stream: BinaryIO, output_format: str = "perfetto",
                tuning: Tuning = DEFAULT_TUNING) -> dict[str, Any]:
    """Write one trace in the chosen format; the JSON writer reports how it placed times and arrows."""
    progress.stage(f"writing {len(trace.slices)} slices")
    if output_format == "json":
        from ..outputs.json_writer import ChromeJsonWriter  # only for --format json

        return ChromeJsonWriter(stream, tuning).write(trace)
    writer = PerfettoWriter(stream, tuning=tuning)
    writer.write(trace)
    writer.close()
    return {}


def _write_file(trace: Trace, files: AtomicFiles, path: Path, options: JobOptions) -> dict[str, Any]:
    stream = files.create(path)
    try:
        # a DirectWriter: the writers only call write()
        written = write_trace(trace, cast(BinaryIO, stream), options.output_format, options.tuning)
        stream.close()
    except OSError as error:
        raise write_failed(path, error) from None
    return written


def _expected(trace: Trace) -> Expected:
    return Expected(len(trace.slices), len(trace.flows), len(trace.counters))


def _commit(files: AtomicFiles, expected: dict[Path, Expected], options: JobOptions) -> dict[Path, dict[str, int]]:
    """Move the files into place, each first reloaded and checked when --verify asks."""
    verified: dict[Path, dict[str, int]] = {}

    def check(temporary: Path, target: Path) -> None:
        progress.stage(f"verifying {target.name}")
        verified[target] = verify_output(temporary, expected[target], options.tp_bin, shown_as=target)

    files.commit(check if options.verify else None)
    return verified


def _write_steps(trace: Trace, input_path: Path, output_path: Path, options: JobOptions) -> list[dict[str, Any]]:
    """One file per ProfilerStep, `<output stem>_step<N>.perfetto-trace` (or `.json`; gzipped
    too where the output's name says so); all of them appear (verified, where asked) or none does."""
    ranges = step_ranges(trace)
    if not ranges:
        raise CgtraceError(f"{input_path}: no ProfilerStep#N slices, so it cannot be split by step; "
                           "use --window START:END instead")
    packed = GZIP_SUFFIX if output_path.name.endswith(GZIP_SUFFIX) else ""
    suffix = SUFFIXES[options.output_format] + packed
    stem = output_path.name[: -len(suffix)] if output_path.name.endswith(suffix) else \
        output_path.name.removesuffix(packed).rsplit(".", 1)[0]
    paths = {step: output_path.with_name(f"{stem}_step{step}{suffix}") for step in sorted(ranges)}
    for path in paths.values():
        check_output_path(path, options.overwrite, inputs=[input_path])
    written, expected = [], {}
    with AtomicFiles(options.overwrite) as files:
        for step, path in paths.items():
            step_trace, cut_summary = cut_to_steps(trace, *ranges[step])
            _write_file(step_trace, files, path, options)
            expected[path] = _expected(step_trace)
            written.append({"step": step, "output": str(path), "slices": len(step_trace.slices),
                            "flows": len(step_trace.flows),
                            "flows_dropped_by_window": cut_summary["flows_dropped_by_window"],
                            "gpu_slices_launched_in_window_ending_after":
                                cut_summary["gpu_slices_launched_in_window_ending_after"]})
        verified = _commit(files, expected, options)
    for entry in written:
        path = Path(entry["output"])
        entry["output_bytes"] = path.stat().st_size
        if path in verified:
            entry["verified"] = verified[path]
    return written


def trace_summary(trace: Trace) -> dict[str, Any]:
    instants = trace.instant_count()
    return {
        "events_read": trace.events_read,
        "events_skipped": sum(trace.skipped.values()),
        "skipped_by_reason": dict(sorted(trace.skipped.items())),
        "slices": len(trace.slices) - instants,
        "instants": instants,
        "counter_samples": len(trace.counters),
        "flows": len(trace.flows),
        "flows_unbound": trace.unbound_flows,
        "flows_partner_missing": trace.partnerless_flow_ends,
        "processes": len(trace.processes),
        "threads": len(trace.threads),
        "tracks": len(trace.tracks) + len(trace.processes),
    }
