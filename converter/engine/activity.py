"""Summary rows: what a GPU or a CPU-only rank does (computing, other work, idle), and what
share of a pipeline's GPUs (or CPU-only ranks) compute.

Perfetto v52 shows on a collapsed plain row only what that row holds itself, not the slices
of the rows under it. Each GPU's lanes hang under a plain row of their own (compaction.py says
why they are not threads of its process), so that row gets a counter of its work to show the
GPU's activity collapsed, a merged rank's CPU row one of its CPU work, and a merged
pipeline's root row the share of its GPUs computing, dipping in every bubble. Values are on
one scale for every rank (a count of busy lanes or threads was not: 2 lanes filled one rank's
row, 3 the next, and a CPU rank waiting in a receive counted as a busy thread), and compute
apart from communication: a rank waiting in a blocked NCCL kernel or a gloo receive must not
look busy. A CPU row computes exactly where the report's stage compute says it does
(kineto.is_cpu_compute), so the UI's dips are the report's bubbles and waits. All are
derived series: every slice stays where it is, counted once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import repeat
from typing import Iterable, Optional

import numpy as np

from ..kineto import CPU_OP_CATEGORY, is_communication_op, is_cpu_compute
from ..model import CounterSample, CounterScale, LaneKind, Process, Trace, Track, TrackRole

COMPUTING = 1.0   # a GPU row's level while a compute kernel runs (a CPU row's while a compute op runs)
OTHER_WORK = 0.5  # ... while only communication, memory or other work runs (a CPU row's: communication)
# The UI writes a counter's largest value, then its unit: "1 = computing (½: other work)".
GPU_SCALE = CounterScale(unit="= computing (½: other work)", shared_by="gpu")
# A CPU-only rank's row, on the GPU rows' scale: its ½ is communication alone.
CPU_SCALE = CounterScale(unit="= computing (½: communicating)", shared_by="gpu")
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
    computes = computes_track[table.track[on_lanes]][lasting]
    owner, times, levels = _levels(slice_owner[lasting], starts[lasting], ends[lasting], computes,
                                   np.zeros(len(computes), bool), np.ones(len(computes), bool))
    bounds = np.searchsorted(owner, list(codes.values()) + [len(on_lanes)]).tolist()
    for (container, code), first, end in zip(codes.items(), bounds, bounds[1:]):
        container.is_counter, container.scale = True, GPU_SCALE
        if first == end:  # only zero-length slices: a 0 at the earliest
            trace.counters.append(CounterSample(int(starts[slice_owner == code].min()), 0, container))
            continue
        trace.counters.extend(map(CounterSample, times[first:end].tolist(), levels[first:end].tolist(),
                                  repeat(container)))


def add_cpu_work(trace: Trace, processes: list[Process]) -> None:
    """Make the first of a rank's CPU row groups that holds a slice a counter of what the rank's
    CPUs do, all its threads together, by the report's stage compute for a CPU-only rank:
    COMPUTING (1) while a compute op runs (kineto.is_cpu_compute) and no communication op
    (a cpu_op whose time is a transfer or a wait for one, even inside a compute op), OTHER_WORK
    (1/2) while otherwise only communication runs (its ops, and transport spans such as gloo's
    open on any thread), 0 otherwise: a receive waiting, annotations, transfer buffers. A 0 at
    the first slice where nothing counts, so no row claims work it cannot show."""
    table = trace.slices
    mine = set(map(id, processes))
    process_of_track, owners = table.track_keys(lambda track: _process_of(track, mine))
    on_rows = np.flatnonzero(process_of_track[table.track] >= 0)
    if not len(on_rows):
        return
    holding = {id(owners[key]) for key in np.unique(process_of_track[table.track[on_rows]]).tolist()}
    shown = next(process for process in processes if id(process) in holding)
    shown.activity = Track(name=shown.display_name, is_counter=True, scale=CPU_SCALE)
    # What each distinct (name, category) is, asked of the vocabulary once per pair.
    texts = table.texts
    pairs, kind_of = np.unique(table.name[on_rows] * len(texts) + table.cat[on_rows], return_inverse=True)
    pair_names, pair_categories = np.divmod(pairs, len(texts))
    kinds = np.array([(is_cpu_compute(texts[name], texts[category]),
                       is_communication_op(texts[name]) and texts[category] == CPU_OP_CATEGORY,
                       is_communication_op(texts[name]))
                      for name, category in zip(pair_names.tolist(), pair_categories.tolist())], np.bool_)
    computes, blocks, communicates = kinds.reshape(-1, 3)[kind_of].T
    starts, ends = table.spans(on_rows)
    counted = (ends > starts) & (computes | communicates)
    if not counted.any():
        trace.counters.append(CounterSample(int(starts.min()), 0, shown.activity))
        return
    _, times, levels = _levels(np.zeros(np.count_nonzero(counted), np.int64), starts[counted], ends[counted],
                               computes[counted], blocks[counted], communicates[counted])
    trace.counters.extend(map(CounterSample, times.tolist(), levels.tolist(), repeat(shown.activity)))


def _process_of(track: Track, processes: set[int]) -> Optional[Process]:
    """The process of `processes` (by id) a CPU track belongs to: a thread's, or one scoped to
    the process, but no GPU lane or annotation row (a GPU process holds those)."""
    process = track.thread.process if track.thread is not None else track.process
    return process if process is not None and id(process) in processes and track.role is TrackRole.PLAIN else None


def _levels(owner: np.ndarray, starts: np.ndarray, ends: np.ndarray, computes: np.ndarray, blocks: np.ndarray,
            works: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(owner, ts, level) wherever an owner's level changes, by owner then time, for lasting
    spans: COMPUTING while a `computes` span runs and no `blocks` span, else OTHER_WORK while a
    `works` span runs, else 0. Ends count before starts at one time, so no false peak shows."""
    count = len(starts)
    owner, times = np.concatenate((owner, owner)), np.concatenate((starts, ends))
    changes = np.repeat(np.array([1, -1], np.int64), count)
    order = np.lexsort((changes, times, owner))
    owner, times, changes = owner[order], times[order], changes[order]
    # Each owner's edges sum to 0: no reset needed between them.
    computing, blocked, working = (np.cumsum(np.where(np.tile(mask, 2)[order], changes, 0)) > 0
                                   for mask in (computes, blocks, works))
    levels = np.where(computing & ~blocked, COMPUTING, np.where(working, OTHER_WORK, 0.0))
    last = np.ones(len(times), bool)  # the last edge of each (owner, time) holds its level
    last[:-1] = (owner[1:] != owner[:-1]) | (times[1:] != times[:-1])
    owner, times, levels = owner[last], times[last], levels[last]
    changed = np.ones(len(times), bool)  # a sample only where an owner's level changes
    changed[1:] = (owner[1:] != owner[:-1]) | (levels[1:] != levels[:-1])
    return owner[changed], times[changed], levels[changed]


def busy_gpu_changes(trace: Trace) -> tuple[list[tuple[int, int]], int]:
    """(ts, 1) where a GPU starts computing, (ts, -1) where it stops, read from the GPU rows'
    counters, and how many GPUs: summed over ranks, the pipeline's computing GPUs out of all.
    A rank with no GPU counts as one, computing where its CPU row does (add_cpu_work), so a
    CPU-only pipeline's root counts its computing ranks by the report's stage compute."""
    gpus = sum(track.role is TrackRole.LANES for track in trace.tracks)
    rank_rows = {process.activity for process in trace.processes if process.activity is not None}
    changes: list[tuple[int, int]] = []
    was_computing: dict[Track, bool] = defaultdict(bool)
    for sample in trace.counters:  # each row's samples in time order
        if not (sample.track.role is TrackRole.LANES if gpus else sample.track in rank_rows):
            continue
        computing = sample.value >= COMPUTING
        if computing != was_computing[sample.track]:
            changes.append((sample.ts, 1 if computing else -1))
            was_computing[sample.track] = computing
    return changes, max(gpus, 1)
