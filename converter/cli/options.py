"""What the commands share: option groups, the job options they build, and how results are printed."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ContextManager

import msgspec

from .. import progress
from ..terminal import terminal_safe
from ..kineto import MAX_RANK
from ..engine.window import parse_steps, parse_window
from ..jobs.options import ALIGN_MODES, MAX_JOBS, is_percentage, job_options, workers
from ..jobs.rank_files import parse_rank_list
from ..jobs.runner import JobOptions
from ..lane_rules import load_lane_rules

if TYPE_CHECKING:
    from ..jobs.executors import Workers  # the executors load when a command runs tasks

EXIT_USAGE = 2
QUERY_FILE_LIMIT = 1 << 20


def port_number(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return int(text)


def percentage(text: str) -> float:
    """--fail-above, checked as jobs/options.py's is_percentage says."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not is_percentage(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage (a number, 0 or more)")
    return value


def output_path(text: str) -> Path:
    """-o: `Path("")` would be the current directory, reported as `.` already existing."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the output path is empty; pass a file path")
    return Path(text)


def add_output_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("-o", "--output", type=output_path, metavar="OUT",
                         help="output path (default: beside the input, .perfetto-trace; a name ending .gz is written gzipped)")
    command.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    command.add_argument("--strict", action="store_true",
                         help="fail on any unusable event instead of skipping and counting it")
    command.add_argument("--verify", action="store_true",
                         help="reload the output in trace_processor and check it before reporting success")
    add_tp_bin(command)
    add_quiet(command)
    cut = command.add_mutually_exclusive_group()
    cut.add_argument("--window", type=parse_window, metavar="START:END",
                     help="keep only what overlaps this window, in ms from the trace start")
    cut.add_argument("--steps", type=parse_steps, metavar="N[-M]",
                     help="keep only ProfilerStep#N (to #M); slices crossing the edge are kept whole")


def add_quiet(command: argparse.ArgumentParser) -> None:
    """-q, which every command takes: no progress and no human line on stderr (errors still are)."""
    command.add_argument("-q", "--quiet", action="store_true", help="no progress or summary line on stderr")


def add_tp_bin(command: argparse.ArgumentParser) -> None:
    command.add_argument("--tp-bin", metavar="PATH", default=os.environ.get("CGTRACE_TP_BIN"),
                         help="native trace_processor_shell (default: the built-in WebAssembly one; "
                              "env CGTRACE_TP_BIN)")


def add_split_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--split-steps", action="store_true",
                         help="write one file per ProfilerStep: <name>_step<N>.perfetto-trace")


def add_cycle_option(command: argparse.ArgumentParser, without: str) -> None:
    """--cycle: which profiling cycle (jobs.cycles) of a directory holding several to use."""
    command.add_argument("--cycle", type=int_from(1, MAX_RANK), metavar="N", help=(
        "where the directory holds several profiling cycles of the same ranks (torch.profiler.schedule(repeat=...)), "
        f"told apart by their ProfilerStep numbers and numbered from 1 in step order: {without}"))


def add_merge_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--ranks", type=parse_rank_list, metavar="G,G,...",
                         help="merge only these global ranks (e.g. 0,1,4-7)")
    command.add_argument("--assume-aligned", action="store_true",
                         help="accept ranks without baseTimeNanoseconds as sharing one clock")
    add_cycle_option(command, "merge only cycle N; without it each cycle is merged to its own .cycle<N> file")
    command.add_argument("--pp-group", type=int_from(0, MAX_RANK), metavar="K",
                         help="with several pipelines (DP x PP), merge only pipeline K (from 0)")
    command.add_argument("--align", choices=ALIGN_MODES, default="auto", help=(
        "ranks' clocks: auto moves ranks whose base times disagree with what their NCCL collectives and transfers "
        "show; base-time only reports that estimate; none does not estimate (default: auto)"))


def add_workers_options(command: argparse.ArgumentParser) -> None:
    """Where the tasks of a directory (or a merge's ranks) run."""
    command.add_argument("--jobs", type=int_from(1, MAX_JOBS), metavar="N",
                         help="local worker processes, traces at once (default: one per core; reading traces, "
                              "no more than keep the estimated peak memory below the inputs' total size); for one "
                              "trace, processes reading its pieces (1: this one alone)")
    command.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                         help="run the tasks on this Dask cluster (env CGTRACE_SCHEDULER; pip install "
                              "'cgtrace[cluster]'); every path must be on storage all workers see")


def int_from(low: int, high: int) -> Callable[[str], int]:
    """An int option bounded where it stops meaning anything (0 jobs) or fitting (SQL's LIMIT)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from {low} to {high}")
        return value
    return parse


def add_lane_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--lanes", type=Path, metavar="FILE",
                         help="lane rules (TOML); see `cgtrace lanes --print-default`")
    command.add_argument("--relane", action="store_true",
                         help="traces torch already laned at export (cudaGraphInlineAnnotated) keep their lanes "
                              "by default; re-lane them by the lane rules instead")


def job_options_of(args: argparse.Namespace, compact: bool, ends_command: bool = False) -> JobOptions:
    return job_options(compact, load_lane_rules(getattr(args, "lanes", None)), strict=args.strict,
                       window=args.window or args.steps, split_steps=getattr(args, "split_steps", False),
                       relane=getattr(args, "relane", False), output_format=getattr(args, "format", "perfetto"),
                       overwrite=args.overwrite, verify=args.verify, tp_bin=args.tp_bin, ends_command=ends_command,
                       critical_path=getattr(args, "critical_path", False), jobs=getattr(args, "jobs", None))




def workers_of(args: argparse.Namespace) -> ContextManager[Workers]:
    """The executor of --jobs (default: every core) or --scheduler."""
    return workers(args.jobs, args.scheduler)


def print_summary(summary: dict, quiet: bool, human: str) -> None:
    """The summary as indented JSON on stdout (msgspec, which the reader loads anyway: orjson
    would cost a one-trace command its import), and `human` on stderr unless `quiet`."""
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(summary), indent=2) + b"\n")
    sys.stdout.flush()
    if not quiet:
        skipped = summary.get("events_skipped")
        note = f" ({skipped} unusable events skipped; see skipped_by_reason)" if skipped else ""
        say(f"cgtrace: {human}{note}")


def say(line: str) -> None:
    """One line on stderr, on a line of its own even where progress was shown; what it names
    (a file, a trace's name) escaped, so it stays one line and the terminal only shows it."""
    progress.finish()
    print(terminal_safe(line), file=sys.stderr)


