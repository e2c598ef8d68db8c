"""Flow binding (converter/flows.py) against the rule it implements, read literally.

Most flow events sit exactly at the start of their slice and bind through a lookup by start
time; the others take a sweep in time. Both must give what Chrome's rule gives: an `s`, `t`
or `f` with `bp: "e"` binds to the deepest slice running at its ts on its track (the one
starting last in (start, longer first, input order) order among those still running), any
other `f` to the first slice in that order starting at or after its ts.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple, Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.inputs.flows import PHASE_CODES, FlowEvents, bind_flows, bind_to_slices
from converter.inputs.kineto_reader import parse_trace_text
from converter.model import NO_ARGS, SliceRow, SliceTable, Track

TIMES = st.integers(min_value=0, max_value=40)
SLICES = st.lists(st.tuples(TIMES, st.integers(min_value=0, max_value=15), st.booleans()), max_size=25)
# (ts, binds to the enclosing slice, on the other track)
EVENTS = st.lists(st.tuples(TIMES, st.booleans(), st.booleans()), min_size=1, max_size=25)


class FlowEvent(NamedTuple):
    cat: str
    flow_id: Any
    phase: str
    ts: int
    track: Track
    bind_to_enclosing: bool


def _table(slices: list[tuple[int, int, str, Track, bool]]) -> tuple[SliceTable, list[SliceRow]]:
    """A table of (ts, dur, name, track, instant) slices, and its rows as the oracles read them."""
    table = SliceTable()
    for ts, dur, name, track, instant in slices:
        table.append(ts, dur, name, "", NO_ARGS, track, instant)
    return table, table.rows()


def _bound(events: list[FlowEvent], table: SliceTable) -> list[Optional[SliceRow]]:
    """The slice each event binds to, through the columns bind_to_slices takes."""
    rows = bind_to_slices(np.array([e.ts for e in events], np.int64), [e.track for e in events],
                          np.array([e.bind_to_enclosing for e in events], bool), table)
    return [table.row(row) if row >= 0 else None for row in rows.tolist()]


def _start_order(slices: list[SliceRow]) -> list[SliceRow]:
    return sorted(slices, key=lambda s: (s.ts, -s.dur))


def expected_binding(event: FlowEvent, slices: list[SliceRow]):
    candidates = _start_order([s for s in slices if s.track is event.track and not s.is_instant])
    if event.bind_to_enclosing:
        running = [s for s in candidates if s.ts <= event.ts <= s.ts + s.dur]
        return running[-1] if running else None
    later = [s for s in candidates if s.ts >= event.ts]
    return later[0] if later else None


@settings(derandomize=True, max_examples=300, deadline=None, database=None)
@given(slices=SLICES, other_slices=SLICES, events=EVENTS)
def test_every_flow_event_binds_as_the_rule_says(slices, other_slices, events):
    track, other = Track(name="a"), Track(name="b")
    table, model = _table([(ts, dur, f"a{i}", track, instant) for i, (ts, dur, instant) in enumerate(slices)] +
                          [(ts, dur, f"b{i}", other, False) for i, (ts, dur, _) in enumerate(other_slices)])
    flow_events = [FlowEvent("cat", flow_id, "f", ts, other if on_other else track, enclosing)
                   for flow_id, (ts, enclosing, on_other) in enumerate(events)]
    for event, bound in zip(flow_events, _bound(flow_events, table)):
        assert bound == expected_binding(event, model), (event.phase, event.ts, event.bind_to_enclosing)


def test_a_flow_at_a_shared_start_binds_to_the_shortest_slice_read_last():
    track = Track(name="a")
    table, (_, _, second, _) = _table([(10, 50, "outer", track, False), (10, 5, "first", track, False),
                                       (10, 5, "second", track, False), (10, 0, "instant", track, True)])
    event = FlowEvent("cat", 1, "s", 10, track, True)
    assert _bound([event], table) == [second]


def _plain_arrows(events: list[FlowEvent], bindings: list[Optional[SliceRow]]):
    """The chain rule, read literally on bound events (whose binding the tests above check):
    chains keyed by (category, id) in the order they begin; each in time order (input order on
    a tie); an arrow per step from the last `s` or `t` to each later `t` or `f`."""
    chains: dict = {}
    for event, bound in zip(events, bindings):
        chains.setdefault((event.cat, type(event.flow_id), event.flow_id), []).append((event, bound))
    arrows, unbound, partnerless = [], 0, 0
    for (category, _, _), chain in chains.items():
        phases = [event.phase for event, _ in chain]
        if len(chain) < 2 or "s" not in phases or all(phase == "s" for phase in phases):
            partnerless += len(chain)
            continue
        source = None
        for event, bound in sorted(chain, key=lambda pair: pair[0].ts):
            if event.phase == "s":
                source = bound
                unbound += source is None
                continue
            target = bound
            if target is None or source is None or not (target.ts >= source.ts or target.ts + target.dur > source.ts):
                unbound += 1
            elif target != source:
                arrows.append((source.row, target.row, category))
            if event.phase == "t":
                source = bound
    return arrows, unbound, partnerless


# Ids that collide in careless keys: 1 and "1", ints beyond int64, two categories.
FLOW_IDS = st.sampled_from([1, 2, "1", "2", 1 << 70, -(1 << 70), -1])
CHAIN_EVENTS = st.lists(st.tuples(st.sampled_from(["ac2g", "fwdbwd"]), FLOW_IDS, st.sampled_from("stf"), TIMES,
                                  st.booleans()), max_size=30)


@settings(derandomize=True, max_examples=300, deadline=None, database=None)
@given(slices=SLICES, described=CHAIN_EVENTS, run=st.integers(min_value=0, max_value=8))
def test_chains_give_the_arrows_the_rule_says(slices, described, run):
    """Events added one by one (run 0) or `run` at a time, as the reader's two paths do."""
    track = Track(name="a")
    table, _ = _table([(ts, dur, f"a{i}", track, instant) for i, (ts, dur, instant) in enumerate(slices)])
    columns = FlowEvents()
    if run:
        for first in range(0, len(described), run):
            cats, ids, phases, times, enclosing = zip(*described[first:first + run])
            columns.extend(cats, ids, np.array([PHASE_CODES[phase] for phase in phases]), np.array(times),
                           [track] * len(cats), np.array(enclosing))
    else:
        for cat, flow_id, phase, ts, enclosing in described:
            columns.append(cat, flow_id, phase, ts, track, enclosing)
    bound = bind_flows(columns, table)
    events = [FlowEvent(cat, flow_id, phase, ts, track, enclosing) for cat, flow_id, phase, ts, enclosing in described]
    arrows, unbound, partnerless = _plain_arrows(events, _bound(events, table))
    assert [(flow.source, flow.target, flow.category) for flow in bound.flows] == arrows
    assert (bound.unbound, bound.partnerless) == (unbound, partnerless)


