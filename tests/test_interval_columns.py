"""The column forms of the interval and queue arithmetic (model/intervals.py's Spans,
model/waits.py) against a moment-by-moment reading of small random inputs: each integer moment
is in a set or not, and a queue's depth at a moment is a count."""

from __future__ import annotations

import random

import numpy as np
import pytest

from converter.model.intervals import Spans, clip_spans, intersect_spans, subtract_spans, union_spans
from converter.model.launch_keys import NO_ID, NO_STREAM
from converter.model.waits import NO_LAUNCH, host_side, no_host, queue_depths, ready_times, sorted_work

HORIZON = 120


def moments(spans: Spans) -> set[int]:
    return {moment for start, end in spans.pairs() for moment in range(start, end)}


def as_spans(covered: set[int]) -> list[tuple[int, int]]:
    """A set of moments as sorted, disjoint, non-touching [start, end) pairs."""
    found: list[tuple[int, int]] = []
    for moment in sorted(covered):
        if found and found[-1][1] == moment:
            found[-1] = (found[-1][0], moment + 1)
        else:
            found.append((moment, moment + 1))
    return found


def random_intervals(rng: random.Random, most: int) -> tuple[np.ndarray, np.ndarray]:
    starts = [rng.randrange(HORIZON) for _ in range(rng.randrange(most + 1))]
    ends = [start + rng.randrange(1, 25) for start in starts]
    return np.array(starts, np.int64), np.array(ends, np.int64)


@pytest.mark.parametrize("seed", range(300))
def test_set_operations_match_moments(seed: int) -> None:
    rng = random.Random(seed)
    a, b = union_spans(*random_intervals(rng, 8)), union_spans(*random_intervals(rng, 8))
    raw_starts, raw_ends = random_intervals(rng, 8)
    assert moments(union_spans(raw_starts, raw_ends)) == {
        moment for start, end in zip(raw_starts.tolist(), raw_ends.tolist()) for moment in range(start, end)}
    for spans in (a, b):  # sorted, disjoint, touching ones joined
        assert spans.pairs() == as_spans(moments(spans))
    assert subtract_spans(a, b).pairs() == as_spans(moments(a) - moments(b))
    assert intersect_spans(a, b).pairs() == as_spans(moments(a) & moments(b))
    low, high = sorted(rng.sample(range(HORIZON + 30), 2))
    assert clip_spans(a, low, high).pairs() == as_spans(moments(a) & set(range(low, high)))
    assert a.length() == len(moments(a))


@pytest.mark.parametrize("seed", range(200))
def test_ready_times_and_queue_depths_match_their_definitions(seed: int) -> None:
    rng = random.Random(seed)
    count = rng.randrange(20)
    starts = [rng.randrange(HORIZON) for _ in range(count)]
    slices = [(start, start + rng.randrange(1, 20), rng.choice([NO_ID, *range(5)]), rng.choice([NO_STREAM, 3, 7]))
              for start in starts]
    start, end, correlation, stream = (np.array([slice_[field] for slice_ in slices], np.int64) for field in range(4))
    work = sorted_work(start, end, correlation, np.ones(count, np.bool_), stream)
    calls = [(number, rng.randrange(HORIZON), rng.randrange(1, 15)) for number in range(5) if rng.random() < 0.7]
    host = host_side(np.array([number for number, _, _ in calls], np.int64),
                     np.array([start for _, start, _ in calls], np.int64),
                     np.array([start + length for _, start, length in calls], np.int64),
                     no_host().syncs, no_host().receives) if calls else no_host()
    returned = {number: start + length for number, start, length in calls}
    ready = ready_times(work, host)
    # The definition: the call's return, no earlier than the end of the id's launched slices before it.
    expected = []
    for index in range(count):
        number = int(work.correlation[index])
        if number not in returned:
            expected.append(NO_LAUNCH)
            continue
        earlier = [int(work.end[before]) for before in range(index) if int(work.correlation[before]) == number]
        expected.append(max([returned[number], *earlier]))
    assert ready.tolist() == expected
    depths = queue_depths(work, ready)
    assert list(depths) == sorted({None if stream == NO_STREAM else stream for stream in work.stream.tolist()},
                                  key=lambda stream: (stream is None, stream or 0))
    for stream, changes in depths.items():
        key = NO_STREAM if stream is None else stream
        mine = [index for index in range(count) if int(work.stream[index]) == key]
        enters = [min(int(ready[index]), int(work.start[index])) for index in mine]
        for moment in range(-1, HORIZON + 40):
            depth = sum(enter <= moment < int(work.end[index]) for enter, index in zip(enters, mine))
            at = int(np.searchsorted(changes.moments, moment, side="right")) - 1
            assert (int(changes.depths[at]) if at >= 0 else 0) == depth, (stream, moment)
        assert np.all(np.diff(changes.moments) > 0)
