"""The work counter of each GPU's lane container, against its rule read literally."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from converter.engine.activity import add_busy_lanes
from converter.model import NO_ARGS, LaneGroup, LaneKind, SliceRow, Trace, Track, TrackRole

# (container, lane, ts, dur): zero-length slices included, and a GPU that has nothing else.
SLICES = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 30), st.sampled_from([0, 0, 1, 3, 7])),
                  max_size=40)
# Lane 0 computes, lane 1 communicates, lane 2 copies memory.
GROUPS = [LaneGroup("compute", "Compute", LaneKind.COMPUTE), LaneGroup("nccl", "NCCL", LaneKind.COMMUNICATION),
          LaneGroup("memcpy", "Memcpy", LaneKind.MEMORY)]


def _expected(slices: list[tuple[Track, int, SliceRow]]) -> list[tuple[Track, int, float]]:
    """Per container, in the order its first slice comes: 1 while a compute slice runs, 1/2
    while only others run, 0 idle (a slice runs from its ts, not at its end), sampled at the
    times its slices start or end where that level differs from the one before; only
    zero-length slices: one 0 at the earliest."""
    containers: list[Track] = []
    for container, _, _ in slices:
        if container not in containers:
            containers.append(container)
    samples = []
    for container in containers:
        mine = [(lane, s) for owner, lane, s in slices if owner is container]
        lasting = [(lane, s) for lane, s in mine if s.dur > 0]
        if not lasting:
            samples.append((container, min(s.ts for _, s in mine), 0))
            continue
        previous = None
        for ts in sorted({t for _, s in lasting for t in (s.ts, s.ts + s.dur)}):
            running = {lane for lane, s in lasting if s.ts <= ts < s.ts + s.dur}
            level = 1.0 if 0 in running else 0.5 if running else 0.0
            if level != previous:
                samples.append((container, ts, level))
            previous = level
    return samples


@settings(derandomize=True, max_examples=300, deadline=None, database=None)
@given(SLICES)
def test_each_container_counts_compute_apart_from_other_work(described):
    trace = Trace()
    containers = [trace.add_track(Track(name=f"GPU {g}", role=TrackRole.LANES)) for g in range(3)]
    lanes = [[trace.add_track(Track(name=f"lane {n}", parent=gpu, role=TrackRole.LANE, group=GROUPS[n]))
              for n in range(3)] for gpu in containers]
    other = trace.add_track(Track(name="thread"))
    placed = []
    for gpu, lane, ts, dur in described:
        row = trace.slices.append(ts, dur, "k", "kernel", NO_ARGS, lanes[gpu][lane])
        trace.slices.append(ts, dur + 1, "cpu", "cpu_op", NO_ARGS, other)  # not on a lane: never counted
        placed.append((containers[gpu], lane, trace.slices.row(row)))
    add_busy_lanes(trace)
    assert [(s.track, s.ts, s.value) for s in trace.counters] == _expected(placed)
    counters = {track for track in trace.tracks if track.is_counter}
    assert counters == {gpu for gpu, _, _ in placed}
    assert len({track.scale for track in counters}) <= 1   # every GPU on one scale
