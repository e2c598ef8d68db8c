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
    single layer unless some slices partially overlap). fits_nested, on each layer's stack
    of open ends, inline: this runs once per slice of every track."""
    ordered = nesting_order(table, rows)
    layer_of: list[int] = []
    open_ends: list[list[int]] = [[]]
    for first in range(0, len(ordered), _CHUNK):
        part = ordered[first:first + _CHUNK]
        starts = table.ts[part]
        for start, end, instant in zip(starts.tolist(), (starts + table.dur[part]).tolist(),
                                       table.instant[part].tolist()):
            for layer, ends in enumerate(open_ends):
                while ends and ends[-1] <= start:
                    ends.pop()
                if not ends or ends[-1] >= end:
                    break
            else:
                layer = len(open_ends)
                open_ends.append([])
            if not instant:
                open_ends[layer].append(end)
            layer_of.append(layer)
    if len(open_ends) == 1:
        return [ordered]
    layers = np.array(layer_of, np.int64)
    return [ordered[layers == layer] for layer in range(len(open_ends))]
