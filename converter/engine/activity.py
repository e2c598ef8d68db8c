"""A summary row per GPU: how many of its lanes are busy, as a counter on their container.

Perfetto v52 shows on a collapsed plain row only what that row holds itself (its process
summaries and minimap read threads' slices only, and lanes are no thread's), so each GPU's lanes
hang under a plain row of their own (compaction.py) whose counter gives the collapsed row the
GPU's activity without copying a slice: every slice stays where it is, counted once.
"""

from __future__ import annotations

from collections import defaultdict

from ..model import CounterSample, Trace, Track, TrackRole


def add_busy_lanes(trace: Trace) -> int:
    """Make each lane container a counter of how many of its lanes are busy; returns the
    samples added (one per time the count changes)."""
    edges: dict[Track, list[tuple[int, int]]] = defaultdict(list)  # model objects hash by identity
    for slice_ in trace.slices:
        lane = slice_.track
        if lane.role is TrackRole.LANE and lane.parent is not None and slice_.dur > 0:
            edges[lane.parent].extend(((slice_.ts, 1), (slice_.end, -1)))
    added = 0
    for container, changes in edges.items():
        container.is_counter = True
        busy = 0
        samples: list[CounterSample] = []
        for ts, change in sorted(changes):  # ends before starts at one time: no false peak
            busy += change
            if samples and samples[-1].ts == ts:
                samples[-1].value = busy
            else:
                samples.append(CounterSample(ts, busy, container))
        trace.counters.extend(samples)
        added += len(samples)
    return added
