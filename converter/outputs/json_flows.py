"""Where the Chrome JSON writer puts each arrow so that trace_processor binds it to the
right slices: v1 flow events, v2 bind ids, or ends moved to rows of their own.

v52 binds a v1 flow event (`s`, and `f` with `"bp":"e"`) to the slice on top of its
thread's stack when the event is processed: the last slice begun there, even one that has
already ended; at equal ts, slices are begun before flow events, and flow events keep their file
order. An `f` without `bp` binds to the next slice begun on its thread. v2 (`bind_id` with
`flow_out`/`flow_in` on an `X` event) binds to that event's own slice, but an event carries one
bind id, so a slice cannot start one arrow and end another; v1 and v2 ids share one space (v1
ids are numbered from 0), so v2 ids start at 2**62. trace_processor stores every arrow from the
slice that starts first, whichever way it was written (the protobuf output reads the same).
So every arrow gets its own v1 id (a reused id would chain arrows), with `s` and `f` at times
where that binding picks the right slices; where no such time exists (an end with a child
beginning at the same ts), the arrow uses v2; where neither can (rare: a slice that would need
two v2 roles), its ends move to a row of their own beside their track, "<track> (flow ends)".
One flow per model Flow, between the right slices, checked on generated and adversarial traces.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..model import Trace
from ..model.nesting import fits_nested
from .json_rows import OutputIds, Row

V2_BIND_ID_BASE = 1 << 62      # above every v1 flow id trace_processor hands out


class _Endpoint:
    """Where a flow endpoint lands: its row, its slice's start and kind, and the start of the
    slices begun just before and just after it on that row (trace_processor's processing order)."""

    __slots__ = ("row", "ts", "is_instant", "previous_ts", "next_ts", "order")

    def __init__(self, row: Row, ts: int, is_instant: bool, previous_ts: Optional[int], next_ts: Optional[int],
                 order: tuple):
        self.row, self.ts, self.is_instant = row, ts, is_instant
        self.previous_ts, self.next_ts = previous_ts, next_ts
        self.order = order  # where trace_processor processes it: (ts, -dur), then file order


def flow_endpoints(trace: Trace, rows: list[Row]) -> dict[int, _Endpoint]:
    """The endpoint of every slice (by row) that an arrow starts or ends at."""
    endpoints: dict[int, _Endpoint] = {}
    if not trace.flows:
        return endpoints
    table = trace.slices
    starts, durations, instants = table.ts, table.dur, table.instant
    wanted = np.zeros(len(table), np.bool_)
    wanted[[flow.source for flow in trace.flows]] = True
    wanted[[flow.target for flow in trace.flows]] = True
    for row_index, row in enumerate(rows):
        slices = row.slices
        positions = np.flatnonzero(wanted[slices])
        if not len(positions):
            continue
        last = len(slices) - 1
        picked = slices[positions]
        # The starts of the slices just before and after each endpoint's on its row.
        before = starts[slices[np.maximum(positions - 1, 0)]].tolist()
        after = starts[slices[np.minimum(positions + 1, last)]].tolist()
        for index, slice_row, start, dur, instant, previous, following in zip(
                positions.tolist(), picked.tolist(), starts[picked].tolist(), durations[picked].tolist(),
                instants[picked].tolist(), before, after):
            endpoints[slice_row] = _Endpoint(row, start, instant, previous if index else None,
                                             following if index < last else None, (start, -dur, row_index, index))
    return endpoints


def plan_flows(trace: Trace, endpoints: dict[int, _Endpoint]):
    """How each arrow is written: (v1 arrows as (category, first, second, `f` ts, `f` binds
    the enclosing slice), v2 fields per row, counts by binding, rows of the slices to isolate
    for arrows that neither version can bind as they lie).

    trace_processor reports every arrow from the slice that starts first (at equal starts, from
    the one bound first), so each arrow is planned from that slice, `first`, to the other,
    `second`: the result is the same, and `second` never begins before `first`.
    """
    v1: list[tuple] = []
    v2_slot: dict[int, tuple] = {}  # row -> ("out", bind id) or ("in", bind id)
    v2_out_ids: dict[int, int] = {}
    counts = {"flows_v1": 0, "flows_v1_next_slice": 0, "flows_v2": 0}
    stuck: set[int] = set()
    for flow in trace.flows:
        first, second = flow.source, flow.target
        if endpoints[second].ts < endpoints[first].ts:
            first, second = second, first
        at_first, at_second = endpoints[first], endpoints[second]
        start, end = at_first.ts, at_second.ts
        # An `s` at `first`'s start binds to it unless another slice begins with it later on
        # its row (a child starting at the same ts).
        first_bindable = at_first.next_ts is None or at_first.next_ts > start
        if at_second.next_ts is None or at_second.next_ts > end:
            enclosing, flow_ts = True, end   # likewise an `f` with "bp":"e" at `second`'s start
        else:
            # An `f` without "bp" binds to the next slice begun on its row: `second`, if the
            # `f` comes after the slice begun before `second`, and before `second`. (Strictly
            # after: Chrome's rule, which cgtrace's reader follows, also takes a slice
            # beginning at the `f`'s ts.)
            enclosing = False
            previous = at_second.previous_ts
            flow_ts = start if previous is None else max(start, previous + 1)
        second_bindable = enclosing or flow_ts < end
        if first_bindable and second_bindable:
            counts["flows_v1" if enclosing else "flows_v1_next_slice"] += 1
            v1.append((flow.category, at_first, at_second, flow_ts, enclosing))
            continue
        # v2: bound to the X events' own slices (not instants'); `first` must be processed
        # first, and an event carries one bind id: out to any number of arrows, or in.
        first_slot, second_slot = v2_slot.get(first), v2_slot.get(second)
        if at_first.order < at_second.order and second_slot is None and \
                (first_slot is None or first_slot[0] == "out") and \
                not at_first.is_instant and not at_second.is_instant:
            bind_id = v2_out_ids.get(first)
            if bind_id is None:
                bind_id = v2_out_ids[first] = V2_BIND_ID_BASE + len(v2_out_ids)
                v2_slot[first] = ("out", bind_id)
            v2_slot[second] = ("in", bind_id)
            counts["flows_v2"] += 1
            continue
        if not first_bindable:
            stuck.add(first)
        if not second_bindable:
            stuck.add(second)
    v2_fields = {key: b',"bind_id":%d,"flow_%s":true' % (bind_id, direction.encode())
                 for key, (direction, bind_id) in v2_slot.items()}
    return v1, v2_fields, counts, stuck


def isolate(trace: Trace, rows: list[Row], stuck: set[int], ids: OutputIds) -> list[Row]:
    """Move the given slices (rows) off their rows onto companion rows beside them, layered so
    that each nests properly and begins alone: each is then the last slice begun at its start."""
    table = trace.slices
    starts, durations, instants = table.ts, table.dur, table.instant
    is_stuck = np.zeros(len(table), np.bool_)
    is_stuck[list(stuck)] = True
    result: list[Row] = []
    for row in rows:
        result.append(row)
        moving = is_stuck[row.slices]
        if not moving.any():
            continue
        moved = row.slices[moving]   # already in nesting order
        row.slices = row.slices[~moving]
        members: list[list[int]] = []     # per companion row, its slices
        open_ends: list[list[int]] = []   # per companion row, the ends of its open slices
        last_starts: list[int] = []       # per companion row, its last slice's start
        for slice_row, start, dur, instant in zip(moved.tolist(), starts[moved].tolist(), durations[moved].tolist(),
                                                  instants[moved].tolist()):
            for layer, ends in enumerate(open_ends):
                if last_starts[layer] != start and fits_nested(ends, start, start + dur):
                    last_starts[layer] = start
                    break
            else:
                layer = len(members)
                members.append([])
                open_ends.append([])
                last_starts.append(start)
            if not instant:
                open_ends[layer].append(start + dur)
            members[layer].append(slice_row)
        for layer, slices in enumerate(members):
            suffix = "" if layer == 0 else f" {layer + 1}"
            companion = Row(row.track, row.layer, f"{row.name} (flow ends{suffix})", row.pid,
                             np.array(slices, np.int64))
            companion.companion = layer + 1
            companion.tid = ids.tid(None)
            result.append(companion)
    return result
