"""The critical path of each step across a merged pipeline's ranks (engine/critical_path.py).

Read back from the written trace with trace_processor, and checked against the input JSON:
the path tiles the step from its first ProfilerStep start to the last GPU work's end (on the
merge's clock, within its uncertainty), crosses from `cudaGraphLaunch` into the kernels it
replays and from rank to rank through SEND -> RECV transfers, and sits on tracks of its own
while every measured slice stays where it was.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.cli import main
from converter.engine.work_graph import _self_time
from converter.generator import write_pp_run
from converter.model import TrackRole

from .helpers import merge_files, real_pipeline_copy, rows, track_roles
from .oracle import load_events, to_ns

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def path_segments(trace: Path) -> dict[int, list[dict]]:
    """Per step, the critical path's slices in time order, found by their tracks' role."""
    uuids = [role.uuid for role in track_roles(trace) if role.role is TrackRole.CRITICAL_PATH]
    assert uuids
    found = rows(trace, f"""
        select s.id, s.track_id, s.ts, s.ts + s.dur as end_ts, s.name, s.category,
               extract_arg(s.arg_set_id, 'debug.args.kind') as kind, extract_arg(s.arg_set_id, 'debug.args.step') as step,
               extract_arg(s.arg_set_id, 'debug.args.pp_rank') as pp_rank,
               extract_arg(s.arg_set_id, 'debug.args.global_rank') as global_rank,
               extract_arg(s.arg_set_id, 'debug.args.from_global_rank') as from_global_rank
        from cgtrace_all_slice s join track t on t.id = s.track_id
        where (select a.int_value from args a where a.arg_set_id = t.source_arg_set_id and a.key = 'trace_id')
              in ({', '.join(map(str, uuids))})
        order by s.ts, s.id""")
    steps: dict[int, list[dict]] = defaultdict(list)
    track_end: dict[int, int] = {}
    for row in found:
        assert row["category"] == "critical_path"  # nothing measured sits on the path's tracks
        assert row["ts"] >= track_end.get(row["track_id"], row["ts"])  # a row's slices never overlap
        track_end[row["track_id"]] = row["end_ts"]
        steps[row["step"]].append(row)
    return steps


def rank_events(file: Path, offset: int) -> list[tuple[dict, int, int]]:
    """A rank's complete events with their times on the merge's clock (base time + its offset)."""
    header, events = load_events(file)
    base = int(header.get("baseTimeNanoseconds", 0)) + offset
    return [(e, base + to_ns(e["ts"]), base + to_ns(e["ts"]) + to_ns(e.get("dur", 0))) for e in events
            if e.get("ph") == "X" and "ts" in e]


def step_windows(events_by_rank: dict[int, list]) -> dict[int, tuple[int, int]]:
    """Step N across ranks: from the first ProfilerStep#N start to the last one's end (CPU side)."""
    windows: dict[int, tuple[int, int]] = {}
    for events in events_by_rank.values():
        for e, start, end in events:
            if e["name"].startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation":
                number = int(e["name"].split("#")[1])
                known = windows.get(number, (start, end))
                windows[number] = (min(known[0], start), max(known[1], end))
    return windows


def merged_run(files: list[Path], output: Path) -> tuple[dict, dict[int, list], int]:
    """Merge with the self-check; each global rank's events on the merge's clock, and the largest
    uncertainty of the clocks it set (0 where it kept the base times)."""
    summary = merge_files(files, lambda group, groups: output, verify=True)
    clocks = {rank["global_rank"]: rank for rank in summary.get("clock_alignment", {}).get("ranks", [])}
    by_rank = {}
    for place in summary["pp_ranks"]:
        clock = clocks.get(place["global_rank"], {})
        by_rank[place["global_rank"]] = rank_events(Path(place["file"]), clock.get("applied_offset_ns", 0))
    uncertainty = max([clock["uncertainty_ns"] or 0 for clock in clocks.values() if clock["applied_offset_ns"]],
                      default=0)
    return summary, by_rank, uncertainty


def check_tiling(steps: dict[int, list[dict]], windows: dict[int, tuple[int, int]]) -> None:
    """Each step's segments follow one another with no gap or overlap, from the step's start."""
    assert set(steps) <= set(windows) and steps
    for step, segments in steps.items():
        first, last = windows[step]
        assert segments[0]["ts"] == first
        assert all(a["end_ts"] == b["ts"] for a, b in zip(segments, segments[1:]))
        assert segments[-1]["end_ts"] <= last
        assert {s["kind"] for s in segments} <= {"compute", "transfer", "launch", "wait"}


