"""A batch of slices' packets as plain columns, and their encoding from those columns alone.

The writer turns a batch of the slice table's rows into columns: times, the pieces each
packet takes (tags, track heads, interned names), the runs of encoded args and flow ids.
All that follows is numpy on those columns, about half of writing, and it needs nothing
from the model. So it can run where a core is free: in the args helper, which also holds the
encoded args the packets copy (args_accelerator.py). Both places run `encode_batch`, so
they write the same bytes.
"""

from __future__ import annotations

from typing import Any, BinaryIO, Callable, Iterator, Protocol

import msgspec
import numpy as np

from .fields import Trace, TracePacket, TrackEvent
from .flow_fields import SliceFlowFields
from .packets import Column, PieceTable, Pieces, Rows, Spliced
from .wire import WIRE_BYTES, WIRE_FIXED64, WIRE_VARINT, tag

TRACE_PACKET = tag(Trace.PACKET, WIRE_BYTES)
_TIMESTAMP = tag(TracePacket.TIMESTAMP, WIRE_VARINT)
_TRACK_EVENT = tag(TracePacket.TRACK_EVENT, WIRE_BYTES)
_DOUBLE_COUNTER_TAG = tag(TrackEvent.DOUBLE_COUNTER_VALUE, WIRE_FIXED64)

ArgsRuns = Callable[[np.ndarray, np.ndarray], Spliced]  # (starts, lengths) -> those runs of the encoded args


class PacketTags(msgspec.Struct, frozen=True):
    """The pieces every packet of a sequence has: field tags, and its sequence id."""

    packet: int
    time: int
    event: int
    value: int
    sequence: int

    @classmethod
    def of(cls, pieces: Pieces, sequence: bytes) -> "PacketTags":
        return cls(*(pieces.id(piece) for piece in (TRACE_PACKET, _TIMESTAMP, _TRACK_EVENT, _DOUBLE_COUNTER_TAG,
                                                     sequence)))


class SliceBatch(msgspec.Struct, frozen=True):
    """A batch's packets as columns. `events`: 2i is slice i's BEGIN (or instant), 2i + 1 its
    END, in write order; per slice: its start and end, the state pieces its BEGIN carries,
    its name's piece, its BEGIN and END heads, where its encoded args lie; `extras`: per slice
    the piece of annotations its BEGIN carries beside its args (empty: none in the batch);
    `flows`: the flow ids its BEGIN and END carry; `none`: the empty piece; `packets_at_once`: a part's packets
    (the writer's tuning, which the args helper encoding some parts follows too)."""

    table: PieceTable
    tags: PacketTags
    none: int
    events: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    state: np.ndarray
    names: np.ndarray
    begin_head: np.ndarray
    end_head: np.ndarray
    args_starts: np.ndarray
    args_lengths: np.ndarray
    extras: np.ndarray
    flows: SliceFlowFields
    packets_at_once: int

    @property
    def parts(self) -> int:
        """How many parts `encode_batch` encodes it in."""
        return -(-len(self.events) // self.packets_at_once)

    def to_bytes(self, parts: range) -> bytes:
        """One message asking for those parts: a small header, then every column's bytes."""
        arrays = self._arrays()
        header = msgspec.msgpack.encode((self.tags, self.none, self.packets_at_once, parts.start, parts.stop,
                                         [(array.dtype.str, len(array)) for array in arrays]))
        return b"".join([len(header).to_bytes(4, "little"), header, *(np.ascontiguousarray(a).data for a in arrays)])

    @classmethod
    def from_bytes(cls, message: bytes) -> tuple["SliceBatch", range]:
        """The batch and parts `to_bytes` gave; the columns are views of `message`."""
        size = int.from_bytes(message[:4], "little")
        tags, none, packets_at_once, first, stop, shapes = msgspec.msgpack.decode(
            message[4:4 + size], type=tuple[PacketTags, int, int, int, int, list[tuple[str, int]]])
        arrays, offset = [], 4 + size
        for dtype, count in shapes:
            array = np.frombuffer(message, dtype, count, offset)
            arrays.append(array)
            offset += array.nbytes
        (blob, piece_starts, piece_lengths, events, starts, ends, state, names, begin_head, end_head, args_starts,
         args_lengths, extras, *flows) = arrays
        batch = cls((blob, piece_starts, piece_lengths), tags, none, events, starts, ends, state, names, begin_head,
                    end_head, args_starts, args_lengths, extras, SliceFlowFields(*flows), packets_at_once)
        return batch, range(first, stop)

    def _arrays(self) -> list[np.ndarray]:
        return [*self.table, self.events, self.starts, self.ends, self.state, self.names, self.begin_head,
                self.end_head, self.args_starts, self.args_lengths, self.extras, *self.flows.columns()]


class PacketHelper(Protocol):
    """Another process that encodes packets (the args helper): one batch at a time."""

    def submit(self, batch: SliceBatch, parts: range) -> bool:
        """Start encoding those parts of `batch`; False where the helper is gone (encode
        them here)."""

    def finished(self) -> bool:
        """Wait until the packets submitted last are encoded; False where the helper failed
        (encode them here)."""

    def copy_to(self, stream: BinaryIO) -> None:
        """Write the packets finished last to `stream`."""

    def close(self) -> None:
        """No more batches: the helper may go."""


def encode_batch(batch: SliceBatch, args_runs: ArgsRuns, parts: range | None = None) -> Iterator[np.ndarray]:
    """The batch's TracePackets, a part (a few thousand) at a time, with each slice's encoded
    args where `args_runs` finds them: its `parts` (default: all)."""
    table, tags, at_once = batch.table, batch.tags, batch.packets_at_once
    events = batch.events
    for part_number in parts if parts is not None else range(batch.parts):
        part = events[part_number * at_once:(part_number + 1) * at_once]
        index, is_end = part >> 1, (part & 1).astype(bool)
        args_lengths = np.where(is_end, 0, batch.args_lengths[index])
        event = Rows(len(part), table) \
            .piece(np.where(is_end, batch.end_head[index], batch.begin_head[index])) \
            .piece(np.where(is_end, batch.none, batch.names[index])) \
            .add(args_runs(batch.args_starts[index], args_lengths))
        if len(batch.extras):
            event.piece(np.where(is_end, batch.none, batch.extras[index]))
        event.add(batch.flows.column(index, is_end))
        yield packets(table, tags, np.where(is_end, batch.ends[index], batch.starts[index]),
                      np.where(is_end, tags.sequence, batch.state[index]), event)


def packets(table: PieceTable, tags: PacketTags, times: np.ndarray, state: Any, event: Rows) -> np.ndarray:
    """TracePackets of track events, encoded: each a time, its sequence's state (`state`
    pieces) and its event."""
    packet = Rows(len(times), table).piece(tags.time).add(Column.of_varints(times)).piece(state) \
        .extend(event.framed(tags.event))
    return packet.framed(tags.packet).encode()
