"""Why a GPU waits, in the UI: under each GPU's row a counter of why it is idle, and under
that each stream's queue depth, so the cause shows where the gap is. The definitions are
model/waits.py's (the report applies the same ones), read here off the trace model.
"""

from __future__ import annotations

import numpy as np

from .. import kineto
from ..model import CounterSample, CounterScale, Trace, Track, TrackRole, derived
from ..model.columns import grouped_in_order
from ..model.intervals import Spans, clip_spans, union_spans
from ..model.waits import HostSide, Work, holding, host_side, idle_parts, queue_depths, ready_times, sorted_work
from .launch_keys import launch_keys

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
    next_order = _next_orders(trace)
    made = 0
    for container, slices in work.items():
        ready = ready_times(slices, host)
        busy = slices.busy()
        parts = idle_parts(busy, holding(slices, ready, busy, host), first, last)
        idle = trace.add_track(Track(name="Why idle", parent=container, order=next_order.get(id(container), 1),
                                     is_counter=True, role=TrackRole.IDLE_CAUSE, scale=IDLE_SCALE,
                                     orders_children=True))
        moments, codes = _cause_samples(busy, parts, first, last)
        trace.counters.extend(map(CounterSample, moments, codes, [idle] * len(moments)))
        made += 1
        for order, (stream, depths) in enumerate(queue_depths(slices, ready).items() if queues else (), 1):
            depth = trace.add_track(Track(
                name=f"Queue depth, stream {stream}" if stream is not None else "Queue depth, no stream",
                parent=container, folded_under=idle, order=order, is_counter=True, role=TrackRole.QUEUE_DEPTH,
                # A scale per stream: on one scale a graph's stream of hundreds flattened the others.
                scale=CounterScale(QUEUE_UNIT, f"queue depth {container.name} stream {stream}"), stream=stream))
            trace.counters.extend(map(CounterSample, depths.moments.tolist(), depths.depths.astype(float).tolist(),
                                      [depth] * len(depths.moments)))
            made += 1
    return made


def _cause_samples(busy: Spans, parts: dict[str, Spans], first: int, last: int) -> tuple[list[int], list[float]]:
    """(moments, codes) wherever the cause changes over [first, last], then NOT_IDLE at `last`:
    busy and the causes' parts tile the span, so each stretch is the code of the one it lies in."""
    pieces = [(clip_spans(busy, first, last), derived.NOT_IDLE)] + [
        (spans, derived.IDLE_CODES[cause]) for cause, spans in parts.items()]
    starts = np.concatenate([spans.starts for spans, _ in pieces])
    ends = np.concatenate([spans.ends for spans, _ in pieces])
    codes = np.concatenate([np.full(len(spans.starts), code, np.int64) for spans, code in pieces])
    order = np.lexsort((codes, ends, starts))
    order = order[ends[order] > starts[order]]
    starts, codes = starts[order], codes[order]
    changed = np.concatenate(([True], codes[1:] != codes[:-1])) if len(codes) else np.zeros(0, np.bool_)
    moments, values = starts[changed].tolist(), codes[changed].astype(float).tolist()
    if not moments or moments[-1] < last:
        moments.append(last)
        values.append(float(derived.NOT_IDLE))
    return moments, values


def _next_orders(trace: Trace) -> dict[int, int]:
    """Per container (by id), an order that puts a new row last among its rows: the lanes come
    first, as they did, and the cause sits below the work it explains."""
    found: dict[int, int] = {}
    for track in trace.tracks:
        if track.parent is not None:
            found[id(track.parent)] = max(found.get(id(track.parent), 0), track.order + 1)
    return found


def _gpu_work(trace: Trace) -> dict[Track, Work]:
    """Per GPU (its lanes container), the measured slices on its lanes that last (the report's
    GPU work: what it reads back from the lanes)."""
    table = trace.slices
    on_lane = table.track_mask(lambda track: track.role is TrackRole.LANE and track.parent is not None)
    rows = np.flatnonzero(on_lane[table.track] & (table.dur > 0) & ~table.in_categories(derived.CATEGORIES))
    correlation, stream = launch_keys(trace, rows)
    kernel = table.in_categories(kineto.KERNEL_CATEGORIES)[rows]
    group_of_track, containers = table.track_keys(lambda track: track.parent)
    groups = group_of_track[table.track[rows]]
    found: dict[Track, Work] = {}
    for group, members in grouped_in_order(groups):  # the GPUs in the order their first slice comes
        mine = rows[members]
        found[containers[group]] = sorted_work(table.ts[mine], table.end[mine], correlation[members],
                                               kernel[members], stream[members])
    return found


def _host_side(trace: Trace) -> HostSide:
    """The trace's CPU side (one rank's): runtime calls by correlation id, synchronisations and
    receives open (a receive's name starts with one of kineto.RECEIVE_OPS, on the CPU)."""
    table = trace.slices
    runtime = np.flatnonzero(table.in_categories(kineto.RUNTIME_CATEGORIES))
    ids = launch_keys(trace, runtime)[0]
    lasting = (table.dur > 0) & ~table.in_categories(derived.CATEGORIES)
    syncs = table.named(set(kineto.HOST_SYNCHRONISATIONS).__contains__)
    syncs = syncs[lasting[syncs] & table.in_categories(kineto.RUNTIME_CATEGORIES)[syncs]]
    receives = table.named(lambda name: name.startswith(kineto.RECEIVE_OPS))
    receives = receives[lasting[receives] & ~table.in_categories(kineto.GPU_CATEGORIES)[receives]]
    return host_side(ids, table.ts[runtime], table.end[runtime], union_spans(*table.spans(syncs)),
                     union_spans(*table.spans(receives)))
