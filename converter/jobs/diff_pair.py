"""`cgtrace diff`: both traces measured as `cgtrace report` measures them, as two tasks (at once
where there are cores or a cluster), then compared by analysis/diff.py.

Each task reads its trace where it runs (profiler output compacted first, as report does)
and sends back only the report's figures, every kernel listed, so a kernel that ran on one
side only still shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..analysis.diff import diff_reports
from ..analysis.report import build_report
from ..errors import CgtraceError
from ..lane_rules import LaneRules
from .executors import Workers, for_cluster, run_tasks
from .readable import as_perfetto

_EVERY_KERNEL = (1 << 63) - 1  # SQL's LIMIT that keeps every row


def diff_traces(a: Path, b: Path, workers: Workers, tp_bin: Optional[str], lanes: LaneRules,
                top: int) -> dict[str, Any]:
    """The diff of trace `a` (before) and `b` (after), `top` kernels listed."""
    for path in (a, b):
        if path.is_dir():
            raise CgtraceError(f"{path}: is a directory; diff compares two traces: merge a directory of ranks "
                               "first (cgtrace merge DIR) and diff the merges")
    tasks = [(for_cluster(path, workers.remote), tp_bin, lanes) for path in (a, b)]
    before, after = run_tasks(workers, _figures, tasks, [str(a), str(b)], "reporting", stop_at_failure=True)
    return diff_reports(before.value, after.value, top=top)


def _figures(path: Path, tp_bin: Optional[str], lanes: LaneRules) -> dict[str, Any]:
    with as_perfetto(path, compact=True, lanes=lanes) as trace:
        return build_report(trace, tp_bin=tp_bin, top=_EVERY_KERNEL, lanes=lanes, shown_as=path).figures
