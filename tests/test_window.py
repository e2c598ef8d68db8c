"""--window, --steps, --split-steps and merge --ranks, checked through trace_processor against the input JSON."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from converter.generator import GeneratorConfig, write_pp_run, write_trace
from .helpers import merge_files as merge_ranks
from .helpers import compact_file, convert_file
from converter.model import derived
from converter.engine.window import parse_steps, parse_window

from .helpers import SHARED_TRACES, problem_stats, rows
from .oracle import expected_from, load_events, to_ns


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
    path = tmp_path_factory.mktemp("window") / "trace.json"
    return write_trace(GeneratorConfig(seed=11, steps=3, graphs_per_step=6, kernels_per_replay=12), path)


def step_bounds(source) -> dict[int, tuple[int, int]]:
    header, events = load_events(source)
    base = header.get("baseTimeNanoseconds", 0)
    bounds = {}
    for event in events:
        match = re.match(r"^ProfilerStep#(\d+)$", str(event.get("name")))
        if match and event.get("ph") == "X" and event.get("cat") != "gpu_user_annotation":  # the CPU's step
            start = base + to_ns(event["ts"])
            bounds[int(match.group(1))] = (start, start + to_ns(event["dur"]))
    return bounds


ANNOTATIONS = ("gpu_user_annotation", "cuda_graph_label")


def overlapping(source, start: int, end: int, skip_categories=()) -> Counter:
    expected = expected_from(source, skip_categories=skip_categories).slices
    return Counter({k: n for k, n in expected.items() if k[1] <= end and k[1] + k[2] >= start})


GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def step_members(source, start: int, end: int, skip_categories=()) -> Counter:
    """(name, ts, dur) of what the step [start, end) did, read from the input: slices that began
    in it; GPU work by when its launch (the runtime call with its correlation id) began."""
    header, events = load_events(source)
    base = header.get("baseTimeNanoseconds", 0)
    spans = [e for e in events if e.get("ph") in ("X", "i") and e.get("cat") not in skip_categories]
    launches = {e["args"]["correlation"]: base + to_ns(e["ts"]) for e in spans
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    found = Counter()
    for event in spans:
        ts = base + to_ns(event["ts"])
        begun = launches.get(event["args"].get("correlation"), ts) if event.get("cat") in GPU_WORK else ts
        if start <= begun < end:
            found[(event["name"], ts, to_ns(event.get("dur", 0)))] += 1
    return found


def output_slices(output, skip_categories=("",)) -> Counter:
    skipped = ", ".join(f"'{c}'" for c in skip_categories)
    return Counter((r["name"], r["ts"], r["dur"]) for r in rows(
        output, f"select name, ts, dur from slice where coalesce(category, 'none') not in ({skipped})"))


def test_steps_keep_what_the_step_did(tmp_path, three_steps):
    output = tmp_path / "step1.perfetto-trace"
    summary = convert_file(three_steps, output, window=parse_steps("1"))
    start, end = step_bounds(three_steps)[1]
    assert output_slices(output) == step_members(three_steps, start, end)
    assert not rows(output, "select name from slice where name = 'PyTorch Profiler (0)'")  # a whole-profile span
    assert summary["slices_outside_window"] > 0 and summary["flows_dropped_by_window"] > 0
    assert problem_stats(output) == []
    convert_file(three_steps, tmp_path / "whole.perfetto-trace")
    assert_opens_at_the_step_with_every_launch_arrow(output, tmp_path / "whole.perfetto-trace", start, end)


LAUNCHES_SQL = """select count(*) n from flow f join cgtrace_all_slice k on k.id = f.slice_in join cgtrace_all_slice l on l.id = f.slice_out
                  where k.category in ('kernel', 'gpu_memcpy', 'gpu_memset') and l.ts >= {start} and l.ts < {end}"""


def assert_opens_at_the_step_with_every_launch_arrow(output, whole, start: int, end: int) -> None:
    """The file begins where its step does and holds every CPU->GPU arrow that the whole trace
    (`whole`, uncut) has from a launch in the step."""
    assert rows(output, "select start_ts from trace_bounds")[0]["start_ts"] == start
    dangling = rows(output, "select count(*) n from flow where slice_out is null or slice_in is null")[0]["n"]
    assert dangling == 0
    launches = LAUNCHES_SQL.format(start=start, end=end)
    assert rows(output, launches)[0]["n"] == rows(whole, launches)[0]["n"] > 0


def test_window_in_milliseconds_from_the_trace_start(tmp_path, three_steps):
    output = tmp_path / "window.perfetto-trace"
    summary = convert_file(three_steps, output, window=parse_window("1:3"))
    start, end = summary["window_start_ns"], summary["window_end_ns"]
    assert end - start == 2_000_000
    first = min(ts for _, ts, _ in expected_from(three_steps).slices)
    assert start == first + 1_000_000
    assert output_slices(output) == overlapping(three_steps, start, end)


def test_split_steps_writes_one_loadable_file_per_step(tmp_path, three_steps):
    output = tmp_path / "trace_compacted.perfetto-trace"
    summary = compact_file(three_steps, output, split_steps=True)
    whole = tmp_path / "whole.perfetto-trace"
    compact_file(three_steps, whole)
    bounds = step_bounds(three_steps)
    assert [s["step"] for s in summary["steps"]] == sorted(bounds) == [0, 1, 2]
    for step in summary["steps"]:
        path = tmp_path / f"trace_compacted_step{step['step']}.perfetto-trace"
        assert step["output"] == str(path)
        assert problem_stats(path) == []
        start, end = bounds[step["step"]]
        # Measured slices are exactly what the step did (compaction re-shapes annotations).
        assert output_slices(path, ANNOTATIONS) == step_members(three_steps, start, end, ANNOTATIONS)
        assert_opens_at_the_step_with_every_launch_arrow(path, whole, start, end)


def test_split_steps_names_the_step_files_it_wrote_not_the_base(tmp_path, three_steps, capsys):
    from converter.cli import main

    output = tmp_path / "t.perfetto-trace"
    assert main(["compact", str(three_steps), "-o", str(output), "--split-steps"]) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert not output.exists()
    assert line.endswith(f"-> 3 step files, {tmp_path / 't_step0.perfetto-trace'} ... "
                         f"{tmp_path / 't_step2.perfetto-trace'}"), line


@pytest.mark.parametrize("text", ["", ":", "5", "a:b", "5:2"])
def test_bad_window_is_a_clear_error(text):
    from converter.errors import CgtraceError

    with pytest.raises(CgtraceError, match="--window"):
        parse_window(text)


def test_merge_cuts_every_rank_to_the_step_and_keeps_the_chosen_ranks(tmp_path):
    files = write_pp_run(tmp_path / "run", pp_size=4, microbatches=2, steps=3, seed=5, graphs_per_step=2,
                         kernels_per_replay=4)
    rank_of = {path: json.loads(path.read_text())["distributedInfo"]["rank"] for path in files}
    chosen = {rank_of[files[0]], rank_of[files[1]], rank_of[files[3]]}
    output = tmp_path / "merged.perfetto-trace"
    summary = merge_ranks(files, lambda group, groups: output, window=parse_steps("1"), ranks=chosen)
    processes = rows(output, "select name from track where name glob 'PP rank *'")
    assert {int(re.match(r"PP rank \d+ \(global (\d+)\)", p["name"]).group(1)) for p in processes} == chosen
    # Each rank is cut to its own ProfilerStep#1: its measured slices are exactly what that step did.
    expected = Counter()
    for path in files:
        if rank_of[path] in chosen:
            expected += step_members(path, *step_bounds(path)[1], ANNOTATIONS)
    # Arrival markers and the critical path's copies of its segments are derived.
    assert output_slices(output, (*ANNOTATIONS, derived.ARRIVAL, derived.CRITICAL_PATH)) == expected
    assert sum(rank["flows_dropped_by_window"] for rank in summary["per_rank_compaction"]) > 0
    assert problem_stats(output) == []
    dangling = rows(output, "select count(*) n from flow where slice_out is null or slice_in is null")[0]["n"]
    assert dangling == 0


def test_real_step_files_keep_the_gpu_work_their_step_launched(tmp_path):
    source = SHARED_TRACES / "hta_cuda_graph_rank0.json.gz"
    if not source.exists():
        pytest.skip("../shared/traces is absent")
    summary = compact_file(source, tmp_path / "rank0.perfetto-trace", split_steps=True)
    whole = tmp_path / "whole.perfetto-trace"
    compact_file(source, whole)
    bounds = step_bounds(source)
    assert len(summary["steps"]) == len(bounds) > 1
    for step in summary["steps"]:
        # On this A100 the GPU runs far behind its launches: the step's kernels run after it ends.
        assert step["gpu_slices_launched_in_window_ending_after"] > 0
        assert_opens_at_the_step_with_every_launch_arrow(Path(step["output"]), whole, *bounds[step["step"]])
