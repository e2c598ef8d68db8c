"""Issue 54, Must show 1: each step's GPU idle time cut into causes that add up to it exactly,
checked on real traces against a plain reading of the input JSON that classifies every
elementary stretch of time on its own."""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections import defaultdict
from pathlib import Path

import pytest

from .helpers import SHARED_TRACES, compact_file, rows, track_roles
from .oracle import load_events, to_ns
from .test_report_oracle import merged

GPU = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME = ("cuda_runtime", "cuda_driver")
SYNCS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
RECEIVES = ("c10d::recv", "gloo:recv", "nccl:recv")
PARTS = ("queued_ns", "host_sync_ns", "peer_ns", "host_behind_ns", "other_ns")


def holds(spans: list[tuple[int, int]], a: int, b: int) -> bool:
    """Whether one of the disjoint, sorted `spans` covers [a, b]."""
    index = bisect_right([start for start, _ in spans], a) - 1
    return index >= 0 and spans[index][1] >= b


def expected_launches(source: Path) -> dict[str, dict]:
    """Per step: its kernels (those that begin in it), each one's start less its launch (the
    runtime call with its correlation id returned; a graph replay's kernel no earlier than the
    end of the replay's kernels begun before it), the calls' mean duration, kernels under 10 us."""
    _, events = load_events(source)
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
    calls: dict[int, tuple[int, int]] = {}
    for e in spans:
        number = (e.get("args") or {}).get("correlation")
        if e.get("cat") in RUNTIME and isinstance(number, int):
            calls.setdefault(number, (to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])))
    work = sorted((to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"]), (e.get("args") or {}).get("correlation"),
                   e["cat"] == "kernel", (e.get("args") or {}).get("stream"))
                  for e in spans if e.get("cat") in GPU and to_ns(e["dur"]) > 0)
    replay_end: dict[int, int] = {}
    ready = []
    for start, end, number, _, _ in work:
        if isinstance(number, int) and number in calls:
            ready.append(max(calls[number][1], replay_end.get(number, 0)))
            replay_end[number] = max(replay_end.get(number, 0), end)
        else:
            ready.append(None)
    steps = sorted((e["name"], to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])) for e in spans
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    if not steps:
        steps = [("active span", work[0][0], max(item[1] for item in work))]
    queued = defaultdict(list)  # per stream: (from, to) of each slice launched and not yet ended
    for item, launched in zip(work, ready):
        queued[item[4]].append((item[0] if launched is None else min(launched, item[0]), item[1]))
    found = {}
    for name, step_start, step_end in steps:
        mine = [(item, launched) for item, launched in zip(work, ready) if item[3] and step_start <= item[0] < step_end]
        delays = sorted(item[0] - launched for item, launched in mine if launched is not None)
        used = {item[2] for item, launched in mine if launched is not None}
        cpu = [calls[number][1] - calls[number][0] for number in used]
        lengths = [item[1] - item[0] for item, _ in mine]
        short = [length for length in lengths if length < 10_000]
        depths = {}
        for stream, spans_ in queued.items():
            cuts = sorted({step_start, step_end} | {m for span in spans_ for m in span if step_start < m < step_end})
            # no slice enters or leaves inside a stretch: those in it entered by its start and leave after it
            enters, leaves = sorted(enter for enter, _ in spans_), sorted(leave for _, leave in spans_)
            counts = [(b - a, bisect_right(enters, a) - bisect_right(leaves, a)) for a, b in zip(cuts, cuts[1:])]
            depths[stream] = (max(count for _, count in counts), sum(w * c for w, c in counts) / (step_end - step_start))
        found[name] = {"kernels": len(mine), "delays": delays, "cpu_mean": sum(cpu) / len(cpu),
                       "short": len(short), "short_time": sum(short) / sum(lengths), "depths": depths}
    return found


