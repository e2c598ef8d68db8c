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
    (a single layer unless some slices partially overlap)."""
    layers: list[list[Slice]] = [[]]
    stacks: list[list[Slice]] = [[]]
    for slice_ in nesting_order(slices):
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
