"""Trace model -> native Perfetto protobuf (a stream of TracePackets), encoded by hand.

All packets share one trusted sequence so names, categories and annotation names are
interned once. Slices are emitted per track in nesting order, so every SLICE_END closes the
slice it belongs to; flows get one id per arrow.
"""

from __future__ import annotations

from collections import defaultdict
from typing import BinaryIO

from .annotations import AnnotationEncoder
from .layout import nesting_order
from .model import Slice, Trace, Track
from .wire import (WIRE_BYTES, WIRE_FIXED64, WIRE_VARINT, bytes_field, double_field, fixed64,
                   string_field, tag, varint, varint_field)

SEQUENCE_ID = 1
_FLUSH_BYTES = 1 << 22

# perfetto.protos field numbers (see proto/cgtrace_subset.proto).
_TRACE_PACKET = tag(1, WIRE_BYTES)
_TIMESTAMP = tag(8, WIRE_VARINT)
_TRACK_EVENT = tag(11, WIRE_BYTES)
_INTERNED_DATA = tag(12, WIRE_BYTES)
_SEQUENCE = varint_field(10, SEQUENCE_ID)
_NEEDS_STATE = varint_field(13, 2)       # SEQ_NEEDS_INCREMENTAL_STATE
_STATE_CLEARED = varint_field(13, 1)     # SEQ_INCREMENTAL_STATE_CLEARED
_FIRST_ON_SEQUENCE = varint_field(87, 1)
_TRACK_DESCRIPTOR = 60

_TYPE_BEGIN = varint_field(9, 1)
_TYPE_END = varint_field(9, 2)
_TYPE_INSTANT = varint_field(9, 3)
_TYPE_COUNTER = varint_field(9, 4)
_TRACK_UUID = 11
_NAME_IID = 10
_CATEGORY_IIDS = 3
_FLOW_ID = tag(47, WIRE_FIXED64)
_TERMINATING_FLOW_ID = tag(48, WIRE_FIXED64)
_DOUBLE_COUNTER_VALUE = 44

_INTERNED_CATEGORIES, _INTERNED_NAMES, _INTERNED_ANNOTATION_NAMES = 1, 2, 3
_SIBLING_MERGE_NONE = varint_field(15, 2)
_CHILD_ORDERING_EXPLICIT = varint_field(11, 3)


class _Interner:
    """Iids for one kind of interned string; new entries wait in `pending` for the next packet."""

    def __init__(self, field: int):
        self.field = field
        self.iids: dict[str, int] = {}
        self.pending: list[bytes] = []

    def __call__(self, text: str) -> int:
        iid = self.iids.get(text)
        if iid is None:
            iid = self.iids[text] = len(self.iids) + 1
            self.pending.append(bytes_field(self.field, varint_field(1, iid) + string_field(2, text)))
        return iid

    def take_pending(self) -> bytes:
        entries = b"".join(self.pending)
        self.pending.clear()
        return entries


