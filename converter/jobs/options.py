"""The options the command line and the Python API share, built one way: a job's options from
plain values, and where a merge writes each pipeline. So both say the same thing about the
same mistake. They live below both (not in the API's package), so a command builds its job
without loading the Python API."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ContextManager, Optional, Union

from ..engine.window import Window, parse_steps, parse_window
from ..errors import CgtraceError
from ..lane_rules import LaneRules, load_lane_rules
from ..tuning import Tuning
from .rank_files import RankList, default_merge_output, parse_rank_list
from .runner import JobOptions

if TYPE_CHECKING:
    from .executors import Workers

PathLike = Union[str, os.PathLike[str]]  # what open() takes, typed

# How a merge sets ranks' clocks (merge.py, from engine/clock.py's estimate): "auto" estimates
# each rank's offset from its collectives and transfers and moves the ranks where their base
# times disagree beyond the estimate's uncertainty; "base-time" estimates and reports but keeps
# the base times; "none" only keeps the base times (no estimate). Here, not in clock.py: the
# command line lists them without loading the estimate.
ALIGN_MODES = ("auto", "base-time", "none")
# How report and diff bound a profiled step (`--step-windows`): "launched", on to the end of the
# GPU work it launched (analysis/step_windows.py); "cpu", its ProfilerStep span on the CPU side
# alone. Here, not there: the command line lists them without loading the analyses.
STEP_WINDOWS = ("launched", "cpu")
MAX_TOP = 100_000  # kernels a report or diff lists; SQL's LIMIT takes no more than 2**63 - 1
MAX_JOBS = 1024  # ranks held at once; far beyond any machine's cores


def whole_number(option: str, value: object, low: int, high: int) -> int:
    """An int option of the API, checked as the command line bounds it: where it stops
    meaning anything (0 jobs) or fitting (SQL's LIMIT)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CgtraceError(f"{option}={value!r}: expected a whole number from {low} to {high}")
    return value


def is_percentage(value: object) -> bool:
    """--fail-above: a percentage, 0 or more (0: any change fails), finite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")


def job_options(compact: bool, lanes: Optional[LaneRules] = None, *, relane: bool = False, strict: bool = False,
                window: Optional[Window] = None, split_steps: bool = False, output_format: str = "perfetto",
                overwrite: bool = False, verify: bool = False, tp_bin: Optional[str] = None,
                ends_command: bool = False, critical_path: bool = False,
                jobs: Optional[int] = None) -> JobOptions:
    """A job's options as the command line makes them: the built-in lane rules unless given,
    the args helper where a core is free, `jobs` processes reading one trace (default: a core each)."""
    tuning = Tuning.for_this_machine()
    return JobOptions(compact=compact, lanes=lanes or load_lane_rules(),
                      strict=strict, window=window, split_steps=split_steps, relane=relane,
                      output_format=output_format, args_strategy="auto", overwrite=overwrite, verify=verify,
                      tp_bin=tp_bin, ends_command=ends_command, critical_path=critical_path,
                      tuning=tuning if jobs is None else tuning.reading_with(jobs))


def checked_step_windows(value: object) -> str:
    """`step_windows=` of report and diff, checked as --step-windows is."""
    if value not in STEP_WINDOWS:
        raise CgtraceError(f"step_windows={value!r}: expected one of {', '.join(map(repr, STEP_WINDOWS))}")
    return str(value)


def lane_rules(path: Optional[PathLike]) -> LaneRules:
    """The rules of a lanes TOML file, or the built-in ones."""
    return load_lane_rules(Path(path) if path is not None else None)


def cut(window: Optional[str], steps: Optional[str]) -> Optional[Window]:
    """`window="START:END"` (ms) or `steps="N[-M]"`, the command line's --window and --steps."""
    if window is not None and steps is not None:
        raise CgtraceError(f"window {window!r} and steps {steps!r}: pass one of them, not both")
    return parse_window(window) if window is not None else parse_steps(steps) if steps is not None else None


def rank_list(text: Optional[str]) -> Optional[RankList]:
    """--ranks as the API takes it, a string like `0,1,4-7`, with the command line's message."""
    try:
        return None if text is None else parse_rank_list(text)
    except argparse.ArgumentTypeError as error:
        raise CgtraceError(f"--ranks {error}") from None


def merge_outputs(output: Optional[Path], inputs: list[Path], pp_group: Optional[int]) -> Callable[[int, int], Path]:
    """Where a merge writes pipeline k of n: `output` for the one pipeline (or the one chosen),
    else beside the rank traces, a file per pipeline."""
    def output_for(group: int, groups: int) -> Path:
        if output and (groups == 1 or pp_group is not None):
            return output
        if output:
            raise CgtraceError(f"{output}: the traces hold {groups} pipelines; pass --pp-group K to merge one, "
                               "or leave out -o to write pp_group<k>_merged.perfetto-trace files")
        return default_merge_output(inputs, group, groups)
    return output_for


def workers(jobs: Optional[int], scheduler: Optional[str]) -> ContextManager[Workers]:
    """Where tasks run, as --jobs and --scheduler say: `jobs` local processes (default: every
    core), or the Dask scheduler given (else CGTRACE_SCHEDULER's). The executors are imported
    here: a command on one trace runs no tasks."""
    from .executors import open_workers, scheduler_address

    if jobs is not None:
        whole_number("jobs", jobs, 1, MAX_JOBS)
    return open_workers(jobs or Tuning.for_this_machine().cores, scheduler_address(scheduler))
