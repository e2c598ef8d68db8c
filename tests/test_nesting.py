"""Layers of slices on one track: nested_layers against a plain first-fit, on random tracks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from converter.model import Slice, Track
from converter.model.nesting import nested_layers

TRACK = Track(name="thread")
# (start, duration, instant): few distinct times, so slices tie, touch, nest and partially overlap.
SPANS = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 25), st.booleans()), min_size=1, max_size=60)


def _first_fit(slices: list[Slice]) -> list[list[Slice]]:
    """Each slice, in start order (longest first on a tie, then as given), in the lowest layer
    where it nests inside everything still open, judged on the whole layer (not a stack)."""
    ordered = sorted(slices, key=lambda s: (s.ts, -s.dur))  # stable: input order on a full tie
    layers: list[list[Slice]] = []
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
@given(SPANS)
def test_layers_are_first_fit_in_nesting_order(spans):
    slices = [Slice(ts, 0 if instant else dur, f"s{index}", "cat", None, TRACK, instant)
              for index, (ts, dur, instant) in enumerate(spans)]
    assert [[id(s) for s in layer] for layer in nested_layers(slices)] == \
        [[id(s) for s in layer] for layer in _first_fit(slices)]


def test_a_partial_overlap_takes_a_second_layer_and_nesting_does_not():
    outer, inner, crossing = (Slice(ts, dur, name, "cat", None, TRACK)
                              for ts, dur, name in ((0, 10, "outer"), (2, 3, "inner"), (8, 5, "crossing")))
    assert nested_layers([outer, inner]) == [[outer, inner]]
    assert nested_layers([crossing, inner, outer]) == [[outer, inner], [crossing]]
