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

from typing import NamedTuple, Optional

import numpy as np

from . import derived
from .intervals import Spans, clip_spans, intersect_spans, subtract_spans, union_spans
from .launch_keys import NO_ID, NO_STREAM

NO_LAUNCH = np.iinfo(np.int64).max  # ready_times' moment for a slice whose launch is not in the trace
_BEFORE_ALL = -(1 << 62)  # the start of the idle gap before a GPU's first work


class Work(NamedTuple):
    """One GPU's slices as the causes and launch figures need them, on columns, by start, end,
    then correlation id (none first): `sorted_work` orders them."""

    start: np.ndarray
    end: np.ndarray
    correlation: np.ndarray  # NO_ID: none
    kernel: np.ndarray  # bool
    stream: np.ndarray  # args.stream, NO_STREAM where the slice names none

    def busy(self) -> Spans:
        """The time at least one of the slices runs."""
        return union_spans(self.start, self.end)


def sorted_work(start: np.ndarray, end: np.ndarray, correlation: np.ndarray, kernel: np.ndarray,
                stream: np.ndarray) -> Work:
    """The columns as Work, in its order."""
    order = np.lexsort((correlation, end, start))
    return Work(start[order], end[order], correlation[order], kernel.astype(np.bool_)[order], stream[order])


def no_work() -> Work:
    """A GPU without slices."""
    empty = np.zeros(0, np.int64)
    return Work(empty, empty, empty, np.zeros(0, np.bool_), empty)


class HostSide(NamedTuple):
    """What one rank's CPU did, as the causes need it: each correlation id's runtime call (the
    first to start, where several carry one), by id, and the time synchronisations and receives
    were open."""

    ids: np.ndarray
    call_start: np.ndarray
    call_end: np.ndarray
    syncs: Spans
    receives: Spans


def host_side(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, syncs: Spans, receives: Spans) -> HostSide:
    """A rank's HostSide from its runtime calls (NO_ID where a call has no id), of which the
    first to start (then to end) stands for its id."""
    order = np.lexsort((ends, starts))
    order = order[ids[order] != NO_ID]
    known, first = np.unique(ids[order], return_index=True)
    return HostSide(known, starts[order[first]], ends[order[first]], syncs, receives)


def no_host() -> HostSide:
    """A rank whose CPU side is not in the trace."""
    empty = np.zeros(0, np.int64)
    return HostSide(empty, empty, empty, Spans(empty, empty), Spans(empty, empty))


def launch_of(work: Work, host: HostSide) -> np.ndarray:
    """Per slice, the index of its runtime call in `host` (-1: not in the trace)."""
    if not len(host.ids):
        return np.full(len(work.start), -1, np.int64)
    at = np.minimum(np.searchsorted(host.ids, work.correlation), len(host.ids) - 1)
    return np.where((work.correlation != NO_ID) & (host.ids[at] == work.correlation), at, -1)


def ready_times(work: Work, host: HostSide) -> np.ndarray:
    """Per slice of `work`, when it was launched, graph-aware (NO_LAUNCH: no launch in the
    trace): its runtime call's end, and for a CUDA graph replay's kernel no earlier than the end
    of the replay's slices before it in `work`'s order."""
    call = launch_of(work, host)
    ready = np.full(len(call), NO_LAUNCH, np.int64)
    launched = np.flatnonzero(call >= 0)
    ready[launched] = host.call_end[call[launched]]
    # Per correlation id, in work's order: the latest end among the slices before each.
    ordered = launched[np.argsort(work.correlation[launched], kind="stable")]
    if len(ordered) > 1:
        ids = work.correlation[ordered]
        ends, rank = np.unique(work.end[ordered], return_inverse=True)
        group = np.cumsum(np.concatenate(([0], ids[1:] != ids[:-1])))
        # Ranks lifted by group, so one running max never crosses a group's start.
        latest = np.maximum.accumulate(group * len(ends) + rank.reshape(-1)) - group * len(ends)
        later = np.flatnonzero(group[1:] == group[:-1]) + 1
        rows = ordered[later]
        ready[rows] = np.maximum(ready[rows], ends[latest[later - 1]])
    return ready