def rank_changes(segments: list[dict]) -> list[tuple[dict, dict]]:
    return [(a, b) for a, b in zip(segments, segments[1:]) if a["global_rank"] != b["global_rank"]]


def sent(segment: dict, segments: list[dict]) -> dict:
    """The send a segment stands for: itself, or for its data in flight, the segment before it."""
    if segment["name"] != "in flight":
        return segment
    before = [s for s in segments if s["end_ts"] == segment["ts"] and s["global_rank"] == segment["global_rank"]]
    assert len(before) == 1
    return before[0]


def test_generated_cuda_graph_pipeline(tmp_path):
    # Launch-bound (the CPU's graph launches take 40 times as long) so kernels wait for their launch.
    files = write_pp_run(tmp_path / "ranks", pp_size=4, microbatches=4, steps=2, seed=3, graphs_per_step=2,
                         kernels_per_replay=8, launch_factor=40, include_memcpy=False)
    output = tmp_path / "merged.perfetto-trace"
    summary, by_rank, uncertainty = merged_run(files, output)
    steps = path_segments(output)
    windows = step_windows(by_rank)
    check_tiling(steps, windows)
    assert summary["critical_path"] == {"steps": len(steps), "segments": sum(map(len, steps.values()))}
    for step, segments in steps.items():
        # Its length is the step's: from the step's first start to the last GPU work to end in it.
        first, last = windows[step]
        last_gpu = max(end for events in by_rank.values() for e, start, end in events
                       if e.get("cat") in GPU_CATEGORIES and start >= first and end <= last)
        assert abs((segments[-1]["end_ts"] - segments[0]["ts"]) - (last_gpu - first)) <= uncertainty
    all_segments = [s for segments in steps.values() for s in segments]
    # From a cudaGraphLaunch into a kernel of its replay (the same correlation in the input).
    crossings = 0
    for segments in steps.values():
        work = [s for s in segments if s["kind"] != "wait"]
        for launch, kernel in zip(work, work[1:]):
            if launch["name"] != "cudaGraphLaunch" or launch["global_rank"] != kernel["global_rank"]:
                continue
            events = by_rank[launch["global_rank"]]
            correlations = {e["args"]["correlation"] for e, start, _ in events
                            if e["name"] == "cudaGraphLaunch" and start == launch["ts"]}
            replayed = [e for e, start, _ in events if e.get("cat") == "kernel" and start == kernel["ts"]
                        and e["name"] == kernel["name"] and e["args"].get("correlation") in correlations]
            crossings += len(replayed) == 1
    assert crossings >= 1
    # Across ranks through transfers: a SEND's kernel on one rank, the RECV's kernel running on
    # from the moment it ended on the next rank up or down the pipeline.
    changes = [change for segments in steps.values() for change in rank_changes(segments)]
    assert len(changes) >= 2
    for send, receive in changes:
        assert send["kind"] == receive["kind"] == "transfer" and abs(send["pp_rank"] - receive["pp_rank"]) == 1
        send = sent(send, all_segments)
        assert any(e["name"] == send["name"] and end == send["end_ts"] for e, _, end in by_rank[send["global_rank"]]
                   if e.get("cat") == "kernel")
        # The receive names what it waited for: the data of the sending rank.
        assert receive["from_global_rank"] == send["global_rank"]
        assert any(receive["name"].startswith(f"{e['name']}: data from ") and start <= receive["ts"]
                   and end == receive["end_ts"]
                   for e, start, end in by_rank[receive["global_rank"]] if e.get("cat") == "kernel")
    # The path copies the work it names: each compute segment lies inside a measured slice of its
    # name (a CPU op's own time is cut around its children), and every measured slice stays in place.
    measured = {(row["name"], row["ts"], row["end_ts"]) for row in rows(output, """
        select name, ts, ts + dur as end_ts from cgtrace_all_slice where coalesce(category, '') != 'critical_path'""")}
    spans_of = defaultdict(list)
    for name, start, end in measured:
        spans_of[name].append((start, end))
    computed = [s for s in all_segments if s["kind"] == "compute"]
    assert computed and all(any(start <= s["ts"] and s["end_ts"] <= end for start, end in spans_of[s["name"]])
                            for s in computed)
    assert summary["verified"]["slices"] == len(measured) + len(all_segments)
    check_report(output, steps)


