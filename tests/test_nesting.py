"""Layers of slices on one track: nested_layers against a plain first-fit, on random tracks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numpy as np

from converter.model import NO_ARGS, SliceRow, SliceTable, Track
from converter.model import nesting
from converter.model.nesting import nested_layers, nesting_order
from converter.tuning import DEFAULT_TUNING, Tuning

TRACK = Track(name="thread")
# (start, duration, instant): few distinct times, so slices tie, touch, nest and partially overlap.
SPANS = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 25), st.booleans()), min_size=1, max_size=60)


def _table(spans: list[tuple[int, int, bool]]) -> SliceTable:
    table = SliceTable()
    for index, (ts, dur, instant) in enumerate(spans):
        table.append(ts, 0 if instant else dur, f"s{index}", "cat", NO_ARGS, TRACK, instant)
    return table


def _layers(table: SliceTable, rows: list[int], chunk: int = DEFAULT_TUNING.nesting_chunk,
            looped_whole: int = DEFAULT_TUNING.nesting_looped_whole) -> list[list[int]]:
    """nested_layers' layers (row numbers), its columns tested and its loop's times made
    Python ints `chunk` slices at a time, and stretches of `looped_whole` slices or fewer
    looped whole."""
    tuning = Tuning(nesting_chunk=chunk, nesting_looped_whole=looped_whole)
    return [layer.tolist() for layer in nested_layers(table, np.array(rows, np.int64), tuning)]


def _first_fit(slices: list[SliceRow]) -> list[list[SliceRow]]:
    """Each slice, in start order (longest first on a tie, then as given), in the lowest layer
    where it nests inside everything still open, judged on the whole layer (not a stack)."""
    ordered = sorted(slices, key=lambda s: (s.ts, -s.dur))  # stable: input order on a full tie
    layers: list[list[SliceRow]] = []
    for slice_ in ordered:
        end = slice_.ts + slice_.dur
        for layer in layers:
            still_open = [s for s in layer if not s.is_instant and s.ts + s.dur > slice_.ts]
            if all(s.ts + s.dur >= end for s in still_open):
                layer.append(slice_)
                break
        else:
            layers.append([slice_])
    return layers


@settings(derandomize=True, max_examples=400, deadline=None)
@given(SPANS, st.sampled_from([0, 3, 1 << 16]))
def test_layers_are_first_fit_in_nesting_order(spans, looped_whole):
    table = _table(spans)
    assert _layers(table, list(range(len(spans))), looped_whole=looped_whole) == \
        [[s.row for s in layer] for layer in _first_fit(table.rows())]


def _over_children(parts: tuple[int, list[list[tuple[int, int, bool]]], int]) -> list[tuple[int, int, bool]]:
    """A slice over its children laid one after another, `gap` apart (a negative gap: each
    starts before the one before it ends, crossing it), its end moved by `overrun` (past the
    last child's end: crossing it)."""
    gap, children, overrun = parts
    spans, offset = [], 0
    for child in children:
        spans += [(offset + ts, dur, instant) for ts, dur, instant in child]
        offset = max(0, max(ts + dur for ts, dur, _ in spans) + gap)
    start = min(ts for ts, _, _ in spans)
    end = max(ts + dur for ts, dur, _ in spans)
    return [(start, max(0, end - start + overrun), False), *spans]


# Slices inside slices, some crossing a sibling or their parent's end: crossings deep inside
# enclosing slices, as on real threads (a long step, its ops, their kernels' launches).
_TREE = st.recursive(
    st.tuples(st.integers(0, 3), st.integers(0, 3), st.booleans()).map(lambda leaf: [(leaf[0], leaf[1], leaf[2])]),
    lambda children: st.tuples(st.integers(-2, 2), st.lists(children, min_size=1, max_size=4),
                               st.integers(-2, 2)).map(_over_children),
    max_leaves=30)


@settings(derandomize=True, max_examples=400, deadline=None)
@given(_TREE, st.sampled_from([2, 5, 1 << 16]), st.sampled_from([0, 1, 3, 1 << 16]))
def test_layers_are_first_fit_inside_enclosing_slices(spans, chunk, looped_whole):
    """Also where the columns are tested, and the loop's times made Python ints, a few
    slices at a time, and whatever the stretches looped whole."""
    table = _table(spans)
    assert _layers(table, list(range(len(spans))), chunk, looped_whole) == \
        [[s.row for s in layer] for layer in _first_fit(table.rows())]


def test_a_partial_overlap_takes_a_second_layer_and_nesting_does_not():
    table = _table([(0, 10, False), (2, 3, False), (8, 5, False)])
    outer, inner, crossing = range(3)
    assert _layers(table, [outer, inner]) == [[outer, inner]]
    assert _layers(table, [crossing, inner, outer]) == [[outer, inner], [crossing]]


@pytest.mark.parametrize("stretch", [2, 5, 1 << 16], ids=["stretches of 2", "of 5", "whole"])
def test_the_test_on_columns_says_one_layer_exactly_when_first_fit_does(stretch):
    """The column test that spares most tracks first-fit's loop, checked a stretch at a time
    (short stretches cut where nothing is open) as on a long track."""

    @settings(derandomize=True, max_examples=400, deadline=None)
    @given(SPANS)
    def agrees(spans):
        table = _table(spans)
        ordered = nesting_order(table, np.arange(len(spans)))
        starts, ends = table.spans(ordered)
        crossing = nesting._crossing(starts, ends, table.instant[ordered], stretch)
        assert (len(crossing) == 0) == (len(_first_fit(table.rows())) == 1)

    agrees()


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 6), st.integers(0, 5)), min_size=1, max_size=60),
       st.randoms(use_true_random=False))
def test_rows_by_track_in_nesting_order_are_sorted_as_plain_python_sorts_them(spans, random):
    """by_track_in_nesting_order against sorted(): rows given in any order, some twice; few
    tracks, starts and durations, so many rows share a track and start (only those are
    sorted by duration) and some their duration too."""
    tracks = [Track(name=f"thread {number}") for number in range(3)]
    table = SliceTable()
    for index, (track, ts, dur) in enumerate(spans):
        table.append(ts, dur, f"s{index}", "cat", NO_ARGS, tracks[track])
    rows = [random.randrange(len(spans)) for _ in range(random.randrange(1, 2 * len(spans)))]
    track_ids = table.track.tolist()  # tracks numbered as first added
    key = [(track_ids[row], spans[row][1], -spans[row][2], place) for place, row in enumerate(rows)]
    expected = sorted(range(len(rows)), key=key.__getitem__)
    assert nesting.by_track_in_nesting_order(table, np.array(rows, np.int64)).tolist() == expected