class PerfettoWriter:
    """Writes traces to a binary stream; uuids and flow ids keep counting across `write` calls,
    so several traces can share one file without collisions."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.buffer = bytearray()
        self.names = _Interner(_INTERNED_NAMES)
        self.categories = _Interner(_INTERNED_CATEGORIES)
        self.annotation_names = _Interner(_INTERNED_ANNOTATION_NAMES)
        self.annotations = AnnotationEncoder(self.annotation_names)
        self.next_uuid = 1
        self.next_flow_id = 1
        self.packets = 0
        self._emit(_SEQUENCE + _STATE_CLEARED + _FIRST_ON_SEQUENCE)

    def write(self, trace: Trace) -> None:
        uuids = self._write_descriptors(trace)
        flows_out, flows_in = self._flow_ids(trace)
        by_track: dict[int, list[Slice]] = defaultdict(list)
        for slice_ in trace.slices:
            by_track[id(slice_.track)].append(slice_)
        for track in trace.tracks:
            slices = by_track.get(id(track))
            if slices:
                self._write_track_slices(uuids[id(track)], slices, flows_out, flows_in)
        for sample in trace.counters:
            event = _TYPE_COUNTER + varint_field(_TRACK_UUID, uuids[id(sample.track)]) + \
                double_field(_DOUBLE_COUNTER_VALUE, sample.value)
            self._emit(_TIMESTAMP + varint(sample.ts) + _SEQUENCE + _TRACK_EVENT + varint(len(event)) + event)

    def close(self) -> None:
        self.stream.write(self.buffer)
        self.buffer.clear()

    # -- descriptors ----------------------------------------------------------------------
    def _write_descriptors(self, trace: Trace) -> dict[int, int]:
        uuids: dict[int, int] = {}
        process_uuids: dict[int, int] = {}
        for process in trace.processes:
            uuid = process_uuids[id(process)] = self._take_uuid()
            descriptor = varint_field(1, process.pid) + string_field(6, process.display_name)
            for label in process.labels:
                descriptor += string_field(8, label)
            self._emit_descriptor(varint_field(1, uuid) + bytes_field(3, descriptor))
        for track in trace.tracks:
            uuids[id(track)] = self._take_uuid()
        for track in trace.tracks:
            self._emit_descriptor(self._track_descriptor(track, uuids, process_uuids))
        return uuids

    def _track_descriptor(self, track: Track, uuids: dict, process_uuids: dict) -> bytes:
        body = varint_field(1, uuids[id(track)])
        thread = track.thread
        if thread is not None:
            descriptor = varint_field(1, thread.process.pid) + varint_field(2, thread.tid) + \
                string_field(5, thread.display_name)
            return body + bytes_field(4, descriptor)
        if track.parent is not None:
            body += varint_field(5, uuids[id(track.parent)])
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

    def _emit_descriptor(self, descriptor: bytes) -> None:
        self._emit(_SEQUENCE + bytes_field(_TRACK_DESCRIPTOR, descriptor))

    def _take_uuid(self) -> int:
        uuid = self.next_uuid
        self.next_uuid += 1
        return uuid

    # -- events -----------------------------------------------------------------------------
    def _flow_ids(self, trace: Trace):
        flows_out: dict[int, list[int]] = defaultdict(list)
        flows_in: dict[int, list[int]] = defaultdict(list)
        for flow in trace.flows:
            flow_id = self.next_flow_id
            self.next_flow_id += 1
            flows_out[id(flow.source)].append(flow_id)
            flows_in[id(flow.target)].append(flow_id)
        return flows_out, flows_in

    def _write_track_slices(self, uuid: int, slices: list[Slice], flows_out, flows_in) -> None:
        track_field = varint_field(_TRACK_UUID, uuid)
        end_event = _TYPE_END + track_field
        end_tail = _SEQUENCE + _TRACK_EVENT + varint(len(end_event)) + end_event
        names, categories, encode_args = self.names, self.categories, self.annotations.encode
        emit = self._emit
        open_ends: list[int] = []
        for slice_ in nesting_order(slices):
            start = slice_.ts
            while open_ends and open_ends[-1] <= start:
                emit(_TIMESTAMP + varint(open_ends.pop()) + end_tail)
            event = (_TYPE_INSTANT if slice_.is_instant else _TYPE_BEGIN) + track_field + \
                varint_field(_NAME_IID, names(slice_.name))
            if slice_.cat:
                event += varint_field(_CATEGORY_IIDS, categories(slice_.cat))
            if slice_.args is not None:
                event += encode_args(slice_.args)
            key = id(slice_)
            if key in flows_out:
                event += b"".join(_FLOW_ID + fixed64(f) for f in flows_out[key])
            if key in flows_in:
                event += b"".join(_TERMINATING_FLOW_ID + fixed64(f) for f in flows_in[key])
            interned = self._take_interned()
            packet = _TIMESTAMP + varint(start) + _SEQUENCE + _NEEDS_STATE
            if interned:
                packet += _INTERNED_DATA + varint(len(interned)) + interned
            emit(packet + _TRACK_EVENT + varint(len(event)) + event)
            if not slice_.is_instant:
                open_ends.append(start + slice_.dur)
        while open_ends:
            emit(_TIMESTAMP + varint(open_ends.pop()) + end_tail)

    def _take_interned(self) -> bytes:
        if not (self.names.pending or self.categories.pending or self.annotation_names.pending):
            return b""
        return self.categories.take_pending() + self.names.take_pending() + \
            self.annotation_names.take_pending()

    def _emit(self, packet: bytes) -> None:
        buffer = self.buffer
        buffer += _TRACE_PACKET
        buffer += varint(len(packet))
        buffer += packet
        self.packets += 1
        if len(buffer) >= _FLUSH_BYTES:
            self.stream.write(buffer)
            buffer.clear()