def check_report(trace: Path, steps: dict[int, list[dict]]) -> None:
    """`report` gives the path per step as the trace holds it, its time per kind and per rank
    summed from the trace's rows, prints those sums as text, and draws it on the HTML timeline."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(trace), "--format", "json"]) == 0
    reported = json.loads(out.getvalue())["critical_path"]
    assert [row["step"] for row in reported] == sorted(steps)
    for row in reported:
        segments = steps[row["step"]]
        assert row["start_ns"] == segments[0]["ts"] and row["end_ns"] == segments[-1]["end_ts"]
        assert row["length_ns"] == row["end_ns"] - row["start_ns"]
        assert [(s["pp_rank"], s["global_rank"], s["kind"], s["name"], s["start_ns"], s["end_ns"])
                for s in row["segments"]] == [(s["pp_rank"], s["global_rank"], s["kind"], s["name"], s["ts"],
                                               s["end_ts"]) for s in segments]
        by_kind: dict[str, int] = defaultdict(int)
        by_rank: dict[tuple, int] = defaultdict(int)
        for s in segments:
            by_kind[s["kind"]] += s["end_ts"] - s["ts"]
            by_rank[(s["pp_rank"], s["global_rank"])] += s["end_ts"] - s["ts"]
        assert {k: v for k, v in row["kinds_ns"].items() if v} == dict(by_kind)
        assert sum(row["kinds_ns"].values()) == row["length_ns"]
        assert {(r["pp_rank"], r["global_rank"]): r["on_path_ns"] for r in row["ranks"]} == dict(by_rank)
        for rank in row["ranks"]:  # the work it spent most in there is a name of its segments, at least as long as any
            mine = [s for s in segments if (s["pp_rank"], s["global_rank"]) == (rank["pp_rank"], rank["global_rank"])]
            named: dict[tuple, int] = defaultdict(int)
            for s in mine:
                named[(s["kind"], s["name"])] += s["end_ts"] - s["ts"]
            assert named[(rank["most"]["kind"], rank["most"]["name"])] == rank["most"]["ns"] == max(named.values())
    text = io.StringIO()
    with redirect_stdout(text):
        assert main(["report", str(trace)]) == 0
    table = text.getvalue().split("Critical path (derived)", 1)[1].split("\n\n", 1)[0]
    assert [line.split() for line in table.splitlines()[3:]] == [
        [str(row["step"])] + [f"{ns / 1e6:.3f}" for ns in (row["length_ns"], *row["kinds_ns"].values())]
        for row in reported]
    html = out_html(trace)
    kinds = {s["kind"] for segments in steps.values() for s in segments}
    # A band drawn under a rank's strip (the CSS and the key name every kind whatever is drawn).
    assert all(f'<rect data-path="{kind}" x=' in html for kind in kinds) and "critical path" in html


def out_html(trace: Path) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(trace), "--format", "html"]) == 0
    return out.getvalue()


REAL_SETS = ["dp2_pp2", "interleaved1f1b_pp2v2", "torch215_1f1b_pp4", "torch215_gpipe_pp4",
             "torch215_interleaved1f1b_pp2v2", "torch215_zb_pp2v2"]
COMMUNICATION = ("c10d::", "gloo:", "nccl:", "record_param_comms")
BUFFERS = ("aten::empty", "aten::detach", "detach")
WAIT_NAMES = ("untraced time on the thread after ", "untraced: before the rank's first traced work", "wait for ",
              "stream idle after ", "queued on the GPU after its launch by ")


def union(spans) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def subtract(spans, holes) -> list[tuple[int, int]]:
    result = []
    for start, end in spans:
        for hole_start, hole_end in holes:
            if hole_end <= start or hole_start >= end:
                continue
            if hole_start > start:
                result.append((start, hole_start))
            start = max(start, hole_end)
        if start < end:
            result.append((start, end))
    return result


def overlap(spans, start: int, end: int) -> int:
    return sum(max(0, min(end, e) - max(start, s)) for s, e in spans)


def cpu_compute(events: list) -> list[tuple[int, int]]:
    """A CPU-only rank's compute as the report defines it, read plainly from the input: the
    spans of cpu_ops that are no communication op and no transfer buffer, less the spans of
    communication cpu_ops."""
    ops = [(e, start, end) for e, start, end in events if e.get("cat") == "cpu_op" and end > start]
    work = union((start, end) for e, start, end in ops
                 if not e["name"].startswith(COMMUNICATION) and not e["name"].startswith(BUFFERS))
    blocking = union((start, end) for e, start, end in ops if e["name"].startswith(COMMUNICATION))
    return subtract(work, blocking)


def communication(events: list) -> list[tuple[int, int]]:
    """Every span of a communication op or of its transport (gloo's spans outlive the ops)."""
    return union((start, end) for e, start, end in events if e["name"].startswith(COMMUNICATION) and end > start)


def merged_pipelines(files: list[Path], tmp_path: Path) -> list[tuple[Path, dict, dict[int, list], int]]:
    """Each pipeline of the set merged (with the self-check), as merged_run gives one."""
    outputs: list[Path] = []

    def output_for(group: int, groups: int) -> Path:
        outputs.append(tmp_path / f"merged{group}.perfetto-trace")
        return outputs[-1]

    result = merge_files(files, output_for, verify=True)
    summaries = result.get("pipelines", [result])
    return [(Path(summary["output"]), summary, *run_clock(summary)) for summary in summaries]


def run_clock(summary: dict) -> tuple[dict[int, list], int]:
    """Each global rank's events on the merge's clock, and the largest uncertainty it reported."""
    clocks = {rank["global_rank"]: rank for rank in summary.get("clock_alignment", {}).get("ranks", [])}
    by_rank = {place["global_rank"]: rank_events(Path(place["file"]),
                                                 clocks.get(place["global_rank"], {}).get("applied_offset_ns", 0))
               for place in summary["pp_ranks"]}
    uncertainty = max([clock["uncertainty_ns"] or 0 for clock in clocks.values() if clock["applied_offset_ns"]],
                      default=0)
    return by_rank, uncertainty


@pytest.mark.parametrize("name", REAL_SETS)
def test_real_torch_pipelines(name, tmp_path):
    """CPU-only gloo pipelines, checked against a plain reading of the input JSON: no wait on
    the path while its rank computes or communicates, the path's compute is the compute under
    it, it spans the step, and it crosses ranks where a receive ran on from its send."""
    ranks = real_pipeline_copy(name, tmp_path)
    for output, summary, by_rank, uncertainty in merged_pipelines(sorted(ranks.glob("rank*_trace.json*")), tmp_path):
        steps = path_segments(output)
        windows = step_windows(by_rank)
        check_tiling(steps, windows)
        compute = {rank: cpu_compute(events) for rank, events in by_rank.items()}
        communicating = {rank: communication(events) for rank, events in by_rank.items()}
        for step, segments in steps.items():
            first, last = windows[step]
            # Every wait says what it waited for, and no wait lies where its rank computed or communicated.
            for s in segments:
                if s["kind"] == "wait":
                    assert s["name"].startswith(WAIT_NAMES), s["name"]
                    assert overlap(compute[s["global_rank"]], s["ts"], s["end_ts"]) == 0, s
                    assert overlap(communicating[s["global_rank"]], s["ts"], s["end_ts"]) == 0, s
            # Its compute is the compute under it: the oracle's compute of each segment's rank
            # within the segment, summed, within 1% of the step.
            length = segments[-1]["end_ts"] - segments[0]["ts"]
            on_path = sum(s["end_ts"] - s["ts"] for s in segments if s["kind"] == "compute")
            under = sum(overlap(compute[s["global_rank"]], s["ts"], s["end_ts"]) for s in segments)
            assert on_path > 0 and abs(on_path - under) <= length / 100, (step, on_path, under, length)
            # Its length is the step's: from the first ProfilerStep start to the last work to end in it.
            last_work = max(end for events in by_rank.values() for e, start, end in events
                            if (e.get("cat") == "cpu_op" or e["name"].startswith(COMMUNICATION))
                            and start >= first and end <= last and end > start)
            assert abs(length - (last_work - first)) <= uncertainty, (length, last_work - first, uncertainty)
        changes = [change for segments in steps.values() for change in rank_changes(segments)]
        assert changes
        all_segments = [s for segments in steps.values() for s in segments]
        for send, receive in changes:
            send = sent(send, all_segments)
            sends = [end for e, _, end in by_rank[send["global_rank"]] if e["name"] == "c10d::send"]
            assert send["end_ts"] in sends and send["kind"] == "transfer"
            # The receive ran on from the arrival, waiting in a receive for that rank's data.
            assert receive["kind"] == "transfer" and receive["from_global_rank"] == send["global_rank"]
            assert receive["name"].startswith(("c10d::recv", "gloo:recv"))
        check_report(output, steps)


def test_data_parallel_ranks_through_collectives(tmp_path):
    """Eight data-parallel ranks (real DLRM capture, NCCL kernels naming no process group): the
    path crosses ranks where a collective kernel could not end before the last rank's kernel of
    that collective (the k-th of its kind on every rank) began, and spans the step."""
    source = Path(__file__).resolve().parents[2] / "shared" / "traces" / "dlrm_8ranks"
    if not source.is_dir():
        pytest.skip("../shared/traces is absent")
    output, summary, by_rank, uncertainty = merged_pipelines(sorted(source.glob("rank*_trace.json*")), tmp_path)[0]
    steps = path_segments(output)
    windows = step_windows(by_rank)
    check_tiling(steps, windows)
    # Each rank's NCCL kernels as (kind, k) -> start: the k-th kernel of a kind, in start order.
    collectives: dict[int, dict[tuple[str, int], tuple[int, int, str]]] = {}
    for rank, events in by_rank.items():
        seen: dict[str, int] = defaultdict(int)
        found = {}
        for e, start, end in sorted(((e, s, t) for e, s, t in events if e.get("cat") == "kernel"
                                     and e["name"].startswith(("ncclKernel_", "ncclDevKernel_"))),
                                    key=lambda item: item[1]):
            kind = e["name"].split("_")[1]
            found[(kind, seen[kind])] = (start, end, e["name"])
            seen[kind] += 1
        collectives[rank] = found
    crossings = 0
    for step, segments in steps.items():
        first, last = windows[step]
        last_gpu = max(end for events in by_rank.values() for e, start, end in events
                       if e.get("cat") in GPU_CATEGORIES and start >= first and end <= last)
        assert abs((segments[-1]["end_ts"] - segments[0]["ts"]) - (last_gpu - first)) <= uncertainty
        for before, after in rank_changes(segments):
            # The later rank's collective kernel ran on from the start of the same collective's
            # kernel on the rank before it, the last of all ranks to start it.
            assert after["kind"] == "transfer" and after["from_global_rank"] == before["global_rank"]
            assert before["end_ts"] == after["ts"]
            key = next(key for key, (start, end, name) in collectives[after["global_rank"]].items()
                       if start <= after["ts"] and end == after["end_ts"]
                       and after["name"].startswith(f"{name}: held up by "))
            starts = [found[key][0] for found in collectives.values() if key in found]
            assert collectives[before["global_rank"]][key][0] == after["ts"] == max(starts)
            crossings += 1
    assert crossings >= 1
    check_report(output, steps)


def _nested(draw_spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans made to nest (each inside the one it starts in, as a thread's calls are)."""
    nested: list[tuple[int, int]] = []
    for start, length in sorted(draw_spans):
        end = start + length
        for outer_start, outer_end in reversed(nested):
            if outer_start <= start < outer_end:
                end = min(end, outer_end)
                break
        nested.append((start, end))
    return [(start, end) for start, end in nested if end > start]


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(st.tuples(st.integers(0, 60), st.integers(1, 40)),
                                                       max_size=12)), max_size=3))
def test_self_time_pieces_are_each_moment_s_innermost_call(tracks):
    """Every moment a call runs belongs to exactly one piece, owned by the innermost call open
    then (the shortest containing it, as nesting makes them), checked moment by moment."""
    on_track: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for track_of, spans in tracks:
        on_track[track_of] += spans
    rows = list(dict.fromkeys((track_of, start, end) for track_of, spans in on_track.items()
                              for start, end in _nested(spans)))  # one call per span and track
    if not rows:
        return
    track, start, end = (np.array(column, np.int64) for column in zip(*rows))
    pieces = _self_time(track, start, end)
    owned: dict[tuple[int, int], int] = {}
    for owner, piece_start, piece_end in zip(pieces.owner.tolist(), pieces.start.tolist(), pieces.end.tolist()):
        for moment in range(piece_start, piece_end):
            assert (rows[owner][0], moment) not in owned
            owned[(rows[owner][0], moment)] = owner
    expected = {}
    for index, (track_of, span_start, span_end) in enumerate(rows):
        for moment in range(span_start, span_end):
            known = expected.get((track_of, moment))
            if known is None or span_end - span_start < rows[known][2] - rows[known][1]:
                expected[(track_of, moment)] = index
    assert owned == expected
