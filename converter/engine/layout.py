"""Keeping every slice on a track where it nests properly.

Perfetto pairs a SLICE_END with the most recent open slice on its track, so two slices that
partially overlap on one track would be silently mis-paired. Each such slice moves to an extra
track beside its own ("stream 7 (overlap 1)"); nothing is dropped.
"""

from __future__ import annotations

import numpy as np

from ..model import Trace, Track, TrackRole
from ..model.columns import grouped_in_order
from ..model.nesting import nested_layers
from ..tuning import DEFAULT_TUNING, Tuning


def separate_overlaps(trace: Trace, tuning: Tuning = DEFAULT_TUNING) -> int:
    """Move partially overlapping slices to overlap tracks; returns how many moved. Flat
    tracks (compacted lanes) hold no overlaps: compaction's self-check proved it."""
    table = trace.slices
    on = table.track
    rows = np.flatnonzero(~table.track_mask(lambda track: track.flat)[on])
    # Tracks in the order of their first slice, as the overlap tracks are made.
    return sum(_split_track(trace, rows[at], tuning) for _, at in grouped_in_order(on[rows]))


def _split_track(trace: Trace, rows: np.ndarray, tuning: Tuning) -> int:
    table = trace.slices
    home = table.tracks[int(table.track[rows[0]])]
    layers = nested_layers(table, rows, tuning)
    for index, layer in enumerate(layers[1:], start=1):
        track = trace.add_track(Track(name=f"{home.display_name} (overlap {index})", process=home.process,
                                      order=home.order, role=TrackRole.OVERLAP, home=home, layer=index))
        table.move(layer, track)
    return sum(len(layer) for layer in layers[1:])
