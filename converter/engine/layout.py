"""Keeping every slice on a track where it nests properly.

Perfetto pairs a SLICE_END with the most recent open slice on its track, so two slices that
partially overlap on one track would be silently mis-paired. Each such slice moves to an extra
track beside its own ("stream 7 (overlap 1)"); nothing is dropped.
"""

from __future__ import annotations

from collections import defaultdict

from ..model import Slice, Trace, Track, TrackRole
from ..model.nesting import nested_layers


def separate_overlaps(trace: Trace) -> int:
    """Move partially overlapping slices to overlap tracks; returns how many moved. Flat
    tracks (compacted lanes) hold no overlaps: compaction's self-check proved it."""
    by_track: dict[Track, list[Slice]] = defaultdict(list)
    for slice_ in trace.slices:
        by_track[slice_.track].append(slice_)
    return sum(_split_track(trace, slices) for track, slices in by_track.items() if not track.flat)


def _split_track(trace: Trace, slices: list[Slice]) -> int:
    home = slices[0].track
    layers = nested_layers(slices)
    for index, layer in enumerate(layers[1:], start=1):
        track = trace.add_track(Track(name=f"{home.display_name} (overlap {index})", process=home.process,
                                      order=home.order, role=TrackRole.OVERLAP, home=home, layer=index))
        for slice_ in layer:
            slice_.track = track
    return sum(len(layer) for layer in layers[1:])
