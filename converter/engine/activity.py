"""Summary rows: what a GPU does (computing, other work, idle), and what share of a pipeline's
GPUs compute.

Perfetto v52 shows on a collapsed plain row only what that row holds itself, not the slices
of the rows under it. Each GPU's lanes hang under a plain row of their own (compaction.py says
why they are not threads of its process), so that row gets a counter of its work to show the
GPU's activity collapsed, and a merged pipeline's root row the share of its GPUs computing,
dipping in every bubble. Values are on one scale for every rank (a count of busy lanes was
not: 2 lanes filled one rank's row, 3 the next), and compute apart from communication: a rank
waiting in a blocked NCCL kernel must not look busy. All are derived series: every slice stays
where it is, counted once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import repeat
from typing import Iterable, Iterator, Optional

import numpy as np

from ..model import CounterSample, CounterScale, LaneKind, Process, Trace, Track, TrackRole
from ..model.columns import grouped_in_order

_RANK = Track(name="rank")  # a CPU-only rank's busy threads, all its rows together
COMPUTING = 1.0   # a GPU row's level while a compute kernel runs
OTHER_WORK = 0.5  # ... while only communication, memory or other work runs
# The UI writes a counter's largest value, then its unit: "1 = computing (½: other work)".
GPU_SCALE = CounterScale(unit="= computing (½: other work)", shared_by="gpu")
CPU_SCALE = CounterScale(unit="threads busy", shared_by="cpu")
ROOT_SCALE = CounterScale(unit="% computing", shared_by="root")
# A merge's critical path row: what the path does (a wait on it is 0), on the GPU rows' scale.
PATH_SCALE = CounterScale(unit="= computing (½: transfer, launch)", shared_by="gpu")


def _container(track: Track) -> Optional[Track]:
    """A lane's container row (its parent); None for any other track."""
    return track.parent if track.role is TrackRole.LANE else None


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


def highest_levels(spans: Iterable[tuple[int, int, float]]) -> list[tuple[int, float]]:
    """(ts, level) wherever the highest level among the (start, end, level) spans running
    changes, 0 where none runs; at one time ends count before starts."""
    running: Counter[float] = Counter()
    samples: list[tuple[int, float]] = []
    for ts, change, level in sorted((ts, change, level) for start, end, level in spans if end > start
                                    for ts, change in ((start, 1), (end, -1))):
        running[level] += change
        top = max((known for known, count in running.items() if count > 0), default=0.0)
        if samples and samples[-1][0] == ts:
            samples.pop()
        if not samples or samples[-1][1] != top:
            samples.append((ts, top))
    return samples


def add_busy_lanes(trace: Trace) -> None:
    """Make each lane container a counter of what its GPU does: COMPUTING (1) while a compute
    lane runs a kernel, OTHER_WORK (1/2) while only communication, memory or other lanes run
    (a blocked NCCL kernel is not compute), 0 idle; a sample wherever that changes, and a 0 at
    its first slice where none lasts (a GPU of zero-length kernels is a lane container all the
    same). One scale for every GPU, shared in the UI. Containers come in the order of their
    first slice. Counted on columns: a million kernels made two edge tuples each to sort."""
    table = trace.slices
    container_of_track, containers = table.track_keys(_container)
    container_of = container_of_track[table.track]
    computes_track = table.track_mask(lambda track: track.group is not None and track.group.kind is LaneKind.COMPUTE)
    on_lanes = np.flatnonzero(container_of >= 0)
    # Per slice its container's code, the row position of the container's first slice, so
    # codes rise with each container's first slice.
    keys, first, inverse = np.unique(container_of[on_lanes], return_index=True, return_inverse=True)
    slice_owner = first[inverse]
    codes = {containers[key]: code for code, key in sorted(zip(first.tolist(), keys.tolist()))}
    starts, ends = table.spans(on_lanes)
    lasting = ends > starts
    computes = np.tile(computes_track[table.track[on_lanes]][lasting], 2)
    # Edges (container, ts, +1 at a start, -1 at an end), ends first at one time.
    owner = np.concatenate((slice_owner[lasting], slice_owner[lasting]))
    times = np.concatenate((starts[lasting], ends[lasting]))
    changes = np.repeat(np.array([1, -1], np.int64), np.count_nonzero(lasting))
    order = np.lexsort((changes, times, owner))
    owner, times, changes, computes = owner[order], times[order], changes[order], computes[order]
    # Each container's edges sum to 0: no reset needed between them.
    computing = np.cumsum(np.where(computes, changes, 0)) > 0
    working = np.cumsum(changes) > 0
    levels = np.where(computing, COMPUTING, np.where(working, OTHER_WORK, 0.0))
    last = np.ones(len(times), bool)  # the last edge of each (container, time) holds its level
    last[:-1] = (owner[1:] != owner[:-1]) | (times[1:] != times[:-1])
    owner, times, levels = owner[last], times[last], levels[last]
    changed = np.ones(len(times), bool)  # a sample only where a container's level changes
    changed[1:] = (owner[1:] != owner[:-1]) | (levels[1:] != levels[:-1])
    owner, times, levels = owner[changed], times[changed], levels[changed]
    bounds = np.searchsorted(owner, list(codes.values()) + [len(on_lanes)]).tolist()
    for (container, code), first, end in zip(codes.items(), bounds, bounds[1:]):
        container.is_counter, container.scale = True, GPU_SCALE
        if first == end:  # only zero-length slices: a 0 at the earliest
            trace.counters.append(CounterSample(int(starts[slice_owner == code].min()), 0, container))
            continue
        trace.counters.extend(map(CounterSample, times[first:end].tolist(), levels[first:end].tolist(),
                                  repeat(container)))


