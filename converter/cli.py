"""The `cgtrace` command line: argument parsing, one-line errors, JSON summaries."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import orjson

from . import __version__
from .errors import CgtraceError
from .pipeline import convert_file, default_output_path
from .verify import verify_output

EXIT_USAGE = 2


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        # The model is millions of small acyclic objects: cyclic GC passes over them cost
        # a quarter of the run and free nothing.
        gc.disable()
        return args.run(args)
    except CgtraceError as error:
        print(f"cgtrace: error: {error.message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("cgtrace: interrupted; nothing was written", file=sys.stderr)
        return 130
    except MemoryError:
        print("cgtrace: error: out of memory; try a machine with more memory or cut the trace down",
              file=sys.stderr)
        return EXIT_USAGE
    finally:
        gc.enable()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    convert.set_defaults(run=_run_convert)

    demo = commands.add_parser(
        "demo", help="generate an example CUDA-graph trace and convert it",
        description="Write an example CUDA-graph training trace and its converted .perfetto-trace.")
    demo.add_argument("directory", type=Path, nargs="?", default=Path("cgtrace-demo"), metavar="DIR")
    demo.add_argument("--overwrite", action="store_true", help="replace files from an earlier demo")
    demo.set_defaults(run=_run_demo)
    return parser


def _add_output_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("-o", "--output", type=Path, metavar="OUT",
                         help="output path (default: beside the input, .perfetto-trace)")
    command.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    command.add_argument("--strict", action="store_true",
                         help="fail on any unusable event instead of skipping and counting it")
    command.add_argument("--verify", action="store_true",
                         help="reload the output in trace_processor and check it before reporting success")
    command.add_argument("--tp-bin", metavar="PATH", default=os.environ.get("CGTRACE_TP_BIN"),
                         help="native trace_processor_shell for --verify (default: the built-in "
                              "WebAssembly one; env CGTRACE_TP_BIN)")
    command.add_argument("-q", "--quiet", action="store_true", help="no human summary line on stderr")


def _run_convert(args) -> int:
    output = args.output or default_output_path(args.input)
    summary = convert_file(args.input, output, overwrite=args.overwrite, strict=args.strict)
    if args.verify:
        summary["verified"] = verify_output(output, summary, tp_bin=args.tp_bin)
    _report(summary, args.quiet, f"{summary['slices']} slices, {summary['flows']} flows, "
                                 f"{summary['tracks']} tracks -> {output}")
    return 0


def _run_demo(args) -> int:
    from .demo import run_demo

    summary = run_demo(args.directory, overwrite=args.overwrite)
    _report(summary, quiet=False, human=summary.pop("how_to_open"))
    return 0


def _report(summary: dict, quiet: bool, human: str) -> None:
    sys.stdout.buffer.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()
    if not quiet:
        skipped = summary.get("events_skipped")
        note = f" ({skipped} unusable events skipped; see skipped_by_reason)" if skipped else ""
        print(f"cgtrace: {human}{note}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
