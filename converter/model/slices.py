"""Every slice of a trace as columns: row i of each column is one slice.

A real trace holds millions of slices. As Python objects they took about 170 bytes each and
every stage walked them one at a time; as columns they take 37 bytes, and stages select,
sort and move them with numpy. Rows keep the order slices were added in (a stage that drops
rows keeps the others' order, one that adds appends), which every "in input order" tie-break
relies on.

Start, duration, name, category, args and `instant` are measured data, set once when a slice
is added; `track` (its display row) is what stages change, through `move`. The one other
change is coalescing identical GPU annotations into their union (`set_duration`, `keep`).
"""

from __future__ import annotations

from array import array
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Container, Hashable, Iterable, NamedTuple, Optional, Sequence, TypeVar

import numpy as np

if TYPE_CHECKING:
    from .trace import Track

NO_ARGS = -1  # the args column's value for a slice without args
Key = TypeVar("Key", bound=Hashable)

_COLUMNS = ("ts", "dur", "name", "cat", "args", "track", "instant")
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


class SliceTable:
    """The columns, the texts their name and category ids stand for, and the tracks their
    track ids stand for (tracks hash by identity).

    Slices are added one at a time (`append`) or a column run at a time (`extend`); either is
    kept aside and joined into the columns the next time a column is read."""

    def __init__(self) -> None:
        self.texts: list[str] = []                 # name and category ids -> text
        self._text_ids: dict[str, int] = {}
        self.tracks: list[Track] = []              # track ids -> track
        self._track_ids: dict[Track, int] = {}
        self._columns: list[np.ndarray] = [np.zeros(0, dtype) for dtype in _DTYPES]
        # Rows added since the columns were last read, a growing array per column: a large one
        # grows in place (realloc), where joining runs at the end held every column twice.
        self._pending = [array(code) for code in _ARRAY_CODES]
        self._length = 0

    def __len__(self) -> int:
        return self._length

    # -- adding ---------------------------------------------------------------------------
    def text_id(self, text: str) -> int:
        found = self._text_ids.get(text)
        if found is None:
            found = self._text_ids[text] = len(self.texts)
            self.texts.append(text)
        return found

    def text_ids(self, texts: Sequence[str]) -> np.ndarray:
        """The ids of many texts (new ones numbered here), one dict look-up each in C."""
        ids = self._text_ids
        found = np.fromiter(map(ids.get, texts, repeat(-1)), np.int32, len(texts))
        for at in np.flatnonzero(found < 0).tolist():
            found[at] = self.text_id(texts[at])
        return found

    def track_id(self, track: Track) -> int:
        found = self._track_ids.get(track)
        if found is None:
            found = self._track_ids[track] = len(self.tracks)
            self.tracks.append(track)
        return found

    def track_ids(self, tracks: Sequence[Track]) -> np.ndarray:
        ids = self._track_ids
        found = np.fromiter(map(ids.get, tracks, repeat(-1)), np.int32, len(tracks))
        for at in np.flatnonzero(found < 0).tolist():
            found[at] = self.track_id(tracks[at])
        return found

    def append(self, ts: int, dur: int, name: str, cat: str, args: int, track: Track, instant: bool = False) -> int:
        """Add one slice; returns its row."""
        starts, durations, names, cats, references, tracks, instants = self._pending
        starts.append(ts)
        durations.append(dur)
        names.append(self.text_id(name))
        cats.append(self.text_id(cat))
        references.append(args)
        tracks.append(self.track_id(track))
        instants.append(instant)
        self._length += 1
        return self._length - 1

    def extend(self, ts: np.ndarray, dur: np.ndarray, names: Sequence[str], cats: Sequence[str], args: np.ndarray,
               tracks: Sequence[Track], instant: Optional[np.ndarray] = None) -> None:
        """Add a run of slices, a column each (`instant` None: none is an instant)."""
        count = len(ts)
        if not count:
            return
        run = (ts, dur, self.text_ids(names), self.text_ids(cats), args, self.track_ids(tracks),
               np.zeros(count, np.bool_) if instant is None else instant)
        for pending, column, dtype in zip(self._pending, run, _DTYPES):
            pending.frombytes(np.ascontiguousarray(column, dtype).view(np.uint8).data)
        self._length += count

    # -- columns --------------------------------------------------------------------------
    @property
    def ts(self) -> np.ndarray:
        return self._joined()[0]

    @property
    def dur(self) -> np.ndarray:
        return self._joined()[1]

    @property
    def name(self) -> np.ndarray:
        """Name ids (texts[id])."""
        return self._joined()[2]

    @property
    def cat(self) -> np.ndarray:
        """Category ids (texts[id])."""
        return self._joined()[3]

    @property
    def args(self) -> np.ndarray:
        """References into the trace's ArgsStore, NO_ARGS for none."""
        return self._joined()[4]

    @property
    def track(self) -> np.ndarray:
        """Track ids (tracks[id])."""
        return self._joined()[5]

    @property
    def instant(self) -> np.ndarray:
        return self._joined()[6]

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

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
            picked.tolist(), columns[0][picked].tolist(), columns[1][picked].tolist(),
            _pick(texts, columns[2][picked]), _pick(texts, columns[3][picked]), columns[4][picked].tolist(),
            _pick(tracks, columns[5][picked]), columns[6][picked].tolist())))

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
        self._joined()[5][rows] = track_id

    def set_duration(self, row: int, dur: int) -> None:
        """A coalesced annotation's duration: the union of those it stands for."""
        self._joined()[1][row] = dur

    def keep(self, kept: np.ndarray) -> None:
        """Keep the rows where `kept` (a mask) is true, in order (`renumbering` says where each goes)."""
        self._columns = [column[kept] for column in self._joined()]
        self._length = len(self._columns[0])

    def take(self, rows: np.ndarray) -> "SliceTable":
        """A table of `rows`, in that order, sharing this one's texts and tracks (a copy of each list)."""
        taken = SliceTable()
        taken.texts, taken._text_ids = list(self.texts), dict(self._text_ids)
        taken.tracks, taken._track_ids = list(self.tracks), dict(self._track_ids)
        taken._columns = [column[rows] for column in self._joined()]
        taken._length = len(taken._columns[0])
        return taken

    def __getstate__(self) -> dict[str, Any]:
        self._joined()
        state = dict(self.__dict__)
        del state["_pending"], state["_text_ids"], state["_track_ids"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pending = [array(code) for code in _ARRAY_CODES]
        self._text_ids = {text: index for index, text in enumerate(self.texts)}
        self._track_ids = {track: index for index, track in enumerate(self.tracks)}


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
