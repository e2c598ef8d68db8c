"""How slices nest on one track: the order and the test every writer and stage shares.

Perfetto pairs a SLICE_END with the most recent open slice on its track, so slices must be
written in nesting order and never partially overlap on one track.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..tuning import DEFAULT_TUNING, Tuning
from .columns import sorted_distinct
from .slices import SliceTable


def sort_by_start(table: SliceTable, rows: np.ndarray, longest_first: bool) -> np.ndarray:
    """`rows` by start, equal starts by duration (longest or shortest first), then in the
    order given (lexsort is stable)."""
    durations = table.dur[rows]
    return rows[np.lexsort((-durations if longest_first else durations, table.ts[rows]))]


def nesting_order(table: SliceTable, rows: np.ndarray) -> np.ndarray:
    """Start order, enclosing slices before the ones they contain."""
    return sort_by_start(table, rows, longest_first=True)


def by_track_in_nesting_order(table: SliceTable, rows: np.ndarray) -> np.ndarray:
    """The positions that put `rows` by track, then in nesting order, then in the order given
    (np.lexsort's answer). Two stable sorts, by start then track, cost little on rows given in
    start order (the table's canonical order); only the rows sharing a track and start are
    then sorted by the rest."""
    starts, tracks = table.ts[rows], table.track[rows]
    order = np.argsort(starts, kind="stable")
    order = order[np.argsort(tracks[order], kind="stable")]
    same = (tracks[order[1:]] == tracks[order[:-1]]) & (starts[order[1:]] == starts[order[:-1]])
    tied = np.flatnonzero(np.append(same, False) | np.append(False, same))
    if len(tied):
        group = np.cumsum(np.append(True, ~same))[tied]  # the tied runs stay where they are
        held = order[tied]
        order[tied] = held[np.lexsort((held, -table.dur[rows[held]], group))]
    return order


def fits_nested(open_ends: list[int], start: int, end: int) -> bool:
    """Pop the ends of what ended by `start`; True when [start, end] nests inside what is left."""
    while open_ends and open_ends[-1] <= start:
        open_ends.pop()
    return not open_ends or open_ends[-1] >= end


def nested_layers(table: SliceTable, rows: np.ndarray, tuning: Tuning = DEFAULT_TUNING) -> list[np.ndarray]:
    """`rows` in nesting order, split first-fit into layers that each nest properly (a
    single layer unless some slices partially overlap). Which spans cross is found on
    columns, for the whole track at once (_crossing); first-fit's loop then runs only over
    the stretches around them where it must: it starts afresh wherever nothing is open, and
    after slices that enclose everything up to such a point (a call stack's outer frames).
    So a long track with a few deep crossings (a CPU thread's call stacks) no longer sends
    every slice through the loop. A stretch of the tuning's nesting_looped_whole slices or fewer goes
    to the loop whole: looking inside it with numpy costs more in fixed per-call overhead than
    the loop takes over its slices."""
    chunk, looped_whole = tuning.nesting_chunk, tuning.nesting_looped_whole
    ordered = nesting_order(table, rows)
    starts, ends = table.spans(ordered)
    crossing = _crossing(starts, ends, table.instant[ordered], chunk)
    if not len(crossing):
        return [ordered]
    looped: list[np.ndarray] = []  # the stretches the loop takes
    stretches = _stretches_holding(crossing, starts, ends, 0, len(ordered))
    while stretches:
        first, last = stretches.pop()
        enclosing = _enclosing(ends[first:last]) if last - first > looped_whole else 0
        if enclosing:
            stretches += _stretches_holding(crossing, starts, ends, first + enclosing, last)
        else:
            looped.append(np.arange(first, last))
    # One loop over them all, in order: everything in one has ended before the next begins.
    positions = np.sort(np.concatenate(looped))
    layers = np.zeros(len(ordered), np.int64)
    layers[positions] = _first_fit(starts[positions], ends[positions], table.instant[ordered[positions]], chunk)
    by_layer = ordered[np.argsort(layers, kind="stable")]  # each layer's rows, still in nesting order
    return np.split(by_layer, np.cumsum(np.bincount(layers))[:-1])


def _stretches_holding(positions: np.ndarray, starts: np.ndarray, ends: np.ndarray, first: int,
                       last: int) -> list[tuple[int, int]]:
    """Of slices first .. last - 1 (in nesting order), the stretches between points where none
    of them is open that hold any of `positions` (ascending), each as (first, last)."""
    clear = first + _all_clear(starts[first:last], ends[first:last])
    inside = positions[np.searchsorted(positions, first):np.searchsorted(positions, last)]
    numbers = sorted_distinct(np.searchsorted(clear, inside, "right"))
    cuts = np.concatenate(([first], clear, [last]))
    return list(zip(cuts[numbers].tolist(), cuts[numbers + 1].tolist()))


def _enclosing(ends: np.ndarray) -> int:
    """How many of a stretch's first slices each end at or after every later one: first-fit
    keeps them in the first layer, where they never stop a later slice, and is afresh after
    them."""
    later = np.maximum.accumulate(ends[:0:-1])[::-1]  # later[i]: the latest end after slice i
    not_enclosing = np.flatnonzero(ends[:-1] < later)
    return int(not_enclosing[0]) if len(not_enclosing) else len(ends)


def _first_fit(starts: np.ndarray, ends: np.ndarray, instant: np.ndarray, chunk: int) -> np.ndarray:
    """Each slice's layer: the first whose stack of open ends it nests in (fits_nested,
    inline: it runs once per slice); times made Python ints `chunk` slices at a time. The first
    layer, where nearly every slice goes, is tested apart; the others (_OverlapLayers) are
    searched in log time, since a staircase (each slice overlapping all later ones) makes one
    per slice."""
    layer_of: list[int] = []
    first_ends: list[int] = []
    others = _OverlapLayers()
    closing = others.tops  # a heap: every other layer's innermost open end
    for first in range(0, len(starts), chunk):
        part = slice(first, first + chunk)
        for start, end, is_instant in zip(starts[part].tolist(), ends[part].tolist(), instant[part].tolist()):
            while first_ends and first_ends[-1] <= start:
                first_ends.pop()
            if closing and closing[0][0] <= start:
                others.close(start)
            if not first_ends or first_ends[-1] >= end:
                if not is_instant:
                    first_ends.append(end)
                layer_of.append(0)
            else:
                layer_of.append(others.place(end, is_instant))
    return np.array(layer_of, np.int64)


class _OverlapLayers:
    """Layers 1, 2, ...: a stack of open ends each (innermost last, so ascending from the
    top), closed at every start as first-fit would close them when it came to test them
    (closing earlier changes nothing: starts only grow). A tree over them keeps each subtree's
    largest innermost end, so the first layer a slice nests in (innermost end at or after
    its end, or empty) is found by descending it: n log n for n slices."""

    _EMPTY = 1 << 64  # an empty layer's innermost end: every slice nests in it
    _NONE = -(1 << 64)  # a layer not made yet: no slice nests in it

    def __init__(self) -> None:
        self.stacks: list[list[int]] = []
        self.tops: list[tuple[int, int]] = []  # (innermost end, layer index) per non-empty layer, and stale ones
        self._size = 1
        self._tree = [self._NONE] * 2

    def close(self, start: int) -> None:
        """Pop, in every layer, the ends at or before `start`."""
        while self.tops and self.tops[0][0] <= start:
            index = heapq.heappop(self.tops)[1]
            stack = self.stacks[index]
            if stack and stack[-1] <= start:
                while stack and stack[-1] <= start:
                    stack.pop()
                self._set(index, stack[-1] if stack else self._EMPTY)

    def place(self, end: int, is_instant: bool) -> int:
        """The first layer (counting the first as 0) the slice ending at `end` nests in, made
        when none does; the slice opens there unless it is an instant."""
        tree = self._tree
        if tree[1] >= end:
            node = 1
            while node < self._size:
                node = 2 * node if tree[2 * node] >= end else 2 * node + 1
            index = node - self._size
        else:
            index = len(self.stacks)
            self.stacks.append([])
        if not is_instant:
            self.stacks[index].append(end)
        self._set(index, self.stacks[index][-1] if self.stacks[index] else self._EMPTY)
        return index + 1

    def _set(self, index: int, top: int) -> None:
        if index >= self._size:
            leaves = self._tree[self._size:] + [self._NONE] * self._size
            self._size *= 2
            self._tree = [self._NONE] * self._size + leaves
            for node in range(self._size - 1, 0, -1):
                self._tree[node] = max(self._tree[2 * node], self._tree[2 * node + 1])
        node = self._size + index
        self._tree[node] = top
        if top != self._EMPTY:
            heapq.heappush(self.tops, (top, index))
        while node > 1:
            node //= 2
            self._tree[node] = max(self._tree[2 * node], self._tree[2 * node + 1])


def clear_points(starts: np.ndarray, ends: np.ndarray, every: int) -> np.ndarray:
    """Where to cut slices in nesting order (their `starts` and `ends`), about every `every`
    slices, where one can: before a slice that starts when every slice before it has ended,
    so nothing is open across a cut."""
    clear = _all_clear(starts, ends)
    if not len(clear):
        return clear
    wanted = np.searchsorted(clear, np.arange(every, len(starts), every))
    return sorted_distinct(clear[np.minimum(wanted, len(clear) - 1)])


def _all_clear(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Of slices in nesting order, the positions of those that start when every slice before
    them has ended: first-fit starts afresh there."""
    return np.flatnonzero(np.maximum.accumulate(ends)[:-1] <= starts[1:]) + 1


def _crossing(starts: np.ndarray, ends: np.ndarray, instant: np.ndarray, chunk: int) -> np.ndarray:
    """Of slices in nesting order, the positions (ascending) of spans in bracket pairs that do
    not match (_misplaced): none exactly when first-fit keeps the slices in one layer, and some
    in every innermost stretch that needs another. Instants and empty spans always fit the
    first layer (nothing still open ends inside them) and are gone by the next start, so only
    spans longer than 0 are tested, between points where nothing is open about `chunk` slices
    apart, which bounds the arrays to a few MB."""
    spans = np.flatnonzero((ends > starts) & ~instant)
    bounds = [0, *np.searchsorted(spans, clear_points(starts, ends, chunk)).tolist(), len(spans)]
    return sorted_distinct(np.concatenate([np.zeros(0, np.int64), *(
        spans[first:last][_misplaced(starts[spans[first:last]], ends[spans[first:last]])]
        for first, last in zip(bounds, bounds[1:]))]))


def _misplaced(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Of spans in nesting order, each longer than 0, the ones whose end does not close the
    most recently opened span still open (and that span), as brackets in time (ends before
    starts at one time, the later opened first). A begin's level is the depth before it, an
    end's the depth after it; properly nested, each level alternates one span's begin and
    its end. A stretch where nothing is open, or inside a span enclosing it, has as many of
    each at every level, so a pair that does not match lies within the innermost such
    stretch holding the crossing."""
    count = len(starts)
    spans = np.arange(count)
    is_begin = np.repeat(np.array([False, True]), count)  # events 0..count-1: ends, then begins
    events = np.lexsort((np.concatenate((-spans, spans)), is_begin, np.concatenate((ends, starts))))
    begins = is_begin[events]
    levels = np.cumsum(np.where(begins, 1, -1)) - begins
    paired = events[np.argsort(levels, kind="stable")]
    wrong = paired[0::2] != paired[1::2] + count
    return np.concatenate((paired[0::2][wrong], paired[1::2][wrong])) % max(count, 1)
