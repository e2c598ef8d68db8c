"""Summary rows: how many of a GPU's lanes are busy, and how many of a pipeline's GPUs.

Perfetto v52 shows on a collapsed plain row only what that row holds itself (its process
summaries and minimap read threads' slices only, and lanes are no thread's), so each GPU's lanes
hang under a plain row of their own (compaction.py) whose counter gives the collapsed row the
GPU's activity, and a merged pipeline's root row counts its busy GPUs, dipping in every bubble.
Both are derived series: every slice stays where it is, counted once.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import compress
from operator import attrgetter
from typing import Iterable

from ..model import CounterSample, Trace, Track, TrackRole

_TRACK = attrgetter("track")


def running_totals(changes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(ts, total) wherever the sum of the (ts, change) pairs so far changes, one per time;
    at one time ends (negative changes) count before starts, so no false peak shows."""
    totals: list[tuple[int, int]] = []
    total = 0
    for ts, change in sorted(changes):
        total += change
        if totals and totals[-1][0] == ts:
            totals[-1] = (ts, total)
        else:
            totals.append((ts, total))
    return totals


def add_busy_lanes(trace: Trace) -> None:
    """Make each lane container a counter of how many of its lanes are busy: one sample per
    time the count changes, and a 0 at its first slice where none lasts (a GPU of zero-length
    kernels is a lane container all the same)."""
    edges: dict[Track, list[tuple[int, int]]] = defaultdict(list)  # model objects hash by identity
    first: dict[Track, int] = {}
    container_of: dict[Track, Track] = {}  # lane -> its container
    for track in trace.tracks:
        if track.role is TrackRole.LANE and track.parent is not None:
            container_of[track] = track.parent
    for slice_ in compress(trace.slices, map(container_of.__contains__, map(_TRACK, trace.slices))):
        container = container_of[slice_.track]
        first[container] = min(first.get(container, slice_.ts), slice_.ts)
        if slice_.dur > 0:
            edges[container].extend(((slice_.ts, 1), (slice_.end, -1)))
    for container, start in first.items():
        container.is_counter = True
        totals = running_totals(edges[container]) or [(start, 0)]
        trace.counters.extend(CounterSample(ts, busy, container) for ts, busy in totals)


def busy_gpu_changes(trace: Trace) -> list[tuple[int, int]]:
    """(ts, 1) where a GPU's lanes turn busy, (ts, -1) where they all turn idle, read from the
    busy-lanes counters: summed over ranks, the number of busy GPUs."""
    changes: list[tuple[int, int]] = []
    was_busy: dict[Track, bool] = defaultdict(bool)
    for sample in trace.counters:  # each container's samples in time order
        if sample.track.role is TrackRole.LANES:
            busy = sample.value > 0
            if busy != was_busy[sample.track]:
                changes.append((sample.ts, 1 if busy else -1))
                was_busy[sample.track] = busy
    return changes