def holding(work: Work, ready: np.ndarray, busy: Spans, host: HostSide) -> list[tuple[str, Spans]]:
    """Where each cause but OTHER holds, in IDLE_CAUSES' order. Each idle gap goes by the work
    that ends it: queued from that work's launch to the gap's end, host behind the gap before
    that launch returned; a gap whose next work has no launch in the trace, and the time after
    the last work, are in neither."""
    gap_start = np.concatenate(([_BEFORE_ALL], busy.ends))[:len(busy.starts)]
    gap_end = busy.starts
    # Per start: the earliest any slice begun then was launched (NO_LAUNCH: none was).
    new_start = np.ones(len(work.start), np.bool_)
    new_start[1:] = work.start[1:] != work.start[:-1]
    first_of = np.flatnonzero(new_start)
    starts = work.start[first_of]
    earliest = np.minimum.reduceat(ready, first_of) if len(first_of) else ready
    at = np.minimum(np.searchsorted(starts, gap_end), max(len(starts) - 1, 0))
    first = earliest[at] if len(starts) else np.full(len(gap_end), NO_LAUNCH, np.int64)
    launched = (first != NO_LAUNCH) & (starts[at] == gap_end if len(starts) else False)
    queued = launched & (first < gap_end)
    behind = launched & (gap_start < first)
    return [(derived.QUEUED, Spans(np.maximum(gap_start, first)[queued], gap_end[queued])),
            (derived.HOST_SYNC, host.syncs), (derived.PEER, host.receives),
            (derived.HOST_BEHIND, Spans(gap_start[behind], np.minimum(first, gap_end)[behind]))]


def idle_parts(busy: Spans, causes: list[tuple[str, Spans]], start: int, end: int) -> dict[str, Spans]:
    """[start, end)'s idle time (no GPU work: outside `busy`) cut by cause, each moment to the
    first of `causes` (holding's) that holds, the rest OTHER."""
    left = subtract_spans(Spans(np.array([start], np.int64), np.array([end], np.int64)), busy)
    parts: dict[str, Spans] = {}
    for cause, holds in causes:
        parts[cause] = intersect_spans(left, clip_spans(holds, start, end))
        left = subtract_spans(left, parts[cause])
    parts[derived.OTHER] = left
    return parts


class Depths(NamedTuple):
    """One stream's queue depth: from each moment on (sorted), the depth."""

    moments: np.ndarray
    depths: np.ndarray


def queue_depths(work: Work, ready: np.ndarray) -> dict[Optional[int], Depths]:
    """Per stream (by number, None last), its queue depth: a slice is queued from its launch
    (graph-aware: ready_times) or its start where earlier or unknown, until it ends; at one
    moment ends count before launches."""
    enters = np.minimum(ready, work.start)
    moments = np.concatenate([enters, work.end])
    steps = np.concatenate([np.ones(len(enters), np.int64), np.full(len(enters), -1, np.int64)])
    streams = np.concatenate([work.stream, work.stream])
    unnamed = streams == NO_STREAM
    order = np.lexsort((steps, moments, streams, unnamed))
    moments, steps, streams = moments[order], steps[order], streams[order]
    depth = np.cumsum(steps)  # a stream's events net to zero, so each stream's count starts from 0
    last = np.flatnonzero(np.concatenate(((moments[1:] != moments[:-1]) | (streams[1:] != streams[:-1]), [True])))
    firsts = np.flatnonzero(np.concatenate(([True], streams[1:] != streams[:-1]))) if len(streams) else np.zeros(0, np.intp)
    found: dict[Optional[int], Depths] = {}
    for stream, mine in zip(streams[firsts].tolist(), np.split(last, np.searchsorted(last, firsts[1:]))):
        found[None if stream == NO_STREAM else stream] = Depths(moments[mine], depth[mine])
    return found
