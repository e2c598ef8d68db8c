"""Trace model -> native Perfetto protobuf (a stream of TracePackets), encoded by hand.

All packets share one trusted sequence so names, categories and annotation names are
interned once. Slices are emitted per track in nesting order, so every SLICE_END closes the
slice it belongs to; flows get one id per arrow.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, BinaryIO, Callable, Optional

import msgspec

from ..model import Process, Slice, Trace, Track, TrackRole
from ..model.nesting import nesting_order
from .annotations import ArgsEncoder
from .interning import (CATEGORY_IIDS, INTERNED_CATEGORIES, INTERNED_NAMES, NAME_IID, Interner,
                        annotation_name_interner)
from .prepared_args import ARGS_FORM, prepare_in_process
from .wire import (SMALL_VARINT_LIMIT, SMALL_VARINTS, WIRE_BYTES, WIRE_FIXED64, WIRE_VARINT, bytes_field,
                   double_field, fixed64, length_prefixed, string_field, tag, varint, varint_field)

_FLUSH_BYTES = 1 << 22
# trace_processor keeps it in `metadata` as "cr-cgtrace_track_roles" (or "cr-<k>-cgtrace_track_roles").
TRACK_ROLES_NAME = "cgtrace_track_roles"

# perfetto.protos field numbers (see proto/cgtrace_subset.proto).
_TRACE_PACKET = tag(1, WIRE_BYTES)
_TIMESTAMP = tag(8, WIRE_VARINT)
_TRACK_EVENT = tag(11, WIRE_BYTES)
_INTERNED_DATA = tag(12, WIRE_BYTES)
_NEEDS_STATE = varint_field(13, 2)       # SEQ_NEEDS_INCREMENTAL_STATE
_STATE_CLEARED = varint_field(13, 1)     # SEQ_INCREMENTAL_STATE_CLEARED
_FIRST_ON_SEQUENCE = varint_field(87, 1)
_TRACK_DESCRIPTOR = 60
_CHROME_EVENTS = 5
_CHROME_METADATA = 2

_TYPE_BEGIN = varint_field(9, 1)
_TYPE_END = varint_field(9, 2)
_TYPE_INSTANT = varint_field(9, 3)
_TYPE_COUNTER = varint_field(9, 4)
_TRACK_UUID = 11
_FLOW_ID = tag(47, WIRE_FIXED64)
_TERMINATING_FLOW_ID = tag(48, WIRE_FIXED64)
_DOUBLE_COUNTER_VALUE = 44

_SIBLING_MERGE_NONE = varint_field(15, 2)
_CHILD_ORDERING_EXPLICIT = varint_field(11, 3)


def _flat_order(slice_: Slice) -> tuple[int, int]:
    return slice_.ts, slice_.dur


class PerfettoWriter:
    """Writes traces to a binary stream; uuids and flow ids keep counting across `write` calls,
    so several traces can share one file without collisions."""

    def __init__(self, stream: BinaryIO, sequence_id: int = 1, uuid_base: int = 0, flow_id_base: int = 0):
        """Several writers may fill one file (a merge writes one part per rank): each needs its
        own sequence id (interning is per sequence) and disjoint uuid and flow-id ranges."""
        self.stream = stream
        self.sequence = varint_field(10, sequence_id)
        self.buffer = bytearray()
        self.pending_interned: list[bytes] = []
        self.names = Interner(INTERNED_NAMES, NAME_IID, self.pending_interned)
        self.categories = Interner(INTERNED_CATEGORIES, CATEGORY_IIDS, self.pending_interned)
        self.annotation_names = annotation_name_interner(self.pending_interned)
        self.args = ArgsEncoder(self.annotation_names.field)
        self._heads: dict[tuple, bytes] = {}
        self.next_uuid = uuid_base + 1
        self.next_flow_id = flow_id_base + 1
        self._emit(self.sequence + _STATE_CLEARED + _FIRST_ON_SEQUENCE)

    def write(self, trace: Trace) -> None:
        uuids, process_uuids = self._write_descriptors(trace)
        self._write_track_roles(trace, uuids, process_uuids)
        flows_at_begin, flows_at_end = self._flow_ids(trace)
        stored_args = self._stored_args_encoder(trace)
        by_track: dict[Track, list[Slice]] = defaultdict(list)  # model objects hash by identity
        for slice_ in trace.slices:
            by_track[slice_.track].append(slice_)
        for track in trace.tracks:
            slices = by_track.get(track)
            if slices:
                # A zero-duration slice at another's start would nest under it in nesting order.
                ordered = sorted(slices, key=_flat_order) if track.flat else nesting_order(slices)
                self._write_track_slices(uuids[id(track)], ordered, flows_at_begin, flows_at_end, stored_args)
        for sample in trace.counters:
            event = _TYPE_COUNTER + varint_field(_TRACK_UUID, uuids[id(sample.track)]) + \
                double_field(_DOUBLE_COUNTER_VALUE, sample.value)
            self._emit(_TIMESTAMP + varint(sample.ts) + self.sequence + _TRACK_EVENT + varint(len(event)) + event)

    def close(self) -> None:
        self.stream.write(self.buffer)
        self.buffer.clear()

    # -- descriptors ----------------------------------------------------------------------
    def _write_descriptors(self, trace: Trace) -> tuple[dict[int, int], dict[int, int]]:
        """Every process's and track's descriptor; returns the uuids given to tracks and to
        processes (by id of the model object)."""
        process_uuids = {id(process): self._take_uuid() for process in trace.processes}
        uuids = {id(track): track.uuid if track.uuid is not None else self._take_uuid() for track in trace.tracks}
        for process in trace.processes:
            self._emit_descriptor(_process_descriptor(process, process_uuids[id(process)], uuids))
        for track in trace.tracks:
            self._emit_descriptor(self._track_descriptor(track, uuids, process_uuids))
        return uuids, process_uuids

    def _track_descriptor(self, track: Track, uuids: dict, process_uuids: dict) -> bytes:
        body = varint_field(1, uuids[id(track)])
        thread = track.thread
        if thread is not None and thread.process.row_group:
            return body + varint_field(5, process_uuids[id(thread.process)]) + \
                string_field(2, thread.row_title) + _SIBLING_MERGE_NONE
        if thread is not None:
            descriptor = varint_field(1, thread.process.pid) + varint_field(2, thread.tid) + \
                string_field(5, thread.display_name)
            return body + bytes_field(4, descriptor)
        if track.parent is not None:
            body += varint_field(5, _parent_uuid(track.parent, uuids))
        elif track.process is not None:
            body += varint_field(5, process_uuids[id(track.process)])
        body += string_field(2, track.name) + _SIBLING_MERGE_NONE
        if track.order:
            body += varint_field(12, track.order)
        if track.orders_children:
            body += _CHILD_ORDERING_EXPLICIT
        if track.is_counter:
            body += bytes_field(8, b"")
        return body

    def _write_track_roles(self, trace: Trace, uuids: dict[int, int], process_uuids: dict[int, int]) -> None:
        """What each compacted track is for, as data trace_processor keeps (its `metadata`
        table), so queries never read it from a display name. One entry per writer call; a
        merged rank's also lists the rows standing for its processes ("groups"), whose
        children are its threads' rows."""
        roles = [_track_role(track, uuids) for track in trace.tracks if track.role is not TrackRole.PLAIN]
        if not roles and trace.rank is None:
            return
        document: dict[str, Any] = {"version": 1, "tracks": roles}
        if trace.rank is not None:
            document["rank"] = {"pp_rank": trace.rank.pp_rank, "global_rank": trace.rank.global_rank,
                                "groups": [process_uuids[id(p)] for p in trace.processes if p.row_group]}
        entry = string_field(1, TRACK_ROLES_NAME) + string_field(2, msgspec.json.encode(document).decode())
        self._emit(self.sequence + bytes_field(_CHROME_EVENTS, bytes_field(_CHROME_METADATA, entry)))

    def _emit_descriptor(self, descriptor: bytes) -> None:
        self._emit(self.sequence + bytes_field(_TRACK_DESCRIPTOR, descriptor))

    def _take_uuid(self) -> int:
        uuid = self.next_uuid
        self.next_uuid += 1
        return uuid

    # -- events -----------------------------------------------------------------------------
    def _stored_args_encoder(self, trace: Trace) -> Callable[[int], bytes]:
        """reference -> encoded args, taken from the store's entries prepared in this writer's
        form (by the args accelerator, or here, once per store: prepared_args.py), with their
        annotation names interned first so that their iids are ours. A writer that already
        interned names for an earlier trace encodes each slice's args itself."""
        store = trace.args
        if self.annotation_names.references:
            encode, text = self.args.encode, store.text
            return lambda reference: encode(text(reference))
        prepared = store.prepared(ARGS_FORM)
        if prepared is None:
            prepared = prepare_in_process(store)
            store.keep_prepared(ARGS_FORM, prepared)
        for name in prepared.interned:
            self.annotation_names.field(name)
        return prepared.of

    def _flow_ids(self, trace: Trace):
        """Per slice, the encoded flow ids for its BEGIN (outgoing, incoming) and for its END.

        trace_processor opens a flow at the event that lists its id in flow_ids and closes it
        at the next event listing it in terminating_flow_ids, in time order. An arrow whose
        target began no later than its source therefore terminates at the target's END.
        """
        at_begin: dict[Slice, bytes] = defaultdict(bytes)
        at_end: dict[Slice, bytes] = defaultdict(bytes)
        for flow in trace.flows:
            encoded = fixed64(self.next_flow_id)
            self.next_flow_id += 1
            source, target = flow.source, flow.target
            at_begin[source] += _FLOW_ID + encoded
            if target.ts > source.ts or target.is_instant or not target.dur:
                at_begin[target] += _TERMINATING_FLOW_ID + encoded
            else:
                at_end[target] += _TERMINATING_FLOW_ID + encoded
        for end in trace.flow_ends:
            field = _FLOW_ID if end.outgoing else _TERMINATING_FLOW_ID
            at_begin[end.slice] += field + fixed64(end.flow_id)
        return at_begin, at_end

    def _write_track_slices(self, uuid: int, slices: list[Slice], flows_at_begin, flows_at_end, stored_args) -> None:
        """BEGIN/INSTANT packets in the given (nesting) order, each END as soon as its slice is over."""
        track_field = varint_field(_TRACK_UUID, uuid)
        begin_head = _TYPE_BEGIN + track_field
        instant_head = _TYPE_INSTANT + track_field
        end_event = _TYPE_END + track_field
        end_tail = self.sequence + _TRACK_EVENT + length_prefixed(end_event)
        needs_state = self.sequence + _NEEDS_STATE
        needs_state_event = needs_state + _TRACK_EVENT
        name_field, category_field = self.names.field, self.categories.field
        heads = self._heads  # (name, cat) -> their interned fields, looked up once per slice
        begin_flows, end_flows = flows_at_begin.get, flows_at_end.get
        small, limit = SMALL_VARINTS, SMALL_VARINT_LIMIT
        pending = self.pending_interned
        buffer = self.buffer
        open_ends: list[tuple[int, bytes]] = []  # (end ts, END packet tail) of open slices
        for slice_ in slices:
            start = slice_.ts
            while open_ends and open_ends[-1][0] <= start:
                end, tail = open_ends.pop()
                packet = _TIMESTAMP + varint(end) + tail
                size = len(packet)
                buffer += _TRACE_PACKET + (small[size] if size < limit else varint(size)) + packet
            name, cat = slice_.name, slice_.cat
            fields = heads.get((name, cat))
            if fields is None:
                fields = heads[(name, cat)] = name_field(name) + (category_field(cat) if cat else b"")
            event = (instant_head if slice_.is_instant else begin_head) + fields
            args = slice_.args
            if args is not None:
                event += stored_args(args)
            flows = begin_flows(slice_)
            if flows is not None:
                event += flows
            size = len(event)
            if pending:
                packet = _TIMESTAMP + varint(start) + needs_state + _INTERNED_DATA + \
                    length_prefixed(b"".join(pending)) + _TRACK_EVENT + \
                    (small[size] if size < limit else varint(size)) + event
                pending.clear()
            else:
                packet = _TIMESTAMP + varint(start) + needs_state_event + \
                    (small[size] if size < limit else varint(size)) + event
            size = len(packet)
            buffer += _TRACE_PACKET + (small[size] if size < limit else varint(size)) + packet
            if not slice_.is_instant:
                flows = end_flows(slice_)
                if flows is None:
                    open_ends.append((start + slice_.dur, end_tail))
                else:
                    open_ends.append((start + slice_.dur,
                                      self.sequence + _TRACK_EVENT + length_prefixed(end_event + flows)))
            if len(buffer) >= _FLUSH_BYTES:
                self._flush()
        while open_ends:
            end, tail = open_ends.pop()
            buffer += _TRACE_PACKET + length_prefixed(_TIMESTAMP + varint(end) + tail)
        self._flush()

    def _emit(self, packet: bytes) -> None:
        self.buffer += _TRACE_PACKET + length_prefixed(packet)
        if len(self.buffer) >= _FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        self.stream.write(self.buffer)
        self.buffer.clear()


