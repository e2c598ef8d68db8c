"""How slices nest on one track: the order and the test every writer and stage shares.

Perfetto pairs a SLICE_END with the most recent open slice on its track, so slices must be
written in nesting order and never partially overlap on one track.
"""

from __future__ import annotations

from itertools import compress, islice
from operator import attrgetter, eq

from .trace import Slice

_START, _DURATION = attrgetter("ts"), attrgetter("dur")


def nesting_order(slices: list[Slice]) -> list[Slice]:
    """Start order, enclosing slices before the ones they contain (a new list)."""
    ordered = list(slices)
    sort_by_start(ordered, longest_first=True)
    return ordered


def sort_by_start(slices: list[Slice], longest_first: bool) -> None:
    """By start, equal starts by duration (longest or shortest first), then in input order;
    in place (a writer's own lists: no second list of a million slices).

    Sorted by start alone, on a C key (a real track is nearly in order already: timsort's
    best case), then only the runs of equal starts by duration: no key tuple per slice."""
    slices.sort(key=_START)
    ties = compress(range(1, len(slices)), map(eq, map(_START, slices), map(_START, islice(slices, 1, None))))
    runs: list[list[int]] = []  # [first, last] of each run of equal starts
    for index in ties:  # slices[index] starts with slices[index - 1]
        if runs and runs[-1][1] == index - 1:
            runs[-1][1] = index
        else:
            runs.append([index - 1, index])
    for first, last in runs:
        slices[first:last + 1] = sorted(slices[first:last + 1], key=_DURATION, reverse=longest_first)


def fits_nested(stack: list[Slice], candidate: Slice) -> bool:
    """Pop what ended by candidate's start; True when candidate nests inside what is left."""
    start = candidate.ts
    while stack and stack[-1].ts + stack[-1].dur <= start:
        stack.pop()
    return not stack or stack[-1].ts + stack[-1].dur >= start + candidate.dur


def nested_layers(slices: list[Slice]) -> list[list[Slice]]:
    """The slices in nesting order, split first-fit into layers that each nest properly
    (a single layer unless some slices partially overlap). fits_nested, on each layer's
    stack of open ends: ints, not slices, as this runs once per slice of every track."""
    layers: list[list[Slice]] = [[]]
    open_ends: list[list[int]] = [[]]
    for slice_ in nesting_order(slices):
        start = slice_.ts
        end = start + slice_.dur
        for layer, ends in enumerate(open_ends):
            while ends and ends[-1] <= start:
                ends.pop()
            if not ends or ends[-1] >= end:
                break
        else:
            layer = len(open_ends)
            open_ends.append([])
            layers.append([])
        if not slice_.is_instant:
            open_ends[layer].append(end)
        layers[layer].append(slice_)
    return layers
