"""Trace model -> native Perfetto protobuf (a stream of TracePackets), encoded by hand.

All packets share one trusted sequence so names, categories and annotation names are
interned once. Slices are emitted per track in nesting order, so every SLICE_END closes the
slice it belongs to; flows get one id per arrow.
"""

from __future__ import annotations

import time
from collections import defaultdict
from functools import partial
from itertools import repeat
from operator import attrgetter
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Mapping, Optional

import numpy as np

from .. import progress
from ..model import CounterScale, ExtraArgs, PreparedArgs, Process, SliceTable, Trace, Track, roles_document
from ..model.columns import first_positions
from ..model.nesting import clear_points
from ..tuning import DEFAULT_TUNING, Tuning
from .annotations import ArgsEncoder, annotation
from .event_order import events_in_write_order
from .interning import EVENT_CATEGORIES, EVENT_NAMES, Interner, annotation_name_interner
from .fields import (ChromeEventBundle, ChromeMetadata, CounterDescriptor, ProcessDescriptor, ThreadDescriptor,
                     TrackDescriptor, TracePacket, TrackEvent)
from .flow_fields import FlowFields, write_order
from .packets import Column, Pieces, Rows, Spliced
from .prepared_args import ARGS_FORM, EncodedArgs, prepare_in_process
from .slice_packets import TRACE_PACKET, ArgsRuns, PacketHelper, PacketTags, SliceBatch, encode_batch, packets
from .wire import WIRE_BYTES, bytes_field, length_prefixed, string_field, tag, varint_field

_HELPER_SHARE_FIRST = 0.6      # of a batch's packet parts, encoded by the args helper where there is one
_HELPER_SHARE_STEP = 0.05
_HELPER_WAIT_TOLERATED = 1e-3  # seconds

_INTERNED_DATA = tag(TracePacket.INTERNED_DATA, WIRE_BYTES)
_NEEDS_STATE = varint_field(TracePacket.SEQUENCE_FLAGS, TracePacket.SequenceFlags.SEQ_NEEDS_INCREMENTAL_STATE)
_STATE_CLEARED = varint_field(TracePacket.SEQUENCE_FLAGS, TracePacket.SequenceFlags.SEQ_INCREMENTAL_STATE_CLEARED)
_FIRST_ON_SEQUENCE = varint_field(TracePacket.FIRST_PACKET_ON_SEQUENCE, True)

_TYPE_BEGIN = varint_field(TrackEvent.TYPE, TrackEvent.Type.TYPE_SLICE_BEGIN)
_TYPE_END = varint_field(TrackEvent.TYPE, TrackEvent.Type.TYPE_SLICE_END)
_TYPE_INSTANT = varint_field(TrackEvent.TYPE, TrackEvent.Type.TYPE_INSTANT)
_TYPE_COUNTER = varint_field(TrackEvent.TYPE, TrackEvent.Type.TYPE_COUNTER)
_ID = np.int32               # a piece's id

_START, _TRACK, _VALUE, _FLAT = map(attrgetter, ("ts", "track", "value", "flat"))
_SIBLING_MERGE_NONE = varint_field(TrackDescriptor.SIBLING_MERGE_BEHAVIOR,
                                   TrackDescriptor.SiblingMergeBehavior.SIBLING_MERGE_BEHAVIOR_NONE)
_CHILD_ORDERING_EXPLICIT = varint_field(TrackDescriptor.CHILD_ORDERING, TrackDescriptor.ChildTracksOrdering.EXPLICIT)


