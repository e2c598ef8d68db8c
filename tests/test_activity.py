"""The work counters of each GPU's lane container and of a CPU rank's row, against their rules
read literally."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from converter.engine.activity import add_busy_lanes, add_cpu_work, busy_gpu_changes
from converter.model import NO_ARGS, LaneGroup, LaneKind, Process, SliceRow, Thread, Trace, Track, TrackRole

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


# (name, category) of a CPU-only rank's slices, and what the report's stage compute makes of
# each: compute, a communication op (blocks compute while it runs), a transport span (other
# work only), or nothing (a transfer buffer, an annotation, a step).
CPU_KINDS = {("aten::mm", "cpu_op"): "compute", ("aten::add_", "cpu_op"): "compute",
             ("c10d::recv_", "cpu_op"): "blocking", ("gloo:recv", "user_annotation"): "span",
             ("aten::empty", "cpu_op"): None, ("ProfilerStep#2", "user_annotation"): None,
             ("PP:0F1", "user_annotation"): None}
CPU_SLICES = st.lists(st.tuples(st.integers(0, 1), st.sampled_from(sorted(CPU_KINDS)), st.integers(0, 30),
                                st.sampled_from([0, 1, 3, 7, 12])), max_size=30)


def _expected_cpu(slices: list[tuple[str, int, int]]) -> list[tuple[int, float]]:
    """1 where a compute slice runs and no communication op, 1/2 where otherwise a
    communication op or span runs, 0 else; a sample where that changes (none at first: a 0 at
    the first slice where nothing lasting counts)."""
    lasting = [(kind, ts, end) for kind, ts, end in slices if end > ts]
    samples: list[tuple[int, float]] = []
    previous = None
    for at in sorted({t for kind, ts, end in lasting if kind is not None for t in (ts, end)}):
        running = {kind for kind, ts, end in lasting if ts <= at < end}
        level = 1.0 if "compute" in running and "blocking" not in running else \
            0.5 if running & {"blocking", "span"} else 0.0
        if level != previous:
            samples.append((at, level))
        previous = level
    return samples or [(min(ts for _, ts, _ in slices), 0.0)]


@settings(derandomize=True, max_examples=300, deadline=None, database=None)
@given(CPU_SLICES)
def test_a_cpu_rank_row_computes_by_the_stage_compute_definition(described):
    trace = Trace()
    gpu = Process(pid=0, source_pid=0, labels=["GPU 0"])
    cpu = Process(pid=1, source_pid=1, labels=["CPU"])
    trace.processes += [gpu, cpu]
    threads = [Thread(cpu, tid, tid) for tid in (1, 2)]
    trace.threads += threads
    tracks = [trace.add_track(Track("", process=cpu, thread=thread)) for thread in threads]
    lane = trace.add_track(Track("Compute", process=gpu, role=TrackRole.LANE, group=GROUPS[0]))
    trace.slices.append(0, 40, "aten::mm", "cpu_op", NO_ARGS, lane)  # a GPU's row: never the CPU's
    placed = []
    for thread, (name, category), ts, dur in described:
        trace.slices.append(ts, dur, name, category, NO_ARGS, tracks[thread])
        placed.append((CPU_KINDS[name, category], ts, ts + dur))
    add_cpu_work(trace, [gpu, cpu])
    assert gpu.activity is None
    if not placed:
        assert cpu.activity is None and trace.counters == []
        return
    assert cpu.activity is not None and cpu.activity.is_counter
    samples = [(s.ts, s.value) for s in trace.counters if s.track is cpu.activity]
    assert samples == _expected_cpu(placed)
    # The root counts the rank as computing exactly where its row is at 1.
    changes, ranks = busy_gpu_changes(trace)
    before = [0.0] + [level for _, level in samples[:-1]]
    assert ranks == 1
    assert changes == [(ts, 1 if level == 1.0 else -1) for (ts, level), prior in zip(samples, before)
                       if (level == 1.0) != (prior == 1.0)]