@pytest.mark.parametrize("counter", [False, True], ids=["bulk", "event-by-event"])
def test_a_read_keeps_one_text_per_flow_category(counter):
    """Each decoded event brings its own copy of "fwdbwd"; held by every flow event through
    the read and by every arrow after it, they cost 105 MB at 1 GB. A counter event sends the
    whole piece down the event-by-event path."""
    events: list[dict[str, Any]] = []
    for chain in range(3):
        ts = 100 * chain
        events += [{"ph": "X", "name": "send", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": ts, "dur": 10},
                   {"ph": "X", "name": "recv", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": ts + 20, "dur": 10},
                   {"ph": "s", "id": chain, "name": "fb", "cat": "fwdbwd", "pid": 1, "tid": 1, "ts": ts},
                   {"ph": "f", "bp": "e", "id": chain, "name": "fb", "cat": "fwdbwd", "pid": 1, "tid": 2,
                    "ts": ts + 20}]
    if counter:
        events.append({"ph": "C", "name": "memory", "pid": 1, "ts": 0, "args": {"bytes": 1}})
    trace = parse_trace_text(json.dumps({"traceEvents": events}).encode())
    rows = trace.slices.rows
    arrows = [(*(s.name for s in rows([flow.source, flow.target])), flow.category) for flow in trace.flows]
    assert arrows == [("send", "recv", "fwdbwd")] * 3
    assert len({id(flow.category) for flow in trace.flows}) == 1
