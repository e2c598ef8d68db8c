"""Every slice of a trace as columns: row i of each column is one slice.

A real trace holds millions of slices. As Python objects each took several times its
columns' size and every stage walked them one at a time; as columns they take 37 bytes, and stages select,
sort and move them with numpy. Once read, the rows are in canonical order (canonical.py: by
content, not by the input's order); a stage that drops rows keeps the others' order and one
that adds appends, so every "then by row" tie-break is one of content.

Start, duration, name, category, args and `instant` are measured data, set once when a slice
is added; `track` (its display row) is what stages change, through `move`. The one other
change is coalescing identical GPU annotations into their union (`set_duration`, `keep`); a
merge may move every start of a rank by one clock offset (`shift`). What a stage derives about
a slice's args lives beside the table (`Trace.derived_args`), never in it.
"""

from __future__ import annotations

from array import array
from itertools import repeat
from operator import itemgetter
from typing import (TYPE_CHECKING, Any, Callable, Container, Generic, Hashable, Iterable, NamedTuple, Optional, Sequence,
                    TypeVar)

import numpy as np

if TYPE_CHECKING:
    from .trace import Track

NO_ARGS = -1  # the args column's value for a slice without args
Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value", bound=Hashable)

_TS, _DUR, _NAME, _CAT, _ARGS, _TRACK, _INSTANT = range(7)  # the columns, in this order
_DTYPES = (np.int64, np.int64, np.int32, np.int32, np.int64, np.int32, np.bool_)
_ARRAY_CODES = ("q", "q", "i", "i", "q", "i", "b")  # array.array codes of the same widths


class SliceRow(NamedTuple):
    """One slice read out of its table: a snapshot, for stages that handle a few slices in
    Python (pipeline blocks, arrows). Equal only to the same row's snapshot."""

    row: int
    ts: int
    dur: int
    name: str
    cat: str
    args: int  # NO_ARGS: none
    track: "Track"
    is_instant: bool

    @property
    def end(self) -> int:
        return self.ts + self.dur


class _Numbered(Generic[Value]):
    """Values numbered in the order first met: `values[id]`, and `id_of(value)`."""

    def __init__(self, values: Iterable[Value] = ()):
        self.values: list[Value] = list(values)
        self._ids = {value: index for index, value in enumerate(self.values)}

    def id_of(self, value: Value) -> int:
        found = self._ids.get(value)
        if found is None:
            found = self._ids[value] = len(self.values)
            self.values.append(value)
        return found

    def ids_of(self, values: Sequence[Value]) -> np.ndarray:
        """The ids of many values (new ones numbered here), one dict look-up each in C."""
        found = np.fromiter(map(self._ids.get, values, repeat(-1)), np.int32, len(values))
        new = np.flatnonzero(found < 0)
        if len(new):  # numbered in the order first met; a value repeated in the run, once
            new_values = [values[at] for at in new.tolist()]
            for value in dict.fromkeys(new_values):
                self.id_of(value)
            found[new] = np.fromiter(map(self._ids.__getitem__, new_values), np.int32, len(new_values))
        return found

    def copy(self) -> "_Numbered[Value]":
        return _Numbered(self.values)


class _Column:
    """One column of a SliceTable, read with every pending row joined first."""

    def __init__(self, index: int, doc: Optional[str] = None):
        self.index = index
        self.__doc__ = doc

    def __get__(self, table: "SliceTable", owner: type) -> np.ndarray:
        return table._joined()[self.index]


