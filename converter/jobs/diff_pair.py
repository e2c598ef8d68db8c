"""`cgtrace diff`: both traces measured as `cgtrace report` measures them, as two tasks (at once
where there are cores or a cluster), then compared by analysis/diff.py.

Each task reads its trace where it runs (profiler output compacted first, as report does)
and sends back only the report's figures, every kernel and op listed, so a kernel that ran on
one side only still shows. A rank or GPU chosen for a side is checked against its profiler
output first (the header's rank; the devices its GPU events ran on), so a wrong one is refused
before either trace is measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import msgspec

from ..analysis.diff import Side, diff_reports
from ..analysis.report import build_report
from ..errors import CgtraceError
from ..inputs.source import read_input_bytes
from ..kineto import GPU_CATEGORIES
from ..lane_rules import LaneRules
from .executors import Workers, for_cluster, run_tasks
from .rank_files import header_rank
from .readable import as_perfetto
from .runner import PROFILER_OUTPUT

_EVERY_KERNEL = (1 << 63) - 1  # SQL's LIMIT that keeps every row


def diff_traces(a: Path, b: Path, workers: Workers, tp_bin: Optional[str], lanes: LaneRules,
                top: int, sides: tuple[Side, Side] = (Side(), Side()), step_windows: str = "launched"
                ) -> dict[str, Any]:
    """The diff of trace `a` (before) and `b` (after), `top` kernels and ops listed; `sides`:
    what of each is compared; `step_windows`: how both bound their steps (report's)."""
    for path in (a, b):
        if path.is_dir():
            raise CgtraceError(f"{path}: is a directory; diff compares two traces: merge a directory of ranks "
                               "first (cgtrace merge DIR) and diff the merges")
    for path, side, name in zip((a, b), sides, ("a", "b")):
        _check_rank(path, side.rank, f"--{name}-rank")
        _check_gpu(path, side.gpu, f"--{name}-gpu")
    tasks = [(for_cluster(path, workers.remote), tp_bin, lanes, step_windows) for path in (a, b)]
    before, after = run_tasks(workers, _figures, tasks, [str(a), str(b)], "reporting", stop_at_failure=True)
    return diff_reports(before.value, after.value, top=top, sides=sides)


def _check_rank(path: Path, rank: Optional[int], option: str) -> None:
    """Refuses `rank` where the profiler header of `path` records another one; a trace with no
    such header (one cgtrace wrote, a merge) is checked against its GPUs once measured."""
    header = header_rank(path) if rank is not None else None
    if header is not None and header.rank is not None and header.rank != rank:
        world = "" if header.world_size is None else f" of {header.world_size} (ranks 0-{header.world_size - 1})"
        raise CgtraceError(f"{path}: holds rank {header.rank}{world}, not rank {rank} ({option})")


class _DeviceArg(msgspec.Struct):
    device: Any = None


class _Event(msgspec.Struct):
    """What of an event says which GPU ran it: its category and Kineto's `device` arg."""

    cat: Any = None
    args: Optional[_DeviceArg] = None


class _Events(msgspec.Struct):
    traceEvents: list[_Event] = []


_EVENTS = msgspec.json.Decoder(_Events)


def _check_gpu(path: Path, gpu: Optional[int], option: str) -> None:
    """Refuses `gpu` where profiler output `path` ran no GPU work on it; a trace cgtrace wrote,
    or one whose events do not decode plainly, is checked against its GPUs once measured."""
    if gpu is None or not path.name.endswith(PROFILER_OUTPUT):
        return
    try:
        events = _EVENTS.decode(read_input_bytes(path)).traceEvents
    except (msgspec.DecodeError, msgspec.ValidationError):
        return  # the reader names what is wrong when the trace is measured
    devices = sorted({event.args.device for event in events if event.cat in GPU_CATEGORIES and event.args
                      and isinstance(event.args.device, int)})
    if gpu not in devices:
        has = f"GPU {', '.join(map(str, devices))}" if devices else "no GPU work"
        raise CgtraceError(f"{path}: ran no GPU work on GPU {gpu} ({option}); it has {has}")


def _figures(path: Path, tp_bin: Optional[str], lanes: LaneRules, step_windows: str) -> dict[str, Any]:
    with as_perfetto(path, compact=True, lanes=lanes) as trace:
        return build_report(trace, tp_bin=tp_bin, top=_EVERY_KERNEL, lanes=lanes, shown_as=path,
                            step_windows=step_windows).figures
