"""cgtrace diff through the real command line and trace_processor: a trace against a copy
whose NCCL kernels run half as long names exactly that change; a trace against itself is all
zero; --fail-above gates on it; bad input and options write nothing."""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal
from html import escape
from pathlib import Path

import pytest

from converter.analysis.diff import DIFF_DEFINITIONS, Side, beyond, diff_reports
from converter.cli import main
from converter.errors import CgtraceError
from converter.generator import GeneratorConfig, write_pp_run, write_trace
from converter.jobs import diff_pair
from converter.jobs.options import workers
from converter.lane_rules import load_lane_rules
from converter.model.trace import rank_title

from .helpers import SHARED_TRACES, compact_file
from .oracle import load_events, to_ns
from .test_report_oracle import GPU, expected_gpus, launch_times, owned_steps

REAL = SHARED_TRACES / "hta_nccl_a100.json.gz"
KERNEL = {"kernel", "Kernel"}
MS = 1_000_000  # ns
ROW_FIELDS = {"a_ns", "b_ns", "delta_ns", "change_pct"}


def run_diff(capsys, *args) -> tuple[int, str, list[str]]:
    """(exit status, stdout, stderr's lines) of `cgtrace diff ARGS`."""
    capsys.readouterr()
    status = main(["diff", *map(str, args)])
    out, err = capsys.readouterr()
    return status, out, err.splitlines()


def is_nccl_kernel(event: dict) -> bool:
    return event.get("ph") == "X" and event.get("cat") in KERNEL and "nccl" in event.get("name", "").lower()


def halve_nccl(source: Path, target: Path) -> Path:
    """A copy of `source` whose kernels with "nccl" in their name last half as long; every other
    number written exactly as read (absolute microsecond stamps need more digits than a float)."""
    header, events = load_events(source)
    for event in events:
        if is_nccl_kernel(event):
            event["dur"] = Decimal(event["dur"]) / 2
    document = {**header, "traceEvents": events} if header else events
    text = exact_json(document).encode()
    target.write_bytes(gzip.compress(text) if target.suffix == ".gz" else text)
    return target


