"""Keeping every slice on a track where it nests properly.

Perfetto pairs a SLICE_END with the most recent open slice on its track, so two slices that
partially overlap on one track would be silently mis-paired. Each such slice moves to an extra
track beside its own ("stream 7 (overlap 1)"); nothing is dropped.
"""

from __future__ import annotations

from collections import defaultdict

from .model import Slice, Trace, Track


def nesting_order(slices: list[Slice]) -> list[Slice]:
    """Start order, enclosing slices before the ones they contain."""
    return sorted(slices, key=lambda s: (s.ts, -s.dur))


def fits_nested(stack: list[Slice], candidate: Slice) -> bool:
    """Pop what ended by candidate's start; True when candidate nests inside what is left."""
    start = candidate.ts
    while stack and stack[-1].ts + stack[-1].dur <= start:
        stack.pop()
    return not stack or stack[-1].ts + stack[-1].dur >= start + candidate.dur


def separate_overlaps(trace: Trace) -> int:
    """Move partially overlapping slices to overlap tracks; returns how many moved. Flat
    tracks (compacted lanes) hold no overlaps: compaction's self-check proved it."""
    by_track: dict[Track, list[Slice]] = defaultdict(list)
    for slice_ in trace.slices:
        track = slice_.track
        if not track.flat:
            by_track[track].append(slice_)
    moved = 0
    for slices in by_track.values():
        moved += _split_track(trace, slices)
    return moved


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


def _split_track(trace: Trace, slices: list[Slice]) -> int:
    home = slices[0].track
    layers = nested_layers(slices)
    for index, layer in enumerate(layers[1:], start=1):
        track = trace.add_track(_overlap_track(home, index))
        for slice_ in layer:
            slice_.track = track
    return sum(len(layer) for layer in layers[1:])


def _overlap_track(home: Track, layer: int) -> Track:
    base = home.thread.display_name if home.thread is not None else home.name
    return Track(name=f"{base} (overlap {layer})", process=home.process, order=home.order)
