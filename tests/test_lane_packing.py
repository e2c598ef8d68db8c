"""GPU slices packed into lanes (engine/compaction.partition_intervals), against the rule
stated one slice at a time: in (start, duration) order, each slice takes the lowest lane
that nothing still runs on at its start (a slice that ends where another starts leaves it
free), so there are as many lanes as slices ever run at once."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.engine.compaction import partition_intervals
from converter.model import Trace, Track

_STARTS = st.sampled_from([0, 1, 2, 3, 5, 8, 13, 2**40])  # repeats, touching ends, an epoch-sized time
_DURATIONS = st.sampled_from([0, 1, 2, 3, 5, 40])


def _one_by_one(spans: list[tuple[int, int]]) -> list[int]:
    """Each span's lane, in the order given (sorted by start, then duration)."""
    lanes: list[int] = []
    for index, (start, _) in enumerate(spans):
        taken = {lane for (_, end), lane in zip(spans[:index], lanes) if end > start}
        lanes.append(min(set(range(len(taken) + 1)) - taken))
    return lanes


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_STARTS, _DURATIONS), max_size=40))
def test_each_slice_takes_the_lowest_lane_free_at_its_start(drawn):
    trace = Trace()
    track = trace.add_track(Track(name="stream 7"))
    for start, duration in drawn:
        trace.slices.append(start, duration, "kernel", "kernel", -1, track)
    lanes = partition_intervals(trace.slices, np.arange(len(drawn), dtype=np.int64))
    order = sorted(range(len(drawn)), key=lambda index: (drawn[index][0], drawn[index][1]))
    spans = [(drawn[index][0], drawn[index][0] + drawn[index][1]) for index in order]
    want = _one_by_one(spans)
    lane_of = {row: lane for lane, rows in enumerate(lanes) for row in rows.tolist()}
    assert [lane_of[index] for index in order] == want
    assert len(lanes) == (max(want) + 1 if want else 0)
    for rows in lanes:  # each lane's rows in start order
        assert [drawn[row] for row in rows.tolist()] == sorted(drawn[row] for row in rows.tolist())
