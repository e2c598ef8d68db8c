"""Self-check: reload a written file in trace_processor and compare it with what was written."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import msgspec

from ..errors import CgtraceError

PROBLEM_STATS_SQL = (
    "select name, idx, severity, value from stats "
    "where severity in ('error', 'data_loss') and value > 0 order by name")


class Expected(msgspec.Struct, frozen=True):
    """What a written file must hold: slices (instants included), arrows, counter samples."""

    slices: int
    flows: int
    counter_samples: int


def problem_stats(tp: Any) -> list[tuple[str, int]]:
    """trace_processor's error and data-loss counters that fired while loading."""
    return [(row.name, row.value) for row in tp.query(PROBLEM_STATS_SQL)]


def verify_output(path: Path, expected: Expected, tp_bin: Optional[str] = None,
                  shown_as: Optional[Path] = None) -> dict[str, int]:
    """Counts as trace_processor sees them in `path` (a file about to become `shown_as`);
    raises CgtraceError on any load error or any difference from `expected`."""
    # trace_processor brings in perfetto and wasmtime, a start-up cost in time and memory:
    # only when a check runs.
    from ..tp import open_trace

    with open_trace(path, tp_bin=tp_bin, shown_as=shown_as) as tp:
        stats = problem_stats(tp)
        found = Expected(_count(tp, "cgtrace_all_slice"), _count(tp, "flow"), _count(tp, "counter"))
    if stats or found != expected:
        errors = ", ".join(f"{name}={value}" for name, value in stats) or "no load errors"
        raise CgtraceError(
            f"{shown_as or path}: self-check failed: trace_processor reads {found.slices} slices, {found.flows} "
            f"flows, {found.counter_samples} counter samples (expected {expected.slices}, {expected.flows}, "
            f"{expected.counter_samples}), {errors}; nothing was written. Please report this with the input trace")
    return {"slices": found.slices, "flows": found.flows, "counter_samples": found.counter_samples, "load_errors": 0}


def _count(tp: Any, table: str) -> int:
    return int(next(iter(tp.query(f"select count(*) as n from {table}"))).n)
