"""The commands that write traces: convert, compact, merge (and their directory batches), lanes, demo.

Start-up is part of every command's time: what only merge, a directory batch or demo needs
(the merge's engine, the executors) is imported when that command runs, as answers.py does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

from ..jobs.options import merge_outputs
from ..jobs.runner import COMPACTED_TAG, default_output_path, run_job
from ..lane_rules import DEFAULT_LANES_TOML
from .options import (EXIT_USAGE, add_lane_options, add_quiet, add_merge_options, add_output_options, add_split_option,
                      add_workers_options, job_options_of, print_summary, say)


def _add_convert(commands: Any) -> None:
    convert = commands.add_parser(
        "convert", help="convert a trace losslessly to .perfetto-trace",
        description="Convert a Kineto JSON trace (.json or .json.gz) to native Perfetto protobuf, "
                    "keeping every slice, flow, counter and arg.")
    convert.add_argument("input", type=Path, metavar="IN")
    add_output_options(convert)
    add_split_option(convert)
    add_workers_options(convert)
    convert.set_defaults(run=_run_convert)


def _add_compact(commands: Any) -> None:
    compact = commands.add_parser(
        "compact", help="repack CUDA-graph GPU streams into a few named lanes",
        description="Convert a Kineto trace and repack each GPU's slices into semantic lanes (compute, "
                    "NCCL all-gather, ...), with annotations above their lanes and PP arrows.")
    compact.add_argument("input", type=Path, metavar="TRACE")
    add_output_options(compact)
    add_split_option(compact)
    add_lane_options(compact)
    compact.add_argument("--format", choices=("perfetto", "json"), default="perfetto",
                         help="json: Chrome JSON (lanes as threads) for JSON-only tools")
    compact.add_argument("--critical-path", action="store_true",
                         help="also derive each profiler step's critical path (CPU ops, launches, GPU streams, "
                              "synchronisations) and write it on rows at the top; about twice the time")
    compact.add_argument("--merge-pp-ranks", action="store_true",
                         help="TRACE is a directory of rank traces: merge them (same as `cgtrace merge`)")
    add_merge_options(compact)
    add_workers_options(compact)
    compact.set_defaults(run=_run_compact)


def _add_merge(commands: Any) -> None:
    merge = commands.add_parser(
        "merge", help="merge pipeline-parallel rank traces into one timeline",
        description="Compact every rank's trace and write one timeline with ranks in pipeline order and "
                    "arrows SEND -> RECV across ranks.")
    merge.add_argument("inputs", type=Path, nargs="+", metavar="DIR_OR_FILES")
    add_output_options(merge)
    add_merge_options(merge)
    add_workers_options(merge)
    add_lane_options(merge)
    merge.set_defaults(run=_run_merge)


def _add_lanes(commands: Any) -> None:
    lanes = commands.add_parser("lanes", help="show the lane rules compact uses",
                                description="Print the built-in lane rules in the --lanes TOML format.")
    lanes.add_argument("--print-default", action="store_true", help="print the built-in rules")
    add_quiet(lanes)
    lanes.set_defaults(run=lambda args: _run_lanes(args, lanes))


def _add_demo(commands: Any) -> None:
    demo = commands.add_parser(
        "demo", help="generate an example CUDA-graph trace and convert it",
        description="Write an example CUDA-graph training trace and its converted .perfetto-trace.")
    demo.add_argument("directory", type=Path, nargs="?", default=Path("cgtrace-demo"), metavar="DIR")
    demo.add_argument("--overwrite", action="store_true",
                      help="write into a DIR that holds other files (an earlier demo's DIR needs no flag)")
    add_quiet(demo)
    demo.set_defaults(run=_run_demo)


# Each command's parser, in the order `cgtrace --help` lists them; the command line builds
# only the one it runs (cli/__init__.py).
COMMANDS: dict[str, Callable[[Any], None]] = {"convert": _add_convert, "compact": _add_compact, "merge": _add_merge,
                                              "lanes": _add_lanes, "demo": _add_demo}


def _run_convert(args: argparse.Namespace) -> int:
    if args.input.is_dir():
        return _run_batch(args, compact=False)
    output = args.output or default_output_path(args.input)
    summary = run_job(args.input, output, job_options_of(args, compact=False, ends_command=True))
    print_summary(summary, args.quiet, f"{summary['slices']} slices, {summary['flows']} flows, "
                                       f"{summary['tracks']} tracks -> {_written(summary, output)}")
    return 0


def _run_compact(args: argparse.Namespace) -> int:
    if args.merge_pp_ranks:
        args.inputs = [args.input]
        return _run_merge(args)
    if args.input.is_dir():
        return _run_batch(args, compact=True)
    output = args.output or default_output_path(args.input, COMPACTED_TAG, args.format)
    summary = run_job(args.input, output, job_options_of(args, compact=True, ends_command=True))
    per_gpu = "; ".join(f"{gpu['gpu']}: {gpu['streams']} streams -> {gpu['lanes']} lanes"
                        for gpu in summary["per_gpu"]) or "no GPU slices"
    print_summary(summary, args.quiet, f"{per_gpu} -> {_written(summary, output)}")
    return 0


def _written(summary: dict[str, Any], output: Path) -> str:
    """What a job wrote: OUT, or with --split-steps its step files (OUT itself is not written)."""
    steps = summary.get("steps")
    if not steps:
        return str(output)
    first, last = steps[0]["output"], steps[-1]["output"]
    return first if len(steps) == 1 else f"{len(steps)} step files, {first} ... {last}"


def _run_merge(args: argparse.Namespace) -> int:
    from ..jobs.executors import scheduler_address
    from ..jobs.merge import merge_ranks

    options = job_options_of(args, compact=True)
    summary = merge_ranks(args.inputs, merge_outputs(args.output, args.inputs, args.pp_group), options, jobs=args.jobs,
                          assume_aligned=args.assume_aligned, pp_group=args.pp_group, ranks=args.ranks,
                          scheduler=scheduler_address(args.scheduler), align=args.align, cycle=args.cycle)
    merged = summary.get("pipelines", [summary])
    lines = [f"{len(r['pp_ranks'])} ranks ({r['pp_order_source']}), {r['pp_send_recv_pairs']} send/recv arrows, "
             f"{r['pp_send_recv_unmatched']} unmatched -> {r['output']}" for r in merged]
    if merged and merged[0]["ranks_at_once"] == 1 and not args.jobs and options.tuning.cores > 1:
        lines.append("ranks were read one at a time to keep memory below the inputs' size; --jobs 2 is faster")
    print_summary(summary, args.quiet, "; ".join(lines))
    broken = summary.get("broken_pipelines", [])
    if "rank_account" in summary:
        failed, absent = summary["failed"], summary["rank_account"]["note"]
        say(f"cgtrace: {'error' if broken else 'warning'}: " + "; ".join([entry["why"] for entry in broken]
                                           + [f"{len(failed)} trace(s) could not be read, first {failed[0]['error']}"
                                              for _ in failed[:1]] + ([absent] if absent else []))
            + f"; the {len(merged)} intact pipeline(s) asked for are written")
        return EXIT_USAGE if broken else 0
    return 0


def _run_batch(args: argparse.Namespace, compact: bool) -> int:
    """convert or compact every rank trace of a directory: a summary per rank; exit code 2 if any failed."""
    from ..jobs.batch import run_batch
    from ..jobs.executors import scheduler_address

    summary = run_batch(args.input, args.output, job_options_of(args, compact), jobs=args.jobs,
                        scheduler=scheduler_address(args.scheduler))
    failed = [rank for rank in summary["ranks"] if rank["status"] == "failed"]
    missing = summary["rank_account"]["note"]
    print_summary(summary, args.quiet, f"{summary['written']} written, {summary['skipped']} skipped (outputs exist), "
                                 f"{len(failed)} failed of {summary['traces']} traces ({summary['workers']})"
                                 + (f"; {missing}" if missing else ""))
    if failed:
        say(f"cgtrace: error: {len(failed)} of {summary['traces']} traces failed, first {failed[0]['error']}; "
            + (f"{missing}; " if missing else "")
            + "the other outputs are kept: fix the cause and run the same command again to redo only these")
        return EXIT_USAGE
    return 0


def _run_lanes(args, parser: argparse.ArgumentParser) -> int:
    """The rules with --print-default; alone, how to use the command."""
    sys.stdout.write(DEFAULT_LANES_TOML if args.print_default else parser.format_help())
    return 0


def _run_demo(args) -> int:
    from ..jobs.demo import run_demo

    summary = run_demo(args.directory, overwrite=args.overwrite)
    print_summary(summary, args.quiet, human=summary.pop("how_to_open"))
    return 0


