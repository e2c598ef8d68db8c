"""How slices nest on one track: the order and the test every writer and stage shares.

Perfetto pairs a SLICE_END with the most recent open slice on its track, so slices must be
written in nesting order and never partially overlap on one track.
"""

from __future__ import annotations

import numpy as np

from .slices import SliceTable

_CHUNK = 1 << 16  # slices whose times are Python ints at once: a whole track's were 24 MB at 100 MB


def sort_by_start(table: SliceTable, rows: np.ndarray, longest_first: bool) -> np.ndarray:
    """`rows` by start, equal starts by duration (longest or shortest first), then in the
    order given (lexsort is stable)."""
    durations = table.dur[rows]
    return rows[np.lexsort((-durations if longest_first else durations, table.ts[rows]))]


def nesting_order(table: SliceTable, rows: np.ndarray) -> np.ndarray:
    """Start order, enclosing slices before the ones they contain."""
    return sort_by_start(table, rows, longest_first=True)


def fits_nested(open_ends: list[int], start: int, end: int) -> bool:
    """Pop the ends of what ended by `start`; True when [start, end] nests inside what is left."""
    while open_ends and open_ends[-1] <= start:
        open_ends.pop()
    return not open_ends or open_ends[-1] >= end


def nested_layers(table: SliceTable, rows: np.ndarray) -> list[np.ndarray]:
    """`rows` in nesting order, split first-fit into layers that each nest properly (a
    single layer unless some slices partially overlap). Most tracks nest: that is tested on
    columns first; the others take fits_nested, on each layer's stack of open ends, inline
    (it runs once per slice)."""
    ordered = nesting_order(table, rows)
    if nest_in_one_layer(table, ordered):
        return [ordered]
    layer_of: list[int] = []
    open_ends: list[list[int]] = [[]]
    for first in range(0, len(ordered), _CHUNK):
        part = ordered[first:first + _CHUNK]
        starts, ends = table.spans(part)
        for start, end, instant in zip(starts.tolist(), ends.tolist(), table.instant[part].tolist()):
            for layer, layer_ends in enumerate(open_ends):
                while layer_ends and layer_ends[-1] <= start:
                    layer_ends.pop()
                if not layer_ends or layer_ends[-1] >= end:
                    break
            else:
                layer = len(open_ends)
                open_ends.append([])
            if not instant:
                open_ends[layer].append(end)
            layer_of.append(layer)
    layers = np.array(layer_of, np.int64)
    return [ordered[layers == layer] for layer in range(len(open_ends))]


def clear_points(starts: np.ndarray, ends: np.ndarray, every: int) -> np.ndarray:
    """Where to cut slices in nesting order (their `starts` and `ends`), about every `every`
    slices, where one can: before a slice that starts when every slice before it has ended,
    so nothing is open across a cut."""
    ended = np.maximum.accumulate(ends)
    clear = np.flatnonzero(ended[:-1] <= starts[1:]) + 1
    if not len(clear):
        return clear
    wanted = np.searchsorted(clear, np.arange(every, len(starts), every))
    return np.unique(clear[np.minimum(wanted, len(clear) - 1)])


def nest_in_one_layer(table: SliceTable, ordered: np.ndarray) -> bool:
    """Whether first-fit would keep these rows (in nesting order) in one layer: whether no
    span ends inside a later one. Instants and empty spans always fit the first layer
    (nothing still open ends inside them) and are gone by the next start, so only spans
    longer than 0 are tested, a stretch between clear points at a time (first-fit starts
    afresh there), which bounds the arrays to a few MB."""
    starts, ends = table.spans(ordered)
    spans = (ends > starts) & ~table.instant[ordered]
    bounds = [0, *clear_points(starts, ends, _CHUNK).tolist(), len(ordered)]
    return all(_nest_properly(starts[first:last][spans[first:last]], ends[first:last][spans[first:last]])
               for first, last in zip(bounds, bounds[1:]))


def _nest_properly(starts: np.ndarray, ends: np.ndarray) -> bool:
    """Whether spans in nesting order, each longer than 0, nest properly: as brackets in time
    (ends before starts at one time, the later opened first), each end closes the most
    recently opened span still open. A begin's level is the depth before it, an end's the
    depth after it; properly nested, each level alternates one span's begin and its end."""
    count = len(starts)
    spans = np.arange(count)
    is_begin = np.repeat(np.array([False, True]), count)  # events 0..count-1: ends, then begins
    events = np.lexsort((np.concatenate((-spans, spans)), is_begin, np.concatenate((ends, starts))))
    begins = is_begin[events]
    levels = np.cumsum(np.where(begins, 1, -1)) - begins
    paired = events[np.argsort(levels, kind="stable")]
    return bool(np.array_equal(paired[0::2], paired[1::2] + count))
