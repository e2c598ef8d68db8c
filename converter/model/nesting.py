"""How slices nest on one track: the order and the test every writer and stage shares.

Perfetto pairs a SLICE_END with the most recent open slice on its track, so slices must be
written in nesting order and never partially overlap on one track.
"""

from __future__ import annotations

from .trace import Slice


def nesting_order(slices: list[Slice]) -> list[Slice]:
    """Start order, enclosing slices before the ones they contain."""
    return sorted(slices, key=lambda s: (s.ts, -s.dur))


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