def _process_descriptor(process: Process, uuid: int, uuids: dict[int, int]) -> bytes:
    """A process's descriptor, or for a row group a plain track (under its parent, if any,
    ranked among its siblings by its sort index)."""
    if process.row_group:
        parent = b"" if process.parent is None else varint_field(5, _parent_uuid(process.parent, uuids))
        order = b"" if process.sort_index is None else varint_field(12, process.sort_index)
        return varint_field(1, uuid) + parent + string_field(2, process.display_name) + _SIBLING_MERGE_NONE + order
    descriptor = varint_field(1, process.pid) + string_field(6, process.display_name)
    for label in process.labels:
        descriptor += string_field(8, label)
    return varint_field(1, uuid) + bytes_field(3, descriptor)


def _parent_uuid(parent: Track, uuids: dict[int, int]) -> int:
    """A parent's uuid: its own where it has a fixed one (a place outside this trace, such as a
    merge's root), else the one this writer gave it."""
    return parent.uuid if parent.uuid is not None else uuids[id(parent)]


def _track_role(track: Track, uuids: dict[int, int]) -> dict[str, Any]:
    role: dict[str, Any] = {"uuid": _uuid_of(track, uuids), "role": track.role.value}
    if track.group is not None:
        role.update(group=track.group.id, label=track.group.label, kind=track.group.kind.value)
    if track.home is not None:
        role["home"] = _uuid_of(track.home, uuids)
    if track.layer:
        role["layer"] = track.layer
    return role


def _uuid_of(track: Track, uuids: dict[int, int]) -> Optional[int]:
    return track.uuid if track.uuid is not None else uuids.get(id(track))