def expected_idle(source: Path) -> dict[str, dict[str, int]]:
    """Per step: idle time and its parts. Every stretch between two consecutive moments where
    anything changes is idle when no GPU slice runs; its gap's next GPU work (the slices that
    start where the gap ends) was launched at its runtime call's end, or for a graph replay's
    kernel once the replay's kernels begun before it ended; the stretch is queued once that
    has happened, else host sync, peer or host behind as the CPU says, else other."""
    _, events = load_events(source)
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
    work = sorted((to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"]), (e.get("args") or {}).get("correlation"))
                  for e in spans if e.get("cat") in GPU and to_ns(e["dur"]) > 0)
    launch_end: dict[int, int] = {}
    for e in spans:
        number = (e.get("args") or {}).get("correlation")
        if e.get("cat") in RUNTIME and isinstance(number, int):
            launch_end.setdefault(number, to_ns(e["ts"]) + to_ns(e["dur"]))
    syncs = merged((to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])) for e in spans
                   if e.get("cat") in RUNTIME and e["name"] in SYNCS and to_ns(e["dur"]) > 0)
    receives = merged((to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])) for e in spans
                      if e.get("cat") not in GPU and str(e.get("name", "")).startswith(RECEIVES) and to_ns(e["dur"]) > 0)
    ready_at: dict[int, int] = {}
    replay_end: dict[int, int] = {}
    for start, end, number in work:
        if isinstance(number, int) and number in launch_end:
            ready = max(launch_end[number], replay_end.get(number, 0))
            ready_at[start] = min(ready_at.get(start, ready), ready)
            replay_end[number] = max(replay_end.get(number, 0), end)
    busy = merged((start, end) for start, end, _ in work)
    island_starts = [start for start, _ in busy]
    steps = sorted((e["name"], to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])) for e in spans
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    if not steps:
        steps = [("active span", busy[0][0], busy[-1][1])]
    moments = sorted({m for start, end, _ in work for m in (start, end)} | set(ready_at.values())
                     | {m for span in syncs + receives for m in span})
    found = {}
    for name, step_start, step_end in steps:
        cuts = [step_start] + moments[bisect_right(moments, step_start):bisect_left(moments, step_end)] + [step_end]
        parts = dict.fromkeys(["idle_ns", *PARTS], 0)
        for a, b in zip(cuts, cuts[1:]):
            if holds(busy, a, b):
                continue
            parts["idle_ns"] += b - a
            following = bisect_left(island_starts, b)
            ready = ready_at.get(island_starts[following]) if following < len(island_starts) else None
            part = ("queued_ns" if ready is not None and ready <= a else "host_sync_ns" if holds(syncs, a, b)
                    else "peer_ns" if holds(receives, a, b) else "host_behind_ns" if ready is not None else "other_ns")
            parts[part] += b - a
        found[name] = parts
    return found


def reported_gpu(source: Path, tmp_path: Path, capsys) -> dict:
    """The report's one GPU of `source`, compacted; steps bounded by their ProfilerStep spans,
    as the oracles bound them (test_step_windows checks the default's bounds)."""
    from converter.cli import main

    if not source.is_file():
        pytest.skip("../shared/traces is absent")
    output = tmp_path / "out.perfetto-trace"
    compact_file(source, output)
    capsys.readouterr()
    assert main(["report", str(output), "--format", "json", "--step-windows", "cpu"]) == 0
    [gpu] = json.loads(capsys.readouterr().out)["gpus"]
    return gpu


@pytest.mark.parametrize("name", ["hta_cuda_graph_rank0.json.gz", "hta_nccl_a100.json.gz",
                                  "tracelens_b200_eager.json.gz"])
def test_idle_parts_add_up_and_agree_with_the_input(tmp_path: Path, capsys, name: str) -> None:
    source = SHARED_TRACES / name
    gpu = reported_gpu(source, tmp_path, capsys)
    steps = {step["step"]: {key: value for key, value in step.items() if key != "step"} for step in gpu["idle_by_cause"]}
    for step in steps.values():
        assert sum(step[part] for part in PARTS) == step["idle_ns"]
    assert steps == expected_idle(source)


@pytest.mark.parametrize("name", ["hta_cuda_graph_rank0.json.gz", "hta_nccl_a100.json.gz",
                                  "tracelens_b200_eager.json.gz"])
