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


def _nests(ordered: list[Slice]) -> bool:
    """Whether slices in nesting order all nest in one layer: fits_nested for each, on ends
    alone (the usual track, checked at a fraction of the first-fit's cost)."""
    open_ends: list[int] = []
    for slice_ in ordered:
        start, end = slice_.ts, slice_.ts + slice_.dur
        while open_ends and open_ends[-1] <= start:
            open_ends.pop()
        if open_ends and open_ends[-1] < end:
            return False
        if not slice_.is_instant:
            open_ends.append(end)
    return True


def nested_layers(slices: list[Slice]) -> list[list[Slice]]:
    """The slices in nesting order, split first-fit into layers that each nest properly
    (a single layer unless some slices partially overlap)."""
    ordered = nesting_order(slices)
    if _nests(ordered):
        return [ordered]
    layers: list[list[Slice]] = [[]]
    stacks: list[list[Slice]] = [[]]
    for slice_ in ordered:
        for layer, stack in enumerate(stacks):
            if fits_nested(stack, slice_):
                break
        else:
            layer = len(stacks)
            stacks.append([])
            layers.append([])
        if not slice_.is_instant:
            stacks[layer].append(slice_)
        layers[layer].append(slice_)
    return layers
