"""Why a GPU waits, in the UI: under each GPU's row a counter of why it is idle, and under
that each stream's queue depth, so the cause shows where the gap is. The definitions are
model/waits.py's (the report applies the same ones), read here off the trace model.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import repeat

import numpy as np

from .. import kineto
from ..model import CounterSample, CounterScale, Trace, Track, TrackRole, derived
from ..model.intervals import Intervals, clip, union
from ..model.waits import HostSide, Work, holding, idle_parts, queue_depths, ready_times

# The UI writes a counter's value then its unit: "3 = cause (1 queued, ...)".
IDLE_SCALE = CounterScale(unit="= cause (" + ", ".join(f"{code} {cause}" for cause, code in derived.IDLE_CODES.items())
                          + "; 0 working)", shared_by="idle cause")
QUEUE_UNIT = "launched, not ended"


# -- on the trace model ---------------------------------------------------------------------------
def add_wait_counters(trace: Trace, queues: bool = True) -> int:
    """Under each GPU's row (a lanes container), a counter of why it is idle (the cause's code,
    derived.IDLE_CODES; NOT_IDLE while it works) from the trace's first moment to its last, and
    (`queues`) folded under it one counter per stream of its queue depth. Returns the tracks made."""
    work = _gpu_work(trace)
    if not work:
        return 0
    host = _host_side(trace)
    first, last = int(trace.slices.ts.min()), int(trace.slices.end.max())
    made = 0
    for container, slices in work.items():
        ready = ready_times(slices, host.launch)
        busy = union((slice_.start, slice_.end) for slice_ in slices)
        parts = idle_parts(busy, holding(slices, ready, busy, host), first, last)
        idle = trace.add_track(Track(name="Why idle", parent=container, order=_last_order(trace, container),
                                     is_counter=True, role=TrackRole.IDLE_CAUSE, scale=IDLE_SCALE,
                                     orders_children=True))
        trace.counters.extend(CounterSample(ts, value, idle) for ts, value in _cause_samples(busy, parts, first, last))
        made += 1
        for order, (stream, changes) in enumerate(queue_depths(slices, ready).items() if queues else (), 1):
            depth = trace.add_track(Track(
                name=f"Queue depth, stream {stream}" if stream is not None else "Queue depth, no stream",
                parent=container, folded_under=idle, order=order, is_counter=True, role=TrackRole.QUEUE_DEPTH,
                # A scale per stream: on one scale a graph's stream of hundreds flattened the others.
                scale=CounterScale(QUEUE_UNIT, f"queue depth {container.name} stream {stream}"), stream=stream))
            trace.counters.extend(map(CounterSample, (moment for moment, _ in changes),
                                      (float(value) for _, value in changes), repeat(depth)))
            made += 1
    return made


def _cause_samples(busy: Intervals, parts: dict[str, Intervals], first: int, last: int) -> list[tuple[int, float]]:
    """(ts, code) wherever the cause changes over [first, last], then NOT_IDLE at `last`: busy
    and the causes' parts tile the span, so each stretch is the code of the one it lies in."""
    stretches = sorted([(start, end, derived.NOT_IDLE) for start, end in clip(busy, first, last)]
                       + [(start, end, derived.IDLE_CODES[cause]) for cause, spans in parts.items()
                          for start, end in spans])
    samples: list[tuple[int, float]] = []
    for start, end, code in stretches:
        if end > start and (not samples or samples[-1][1] != code):
            samples.append((start, float(code)))
    if not samples or samples[-1][0] < last:
        samples.append((last, float(derived.NOT_IDLE)))
    return samples


def _last_order(trace: Trace, container: Track) -> int:
    """An order that puts a row last among the container's rows: the lanes come first, as
    they did, and the cause sits below the work it explains."""
    return max((track.order for track in trace.tracks if track.parent is container), default=0) + 1


def _gpu_work(trace: Trace) -> dict[Track, list[Work]]:
    """Per GPU (its lanes container), the measured slices on its lanes that last, by start, end
    and correlation id (the report's GPU work: what it reads back from the lanes)."""
    table = trace.slices
    on_lane = table.track_mask(lambda track: track.role is TrackRole.LANE and track.parent is not None)
    rows = np.flatnonzero(on_lane[table.track] & (table.dur > 0) & ~table.in_categories(derived.CATEGORIES))
    kernels = table.in_categories(kineto.KERNEL_CATEGORIES)[rows].tolist()
    found: dict[Track, list[Work]] = defaultdict(list)
    for track, start, end, (correlation, stream), kernel in zip(
            table.tracks_of(rows), table.ts[rows].tolist(), table.end[rows].tolist(),
            map(kineto.launch_keys, trace.args_texts(rows)), kernels):
        assert track.parent is not None
        found[track.parent].append(Work(start, end, correlation, kernel, stream))
    for slices in found.values():
        slices.sort(key=lambda slice_: (slice_.start, slice_.end, slice_.correlation is not None,
                                        slice_.correlation or 0))
    return found


def _host_side(trace: Trace) -> HostSide:
    """The trace's CPU side (one rank's): runtime calls by correlation id, synchronisations and
    receives open (a receive's name starts with one of kineto.RECEIVE_OPS, on the CPU)."""
    table = trace.slices
    host = HostSide()
    runtime = np.flatnonzero(table.in_categories(kineto.RUNTIME_CATEGORIES))
    runtime = runtime[np.lexsort((table.end[runtime], table.ts[runtime]))]
    for start, end, correlation in zip(table.ts[runtime].tolist(), table.end[runtime].tolist(),
                                       map(kineto.correlation, trace.args_texts(runtime))):
        if correlation is not None:
            host.launch.setdefault(correlation, (start, end))
    lasting = (table.dur > 0) & ~table.in_categories(derived.CATEGORIES)
    syncs = table.named(set(kineto.HOST_SYNCHRONISATIONS).__contains__)
    syncs = syncs[lasting[syncs] & table.in_categories(kineto.RUNTIME_CATEGORIES)[syncs]]
    receives = table.named(lambda name: name.startswith(kineto.RECEIVE_OPS))
    receives = receives[lasting[receives] & ~table.in_categories(kineto.GPU_CATEGORIES)[receives]]
    host.syncs = union(zip(*map(np.ndarray.tolist, table.spans(syncs))))
    host.receives = union(zip(*map(np.ndarray.tolist, table.spans(receives))))
    return host
