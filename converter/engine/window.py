"""Cutting a trace down to a time window or to profiler steps, for traces too big to open.

A time window keeps every slice any part of which overlaps it, whole (a boundary never cuts
a kernel in two). Steps keep what they did: every slice that began in them, GPU work by when
it was launched, so a step file holds the kernels its step launched (with their arrows) and
none of the previous step's, and opens at the step, not at a whole-profile span. Either way
an arrow is kept only if both its ends are, and dropped arrows are counted.
"""

from __future__ import annotations

import re
from typing import Optional

import msgspec
import numpy as np

from ..errors import CgtraceError
from ..kineto import GPU_ANNOTATION_CATEGORIES, GPU_CATEGORIES, MAX_NS, profiler_step
from ..model import Trace

_MAX_MS = MAX_NS / 1e6
_RANGE = re.compile(r"^\s*(\d+(?:\.\d*)?)?\s*:\s*(\d+(?:\.\d*)?)?\s*$")


class Window(msgspec.Struct, frozen=True):
    """Either milliseconds from the trace's first event (`start_ms`:`end_ms`) or steps."""

    start_ms: Optional[float] = None
    end_ms: Optional[float] = None
    first_step: Optional[int] = None
    last_step: Optional[int] = None

    @property
    def by_steps(self) -> bool:
        return self.first_step is not None


def parse_window(text: str) -> Window:
    """`START:END` in ms from the trace start; either side may be empty."""
    match = _RANGE.match(text)
    if not match or (match.group(1) is None and match.group(2) is None):
        raise CgtraceError(f"--window {text!r}: not START:END; pass milliseconds from the trace start, e.g. 100:250")
    start = float(match.group(1)) if match.group(1) else None
    end = float(match.group(2)) if match.group(2) else None
    if max(start or 0, end or 0) > _MAX_MS:
        raise CgtraceError(f"--window {text!r}: beyond {_MAX_MS:.0f} ms, the longest a trace can span; "
                           "pass times from the trace start")
    if start is not None and end is not None and end <= start:
        raise CgtraceError(f"--window {text!r}: END must be after START; pass e.g. 100:250")
    return Window(start_ms=start, end_ms=end)


def parse_steps(text: str) -> Window:
    """`N` or `N-M`: ProfilerStep numbers, inclusive."""
    match = re.match(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$", text)
    if not match:
        raise CgtraceError(f"--steps {text!r}: not N or N-M; pass ProfilerStep numbers, e.g. 3-5")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) else first
    if last < first:
        raise CgtraceError(f"--steps {text!r}: the range goes downwards; pass it upwards, e.g. 3-5")
    return Window(first_step=first, last_step=last)


def step_ranges(trace: Trace) -> dict[int, tuple[int, int]]:
    """ProfilerStep number -> (start, end) in ns, from the CPU's ProfilerStep slices (their GPU
    projections run later)."""
    table = trace.slices
    steps = table.named(lambda name: profiler_step(name) is not None)
    ranges = {}
    for slice_ in table.rows(steps[~table.in_categories(GPU_ANNOTATION_CATEGORIES)[steps]]):
        step = profiler_step(slice_.name)
        if step is not None:
            ranges[step] = (slice_.ts, slice_.end)
    return ranges


def window_bounds(trace: Trace, window: Window, source: str) -> tuple[int, int]:
    if window.by_steps:
        assert window.first_step is not None and window.last_step is not None  # parse_steps sets both
        ranges = step_ranges(trace)
        chosen = [span for step, span in ranges.items() if window.first_step <= step <= window.last_step]
        if not chosen:
            known = ", ".join(map(str, sorted(ranges))) or "none"
            raise CgtraceError(f"{source}: no ProfilerStep#{window.first_step}..{window.last_step} in the trace "
                               f"(steps present: {known}); pick steps from that list")
        return min(start for start, _ in chosen), max(end for _, end in chosen)
    table = trace.slices
    origin = int(table.ts.min()) if len(table) else 0
    last = int(table.end.max()) if len(table) else 0
    start = origin + round(window.start_ms * 1e6) if window.start_ms is not None else -MAX_NS
    end = min(origin + round(window.end_ms * 1e6), MAX_NS) if window.end_ms is not None else MAX_NS
    if len(table) and start > last:
        raise CgtraceError(f"{source}: --window starts after the trace ends (it spans 0 to "
                           f"{(last - origin) / 1e6:.3f} ms from its start); pick a window inside that")
    return start, end


def cut(trace: Trace, start: int, end: int) -> tuple[Trace, dict]:
    """A trace of what overlaps [start, end] (the slices copied, their tracks shared), and what
    was left out."""
    table = trace.slices
    return _keep(trace, (table.ts <= end) & (table.end >= start), start, end)


def cut_to_steps(trace: Trace, start: int, end: int) -> tuple[Trace, dict]:
    """A trace of what the steps spanning [start, end) did (see the module's docstring)."""
    launch, launched = _launch_times(trace)
    kept = (start <= launch) & (launch < end)
    window, summary = _keep(trace, kept, start, end)
    summary["gpu_slices_launched_in_window_ending_after"] = int(np.count_nonzero(
        kept & launched & (trace.slices.end > end)))
    return window, summary


def _launch_times(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Per row, when its work was launched, and whether an arrow says so: a GPU slice's is its
    launch's start (the last arrow into it wins), any other's its own start."""
    table = trace.slices
    sources, targets = trace.flow_rows()
    to_gpu = table.in_categories(GPU_CATEGORIES)[targets]
    sources, targets = sources[to_gpu], targets[to_gpu]
    last = len(targets) - 1 - np.unique(targets[::-1], return_index=True)[1]  # each target's last arrow
    starts = table.ts
    launch = starts.copy()
    launch[targets[last]] = starts[sources[last]]
    launched = np.zeros(len(table), np.bool_)
    launched[targets] = True
    return launch, launched


def _keep(trace: Trace, kept: np.ndarray, start: int, end: int) -> tuple[Trace, dict]:
    """The window of the rows where `kept` (a mask), with the arrows between them."""
    window = msgspec.structs.replace(trace.subset(kept), counters=[c for c in trace.counters if start <= c.ts <= end])
    return window, {"window_start_ns": start, "window_end_ns": end,
                    "slices_outside_window": len(trace.slices) - len(window.slices),
                    "flows_dropped_by_window": len(trace.flows) - len(window.flows)}
