"""The `cgtrace` command line: argument parsing, one-line errors, JSON summaries.

The commands live beside this module: those that write traces in conversions.py, those that
answer questions in answers.py, what they share (option groups, printing) in options.py.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import NoReturn

# Before numpy loads (the reader's exact times need it): its OpenBLAS starts a thread per core,
# cgtrace does no linear algebra, and a process running a second thread forks no args helper
# (args_accelerator.cores_to_spare), which halves a compact's speed on two cores. The command
# keeps BLAS to one thread unless the user's environment says otherwise.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# Start-up imports take up to half a second, where a Ctrl-C lands as often as anywhere: it ends
# the command as one elsewhere does, in one line, not a traceback through the import machinery.
try:
    from .. import __version__, progress
    from ..errors import CgtraceError
    from ..heap import end_process, models_kept_to_the_end, reuse_freed_memory_after_reads
    from ..jobs.stopping import exit_status, signals_unwind, stopped_message
    from . import answers, conversions
    from .options import EXIT_USAGE, say
except KeyboardInterrupt:
    sys.stderr.write("cgtrace: interrupted; nothing was written\n")
    raise SystemExit(130) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        # Parsing is inside: option types raise CgtraceError too, with the same one line.
        parser = _parser(argv[0] if argv and argv[0] in _COMMANDS else None)
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
        say(f"cgtrace: error: {error.message}")
        return EXIT_USAGE
    except KeyboardInterrupt as interrupt:
        say(f"cgtrace: {stopped_message(interrupt)}")
        return exit_status(interrupt)
    except MemoryError:
        say("cgtrace: error: out of memory; try a machine with more memory or cut the trace down")
        return EXIT_USAGE
    finally:
        progress.finish()
        gc.enable()


class _Parser(argparse.ArgumentParser):
    """argparse's own errors (a bad int, a missing argument) as the one-line CgtraceError every
    other problem gives, instead of usage text and a second exit path."""

    def error(self, message: str) -> NoReturn:
        raise CgtraceError(f"{message.removeprefix('argument ')}; run `{self.prog} --help` for the options")


_COMMANDS = {**conversions.COMMANDS, **answers.COMMANDS}


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: with every command (for `cgtrace --help`, or a word that names
    none), or with `command`'s alone, since each command's parser costs start-up time to build."""
    parser = _Parser(
        prog="cgtrace",
        description="Turn PyTorch profiler (Kineto) traces of CUDA-graph runs into native Perfetto traces.")
    parser.add_argument("--version", action="version", version=f"cgtrace {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, add in _COMMANDS.items():
        if command in (None, name):
            add(commands)
    return parser


def console() -> NoReturn:
    """The `cgtrace` command: main(), each converted model kept to the end rather than freed
    object by object (heap.py)."""
    with models_kept_to_the_end() as kept:
        status = main()
    end_process(status, kept)
