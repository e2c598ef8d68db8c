"""Why a GPU waits, defined once: when each GPU slice was launched (graph-aware), which cause
each idle moment goes to, and each stream's queue of launched work (docs/cli.md, "idle by
cause" and "queue depth"). The engine applies them to the trace model and writes them as
counters (engine/waits.py); the report applies them to what it reads back through SQL
(analysis/idle.py, analysis/launches.py), so a sum over the counter per step is the report's
figure exactly.

A GPU slice's launch is the CPU runtime call of its rank with the same `correlation` arg.
A CUDA graph is graph-aware here: its replay's kernels all carry their cudaGraphLaunch's id,
yet the graph runs them in order, so a kernel counts as launched once the launch returned and
the replay's kernels that started before it ended, not all at once at the launch. Idle time
goes to the first cause (derived.IDLE_CAUSES, in order) that holds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple, Optional

from . import derived
from .intervals import Intervals, clip, intersect, subtract


class Work(NamedTuple):
    """A GPU slice as the causes and launch figures need it."""

    start: int
    end: int
    correlation: Optional[int]
    kernel: bool
    stream: Optional[int]  # args.stream, where the slice names one


class HostSide:
    """What one rank's CPU did, as the causes need it: each correlation id's runtime call (the
    first to start, where several carry one), and the time synchronisations and receives were open."""

    def __init__(self) -> None:
        self.launch: dict[int, tuple[int, int]] = {}  # correlation id -> its runtime call's (start, end)
        self.syncs: Intervals = []
        self.receives: Intervals = []


def ready_times(work: list[Work], launch: dict[int, tuple[int, int]]) -> list[Optional[int]]:
    """Per slice of `work` (by start, end, then correlation id), when it was launched,
    graph-aware (None: no launch in the trace): its runtime call's end, and for a CUDA graph
    replay's kernel no earlier than the end of the replay's kernels begun before it."""
    replay_end: dict[int, int] = {}  # per correlation id: the latest end of its slices begun so far
    found: list[Optional[int]] = []
    for start, end, correlation, *_ in work:
        if correlation is None or correlation not in launch:
            found.append(None)
            continue
        returned = launch[correlation][1]
        found.append(max(returned, replay_end.get(correlation, returned)))
        replay_end[correlation] = max(replay_end.get(correlation, end), end)
    return found


def holding(work: list[Work], ready: list[Optional[int]], busy: Intervals, host: HostSide) -> list[tuple[str, Intervals]]:
    """Where each cause but OTHER holds, in IDLE_CAUSES' order. Each idle gap goes by the work
    that ends it: queued from that work's launch to the gap's end, host behind the gap before
    that launch returned; a gap whose next work has no launch in the trace, and the time after
    the last work, are in neither."""
    ready_at: dict[int, int] = {}  # per start: the earliest any slice begun then was launched
    for slice_, launched in zip(work, ready):
        if launched is not None:
            ready_at[slice_.start] = min(ready_at.get(slice_.start, launched), launched)
    queued: Intervals = []
    behind: Intervals = []
    for gap_start, gap_end in subtract([(-(1 << 62), busy[-1][1])], busy) if busy else []:
        first = ready_at.get(gap_end)
        if first is None:
            continue
        if first < gap_end:
            queued.append((max(gap_start, first), gap_end))
        if gap_start < first:
            behind.append((gap_start, min(first, gap_end)))
    return [(derived.QUEUED, queued), (derived.HOST_SYNC, host.syncs), (derived.PEER, host.receives),
            (derived.HOST_BEHIND, behind)]


def idle_parts(busy: Intervals, causes: list[tuple[str, Intervals]], start: int, end: int) -> dict[str, Intervals]:
    """[start, end)'s idle time (no GPU work: outside `busy`) cut by cause, each moment to the
    first of `causes` (holding's) that holds, the rest OTHER."""
    left = subtract([(start, end)], busy)
    parts: dict[str, Intervals] = {}
    for cause, holds in causes:
        parts[cause] = intersect(left, clip(holds, start, end))
        left = subtract(left, parts[cause])
    parts[derived.OTHER] = left
    return parts


def queue_depths(work: list[Work], ready: list[Optional[int]]) -> dict[Optional[int], list[tuple[int, int]]]:
    """Per stream (by number, None last), its queue depth as (moment, depth from then on), by
    moment: a slice is queued from its launch (graph-aware: ready_times) or its start where
    earlier or unknown, until it ends; at one moment ends count before launches."""
    events: dict[Optional[int], list[tuple[int, int]]] = defaultdict(list)
    for slice_, launched in zip(work, ready):
        enters = slice_.start if launched is None else min(launched, slice_.start)
        events[slice_.stream] += [(enters, 1), (slice_.end, -1)]
    depths = {}
    for stream in sorted(events, key=lambda stream: (stream is None, stream or 0)):
        depth = 0
        changes: list[tuple[int, int]] = []
        for moment, step in sorted(events[stream]):
            depth += step
            if changes and changes[-1][0] == moment:
                changes[-1] = (moment, depth)
            else:
                changes.append((moment, depth))
        depths[stream] = changes
    return depths
