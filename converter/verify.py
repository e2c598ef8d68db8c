"""Self-check: reload a written trace in trace_processor and compare it with what was written."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .errors import CgtraceError
from .tp import open_trace

PROBLEM_STATS_SQL = (
    "select name, idx, severity, value from stats "
    "where severity in ('error', 'data_loss') and value > 0 order by name")


def problem_stats(tp) -> list[tuple[str, int]]:
    """trace_processor's error and data-loss counters that fired while loading."""
    return [(row.name, row.value) for row in tp.query(PROBLEM_STATS_SQL)]


def verify_output(path: Path, summary: Optional[dict], tp_bin: Optional[str] = None) -> dict:
    """Counts as trace_processor sees them; raises CgtraceError on any load error, or on any
    loss against `summary`'s counts when given."""
    with open_trace(path, tp_bin=tp_bin) as tp:
        stats = problem_stats(tp)
        slices = _count(tp, "slice")
        flows = _count(tp, "flow")
        counters = _count(tp, "counter")
    expected = (slices, flows, counters) if summary is None else \
        (summary["slices"] + summary["instants"], summary["flows"], summary["counter_samples"])
    if stats or (slices, flows, counters) != expected:
        found = ", ".join(f"{name}={value}" for name, value in stats) or "no load errors"
        raise CgtraceError(
            f"{path}: self-check failed: trace_processor reads {slices} slices, {flows} flows, "
            f"{counters} counter samples (expected {expected[0]}, {expected[1]}, {expected[2]}), "
            f"{found}; the file is kept for "
            f"inspection, please report this with the input trace")
    return {"slices": slices, "flows": flows, "counter_samples": counters, "load_errors": 0}


def _count(tp, table: str) -> int:
    return next(iter(tp.query(f"select count(*) as n from {table}"))).n
