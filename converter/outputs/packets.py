"""Many protobuf packets encoded at once, as columns of byte runs gathered by numpy.

The writer's per-slice Python (a dozen byte concatenations and varints per BEGIN and END)
was its largest cost per slice. Here a packet is a row of runs: constant pieces (tags, a track's
head, an interned name's reference), varints computed for the whole column, a slice's flow
ids, and its encoded args. Lengths are summed per row to frame each message, and one gather
over the concatenated sources writes every row's short runs in order. The args, long runs of
a large source, are spliced in instead: copied whole between the gathered bytes, a memcpy a
run, where gathering builds and follows an index for every byte.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

_BYTE = np.uint8
_GATHER_BYTES = 1 << 19  # bytes of rows gathered at once (encode)
SPLICES_AT_ONCE = 1 << 9  # spliced runs copied between calls of their column's `release`


def varint_matrix(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's varint as a row of a byte matrix as wide as the longest varint, and each
    row's length in bytes; negative values as their 64-bit two's complement, as protobuf
    writes them."""
    bits = values.astype(np.int64).view(np.uint64)
    largest = int(bits.max()) if len(bits) else 0
    width = max(1, -(-largest.bit_length() // 7))
    lengths = np.ones(len(bits), np.int64)
    for group in range(1, width):
        lengths += bits >= np.uint64(1 << (7 * group))
    matrix = np.empty((len(bits), width), _BYTE)
    for group in range(width):
        low = (bits >> np.uint64(7 * group)) & np.uint64(0x7F)
        matrix[:, group] = low.astype(_BYTE) | ((lengths > group + 1).astype(_BYTE) << 7)
    return matrix, lengths


def gather_runs(source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """source[starts[0]:starts[0] + lengths[0]], then the next run, ..., as one array."""
    kept = lengths > 0
    starts, lengths = starts[kept], lengths[kept]
    if not len(lengths):
        return source[:0]
    ends = np.cumsum(lengths)
    # Each byte's index in source: one more than the byte before, except where a run begins.
    index = np.ones(int(ends[-1]), np.int32 if len(source) < 1 << 31 else np.int64)
    index[0] = starts[0]
    index[ends[:-1]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    np.cumsum(index, out=index)
    return source[index]


PieceTable = tuple[np.ndarray, np.ndarray, np.ndarray]  # (the pieces back to back, starts, lengths)


class Pieces:
    """Distinct short byte strings a column may refer to by id (tags, heads, flow ids)."""

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}

    def id(self, piece: bytes) -> int:
        return self._ids.setdefault(piece, len(self._ids))

    def table(self) -> PieceTable:
        pieces = list(self._ids)
        lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
        return np.frombuffer(b"".join(pieces), _BYTE), np.cumsum(lengths) - lengths, lengths


class Column:
    """One run per row: `lengths[i]` bytes at `starts[i]` of `source`."""

    __slots__ = ("source", "starts", "lengths")

    def __init__(self, source: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
        self.source, self.starts, self.lengths = source, starts, lengths

    @classmethod
    def of_varints(cls, values: np.ndarray) -> "Column":
        matrix, lengths = varint_matrix(values)
        return cls(matrix.reshape(-1), np.arange(0, matrix.size, matrix.shape[1]), lengths)

    @classmethod
    def of_fixed(cls, source: np.ndarray, width: int) -> "Column":
        """Rows of `width` bytes each, back to back in `source`."""
        rows = len(source) // width
        return cls(source, np.arange(0, rows * width, width), np.full(rows, width))

    @classmethod
    def of_pieces(cls, table: PieceTable, ids: Any) -> "Column":
        """Rows taking pieces by id (`ids`: an array, or one id for every row)."""
        blob, starts, lengths = table
        return cls(blob, starts[ids], lengths[ids])


class Spliced:
    """One run per row of a large buffer (`source`: bytes, an array, a mapped file), long
    enough to be copied whole rather than gathered byte by byte; `release` (where given) is
    called after every SPLICES_AT_ONCE runs read (a mapped file lets its pages go)."""

    __slots__ = ("source", "starts", "lengths", "release")

    def __init__(self, source: Any, starts: np.ndarray, lengths: np.ndarray,
                 release: Optional[Callable[[], None]] = None):
        self.source, self.starts, self.lengths, self.release = source, starts, lengths, release


class Rows:
    """Packets under construction, all alike in shape: a list of columns, written row by row;
    at most one of them spliced."""

    def __init__(self, count: int, table: PieceTable):
        self.count = count
        self.table = table
        self.columns: list[Union[Column, Spliced]] = []

    def piece(self, ids: Any) -> "Rows":
        ids = np.broadcast_to(np.asarray(ids, np.int64), (self.count,))
        self.columns.append(Column.of_pieces(self.table, ids))
        return self

    def add(self, column: Union[Column, Spliced]) -> "Rows":
        self.columns.append(column)
        return self

    def extend(self, rows: "Rows") -> "Rows":
        """The other rows' columns after these (row i continues with their row i)."""
        self.columns += rows.columns
        return self

    def size(self) -> np.ndarray:
        """Every row's length so far."""
        return _row_lengths(self.columns, self.count)

    def framed(self, tag_id: int) -> "Rows":
        """These rows as the payload of a length-delimited field (its tag a piece)."""
        return Rows(self.count, self.table).piece(tag_id).add(Column.of_varints(self.size())).extend(self)

    def encode(self) -> np.ndarray:
        """Every row's bytes, rows in order: the gathered columns' bytes, with the spliced
        column's runs copied in where they belong."""
        gathered = [column for column in self.columns if isinstance(column, Column)]
        spliced_columns = [column for column in self.columns if isinstance(column, Spliced)]
        if len(spliced_columns) > 1:
            raise ValueError("rows take at most one spliced column")
        data = _gather(gathered)
        if not spliced_columns:
            return data
        spliced = spliced_columns[0]
        at = self.columns.index(spliced)
        row_lengths = _row_lengths(gathered, self.count)
        before = _row_lengths(self.columns[:at], self.count)
        places = np.cumsum(row_lengths) - row_lengths + before  # where each run goes in `data`
        kept = spliced.lengths > 0
        return _splice(data, places[kept], spliced, spliced.starts[kept], spliced.lengths[kept])


def _row_lengths(columns: Sequence[Union[Column, Spliced]], count: int) -> np.ndarray:
    """Each of `count` rows' bytes in these columns (Column or Spliced)."""
    return sum((column.lengths for column in columns), np.zeros(count, np.int64))


def _gather(columns: list[Column]) -> np.ndarray:
    """Every row's bytes of these columns, rows in order. Gathered a stretch of rows at a time:
    the gather's index takes 4 bytes per byte gathered."""
    sources = {id(column.source): column.source for column in columns}
    offsets, base = {}, 0
    for key, source in sources.items():
        offsets[key] = base
        base += len(source)
    joined = np.concatenate(list(sources.values())) if sources else np.zeros(0, _BYTE)
    starts = np.stack([column.starts + offsets[id(column.source)] for column in columns], axis=1)
    lengths = np.stack([column.lengths for column in columns], axis=1)
    row_ends = np.cumsum(lengths.sum(axis=1))
    total = int(row_ends[-1]) if len(row_ends) else 0
    cuts = [0, *np.searchsorted(row_ends, np.arange(_GATHER_BYTES, total, _GATHER_BYTES), "right").tolist(),
            len(row_ends)]
    encoded = np.empty(total, _BYTE)
    for first, last in zip(cuts, cuts[1:]):
        if first < last:
            done = int(row_ends[first - 1]) if first else 0
            encoded[done:int(row_ends[last - 1])] = gather_runs(joined, starts[first:last].reshape(-1),
                                                                lengths[first:last].reshape(-1))
    return encoded


def _splice(data: np.ndarray, places: np.ndarray, spliced: Spliced, starts: np.ndarray,
            lengths: np.ndarray) -> np.ndarray:
    """`data` with run i of `spliced.source` (at starts[i], lengths[i] long) inserted before
    data[places[i]] (places ascending)."""
    pieces: list[Any] = []
    done = 0
    with data.data as cut, memoryview(spliced.source) as source:
        for first in range(0, len(places), SPLICES_AT_ONCE):
            stretch: list[Any] = []
            for place, start, end in zip(places[first:first + SPLICES_AT_ONCE].tolist(),
                                         starts[first:first + SPLICES_AT_ONCE].tolist(),
                                         (starts[first:first + SPLICES_AT_ONCE]
                                          + lengths[first:first + SPLICES_AT_ONCE]).tolist()):
                stretch += (cut[done:place], source[start:end])
                done = place
            pieces.append(b"".join(stretch))
            del stretch
            if spliced.release is not None:
                spliced.release()
        pieces.append(bytes(cut[done:]))
    return np.frombuffer(b"".join(pieces), _BYTE)