def test_launch_stats_agree_with_the_input(tmp_path: Path, capsys, name: str) -> None:
    source = SHARED_TRACES / name
    gpu = reported_gpu(source, tmp_path, capsys)
    expected = expected_launches(source)
    assert [step["step"] for step in gpu["launches"]] == list(expected)
    for step in gpu["launches"]:
        want = expected[step["step"]]
        delays = want["delays"]
        assert step["kernels"] == want["kernels"] and step["launched_kernels"] == len(delays)
        assert step["launch_delay_p50_ns"] == delays[(len(delays) + 1) // 2 - 1]
        assert step["launch_delay_p90_ns"] == delays[-(-9 * len(delays) // 10) - 1]
        assert step["launch_delay_max_ns"] == max(delays)
        assert step["cpu_per_launch_ns"] == pytest.approx(want["cpu_mean"])
        assert step["short_kernels"] == want["short"]
        assert step["short_kernel_share"] == pytest.approx(want["short"] / want["kernels"])
        assert step["short_kernel_time_share"] == pytest.approx(want["short_time"])
        assert {row["stream"]: (row["max_depth"], pytest.approx(row["mean_depth"])) for row in step["queue_depth"]} \
            == want["depths"]


# The time each idle-cause code holds within [start, end): a sum over the GPU's counter.
CAUSE_TIME_SQL = """
with c as (select c.ts, c.value, lead(c.ts) over (partition by c.track_id order by c.ts) as next_ts
           from counter c join cgtrace_track t on t.track_id = c.track_id where t.role = 'idle_cause')
select cast(value as int) as code, sum(min(next_ts, {end}) - max(ts, {start})) as ns from c
where next_ts > {start} and ts < {end} group by 1"""
# Each queue depth counter's largest value within [start, end): the value holding at start, and every later one.
DEPTH_SQL = """
select t.uuid, max(c.value) as depth from counter c join cgtrace_track t on t.track_id = c.track_id
where t.role = 'queue_depth' and c.ts < {end} and c.ts >= coalesce(
  (select max(b.ts) from counter b where b.track_id = c.track_id and b.ts <= {start}), {start})
group by t.uuid"""


@pytest.mark.parametrize("name", ["hta_cuda_graph_rank0.json.gz", "hta_nccl_a100.json.gz",
                                  "tracelens_b200_eager.json.gz"])
def test_the_written_counters_say_what_the_report_and_the_input_say(tmp_path: Path, capsys, name: str) -> None:
    """The GPU's "Why idle" counter, summed per step by code, is the report's idle by cause and
    the oracle's; each stream's queue depth counter peaks per step where the report and the
    oracle say (graph-aware: never at every replay kernel at once)."""
    from converter.model.derived import IDLE_CODES

    source = SHARED_TRACES / name
    gpu = reported_gpu(source, tmp_path, capsys)
    output = tmp_path / "out.perfetto-trace"
    oracle, launches = expected_idle(source), expected_launches(source)
    streams = {role.uuid: role.stream for role in track_roles(output) if role.role.value == "queue_depth"}
    reported = {step["step"]: step for step in gpu["idle_by_cause"]}
    depths = {step["step"]: {row["stream"]: row["max_depth"] for row in step["queue_depth"]} for step in gpu["launches"]}
    # Each ProfilerStep's CPU span (the report's --step-windows cpu) as the written trace holds it.
    steps = {row["name"]: (row["ts"], row["end_ts"]) for row in rows(output, "select name, ts, end_ts from cgtrace_step")}
    if not steps:  # no ProfilerStep: the report's one period runs from the GPU's first work to its last
        steps = {"active span": tuple(rows(output, """select min(ts) as a, max(end_ts) as b from cgtrace_slice
                                                     where role = 'lane' and dur > 0""")[0].values())}
    assert steps and set(steps) == set(reported) == set(oracle)
    for step, (start, end) in steps.items():
        codes = {row["code"]: row["ns"] for row in rows(output, CAUSE_TIME_SQL.format(start=start, end=end))}
        written = {part: codes.get(IDLE_CODES[cause], 0) for part, cause in zip(PARTS, IDLE_CODES)}
        assert written == {part: reported[step][part] for part in PARTS} == {part: oracle[step][part] for part in PARTS}
        assert sum(written.values()) == oracle[step]["idle_ns"]
        peaks = {streams[row["uuid"]]: int(row["depth"]) for row in rows(output, DEPTH_SQL.format(start=start, end=end))}
        assert peaks == depths[step] == {stream: depth for stream, (depth, _) in launches[step]["depths"].items()}
