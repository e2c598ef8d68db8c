"""The Perfetto writer encodes packets a column at a time (converter/outputs/packets.py); here a
plain writer encodes them one slice at a time, as the writer did before, and both must give
the same bytes on random traces: converted, compacted, and written as read, partial overlaps
and all (the writer's slice-by-slice placement of ENDs), and traces built row by row with
arrows, agreed arrow ends and slices on tracks the trace does not list."""

from __future__ import annotations

import io
import struct
from collections import defaultdict
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.engine.activity import add_busy_lanes
from converter.engine.compaction import compact
from converter.engine.lane_grouping import RuleLanes
from converter.engine.layout import separate_overlaps
from converter.inputs.kineto_reader import parse_trace_text
from converter.lane_rules import load_lane_rules
from converter.model import NO_ARGS, Flow, FlowEnd, Trace, Track, TrackRole
from converter.model.args import ExtraArgs
from converter.outputs.flow_fields import write_order
from converter.outputs.annotations import encode_value
from converter.outputs.packets import varint_matrix
from converter.outputs import packets, perfetto_writer
from converter.outputs.perfetto_writer import PerfettoWriter
from converter.outputs.wire import varint
from converter.tuning import DEFAULT_TUNING, Tuning

from .test_properties import SETTINGS, kineto_traces


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _field(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _delimited(number: int, payload: bytes) -> bytes:
    return _field(number, 2) + _varint(len(payload)) + payload


def _plain_flow_fields(trace, first_flow_id):
    """Per row, the flow id fields of its BEGIN and of its END: an arrow's id goes to its
    source's BEGIN, and terminates at its target's BEGIN, or at its END where the target began
    no later than the source (trace_processor closes a flow at the next event naming it)."""
    at_begin, at_end = defaultdict(bytes), defaultdict(bytes)
    slices = trace.slices.rows()
    for flow_id, flow in enumerate(trace.flows, start=first_flow_id):
        encoded = struct.pack("<Q", flow_id)
        source, target = slices[flow.source], slices[flow.target]
        at_begin[source.row] += _field(47, 1) + encoded
        if target.ts > source.ts or target.is_instant or not target.dur:
            at_begin[target.row] += _field(48, 1) + encoded
        else:
            at_end[target.row] += _field(48, 1) + encoded
    for end in trace.flow_ends:
        at_begin[end.row] += _field(47 if end.outgoing else 48, 1) + struct.pack("<Q", end.flow_id)
    return at_begin, at_end


def _plain_track_order(trace):
    """The tracks as given, but one holding an arrow's target that starts at its source's time
    and ends there (an instant, or no duration) after the source's track; a cycle of such
    tracks goes on at its first track left. Tracks the trace does not list are not written:
    none waits for them."""
    sources_of = defaultdict(set)
    slices = trace.slices.rows()
    for flow in trace.flows:
        source, target = slices[flow.source], slices[flow.target]
        if target.ts == source.ts and (target.is_instant or not target.dur) and source.track is not target.track \
                and source.track in trace.tracks:
            sources_of[target.track].add(source.track)
    order, left = [], list(trace.tracks)
    while left:
        track = next((t for t in left if sources_of[t] <= set(order)), left[0])
        order.append(track)
        left.remove(track)
    return order


class PlainWriter(PerfettoWriter):
    """Every packet built by concatenating bytes, one slice at a time, each END written when the
    next slice of its track starts at or after its end (a stack of open slices)."""

    def _write_slices(self, trace, uuids, flow_fields, extra_args):
        flows_at_begin, flows_at_end = _plain_flow_fields(trace, flow_fields.next_flow_id - len(trace.flows))
        by_track = defaultdict(list)
        for slice_ in trace.slices.rows():
            by_track[slice_.track].append(slice_)
        prepared = self._prepared_args(trace)
        extras = {row: extra_args.values[which] for row, which in zip(extra_args.rows.tolist(), extra_args.which.tolist())}
        for track in _plain_track_order(trace):
            slices = by_track.pop(track, None)
            if not slices:
                continue
            # By start, then shortest first on a flat track and longest first (nesting) on
            # others, then in row order (a stable sort).
            ordered = sorted(slices, key=lambda s: (s.ts, s.dur if track.flat else -s.dur))
            track_field = _field(11, 0) + _varint(uuids[id(track)])
            open_ends = []
            for slice_ in ordered:
                while open_ends and open_ends[-1][0] <= slice_.ts:
                    self._packet(*open_ends.pop())
                head = self.names.field(slice_.name) + (self.categories.field(slice_.cat) if slice_.cat else b"")
                if slice_.args == NO_ARGS:
                    args = b""
                elif prepared is None:
                    args = self.args.encode(trace.args.text(slice_.args))
                else:
                    blob, starts, lengths = prepared.runs(np.array([slice_.args]))
                    args = bytes(blob[starts[0]:starts[0] + lengths[0]])
                name_field = self.annotation_names.field
                for name, value in extras.get(slice_.row, {}).items():  # TrackEvent.debug_annotations
                    args += _delimited(4, name_field(name) + encode_value(value, name_field))
                kind = 3 if slice_.is_instant else 1
                event = _field(9, 0) + _varint(kind) + track_field + head + args + flows_at_begin.get(slice_.row, b"")
                self._packet(slice_.ts, event, begin=True)
                if not slice_.is_instant:
                    open_ends.append((slice_.ts + slice_.dur, _field(9, 0) + _varint(2) + track_field +
                                      flows_at_end.get(slice_.row, b"")))
            while open_ends:
                self._packet(*open_ends.pop())

    def _packet(self, ts: int, event: bytes, begin: bool = False) -> None:
        state = b""
        if begin:
            state = _field(13, 0) + _varint(2)
            if self.pending_interned:
                state += _delimited(12, b"".join(self.pending_interned))
                self.pending_interned.clear()
        self._emit(_field(8, 0) + _varint(ts) + self.sequence + state + _delimited(11, event))

    def _write_counters(self, trace, uuids):
        for sample in trace.counters:
            event = _field(9, 0) + _varint(4) + _field(11, 0) + _varint(uuids[id(sample.track)]) + \
                _field(44, 1) + struct.pack("<d", sample.value)
            self._emit(_field(8, 0) + _varint(sample.ts) + self.sequence + _delimited(11, event))


def _written(writer_class, trace: Trace, tuning: Tuning = DEFAULT_TUNING, extra_args=None) -> bytes:
    stream = io.BytesIO()
    writer = writer_class(stream, tuning=tuning)
    writer.write(trace, extra_args)
    writer.close()
    return stream.getvalue()


def _both_built(build, tuning: Tuning = DEFAULT_TUNING, extra_args=None) -> tuple[bytes, bytes]:
    """The two writers' bytes for a trace `build` makes afresh for each, both with `tuning`
    and `extra_args`."""
    return _written(PerfettoWriter, build(), tuning, extra_args), _written(PlainWriter, build(), tuning, extra_args)


def _both(text: bytes, prepare, tuning: Tuning = DEFAULT_TUNING) -> tuple[bytes, bytes]:
    """The two writers' bytes for one reading of `text` each (the writers assign iids as they go)."""
    def build() -> Trace:
        trace = parse_trace_text(text)
        prepare(trace)
        return trace

    return _both_built(build, tuning)


def _compacted(trace: Trace) -> None:
    rules = load_lane_rules(None)
    compact(trace, rules, RuleLanes(rules))
    add_busy_lanes(trace)
    separate_overlaps(trace)


@settings(max_examples=60, **SETTINGS)
@given(kineto_traces(), st.sampled_from(["as read", "converted", "compacted"]))
def test_column_encoding_writes_what_slice_by_slice_encoding_writes(text, stage):
    prepare = {"as read": lambda trace: None, "converted": separate_overlaps, "compacted": _compacted}[stage]
    columns, plain = _both(text, prepare)
    assert columns == plain


@settings(max_examples=30, **SETTINGS)
@given(kineto_traces(), st.sampled_from(["as read", "compacted"]))
def test_tracks_cut_into_batches_and_packets_into_parts_are_written_alike(text, stage):
    """Batches of a few slices (long tracks cut where nothing is open), parts of a few packets
    (counters' too), their short runs gathered a few bytes at a time and their args spliced in
    a couple at a time."""
    prepare = {"as read": lambda trace: None, "compacted": _compacted}[stage]
    with mock.patch.object(packets, "SPLICES_AT_ONCE", 2), mock.patch.object(packets, "_GATHER_BYTES", 7):
        columns, plain = _both(text, prepare, Tuning(slices_at_once=3, packets_at_once=5))
    assert columns == plain


_TRACK_KINDS = [TrackRole.PLAIN, TrackRole.LANE]  # nesting and flat
_NAMES = ["a", "b", "c"]
_CATEGORIES = ["", "x", "y"]


@st.composite
def built_traces(draw):
    """A recipe for a trace of a few tracks (nesting or flat, listed in the trace or not)
    holding random slices: equal starts, equal durations, zero durations and instants, with
    and without args; arrows between random rows, some momentary at their source's time, and
    agreed arrow ends."""
    tracks = [(draw(st.sampled_from(_TRACK_KINDS)), draw(st.integers(0, 4)) > 0)  # (role, listed)
              for _ in range(draw(st.integers(1, 4)))]
    slices = draw(st.lists(st.tuples(st.integers(0, len(tracks) - 1), st.integers(0, 6), st.integers(0, 4),
                                     st.sampled_from(_NAMES), st.sampled_from(_CATEGORIES),
                                     st.sampled_from([None, b'{"k": 1}', b'{"k": "v", "n": [1, 2]}']), st.booleans()),
                           max_size=40))
    rows = st.integers(0, len(slices) - 1)
    flows = draw(st.lists(st.tuples(rows, rows), max_size=10)) if slices else []
    ends = draw(st.lists(st.tuples(rows, st.integers(1, 2**40), st.booleans()), max_size=4)) if slices else []

    def build() -> Trace:
        trace = Trace()
        made = [Track(name=f"track {index}", role=role) for index, (role, _) in enumerate(tracks)]
        trace.tracks = [track for track, (_, listed) in zip(made, tracks) if listed]
        for on, ts, dur, name, cat, args, instant in slices:
            reference = NO_ARGS if args is None else trace.args.add(args)
            trace.slices.append(ts, 0 if instant else dur, name, cat, reference, made[on], instant)
        trace.flows = [Flow(source, target, "arrow") for source, target in flows]
        trace.flow_ends = [FlowEnd(row, flow_id, outgoing) for row, flow_id, outgoing in ends]
        return trace

    return build


@settings(max_examples=100, **SETTINGS)
@given(built_traces(), st.sampled_from([DEFAULT_TUNING.slices_at_once, 3]))
def test_traces_built_row_by_row_are_written_alike(build, slices_at_once):
    columns, plain = _both_built(build, Tuning(slices_at_once=slices_at_once))
    assert columns == plain


@settings(max_examples=60, **SETTINGS)
@given(built_traces(), st.sets(st.integers(0, 39), max_size=12), st.sampled_from([DEFAULT_TUNING.slices_at_once, 3]))
def test_annotations_added_to_chosen_slices_are_written_alike(build, chosen, slices_at_once):
    """Annotations a stage adds beside some slices' own args (a merge's collective figures),
    with names met for the first time in a later batch; rows the trace lacks are never met."""
    extra = {row: {"cgtrace_extra": {"row": row, "name": f"r{row % 3}", "share": row / 7},
                   **({"cgtrace_more": [row, "x"]} if row % 2 else {})} for row in chosen}
    columns, plain = _both_built(build, Tuning(slices_at_once=slices_at_once), ExtraArgs.per_row(extra))
    assert columns == plain


def test_slices_on_a_track_the_trace_does_not_list_are_not_written():
    listed, unlisted = Track(name="listed"), Track(name="unlisted")
    trace = Trace(tracks=[listed])
    trace.slices.append(1, 1, "kept", "", NO_ARGS, listed)
    trace.slices.append(2, 1, "dropped", "", NO_ARGS, unlisted)
    written = _written(PerfettoWriter, trace)
    assert b"kept" in written and b"dropped" not in written


def test_a_track_with_partial_overlaps_is_written_as_a_stack_places_ends():
    """Without layout, [0, 10) and [5, 20) share a track: a stack closes the first only after
    the second, so both ENDs come after [12, 13), though the first ended before it began."""
    events = [{"ph": "X", "name": n, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
              for n, ts, dur in [("a", 0, 10), ("b", 5, 15), ("c", 12, 1)]]
    columns, plain = _both(f'{{"traceEvents": {events}}}'.replace("'", '"').encode(), lambda trace: None)
    assert columns == plain


def test_a_second_trace_on_one_writer_encodes_its_own_args_like_the_plain_writer():
    first = b'{"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"x": 1}}]}'
    second = b'{"traceEvents": [{"ph": "X", "name": "b", "pid": 2, "tid": 2, "ts": 1, "dur": 1, "args": {"y": "z"}}]}'
    written = []
    for writer_class in (PerfettoWriter, PlainWriter):
        stream = io.BytesIO()
        writer = writer_class(stream)
        for text in (first, second):
            writer.write(parse_trace_text(text))
        writer.close()
        written.append(stream.getvalue())
    assert written[0] == written[1]


@given(st.lists(st.one_of(st.integers(0, 2**63 - 1), st.integers(-2**63, -1), st.sampled_from([0, 127, 128, 2**63 - 1])),
                max_size=50))
def test_varints_of_a_column_are_the_varints_of_each_value(values):
    matrix, lengths = varint_matrix(np.array(values, np.int64))
    assert [bytes(row[:length]) for row, length in zip(matrix, lengths)] == [varint(v) for v in values]
    assert [varint(v) for v in values] == [_varint(v) for v in values]


def test_the_helpers_share_falls_to_one_part_and_rises_again():
    """A helper the writer keeps waiting for still takes a part of every batch: only such a
    batch tells when it keeps up again."""
    share = perfetto_writer._HelperShare()
    for _ in range(40):
        share.waited(1.0)
    assert [len(share.of(parts)) for parts in (1, 8, 40)] == [1, 1, 2]
    for _ in range(40):
        share.waited(0.0)
    assert [len(share.of(parts)) for parts in (1, 8, 40)] == [1, 8, 38]


def test_a_track_waits_for_the_tracks_its_momentary_targets_come_from():
    a, b, c, x, y = (Track(name=name) for name in "abcxy")
    assert write_order([x, y], []) == [x, y]
    assert write_order([c, b, a], [(b, c), (a, b)]) == [a, b, c]
    assert write_order([x, b, y, a], [(a, b), (a, b), (b, b)]) == [x, y, a, b]
    # A cycle (a and b wait for each other) is broken at its first track once nothing else is ready.
    assert write_order([a, b, x], [(a, b), (b, a)]) == [x, a, b]
    # Nothing waits for a track whose slices are not written.
    assert write_order([b, a], [(x, b), (a, b)]) == [a, b]
    assert write_order([b, a], [(x, b)]) == [b, a]