def exact_json(value) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(key)}:{exact_json(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(map(exact_json, value)) + "]"
    return str(value) if isinstance(value, Decimal) else json.dumps(value)


def nccl_time_per_step(path: Path) -> dict[str, float]:
    """Each NCCL kernel's time inside the CPU's ProfilerStep spans, per step, from the JSON alone."""
    header, events = load_events(path)
    base = header.get("baseTimeNanoseconds", 0)
    steps = [(base + to_ns(e["ts"]), base + to_ns(e["ts"]) + to_ns(e["dur"])) for e in events
             if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    totals: dict[str, float] = {}
    for event in filter(is_nccl_kernel, events):
        start = base + to_ns(event["ts"])
        end = start + to_ns(event["dur"])
        inside = sum(max(0, min(end, stop) - max(start, begin)) for begin, stop in steps)
        totals[event["name"]] = totals.get(event["name"], 0) + inside / len(steps)
    return totals


def gated_beyond(diff: dict, pct: float) -> int:
    """How many rows --fail-above PCT must name: every gated section's rows changed beyond it and
    beyond the noise floor."""
    return sum(abs(row["delta_ns"]) * 100 > pct * row["a_ns"] and abs(row["delta_ns"]) > diff["noise_floor_ns"]
               for key in ("gpus", "lane_groups", "stages") for row in diff[key])


def findings(diff: dict) -> dict[str, dict]:
    return {finding["key"]: finding for finding in diff["findings"]}


def assert_all_zero(diff: dict) -> None:
    for section in ("gpus", "lane_groups", "steps", "stages"):
        assert all(row["delta_ns"] == 0 and row["a_ns"] == row["b_ns"] for row in diff[section]), section
    assert diff["kernels"] == []   # only kernels whose time changed are listed
    assert all(row["delta_ns"] == 0 and row["a_kernels"] == row["b_kernels"] for row in diff["kernels_by_op"])
    for apart in diff["unmatched"]:
        assert apart["a_only_ops"] == apart["b_only_ops"] == []
        assert apart["a_no_launch"] == apart["b_no_launch"] and apart["a_no_op"] == apart["b_no_op"]
    assert all(finding["unchanged"] and finding["delta_ns"] == 0 for finding in diff["findings"])


# -- the real trace -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_pair(tmp_path_factory) -> tuple[Path, Path]:
    if not REAL.is_file():
        pytest.skip(f"{REAL.name} is not in ../shared/traces: real-trace tests need it")
    return REAL, halve_nccl(REAL, tmp_path_factory.mktemp("diff") / "half_nccl.json")


def test_halved_nccl_reads_as_communication_down_by_half(real_pair, capsys):
    a, b = real_pair
    status, out, err = run_diff(capsys, a, b, "--format", "json", "--fail-above", "10")
    diff = json.loads(out)
    assert status == 1
    # Every lane group of kind communication lost half its busy time (overlaps are unioned,
    # so within a small tolerance); every other group is exactly as it was.
    lanes = diff["lane_groups"]
    assert {row["kind"] for row in lanes} >= {"compute", "communication"}
    for row in lanes:
        assert set(row) >= {"group", "kind"} | ROW_FIELDS
        if row["kind"] == "communication":
            assert row["b_ns"] == pytest.approx(row["a_ns"] / 2, rel=0.02), row
        else:
            assert row["delta_ns"] == 0, row
    by_figure = {row["figure"]: row for row in diff["gpus"]}
    assert by_figure["step"]["delta_ns"] == by_figure["compute busy"]["delta_ns"] == 0
    assert by_figure["exposed communication"]["delta_ns"] < 0
    # Kernels: exactly the NCCL ones changed, each to half of what the JSON says it ran per step.
    expected = nccl_time_per_step(a)
    assert {row["name"] for row in diff["kernels"]} == set(expected)
    for row in diff["kernels"]:
        assert row["a_ns"] == pytest.approx(expected[row["name"]], abs=1 + 1e-6 * expected[row["name"]])
        assert row["b_ns"] == pytest.approx(expected[row["name"]] / 2, rel=0.01)
    assert [abs(row["delta_ns"]) for row in diff["kernels"]] == sorted((abs(r["delta_ns"]) for r in diff["kernels"]),
                                                                      reverse=True)
    # The findings say so, and no more.
    found = findings(diff)
    assert {key for key, finding in found.items() if not finding["unchanged"]} == {
        "kind.communication", "exposed_communication", "top_kernel"}
    assert found["kind.communication"]["change_pct"] == pytest.approx(-50, abs=1)
    assert found["kind.compute"]["delta_ns"] == found["step_time"]["delta_ns"] == 0
    assert "nccl" in found["top_kernel"]["subject"].lower()
    # --fail-above 10 names each gated row beyond 10%, one line each, and only those.
    assert len(err) == gated_beyond(diff, 10) >= 2
    assert all(line.startswith("cgtrace: ") and line.endswith("more than --fail-above 10%") for line in err)
    for row in lanes:
        named = any(f"{row['group']} busy down" in line for line in err)
        assert named == (row["kind"] == "communication" and abs(row["delta_ns"]) * 100 > 10 * row["a_ns"]
                         and abs(row["delta_ns"]) > diff["noise_floor_ns"])


def test_a_trace_against_itself_is_all_zero(real_pair, capsys):
    a, _ = real_pair
    status, out, err = run_diff(capsys, a, a, "--format", "json", "--fail-above", "0")
    assert (status, err) == (0, [])
    diff = json.loads(out)
    assert diff["gpus"] and diff["lane_groups"] and diff["steps"]
    assert_all_zero(diff)


# -- generated traces ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("generated")
    source = write_trace(GeneratorConfig(seed=4, steps=2, graphs_per_step=4, kernels_per_replay=8), folder / "t.json")
    return source, halve_nccl(source, folder / "t_half.json.gz")


def test_generated_trace_text_json_and_html(generated, capsys, tmp_path):
    a, b = generated
    status, out, err = run_diff(capsys, a, b, "--format", "json")
    assert (status, err) == (0, [])   # no --fail-above: changes are reported, not failed
    diff = json.loads(out)
    assert set(diff) >= {"a", "b", "definitions", "findings", "gpus", "lane_groups", "steps", "kernels", "stages"}
    assert all(set(row) >= {"name"} | ROW_FIELDS for row in diff["kernels"])
    assert all("nccl" in row["name"].lower() and row["delta_ns"] < 0 for row in diff["kernels"])
    assert all(set(row) >= {"gpu", "index", "a_step", "b_step", "figure"} | ROW_FIELDS for row in diff["steps"])
    assert [row["index"] for row in diff["steps"] if row["figure"] == "step"] == [1, 2]
    assert not findings(diff)["kind.communication"]["unchanged"] and findings(diff)["kind.compute"]["unchanged"]
    assert all(DIFF_DEFINITIONS[term] == meaning for term, meaning in diff["definitions"].items()
               if term in DIFF_DEFINITIONS)

    status, text, _ = run_diff(capsys, a, b, "--top", "1")
    assert status == 0
    findings_text = text.split("\nFindings\n", 1)[1].split("\n\n", 1)[0]
    communication = findings(diff)["kind.communication"]["text"]
    assert f"  - {communication}\n" in findings_text and communication.startswith("Communication time down")
    assert re.search(r"  - Unchanged: step time, compute time", findings_text)
    assert len(text.split("\nKernels: largest changes in time per step\n", 1)[1].split("\n\n")[0].splitlines()) == 3

    page = tmp_path / "diff.html"
    assert main(["diff", str(a), str(b), "--format", "html", "-o", str(page)]) == 0
    html = page.read_text()
    assert html.startswith("<!doctype html>") and f"<li>{escape(communication)}</li>" in html
    assert 'class="bar less"' in html   # a decrease drawn in the other colour
    assert all(escape(meaning) in html for meaning in DIFF_DEFINITIONS.values())
    assert not re.search(r"https?:|src=|<script|<link", html)   # self-contained
    assert main(["diff", str(a), str(b), "--format", "html", "-o", str(page)]) == 2   # no --overwrite
    assert main(["diff", str(a), str(a), "--format", "html", "-o", str(page), "--overwrite"]) == 0
    assert "Unchanged: step time" in page.read_text()


def test_merged_pipelines_match_by_rank(tmp_path, capsys):
    """A merge against itself is all zero; against one rank's trace it is refused, naming the
    file that lacks a GPU, since GPUs are matched by rank and device, never by position."""
    write_pp_run(tmp_path / "ranks", pp_size=2, microbatches=2, steps=2, kernels_per_replay=4)
    merged = tmp_path / "merged.perfetto-trace"
    assert main(["merge", str(tmp_path / "ranks"), "-o", str(merged), "-q"]) == 0
    capsys.readouterr()
    status, out, _ = run_diff(capsys, merged, merged, "--format", "json", "--fail-above", "0")
    diff = json.loads(out)
    assert status == 0 and sorted({row["pp_rank"] for row in diff["gpus"]}) == [0, 1]
    assert_all_zero(diff)
    one_rank = tmp_path / "ranks" / "rank0_trace.json"
    status, out, err = run_diff(capsys, merged, one_rank)
    assert (status, out, len(err)) == (2, "", 1)
    assert err[0].startswith(f"cgtrace: error: {one_rank}: has no GPU") and f"which {merged} has" in err[0]


# -- pipeline stages: the report's `pipeline.stages[]` contract -----------------------------------
def test_stage_parts_of_merged_pipelines_through_the_command_line(tmp_path, capsys):
    """Two runs of one 2-stage CUDA-graph pipeline (other seeds, other step counts): each PP
    rank's stage parts are the means of what `cgtrace report` gives per step, and add up to
    its step; a merge against itself changes no part."""
    merges = []
    for seed, steps in ((1, 2), (2, 3)):
        write_pp_run(tmp_path / f"run{seed}", pp_size=2, microbatches=2, steps=steps, kernels_per_replay=4, seed=seed)
        merges.append(tmp_path / f"run{seed}.perfetto-trace")
        assert main(["merge", str(tmp_path / f"run{seed}"), "-o", str(merges[-1]), "-q"]) == 0
    capsys.readouterr()
    reports = []
    for merged in merges:
        assert main(["report", str(merged), "--format", "json"]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    if "pipeline" not in reports[0]:
        pytest.skip("report gives no pipeline.stages yet (issue 42's pipeline anatomy)")
    status, out, _ = run_diff(capsys, *merges, "--format", "json")
    diff = json.loads(out)
    assert status == 0 and {row["pp_rank"] for row in diff["stages"]} == {0, 1}
    for row in diff["stages"]:
        for side, report in zip("ab", reports):
            rows = [stage for stage in report["pipeline"]["stages"] if stage["pp_rank"] == row["pp_rank"]]
            assert row[f"{side}_steps"] == len(rows)
            mean = sum(stage[f"{row['part']}_ns"] for stage in rows) / len(rows)
            assert row[f"{side}_ns"] == pytest.approx(mean, abs=0.5)
    for pp_rank in (0, 1):
        parts = [row for row in diff["stages"] if row["pp_rank"] == pp_rank]
        step = next(row for row in parts if row["part"] == "step")
        assert sum(row["a_ns"] for row in parts if row is not step) == pytest.approx(step["a_ns"], abs=len(parts))
    assert "step_time" in findings(diff) and any(key.startswith("stage.") for key in findings(diff))
    status, out, _ = run_diff(capsys, merges[0], merges[0], "--format", "json", "--fail-above", "0")
    assert status == 0 and json.loads(out)["stages"]
    assert_all_zero(json.loads(out))


def stage_figures(name: str, stages: list[dict]) -> dict:
    """A CPU-only pipeline's report figures as build_report gives them: no GPU, stage rows only."""
    return {"input": {"trace": name, "lanes_from": "track roles"}, "definitions": {}, "gpus": [],
            "top_kernels": [], "pipeline": {"stages": stages}}


def stage(pp_rank: int, step: str, **parts: int) -> dict:
    """A `pipeline.stages[]` row: where it starts, its parts (`<part>_ns`) and `step_ns`, their sum."""
    return {"pp_rank": pp_rank, "rank": rank_title(pp_rank, 4 + pp_rank), "step": step, "start_ns": 10**18 + pp_rank,
            "step_ns": sum(parts.values()),
            **{f"{k}_ns": v for k, v in parts.items()}, "recv_waits": []}


def test_stage_parts_compare_per_pp_rank_as_means_per_step():
    """Step numbers differ between runs (#1, #2 against #7), so each PP rank's parts are
    averaged over its steps; a part one side lacks (drain) is 0 there; where a step starts is
    no part."""
    a = stage_figures("a", [stage(0, "ProfilerStep#1", compute=600 * MS, recv_wait=400 * MS),
                            stage(0, "ProfilerStep#2", compute=600 * MS, recv_wait=200 * MS),
                            stage(1, "ProfilerStep#1", compute=500 * MS, recv_wait=500 * MS)])
    b = stage_figures("b", [stage(0, "ProfilerStep#7", compute=600 * MS, recv_wait=150 * MS),
                            stage(1, "ProfilerStep#7", compute=500 * MS, recv_wait=500 * MS, drain=100 * MS)])
    diff = diff_reports(a, b)
    rows = {(row["pp_rank"], row["part"]): (row["a_ns"] // MS, row["b_ns"] // MS, row["delta_ns"] // MS)
            for row in diff["stages"]}
    assert rows == {(0, "step"): (900, 750, -150), (0, "compute"): (600, 600, 0), (0, "recv_wait"): (300, 150, -150),
                    (1, "step"): (1000, 1100, 100), (1, "compute"): (500, 500, 0), (1, "recv_wait"): (500, 500, 0),
                    (1, "drain"): (0, 100, 100)}
    assert [(row["a_steps"], row["b_steps"]) for row in diff["stages"] if row["part"] == "step"] == [(2, 1), (1, 1)]
    found = findings(diff)
    assert found["stage.recv_wait"]["text"] == "Stage recv wait down 18.8% (-150.000 ms per step); most on PP rank 0 (global 4)"
    assert found["stage.drain"]["text"] == "Stage drain up from 0 to 100.000 ms per step"  # PP rank 1 alone has it
    assert "stage.step" not in found   # a stage's step is no part; without GPUs it is the step time
    # (750 + 1100) / 2 against (900 + 1000) / 2
    assert found["step_time"]["text"] == "Step time down 2.6% (-25.000 ms); most on PP rank 0 (global 4)"
    assert [line.split(" ", 1)[0] for line in beyond(diff, 10)] == ["PP", "PP", "PP"]


def test_stage_parts_of_pp_ranks_one_side_lacks_are_refused():
    a = stage_figures("a.json", [stage(0, "ProfilerStep#1", compute=1), stage(1, "ProfilerStep#1", compute=1)])
    b = stage_figures("b.json", [stage(0, "ProfilerStep#1", compute=1)])
    with pytest.raises(CgtraceError, match=r"^b\.json: has no pipeline stage of PP rank 1 \(global 5\), which a\.json has"):
        diff_reports(a, b)


# -- bad input and options ----------------------------------------------------------------------
@pytest.mark.parametrize("case", ["missing", "directory", "percent", "negative", "format", "top"])
def test_bad_input_one_line_exit_2_nothing_written(case, generated, tmp_path, capsys):
    a, _ = generated
    out = tmp_path / "out.json"
    args = {"missing": [a, tmp_path / "nope.json", "-o", out],
            "directory": [tmp_path, a, "-o", out],
            "percent": [a, a, "--fail-above", "ten", "-o", out],
            "negative": [a, a, "--fail-above", "-5", "-o", out],
            "format": [a, a, "--format", "csv", "-o", out],
            "top": [a, a, "--top", "-1", "-o", out]}[case]
    named = {"missing": "nope.json: no such file", "directory": f"{tmp_path}: is a directory",
             "percent": "--fail-above: 'ten' is not a percentage", "negative": "--fail-above: '-5' is not",
             "format": "--format: invalid choice", "top": "--top: '-1' is not"}[case]
    status, stdout, err = run_diff(capsys, *args)
    assert (status, stdout, len(err)) == (2, "", 1)
    assert err[0].startswith("cgtrace: error: ") and named in err[0]
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_docs_define_each_diff_term_as_the_code_does():
    reference = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    section = reference.split("<!-- diff definitions", 1)[1].split("<!-- end of diff definitions", 1)[0]
    flat = " ".join(section.split())
    assert all(f"**{term}**: {meaning}." in flat for term, meaning in DIFF_DEFINITIONS.items())


def test_the_html_title_tells_two_runs_of_one_name_apart(tmp_path):
    """Two runs' merges share one file name: the title names each by the folder that differs."""
    for run, seed in (("runA", 1), ("runB", 2)):
        (tmp_path / run).mkdir()
        write_trace(GeneratorConfig(steps=2, graphs_per_step=2, kernels_per_replay=4, seed=seed),
                    tmp_path / run / "trace.json")
    out = tmp_path / "diff.html"
    assert main(["diff", str(tmp_path / "runA" / "trace.json"), str(tmp_path / "runB" / "trace.json"),
                 "--format", "html", "-o", str(out), "-q"]) == 0
    [title] = re.findall(r"<title>(.*?)</title>", out.read_text())
    assert title == escape("cgtrace diff: runA/trace.json -> runB/trace.json")


def test_a_change_below_the_noise_floor_is_no_finding_and_fails_nothing():
    """A drain 62% shorter by 26 us in a 15 ms step is jitter (issue 53): under 0.5% of A's mean
    step it is unchanged and --fail-above passes over it; 2 ms is a finding and fails."""
    def figures(name, drain_ns, recv_ns):
        return stage_figures(name, [stage(0, "ProfilerStep#1", compute=5 * MS, drain=drain_ns, recv_wait=recv_ns,
                                          other=15 * MS - 5 * MS - drain_ns - recv_ns)])
    diff = diff_reports(figures("a", 42_000, 2 * MS), figures("b", 16_000, 4 * MS))
    assert diff["noise_floor_ns"] == 75_000
    found = findings(diff)
    assert found["stage.drain"]["unchanged"] and found["stage.drain"]["text"].startswith("Stage drain unchanged")
    assert not found["stage.recv_wait"]["unchanged"]
    assert [line.split(": ")[1].split(" ")[1] for line in beyond(diff, 50)] == ["recv"]


def test_different_schedules_are_warned_of_before_their_stage_parts():
    """1F1B against an interleaved schedule bounds a stage's warm-up and drain differently: the
    diff says so first, naming the rank's stages and compute actions on each side (issue 53)."""
    def run(name, stages, per_step):
        row = stage(0, "ProfilerStep#1", compute=5 * MS, warmup=1 * MS)
        row["actions"] = [{"action": "F", "stage": stages[i % len(stages)], "microbatch": i, "start_ns": 0,
                           "compute_ns": 1} for i in range(per_step)]
        return stage_figures(name, [row])
    one = run("a", [0], 8)
    assert diff_reports(one, run("b", [0], 8))["warnings"] == []
    [warning] = diff_reports(one, run("b", [0, 2], 16))["warnings"]
    assert warning.startswith("PP rank 0 (global 4) runs a different schedule in B: stages [0] with 8 compute "
                              "actions per step in A, [0, 2] with 16 in B")


# -- runs that differ: ranks chosen, kernels matched through their launching op ------------------
HTA_CONTROL = SHARED_TRACES / "hta_trace_diff_control_a100.json.gz"   # A100, rank 3 of 8
HTA_TEST = SHARED_TRACES / "hta_cuda_graph_big_graphs_v100.json.gz"   # V100, rank 1 of 2
OP_CATEGORIES = {"cpu_op", "user_annotation"}


def kernels_by_op(path: Path) -> tuple[dict[str, tuple[int, float]], tuple[int, float], tuple[int, float]]:
    """From the JSON alone, as Kineto links them: each kernel (by its correlation id) to the CPU
    call that launched it, and that call to the innermost cpu_op or user_annotation on its thread
    around it (ProfilerStep#N spans are steps); each kernel's time inside the steps (bounded by
    the GPU work they launched, the default step windows), per step. Returns ({op: (kernels, ns
    per step)}, (kernels, ns) with no launch, and with no op)."""
    header, events = load_events(path)
    base = header.get("baseTimeNanoseconds", 0)
    complete = [e for e in events if e.get("ph") == "X"]
    cpu_steps = sorted((e["name"], base + to_ns(e["ts"]), base + to_ns(e["ts"]) + to_ns(e["dur"])) for e in complete
                       if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    gpu = [(e, base + to_ns(e["ts"]), base + to_ns(e["ts"]) + to_ns(e["dur"])) for e in complete if e.get("cat") in GPU]
    steps = [(start, end) for _, start, end in owned_steps(sorted(cpu_steps, key=lambda step: step[1]), gpu,
                                                           launch_times(events, base))]
    correlated = {e["args"]["correlation"]: e for e in complete
                  if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ops_by_thread: dict[tuple, list[dict]] = {}
    for event in complete:
        if event.get("cat") in OP_CATEGORIES and not event["name"].startswith("ProfilerStep#"):
            ops_by_thread.setdefault((event["pid"], event["tid"]), []).append(event)
    op_of_launch = {}
    for key, ops in ops_by_thread.items():
        # A sweep in start order, the longer first at one start and, of ops with one span, the
        # first by name outside (the definition's tie rule): the open ops form a stack, innermost
        # on top; a launch's op is the topmost that lasts past the launch's end.
        launches = [e for e in correlated.values() if (e["pid"], e["tid"]) == key]
        items = sorted([(to_ns(e["ts"]), 0, -to_ns(e["dur"]), e["name"], e) for e in ops]
                       + [(to_ns(e["ts"]), 1, -to_ns(e["dur"]), e["name"], e) for e in launches],
                       key=lambda item: item[:4])
        stack: list[tuple[int, str]] = []
        for start, is_launch, minus_dur, _, event in items:
            while stack and stack[-1][0] <= start:   # ops over by now
                stack.pop()
            if is_launch:
                end = start - minus_dur
                op_of_launch[id(event)] = next((name for stop, name in reversed(stack) if stop >= end), None)
            else:
                stack.append((start - minus_dur, event["name"]))
    totals: dict[str, list] = {}
    no_launch, no_op = [0, 0], [0, 0]
    for event in complete:
        if event.get("cat") not in KERNEL or to_ns(event["dur"]) <= 0:
            continue
        start = base + to_ns(event["ts"])
        end = start + to_ns(event["dur"])
        inside = sum(max(0, min(end, stop) - max(start, begin)) for begin, stop in steps)
        if inside <= 0:
            continue
        launch = correlated.get(event.get("args", {}).get("correlation"))
        op = op_of_launch.get(id(launch)) if launch is not None else None
        found = totals.setdefault(op, [0, 0]) if op is not None else no_launch if launch is None else no_op
        found[0] += 1
        found[1] += inside
    per_step = len(steps)
    return ({op: (kernels, total / per_step) for op, (kernels, total) in totals.items()},
            (no_launch[0], no_launch[1] / per_step), (no_op[0], no_op[1] / per_step))


@pytest.fixture(scope="module")
def hta_pair() -> tuple[Path, Path]:
    if not (HTA_CONTROL.is_file() and HTA_TEST.is_file()):
        pytest.skip("../shared/traces with HTA's control/test pair is absent")
    return HTA_CONTROL, HTA_TEST


def test_runs_that_differ_compare_chosen_ranks_through_launching_ops(capsys, hta_pair):
    """HTA's control (A100, rank 3) against its test (V100, rank 1): their kernels differ by
    name, so they are matched through the op that launched them; every per-op figure agrees with
    the JSON read plainly, and what could not be matched is listed."""
    status, out, err = run_diff(capsys, *hta_pair, "--a-rank", 3, "--b-rank", 1, "--format", "json",
                                "--top", 100_000)
    assert status == 0, err
    diff = json.loads(out)
    assert (diff["a"]["rank"], diff["b"]["rank"]) == (3, 1)
    assert [(row["global_rank"], row["figure"]) for row in diff["gpus"]][0] == (3, "step")
    assert {(row["gpu"], row["b_gpu"]) for row in diff["gpus"] + diff["lane_groups"] + diff["steps"]} == {
        ("GPU 3, rank 3 (global 3)", "GPU 1, rank 1 (global 1)")}
    expected = [kernels_by_op(path) for path in hta_pair]
    (ops_a, no_launch_a, no_op_a), (ops_b, no_launch_b, no_op_b) = expected
    rows = {row["op"]: row for row in diff["kernels_by_op"]}
    assert set(rows) == ops_a.keys() & ops_b.keys() and len(rows) > 20
    for op, row in rows.items():
        assert (row["a_kernels"], row["b_kernels"]) == (ops_a[op][0], ops_b[op][0]), op
        assert (row["a_ns"], row["b_ns"]) == (round(ops_a[op][1]), round(ops_b[op][1])), op
    [apart] = diff["unmatched"]
    for side, ops, other, no_launch, no_op in (("a", ops_a, ops_b, no_launch_a, no_op_a),
                                               ("b", ops_b, ops_a, no_launch_b, no_op_b)):
        assert {row["op"]: (row["kernels"], row["ns"]) for row in apart[f"{side}_only_ops"]} == {
            op: (kernels, round(ns)) for op, (kernels, ns) in ops.items() if op not in other}
        assert (apart[f"{side}_no_launch"]["kernels"], apart[f"{side}_no_launch"]["ns"]) == (no_launch[0],
                                                                                             round(no_launch[1]))
        assert (apart[f"{side}_no_op"]["kernels"], apart[f"{side}_no_op"]["ns"]) == (no_op[0], round(no_op[1]))
    assert no_launch_b[0] > 0   # the V100 run has kernels no launch record names: listed, not dropped
    status, text, _ = run_diff(capsys, *hta_pair, "--a-rank", 3, "--b-rank", 1, "--top", 3)
    assert status == 0 and "Kernels by launching op" in text and "kernels with no launch arrow" in text


def test_rank_not_in_a_trace_is_refused_before_it_is_measured(capsys, hta_pair, tmp_path):
    """A rank the header does not record is refused in one line that names the trace and its
    ranks, before either trace is read: B here is no trace at all, and is never opened."""
    not_a_trace = tmp_path / "b.json"
    not_a_trace.write_text("not a trace")
    status, out, err = run_diff(capsys, hta_pair[0], not_a_trace, "--a-rank", 1)
    assert status == 2 and out == "" and len(err) == 1
    assert str(hta_pair[0]) in err[0] and "holds rank 3 of 8" in err[0] and "--a-rank" in err[0]
    status, _, err = run_diff(capsys, *hta_pair, "--a-rank", 3, "--b-rank", 3)
    assert status == 2 and len(err) == 1 and str(hta_pair[1]) in err[0] and "holds rank 1 of 2" in err[0]
    import converter

    with pytest.raises(CgtraceError, match="holds rank 1 of 2"):
        converter.diff(hta_pair[0], hta_pair[1], a_rank=3, b_rank=0)


def test_a_run_against_itself_with_its_rank_chosen_is_all_zero_through_every_op(capsys, hta_pair):
    """The control against itself, rank 3 chosen on both sides: every op matched, none apart."""
    status, out, err = run_diff(capsys, hta_pair[0], hta_pair[0], "--a-rank", 3, "--b-rank", 3, "--format", "json",
                                "--top", 100_000, "--fail-above", 0)
    assert status == 0 and err == []
    diff = json.loads(out)
    assert_all_zero(diff)
    ops, no_launch, no_op = kernels_by_op(hta_pair[0])
    assert {row["op"]: row["a_kernels"] for row in diff["kernels_by_op"]} == {op: n for op, (n, _) in ops.items()}
    assert no_launch[0] == no_op[0] == 0


class Measured(Exception):
    """Raised where diff would start measuring its traces."""


def test_a_gpu_index_not_in_profiler_output_is_refused_before_it_is_measured(capsys, monkeypatch):
    """--a-gpu / --b-gpu are checked against the devices profiler output's GPU events ran on
    before either trace is measured: diff's task runner, replaced by one that fails, is never
    reached; the one line names the GPUs the trace has (read here from the JSON)."""
    if not REAL.is_file():
        pytest.skip("../shared/traces is absent")

    def measure(*args, **kwargs):
        raise Measured

    monkeypatch.setattr(diff_pair, "run_tasks", measure)
    _, events = load_events(REAL)
    devices = sorted({e["args"]["device"] for e in events if e.get("cat") in GPU})
    status, out, err = run_diff(capsys, REAL, REAL, "--b-gpu", 99)
    assert (status, out) == (2, "") and err == [
        f"cgtrace: error: {REAL}: ran no GPU work on GPU 99 (--b-gpu); it has GPU {', '.join(map(str, devices))}"]
    with workers(1, None) as local, pytest.raises(Measured):  # the GPU it has passes: measuring would start
        diff_pair.diff_traces(REAL, REAL, local, None, load_lane_rules(), 10, (Side(gpu=devices[0]), Side()))


def test_a_gpu_index_not_in_a_trace_cgtrace_wrote_is_refused_once_measured(capsys, tmp_path):
    """A trace cgtrace wrote records its GPUs in what it holds: checked once measured, one line."""
    if not REAL.is_file():
        pytest.skip("../shared/traces is absent")
    compacted = tmp_path / "a.perfetto-trace"
    compact_file(REAL, compacted)
    status, out, err = run_diff(capsys, compacted, compacted, "--a-gpu", 99)
    assert status == 2 and out == "" and len(err) == 1
    assert f"{compacted}: has no GPU of GPU index 99; it has GPU " in err[0]


def test_kernels_launched_by_cuda_graphs_are_put_under_the_op_around_the_graph_launch(capsys):
    """HTA's CUDA-graph trace: a graph's kernels share their cudaGraphLaunch's correlation, so
    the report's kernels by op (what diff compares) puts them under the op around that launch;
    705 kernels whose correlation names no launch in the trace are counted apart."""
    trace = SHARED_TRACES / "hta_cuda_graph_rank0.json.gz"
    if not trace.is_file():
        pytest.skip("../shared/traces is absent")
    capsys.readouterr()
    assert main(["report", str(trace), "--format", "json", "--top", "100000"]) == 0
    [gpu] = json.loads(capsys.readouterr().out)["gpus"]
    ops, no_launch, no_op = kernels_by_op(trace)
    steps = len(gpu["steps"])
    found = gpu["kernels_by_op"]
    assert {row["op"]: (row["kernels"], row["total_ns"]) for row in found["ops"]} == {
        op: (kernels, round(ns * steps)) for op, (kernels, ns) in ops.items()}
    assert (found["no_launch"]["kernels"], found["no_launch"]["total_ns"]) == (no_launch[0], round(no_launch[1] * steps))
    assert found["no_launch"]["kernels"] == 705 and found["no_op"]["kernels"] == no_op[0] == 0
    assert "CompiledFunctionBackward" in ops   # its kernels ran inside CUDA graphs


# -- two directories, rank by rank ----------------------------------------------------------------
def test_directories_are_compared_rank_by_rank(capsys, tmp_path):
    """Two runs of four independent ranks, rank 1's GPU compute 1.5x as long in B and rank 3 not
    profiled in B: a section per rank both hold, rank 3 named as A's alone; rank 1's change is
    found (its kernels 50% longer, its compute busy per step as the JSON gives it), the other
    ranks' figures unchanged, and only rank 1 fails --fail-above, each line naming it."""
    run = dict(pp_size=1, dp_size=4, steps=3, seed=4, graphs_per_step=2, kernels_per_replay=8)
    ranks_a = write_pp_run(tmp_path / "runA", **run)
    ranks_b = write_pp_run(tmp_path / "runB", slow_rank=1, slow_factor=1.5, **run)
    ranks_b.pop().unlink()
    status, out, err = run_diff(capsys, tmp_path / "runA", tmp_path / "runB", "--format", "json", "--jobs", 2,
                                "--top", 100_000, "--fail-above", 5)
    assert status == 1 and err and all(line.startswith("cgtrace: rank 1: ") for line in err)
    diff = json.loads(out)
    assert [(pair["a_rank"], pair["b_rank"]) for pair in diff["pairs"]] == [(0, 0), (1, 1), (2, 2)]
    assert diff["only_in_a"] == [{"global_rank": 3, "trace": str(ranks_a[3])}] and diff["only_in_b"] == []
    for pair, trace_a, trace_b in zip(diff["pairs"], ranks_a, ranks_b):
        [expected_a], [expected_b] = expected_gpus(trace_a).values(), expected_gpus(trace_b).values()
        [compute] = [row for row in pair["diff"]["gpus"] if row["figure"] == "compute busy"]
        assert (compute["a_ns"], compute["b_ns"]) == tuple(
            round(sum(step["compute_busy_ns"] for step in expected["steps"]) / len(expected["steps"]))
            for expected in (expected_a, expected_b))
        changed = {finding["key"] for finding in pair["diff"]["findings"] if not finding["unchanged"]}
        if pair["a_rank"] == 1:
            assert {"step_time", "kind.compute"} <= changed and compute["b_ns"] > 1.3 * compute["a_ns"]
            kernels = pair["diff"]["kernels"]  # every kernel whose time changed: its compute, by the factor
            assert len(kernels) > 5 and all(abs(kernel["change_pct"] - 50) < 0.1 for kernel in kernels)
        else:
            assert changed == set()
            assert all(row["delta_ns"] == 0 for row in pair["diff"]["gpus"] + pair["diff"]["lane_groups"])
    assert {change["rank"] for change in diff["largest_changes"]} == {"rank 1"}
    assert diff["largest_changes"][0]["key"] == "step_time"

    status, text, _ = run_diff(capsys, tmp_path / "runA", tmp_path / "runB", "--a-rank", 2, "--b-rank", 1,
                               "--jobs", 2)
    assert status == 0 and "=== rank 2 / rank 1 ===" in text and "=== rank 0 ===" not in text


def test_directories_that_cannot_be_paired_are_refused_in_one_line(capsys, tmp_path):
    run = dict(pp_size=1, dp_size=2, steps=1, seed=4, graphs_per_step=2, kernels_per_replay=8)
    write_pp_run(tmp_path / "runA", **run)
    write_pp_run(tmp_path / "runB", **run)
    for args, says in (((tmp_path / "runA", tmp_path / "runB", "--a-rank", 5), "holds no trace of global rank 5"),
                       ((tmp_path / "runA", tmp_path / "runB", "--format", "html"), "--format html is for two traces"),
                       ((tmp_path / "runA", tmp_path / "runB" / "rank0_trace.json"), "is a directory and the other")):
        status, out, err = run_diff(capsys, *args)
        assert (status, out, len(err)) == (2, "", 1) and says in err[0]
    import converter

    with pytest.raises(CgtraceError, match="compares two directories rank by rank"):
        converter.diff(tmp_path / "runA", tmp_path / "runB")
