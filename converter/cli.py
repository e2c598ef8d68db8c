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
from .lanes import DEFAULT_LANES_TOML
from .pipeline import compact_file, convert_file, default_output_path
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

    compact = commands.add_parser(
        "compact", help="repack CUDA-graph GPU streams into a few named lanes",
        description="Convert a Kineto trace and repack each GPU's slices into semantic lanes (compute, "
                    "NCCL all-gather, ...), with annotations above their lanes and PP arrows.")
    compact.add_argument("input", type=Path, metavar="TRACE")
    _add_output_options(compact)
    compact.add_argument("--lanes", type=Path, metavar="FILE",
                         help="lane rules (TOML); see `cgtrace lanes --print-default`")
    compact.set_defaults(run=_run_compact)

    lanes = commands.add_parser("lanes", help="show the lane rules compact uses",
                                description="Print the built-in lane rules in the --lanes TOML format.")
    lanes.add_argument("--print-default", action="store_true", required=True,
                       help="print the built-in rules")
    lanes.set_defaults(run=_run_lanes)

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


def _run_compact(args) -> int:
    output = args.output or default_output_path(args.input, "_compacted")
    summary = compact_file(args.input, output, overwrite=args.overwrite, strict=args.strict,
                           lanes_file=args.lanes)
    if args.verify:
        summary["verified"] = verify_output(output, summary, tp_bin=args.tp_bin)
    per_gpu = "; ".join(f"{gpu['gpu']}: {gpu['streams']} streams -> {gpu['lanes']} lanes"
                        for gpu in summary["per_gpu"]) or "no GPU slices"
    _report(summary, args.quiet, f"{per_gpu} -> {output}")
    return 0


def _run_lanes(args) -> int:
    sys.stdout.write(DEFAULT_LANES_TOML)
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
