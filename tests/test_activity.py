"""The busy-lanes counter of each GPU's lane container, against its rule read literally."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from converter.engine.activity import add_busy_lanes
from converter.model import NO_ARGS, SliceRow, Trace, Track, TrackRole

# (container, lane, ts, dur): zero-length slices included, and a GPU that has nothing else.
SLICES = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 30), st.sampled_from([0, 0, 1, 3, 7])),
                  max_size=40)


def _expected(slices: list[tuple[Track, SliceRow]]) -> list[tuple[Track, int, int]]:
    """Per container, in the order its first slice comes: at every time where one of its
    slices starts or ends, how many run just after it (started at or before, ending after);
    only zero-length slices: one 0 at the earliest."""
    containers: list[Track] = []
    for container, _ in slices:
        if container not in containers:
            containers.append(container)
    samples = []
    for container in containers:
        mine = [s for owner, s in slices if owner is container]
        lasting = [s for s in mine if s.dur > 0]
        if not lasting:
            samples.append((container, min(s.ts for s in mine), 0))
            continue
        for ts in sorted({t for s in lasting for t in (s.ts, s.ts + s.dur)}):
            samples.append((container, ts, sum(1 for s in lasting if s.ts <= ts < s.ts + s.dur)))
    return samples


@settings(derandomize=True, max_examples=300, deadline=None, database=None)
@given(SLICES)
def test_each_container_counts_its_busy_lanes(described):
    trace = Trace()
    containers = [trace.add_track(Track(name=f"GPU {g}", role=TrackRole.LANES)) for g in range(3)]
    lanes = [[trace.add_track(Track(name=f"lane {n}", parent=gpu, role=TrackRole.LANE)) for n in range(3)]
             for gpu in containers]
    other = trace.add_track(Track(name="thread"))
    placed = []
    for gpu, lane, ts, dur in described:
        row = trace.slices.append(ts, dur, "k", "kernel", NO_ARGS, lanes[gpu][lane])
        trace.slices.append(ts, dur + 1, "cpu", "cpu_op", NO_ARGS, other)  # not on a lane: never counted
        placed.append((containers[gpu], trace.slices.row(row)))
    add_busy_lanes(trace)
    assert [(s.track, s.ts, s.value) for s in trace.counters] == _expected(placed)
    assert {track for track in trace.tracks if track.is_counter} == {gpu for gpu, _ in placed}