def add_busy_threads(trace: Trace, process: Process) -> None:
    """Make a row group's own row a counter of how many of its threads run a slice (a step's
    ProfilerStep#N aside, which spans all of it): collapsed, a CPU rank's row shows its work
    where it would show nothing. Each thread's slices count as their union: nesting counts once."""
    table = trace.slices
    thread_of_track, threads = table.track_keys(lambda track: track.thread if track.thread is not None
                                                and track.thread.process is process else None)
    steps = np.zeros(len(table), bool)
    steps[table.named(lambda name: name.startswith("ProfilerStep#"))] = True
    changes: list[tuple[int, int]] = []
    for thread, at in grouped_in_order(thread_of_track[table.track]):
        if thread < 0:  # not on one of its threads
            continue
        rows = at[~steps[at]]
        starts, ends = table.spans(rows[np.argsort(table.ts[rows], kind="stable")])
        if not len(starts):
            continue
        reach = np.maximum.accumulate(ends)  # the furthest end so far: a new run starts past it
        opens = np.flatnonzero(np.r_[True, starts[1:] > reach[:-1]])
        closes = np.r_[reach[opens[1:] - 1], reach[-1]]
        changes += zip(starts[opens].tolist(), repeat(1))
        changes += zip(closes.tolist(), repeat(-1))
    if changes:
        process.activity = Track(name=process.display_name, is_counter=True, scale=CPU_SCALE)
        trace.counters.extend(CounterSample(ts, total, process.activity) for ts, total in running_totals(changes))


def busy_gpu_changes(trace: Trace) -> tuple[list[tuple[int, int]], int]:
    """(ts, 1) where a GPU starts computing, (ts, -1) where it stops, read from the GPU rows'
    counters, and how many GPUs: summed over ranks, the pipeline's computing GPUs out of all.
    A rank with no GPU counts as one, computing where any of its CPU rows counts a busy
    thread, so a CPU-only pipeline's root counts its busy ranks."""
    gpus = sum(track.role is TrackRole.LANES for track in trace.tracks)
    rank_rows = {process.activity for process in trace.processes if process.activity is not None}
    samples = [sample for sample in trace.counters if sample.track.role is TrackRole.LANES] if gpus else \
        [CounterSample(ts, COMPUTING if total > 0 else 0, _RANK) for ts, total in running_totals(
            (sample.ts, int(sample.value - previous)) for sample, previous in _steps(trace.counters, rank_rows))]
    changes: list[tuple[int, int]] = []
    was_computing: dict[Track, bool] = defaultdict(bool)
    for sample in samples:  # each container's samples in time order
        computing = sample.value >= COMPUTING
        if computing != was_computing[sample.track]:
            changes.append((sample.ts, 1 if computing else -1))
            was_computing[sample.track] = computing
    return changes, max(gpus, 1)


def _steps(samples: list[CounterSample], tracks: set[Track]) -> Iterator[tuple[CounterSample, float]]:
    """Each sample of `tracks` with the value before it on its track (0 at first)."""
    previous: dict[Track, float] = defaultdict(float)
    for sample in samples:
        if sample.track in tracks:
            yield sample, previous[sample.track]
            previous[sample.track] = sample.value
