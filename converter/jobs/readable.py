"""What `cgtrace report` and `cgtrace query` read: a Perfetto trace as given, or profiler
output (.json, .json.gz) turned into one first, in a temporary file, by our own reader.

So every form of a trace is read by one set of rules with one set of messages, and nothing
reaches trace_processor's JSON importer, which drops partially overlapping slices.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from ..errors import CgtraceError
from ..fileio.atomic import NotWritten, scratch_folder
from ..lane_rules import LaneRules, load_lane_rules
from .runner import PROFILER_OUTPUT, JobOptions, default_output_path, run_job


@contextmanager
def as_perfetto(path: Path, compact: bool, lanes: Optional[LaneRules] = None) -> Iterator[Path]:
    """`path` itself, or for profiler output a temporary Perfetto trace of it, converted (or,
    with `compact`, compacted by `lanes`), removed afterwards."""
    if not path.name.endswith(PROFILER_OUTPUT):
        yield path
        return
    with scratch_folder("cgtrace-") as folder:
        output = folder / default_output_path(path).name
        try:
            run_job(path, output, JobOptions(compact=compact, lanes=lanes or load_lane_rules(), args_strategy="auto"))
        except NotWritten as error:  # the user named no output: the temporary folder is what to free or move
            raise CgtraceError(f"{path}: cannot make a temporary Perfetto trace of it in {folder.parent} "
                               f"({error.reason}); free some space there or point "
                               "TMPDIR at a disk with room", io_error=error.io_error) from None
        yield output