class SliceTable:
    """The columns, the texts their name and category ids stand for, and the tracks their
    track ids stand for (tracks hash by identity).

    Slices are added one at a time (`append`) or a column run at a time (`extend`); either is
    kept aside and joined into the columns the next time a column is read."""

    def __init__(self) -> None:
        self._texts: _Numbered[str] = _Numbered()      # name and category ids -> text
        self._tracks: _Numbered[Track] = _Numbered()   # track ids -> track
        self._columns: list[np.ndarray] = [np.zeros(0, dtype) for dtype in _DTYPES]
        # Rows added since the columns were last read, a growing array per column: a large one
        # grows in place (realloc), where joining runs at the end held every column twice.
        self._pending = [array(code) for code in _ARRAY_CODES]
        self._length = 0

    def __len__(self) -> int:
        return self._length

    # -- what ids stand for, and adding ------------------------------------------------------
    @property
    def texts(self) -> list[str]:
        """Name and category ids -> text."""
        return self._texts.values

    @property
    def tracks(self) -> list[Track]:
        """Track ids -> track."""
        return self._tracks.values

    def track_id(self, track: Track) -> int:
        return self._tracks.id_of(track)

    def append(self, ts: int, dur: int, name: str, cat: str, args: int, track: Track, instant: bool = False) -> int:
        """Add one slice; returns its row."""
        starts, durations, names, cats, references, tracks, instants = self._pending
        starts.append(ts)
        durations.append(dur)
        names.append(self._texts.id_of(name))
        cats.append(self._texts.id_of(cat))
        references.append(args)
        tracks.append(self._tracks.id_of(track))
        instants.append(instant)
        self._length += 1
        return self._length - 1

    def extend(self, ts: np.ndarray, dur: np.ndarray, names: Sequence[str], cats: Sequence[str], args: np.ndarray,
               tracks: Sequence[Track], instant: Optional[np.ndarray] = None) -> None:
        """Add a run of slices, a column each (`instant` None: none is an instant)."""
        count = len(ts)
        if not count:
            return
        run = (ts, dur, self._texts.ids_of(names), self._texts.ids_of(cats), args, self._tracks.ids_of(tracks),
               np.zeros(count, np.bool_) if instant is None else instant)
        for pending, column, dtype in zip(self._pending, run, _DTYPES):
            pending.frombytes(np.ascontiguousarray(column, dtype).view(np.uint8).data)
        self._length += count

    # -- columns --------------------------------------------------------------------------
    ts = _Column(_TS)
    dur = _Column(_DUR)
    name = _Column(_NAME, "Name ids (texts[id]).")
    cat = _Column(_CAT, "Category ids (texts[id]).")
    args = _Column(_ARGS, "References into the trace's ArgsStore, NO_ARGS for none.")
    track = _Column(_TRACK, "Track ids (tracks[id]).")
    instant = _Column(_INSTANT)

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    def spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The starts and ends of `rows`, in their order."""
        starts = self.ts[rows]
        return starts, starts + self.dur[rows]

    def _joined(self) -> list[np.ndarray]:
        """The columns, with the pending rows joined (taken over as they are where there were
        no columns yet: a reader's whole table)."""
        if self._pending[0]:
            for index, (pending, dtype) in enumerate(zip(self._pending, _DTYPES)):
                added: np.ndarray = np.frombuffer(pending, dtype)
                self._columns[index] = np.concatenate((self._columns[index], added)) if len(self._columns[index]) \
                    else added
            self._pending = [array(code) for code in _ARRAY_CODES]
        return self._columns

    # -- reading --------------------------------------------------------------------------
    def rows(self, rows: Optional[Iterable[int] | np.ndarray] = None) -> list[SliceRow]:
        """Snapshots of `rows` (every row: None), in that order."""
        picked = np.arange(self._length) if rows is None else np.asarray(rows, np.int64).reshape(-1)
        if not len(picked):
            return []
        columns = self._joined()
        texts, tracks = self.texts, self.tracks
        return list(map(SliceRow._make, zip(
            picked.tolist(), columns[_TS][picked].tolist(), columns[_DUR][picked].tolist(),
            _pick(texts, columns[_NAME][picked]), _pick(texts, columns[_CAT][picked]),
            columns[_ARGS][picked].tolist(), _pick(tracks, columns[_TRACK][picked]),
            columns[_INSTANT][picked].tolist())))

    def row(self, row: int) -> SliceRow:
        return self.rows([row])[0]

    def tracks_of(self, rows: np.ndarray) -> list[Track]:
        return _pick(self.tracks, self.track[rows])

    def named(self, wanted: Callable[[str], object]) -> np.ndarray:
        """The rows whose name is `wanted`, in order; each distinct text is tested once."""
        chosen = [index for index, text in enumerate(self.texts) if wanted(text)]
        return np.flatnonzero(np.isin(self.name, chosen)) if chosen else np.zeros(0, np.int64)

    def in_categories(self, categories: Container[str]) -> np.ndarray:
        """Per row, whether its category is one of `categories`."""
        wanted = np.fromiter((text in categories for text in self.texts), np.bool_, len(self.texts))
        return wanted[self.cat]

    def track_mask(self, wanted: Callable[[Track], object]) -> np.ndarray:
        """Per track id, whether `wanted(track)` (index it with the track column)."""
        return np.fromiter((bool(wanted(track)) for track in self.tracks), np.bool_, len(self.tracks))

    def track_keys(self, key_of: Callable[[Track], Optional[Key]]) -> tuple[np.ndarray, list[Key]]:
        """Per track id, which of the distinct keys `key_of` gives its track (-1: None), and
        those keys, in the order of the track ids (index the first with the track column)."""
        distinct: dict[Key, int] = {}
        ids = np.full(len(self.tracks), -1, np.int64)
        for track_id, key in enumerate(map(key_of, self.tracks)):
            if key is not None:
                ids[track_id] = distinct.setdefault(key, len(distinct))
        return ids, list(distinct)

    # -- changing -------------------------------------------------------------------------
    def move(self, rows: Any, track: Track) -> None:
        """Show `rows` on `track`: the one change a stage makes to measured slices."""
        track_id = self.track_id(track)
        self._joined()[_TRACK][rows] = track_id

    def shift(self, offset: int) -> None:
        """Every start `offset` ns later: a merge moving a rank onto the others' clock, as a whole."""
        self._joined()[_TS] += offset

    def set_duration(self, row: int, dur: int) -> None:
        """A coalesced annotation's duration: the union of those it stands for."""
        self._joined()[_DUR][row] = dur

    def renumber(self, texts: list[str], tracks: list[Track]) -> None:
        """Number texts and tracks anew, in the order of `texts` and `tracks` (each holding every
        one of the table's own: canonical.py's order)."""
        columns = self._joined()
        for numbered, new, indices in ((self._texts, texts, (_NAME, _CAT)), (self._tracks, tracks, (_TRACK,))):
            renumbered: _Numbered = _Numbered(new)
            new_id = np.fromiter(map(renumbered.id_of, numbered.values), np.int32, len(numbered.values))
            if len(renumbered.values) != len(new):
                raise ValueError("a renumbering must hold every value once")
            for index in indices:
                if len(new_id):
                    columns[index] = new_id[columns[index]]
            if numbered is self._texts:
                self._texts = renumbered
            else:
                self._tracks = renumbered

    def permute(self, rows: np.ndarray) -> None:
        """The rows in the order `rows` gives (a permutation of them all), a column at a time
        (each old one goes before the next is copied)."""
        columns = self._joined()
        for index, column in enumerate(columns):
            columns[index] = column[rows]
            del column

    def keep(self, kept: np.ndarray) -> None:
        """Keep the rows where `kept` (a mask) is true, in order (`renumbering` says where each goes)."""
        self._columns = [column[kept] for column in self._joined()]
        self._length = len(self._columns[0])

    def take(self, rows: np.ndarray) -> "SliceTable":
        """A table of `rows`, in that order, with copies of this one's lists of texts and tracks
        (the same Track objects)."""
        taken = SliceTable()
        taken._texts, taken._tracks = self._texts.copy(), self._tracks.copy()
        taken._columns = [column[rows] for column in self._joined()]
        taken._length = len(taken._columns[0])
        return taken

    def __getstate__(self) -> dict[str, Any]:
        self._joined()
        state = dict(self.__dict__)
        del state["_pending"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pending = [array(code) for code in _ARRAY_CODES]


def renumbering(kept: np.ndarray) -> np.ndarray:
    """Each row's row among those `kept` (a mask) keeps, in order; -1 for a row it drops."""
    new_rows = np.full(len(kept), -1, np.int64)
    new_rows[kept] = np.arange(np.count_nonzero(kept))
    return new_rows


def _pick(values: list, ids: np.ndarray) -> list:
    """values[i] for each id, in one pass in C."""
    if len(ids) == 0:
        return []
    if len(ids) == 1:
        return [values[int(ids[0])]]
    return list(itemgetter(*ids.tolist())(values))