class PerfettoWriter:
    """Writes traces to a binary stream; uuids and flow ids keep counting across `write` calls,
    so several traces can share one file without collisions."""

    def __init__(self, stream: BinaryIO, sequence_id: int = 1, uuid_base: int = 0, flow_id_base: int = 0,
                 tuning: Tuning = DEFAULT_TUNING):
        """Several writers may fill one file (a merge writes one part per rank): each needs its
        own sequence id (interning is per sequence) and disjoint uuid and flow-id ranges."""
        self.stream = stream
        self.tuning = tuning
        self._flush_bytes = tuning.flush_bytes
        self.sequence = varint_field(TracePacket.TRUSTED_PACKET_SEQUENCE_ID, sequence_id)
        self.buffer = bytearray()
        self.pending_interned: list[bytes] = []
        self.names = Interner(EVENT_NAMES, self.pending_interned)
        self.categories = Interner(EVENT_CATEGORIES, self.pending_interned)
        self.annotation_names = annotation_name_interner(self.pending_interned)
        self.args = ArgsEncoder(self.annotation_names.field, tuning)
        self._heads: dict[tuple, bytes] = {}
        self.next_uuid = uuid_base + 1
        self.next_flow_id = flow_id_base + 1
        self._emit(self.sequence + _STATE_CLEARED + _FIRST_ON_SEQUENCE)

    def write(self, trace: Trace, extra_args: Optional[ExtraArgs] = None) -> None:
        """The trace's derived args (its launch attribution) and `extra_args` (a merge's
        collective figures): per row, debug annotations (name -> value) its slice carries beside
        its own args, which are written as read, so what a stage derives about a slice is never
        mistaken for what the profiler recorded. Each distinct value is encoded once."""
        uuids, process_uuids = self._write_descriptors(trace)
        self._write_track_roles(trace, uuids, process_uuids)
        flow_fields = FlowFields(trace, self.next_flow_id)
        self.next_flow_id = flow_fields.next_flow_id
        self._extra_encoded: dict[int, bytes] = {}  # per value of extra_args, its annotations encoded
        self._write_slices(trace, uuids, flow_fields,
                          trace.derived_args if extra_args is None else trace.derived_args.joined(extra_args))
        self._write_counters(trace, uuids)

    def close(self) -> None:
        self.stream.write(self.buffer)
        self.buffer.clear()

    # -- descriptors ----------------------------------------------------------------------
    def _write_descriptors(self, trace: Trace) -> tuple[dict[int, int], dict[int, int]]:
        """Every process's and track's descriptor; returns the uuids given to tracks and to
        processes (by id of the model object)."""
        process_uuids = {id(process): self._take_uuid() for process in trace.processes}
        uuids = {id(track): track.uuid if track.uuid is not None else self._take_uuid() for track in trace.tracks}
        uuids.update((id(process.activity), process_uuids[id(process)]) for process in trace.processes
                     if process.activity is not None)
        for process in trace.processes:
            self._emit_descriptor(_process_descriptor(process, process_uuids[id(process)], uuids))
        for track in trace.tracks:
            self._emit_descriptor(self._track_descriptor(track, uuids, process_uuids))
        return uuids, process_uuids

    def _track_descriptor(self, track: Track, uuids: dict, process_uuids: dict) -> bytes:
        body = varint_field(TrackDescriptor.UUID, uuids[id(track)])
        thread = track.thread
        if thread is not None and thread.process.row_group:
            return body + varint_field(TrackDescriptor.PARENT_UUID, process_uuids[id(thread.process)]) + \
                string_field(TrackDescriptor.NAME, thread.row_title) + _SIBLING_MERGE_NONE
        if thread is not None:
            descriptor = varint_field(ThreadDescriptor.PID, thread.process.pid) + \
                varint_field(ThreadDescriptor.TID, thread.tid) + \
                string_field(ThreadDescriptor.THREAD_NAME, thread.display_name)
            return body + bytes_field(TrackDescriptor.THREAD, descriptor)
        shown_under = track.folded_under or track.parent
        if shown_under is not None:
            body += varint_field(TrackDescriptor.PARENT_UUID, _uuid_of(shown_under, uuids))
        elif track.process is not None:
            body += varint_field(TrackDescriptor.PARENT_UUID, process_uuids[id(track.process)])
        body += string_field(TrackDescriptor.NAME, track.name) + _SIBLING_MERGE_NONE
        if track.order:
            body += varint_field(TrackDescriptor.SIBLING_ORDER_RANK, track.order)
        if track.orders_children:
            body += _CHILD_ORDERING_EXPLICIT
        if track.is_counter:
            body += _counter_descriptor(track.scale)
        return body

    def _write_track_roles(self, trace: Trace, uuids: dict[int, int], process_uuids: dict[int, int]) -> None:
        """What each compacted track is for, as data trace_processor keeps (its `metadata`
        table), so queries never read it from a display name: one document per writer call,
        as model/roles_document.py defines it."""
        document = roles_document.document_of(trace, partial(_uuid_of, uuids=uuids),
                                              lambda process: process_uuids[id(process)])
        if document is None:
            return
        entry = string_field(ChromeMetadata.NAME, roles_document.NAME) + \
            string_field(ChromeMetadata.STRING_VALUE, roles_document.encode(document))
        self._emit(self.sequence + bytes_field(TracePacket.CHROME_EVENTS, bytes_field(ChromeEventBundle.METADATA, entry)))

    def _emit_descriptor(self, descriptor: bytes) -> None:
        self._emit(self.sequence + bytes_field(TracePacket.TRACK_DESCRIPTOR, descriptor))

    def _take_uuid(self) -> int:
        uuid = self.next_uuid
        self.next_uuid += 1
        return uuid

    # -- events -----------------------------------------------------------------------------
    def _write_slices(self, trace: Trace, uuids: dict[int, int], flow_fields: FlowFields,
                      extra_args: ExtraArgs) -> None:
        """Every track's slices in nesting order (flat tracks in start order), each END as soon as
        its slice is over, a batch of tracks (or of a long track's stretches) at a time. Where
        the args helper is still there, it encodes the later parts of each batch's packets
        while this process makes the next batch and encodes the first parts (_HelperShare)."""
        prepared: Optional[PreparedArgs] = None
        helper: Optional[PacketHelper] = None
        share = _HelperShare()
        waiting: Optional[tuple[PacketHelper, SliceBatch, ArgsRuns, range]] = None  # parts the helper encodes
        tracks = write_order(trace.tracks, flow_fields.sources_first)
        batches = _batches(trace.slices, _runs(trace.slices, tracks, uuids), self.tuning.slices_at_once)
        written = 0
        for number, runs in enumerate(batches):
            progress.report(f"writing slices: {written * 100 // len(trace.slices)}%")
            written += sum(len(rows) for _, rows in runs)
            if number == 0:  # interns the annotation names first: only where a slice follows
                prepared = self._prepared_args(trace)
                helper = prepared.take_packet_helper() if isinstance(prepared, EncodedArgs) else None
            batch, args_runs = self._slice_batch(trace, runs, prepared, flow_fields, extra_args)
            if waiting is not None:
                self._write_shared(share, *waiting)
                waiting = None
            helper_parts = share.of(batch.parts)
            if helper is not None and helper.submit(batch, helper_parts):
                waiting = helper, batch, args_runs, helper_parts
            else:
                self._write_encoded(encode_batch(batch, args_runs))
        if waiting is not None:
            self._write_shared(share, *waiting)
        if helper is not None:
            helper.close()

    def _write_shared(self, share: "_HelperShare", helper: PacketHelper, batch: SliceBatch, args_runs: ArgsRuns,
                      helper_parts: range) -> None:
        """A batch whose `helper_parts` the helper encodes: the others encoded here, then the
        helper's (or, where it failed, those too)."""
        self._write_encoded(encode_batch(batch, args_runs, range(helper_parts.start)))
        waiting_since = time.perf_counter()
        finished = helper.finished()
        share.waited(time.perf_counter() - waiting_since)
        if finished:
            self._flush()
            helper.copy_to(self.stream)
        else:
            self._write_encoded(encode_batch(batch, args_runs, helper_parts))

    def _write_encoded(self, parts: Iterable[np.ndarray]) -> None:
        self._flush()
        for part in parts:
            self.stream.write(part.data)

    def _slice_batch(self, trace: Trace, runs: list[tuple[bytes, np.ndarray]], prepared: Optional[PreparedArgs],
                     flow_fields: FlowFields, extra_args: ExtraArgs) -> tuple[SliceBatch, ArgsRuns]:
        """Runs of rows (a track's, or a stretch of one that nothing open spans) as the
        columns their packets are encoded from (slice_packets.py), and where their args are."""
        table = trace.slices
        rows = np.concatenate([run for _, run in runs])
        run_lengths = [len(run) for _, run in runs]
        starts = table.ts[rows]
        ends = starts + table.dur[rows]
        instant = table.instant[rows]
        events = events_in_write_order(starts, ends, instant, run_lengths)

        pieces = Pieces()
        interned: dict[int, list[bytes]] = defaultdict(list)  # slice index -> InternedData entries first met there
        names = self._name_fields(table, rows, pieces, interned)
        args = table.args[rows]
        args_runs: ArgsRuns
        if prepared is None:
            args_source, args_starts, args_lengths = self._encode_args(trace, args, interned)
            args_runs = partial(Spliced, args_source)
        else:
            args_source, args_starts, args_lengths = prepared.runs(args)
            args_runs = partial(Spliced, args_source, release=prepared.release_pages)
        extras = self._extra_fields(rows, extra_args, pieces, interned)
        state = np.full(len(rows), pieces.id(self.sequence + _NEEDS_STATE), _ID)
        for first_use, entries in interned.items():
            state[first_use] = pieces.id(self.sequence + _NEEDS_STATE + _INTERNED_DATA + length_prefixed(b"".join(entries)))
        none = pieces.id(b"")
        flows = flow_fields.of(rows)
        heads = [(pieces.id(_TYPE_BEGIN + field), pieces.id(_TYPE_INSTANT + field), pieces.id(_TYPE_END + field))
                 for field, _ in runs]
        begin_head, instant_head, end_head = np.repeat(np.array(heads, _ID), run_lengths, axis=0).T
        begin_head = np.where(instant, instant_head, begin_head)
        tags = PacketTags.of(pieces, self.sequence)
        return SliceBatch(pieces.table(), tags, none, events, starts, ends, state, names, begin_head, end_head,
                          args_starts, args_lengths, extras, flows, self.tuning.packets_at_once), args_runs

    def _extra_fields(self, rows: np.ndarray, extra_args: ExtraArgs, pieces: Pieces,
                      interned: dict[int, list[bytes]]) -> np.ndarray:
        """Per row, the piece of the annotations `extra_args` gives it, the empty piece for the
        others; an empty column where no row of the batch has any, so its packets are as
        without them. Each distinct value is encoded once per write, in the order rows first
        use it, so a name met for the first time is defined in that slice's packet."""
        given = extra_args.rows
        if not len(given):
            return np.zeros(0, _ID)
        at = np.minimum(np.searchsorted(given, rows), len(given) - 1)
        chosen = np.flatnonzero(given[at] == rows)
        if not len(chosen):
            return np.zeros(0, _ID)
        values, first, inverse = np.unique(extra_args.which[at[chosen]], return_index=True, return_inverse=True)
        name_field, pending = self.annotation_names.field, self.pending_interned
        ids = np.zeros(len(values), _ID)
        for position in np.argsort(first, kind="stable").tolist():
            value = int(values[position])
            encoded = self._extra_encoded.get(value)
            if encoded is None:
                encoded = self._extra_encoded[value] = b"".join(
                    annotation(name, entry, name_field) for name, entry in extra_args.values[value].items())
                if pending:
                    interned[int(chosen[first[position]])] += pending
                    pending.clear()
            ids[position] = pieces.id(encoded)
        extras = np.full(len(rows), pieces.id(b""), _ID)
        extras[chosen] = ids[inverse.reshape(-1)]
        return extras

    def _name_fields(self, table: SliceTable, rows: np.ndarray, pieces: Pieces,
                     interned: dict[int, list[bytes]]) -> np.ndarray:
        """Per row, the piece of its interned name and category references; a name or
        category met for the first time is defined in that slice's packet."""
        if self.pending_interned:  # defined in the first packet, before anything it needs itself
            interned[0] += self.pending_interned
            self.pending_interned.clear()
        heads, name_field, category_field = self._heads, self.names.field, self.categories.field
        texts, name_ids, category_ids = table.texts, table.name[rows], table.cat[rows]

        def piece_of(index: int) -> int:
            key = texts[name_ids[index]], texts[category_ids[index]]  # by text: heads outlive the table
            fields = heads.get(key)
            if fields is None:
                name, cat = key
                fields = heads[key] = name_field(name) + (category_field(cat) if cat else b"")
                if self.pending_interned:  # not where both were met before, in other pairs
                    interned[index] += self.pending_interned
                    self.pending_interned.clear()
            return pieces.id(fields)

        # A text has one id, so the pairs of ids first occur where the pairs of texts do.
        return _pieces_by_first_use(name_ids.astype(np.int64) * len(texts) + category_ids, piece_of)

    def _prepared_args(self, trace: Trace) -> Optional[PreparedArgs]:
        """The store's entries prepared in this writer's form (by the args accelerator, or here,
        once per store: prepared_args.py), with their annotation names interned first so that
        their iids are ours; None for a writer that already interned names for an earlier
        trace, which encodes each slice's args itself."""
        if self.annotation_names.references:
            return None
        store = trace.args
        prepared = store.prepared(ARGS_FORM)
        if prepared is None:
            prepared = prepare_in_process(store, tuning=self.tuning)
            store.keep_prepared(ARGS_FORM, prepared)
        for name in prepared.interned:
            if name is None:
                self.annotation_names.skip()
            else:
                self.annotation_names.field(name)
        return prepared

    def _encode_args(self, trace: Trace, args: np.ndarray,
                     interned: dict[int, list[bytes]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each slice's args (its args column, in order) encoded here: (their bytes, each one's
        start, length)."""
        encode, text, pending = self.args.encode, trace.args.text, self.pending_interned
        encoded = []
        for index, reference in enumerate(args.tolist()):
            encoded.append(b"" if reference < 0 else encode(text(reference)))
            if pending:
                interned[index] += pending
                pending.clear()
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        return np.frombuffer(b"".join(encoded), np.uint8), np.cumsum(lengths) - lengths, lengths

    def _write_counters(self, trace: Trace, uuids: dict[int, int]) -> None:
        samples = trace.counters
        pieces = Pieces()
        head = _pieces_by_first_use(first_positions(map(_TRACK, samples), len(samples))[0], lambda index: pieces.id(
            _TYPE_COUNTER + varint_field(TrackEvent.TRACK_UUID, uuids[id(samples[index].track)])))
        times = np.fromiter(map(_START, samples), np.int64, len(samples))
        values = np.fromiter(map(_VALUE, samples), "<f8", len(samples))
        tags = PacketTags.of(pieces, self.sequence)
        table, at_once = pieces.table(), self.tuning.packets_at_once
        for first in range(0, len(samples), at_once):
            part = slice(first, first + at_once)
            event = Rows(len(times[part]), table).piece(head[part]).piece(tags.value) \
                .add(Column.of_fixed(values[part].view(np.uint8), 8))
            self._write_encoded([packets(table, tags, times[part], tags.sequence, event)])

    def _emit(self, packet: bytes) -> None:
        self.buffer += TRACE_PACKET + length_prefixed(packet)
        if len(self.buffer) >= self._flush_bytes:
            self._flush()

    def _flush(self) -> None:
        self.stream.write(self.buffer)
        self.buffer.clear()


def _pieces_by_first_use(codes: np.ndarray, piece_of: Callable[[int], int]) -> np.ndarray:
    """Per code (equal values, equal codes), its piece id: `piece_of(index)` is asked once per
    distinct code, at the index of its first occurrence and in their order, so the Python
    steps are per distinct value."""
    distinct_first, inverse = np.unique(codes, return_index=True, return_inverse=True)[1:]
    pieces = np.empty(len(distinct_first), _ID)
    for code in np.argsort(distinct_first).tolist():
        pieces[code] = piece_of(int(distinct_first[code]))
    return pieces[inverse]


class _HelperShare:
    """How many of a batch's last parts the helper encodes. Its share falls after the writer
    had to wait for it and rises after it did not, so both processes stay busy whatever the
    trace (the bytes written are the same at any share)."""

    def __init__(self) -> None:
        self.share = _HELPER_SHARE_FIRST

    def of(self, parts: int) -> range:
        """Of a batch's `parts` (one or more), at least one, however low the share: only a batch
        the helper takes part in tells whether it still keeps up."""
        return range(parts - max(1, round(parts * self.share)), parts)

    def waited(self, seconds: float) -> None:
        step = -_HELPER_SHARE_STEP if seconds > _HELPER_WAIT_TOLERATED else _HELPER_SHARE_STEP
        self.share = min(max(self.share + step, _HELPER_SHARE_STEP), 1 - _HELPER_SHARE_STEP)


def _runs(table: SliceTable, tracks: list[Track], uuids: dict[int, int]) -> Iterator[tuple[bytes, np.ndarray]]:
    """Each track's rows in write order, with its uuid field, a track at a time: one sort of
    the whole table by (the track's place in `tracks`, start, duration), so a track's rows
    are a piece of one array. Rows of a track not in `tracks` are not written."""
    place: dict[Track, int] = {}  # a track listed twice is written at its first place
    for index, track in enumerate(tracks):
        place.setdefault(track, index)
    unlisted = len(tracks)  # sorted after every listed track's rows
    track_places = np.fromiter(map(place.get, table.tracks, repeat(unlisted)), np.int32, len(table.tracks))
    track_ids, durations = table.track, table.dur
    # Nesting order (longest first), but a flat track's zero-duration slice goes before another
    # starting with it, which it would otherwise nest under; then by row (lexsort is stable).
    order = np.lexsort((np.where(table.track_mask(_FLAT)[track_ids], durations, -durations), table.ts,
                        track_places[track_ids]))
    places = track_places[track_ids[order]]
    written = int(np.searchsorted(places, unlisted))
    ordered, places = order[:written], places[:written]
    firsts = np.flatnonzero(np.diff(places, prepend=-1)).tolist()  # where each track's rows begin
    for first, last in zip(firsts, [*firsts[1:], written]):
        yield varint_field(TrackEvent.TRACK_UUID, uuids[id(tracks[places[first]])]), ordered[first:last]


def _batches(table: SliceTable, runs: Iterator[tuple[bytes, np.ndarray]], at_once: int
             ) -> Iterator[list[tuple[bytes, np.ndarray]]]:
    """Runs grouped into batches of about `at_once` slices; a longer run is cut where no
    slice is open (its stretches are written alike one by one), where it can be."""
    batch: list[tuple[bytes, np.ndarray]] = []
    size = 0
    for field, rows in runs:
        for stretch in _stretches(table, rows, at_once) if len(rows) > at_once else [rows]:
            if batch and size + len(stretch) > at_once:
                yield batch
                batch, size = [], 0
            batch.append((field, stretch))
            size += len(stretch)
    if batch:
        yield batch


def _stretches(table: SliceTable, ordered: np.ndarray, at_once: int) -> list[np.ndarray]:
    """A long run cut, about every `at_once` slices, where nothing is open (no END is
    pending across the cut)."""
    starts = table.ts[ordered]
    return np.split(ordered, clear_points(starts, starts + table.dur[ordered], at_once))


def _counter_descriptor(scale: Optional[CounterScale]) -> bytes:
    """A TrackDescriptor's counter field: with its unit and shared y scale where it has them."""
    body = b"" if scale is None else string_field(CounterDescriptor.UNIT_NAME, scale.unit) + \
        string_field(CounterDescriptor.Y_AXIS_SHARE_KEY, scale.shared_by)
    return bytes_field(TrackDescriptor.COUNTER, body)


def _process_descriptor(process: Process, uuid: int, uuids: dict[int, int]) -> bytes:
    """A process's descriptor, or for a row group a plain track (under its parent, if any,
    ranked among its siblings by its sort index)."""
    if process.row_group:
        parent = b"" if process.parent is None else \
            varint_field(TrackDescriptor.PARENT_UUID, _uuid_of(process.parent, uuids))
        order = b"" if process.sort_index is None else \
            varint_field(TrackDescriptor.SIBLING_ORDER_RANK, process.sort_index)
        counter = b"" if process.activity is None else _counter_descriptor(process.activity.scale)
        return varint_field(TrackDescriptor.UUID, uuid) + parent + \
            string_field(TrackDescriptor.NAME, process.display_name) + _SIBLING_MERGE_NONE + order + counter
    descriptor = varint_field(ProcessDescriptor.PID, process.pid) + \
        string_field(ProcessDescriptor.PROCESS_NAME, process.display_name)
    for label in process.labels:
        descriptor += string_field(ProcessDescriptor.PROCESS_LABELS, label)
    return varint_field(TrackDescriptor.UUID, uuid) + bytes_field(TrackDescriptor.PROCESS, descriptor)


def _uuid_of(track: Track, uuids: dict[int, int]) -> int:
    """A track's uuid: its own where it has a fixed one (a place outside this trace, such as a
    merge's root), else the one this writer gave it."""
    return track.uuid if track.uuid is not None else uuids[id(track)]
