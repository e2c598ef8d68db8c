"""cgtrace's SQL tables (tp/tables.py) and the cookbook in docs/sql.md.

Every cookbook query runs as the docs write it, on two compacted real GPU traces, a merged
real CPU pipeline and a merged generated CUDA-graph pipeline (its clocks set apart, so the
merge moves them); each one docs/sql.md marks "= report" gives `cgtrace report`'s figures
exactly, the stragglers' also on the real 8-rank DLRM capture merged; a GPU's figures also
over the active span of GPUs without profiler steps (TraceLens' B200 capture, the generated
pipeline's ranks merged with their steps taken out). `cgtrace sql` prints statements that, run in a
trace processor that has not defined them (as the Perfetto UI's query page is), give the same
rows as `cgtrace query`.
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter, defaultdict
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from converter.cli import main
from converter.generator import write_pp_run
from converter.tp import open_trace

from .helpers import SHARED_TRACES, compact_file, merge_files, real_pipeline_copy, write_json
from .oracle import load_events, to_ns

DOCS = Path(__file__).resolve().parent.parent / "docs" / "sql.md"
_QUESTION = re.compile(r"^### (?P<title>.+?)\n(?P<body>.*?)```sql\n(?P<sql>.*?)```", re.MULTILINE | re.DOTALL)


def cookbook() -> dict[str, str]:
    """The cookbook's questions, by the first words of their titles, and their SQL."""
    return {match.group("title"): match.group("sql") for match in _QUESTION.finditer(DOCS.read_text())}


def question(start: str) -> str:
    [sql] = [sql for title, sql in cookbook().items() if title.startswith(start)]
    return sql


def cli_json(*args) -> list | dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main([*map(str, args)]) == 0
    return json.loads(out.getvalue())


def query(trace: Path, sql: str) -> list[dict]:
    return cli_json("query", trace, sql, "--format", "json")  # type: ignore[return-value]


def report(trace: Path, *args) -> dict:
    return cli_json("report", trace, "--format", "json", "--top", 10, *args)  # type: ignore[return-value]


@dataclass
class Answered:
    """One trace, its report's JSON, and every cookbook question's rows on it."""

    path: Path
    figures: dict
    rows: dict[str, list[dict]]

    def of(self, start: str) -> list[dict]:
        [found] = [rows for title, rows in self.rows.items() if title.startswith(start)]
        return found


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Answered]:
    """The traces the cookbook runs on (real where ../shared is there, generated always), each
    with its report and every question's answer, run in one trace processor per trace."""
    folder = tmp_path_factory.mktemp("sql")
    found = {}
    files = write_pp_run(folder / "generated", pp_size=3, microbatches=2, steps=2, seed=4, graphs_per_step=2,
                         kernels_per_replay=6, clock_offsets_ns=[0, 400_000, -250_000])
    found["generated pipeline"] = folder / "generated.perfetto-trace"
    merge_files(files, lambda group, groups: found["generated pipeline"])
    if SHARED_TRACES.is_dir():
        for name in ("hta_nccl_a100", "hta_cuda_graph_rank0"):
            found[name] = folder / f"{name}.perfetto-trace"
            compact_file(SHARED_TRACES / f"{name}.json.gz", found[name])
        ranks = real_pipeline_copy("torch215_interleaved1f1b_pp2v2", folder)
        found["torch215_interleaved1f1b_pp2v2"] = folder / "interleaved.perfetto-trace"
        merge_files(sorted(ranks.glob("rank*_trace.json*")), lambda group, groups: found["torch215_interleaved1f1b_pp2v2"])
    return {name: answered(path, cookbook()) for name, path in found.items()}


def answered(path: Path, questions: dict[str, str]) -> Answered:
    with open_trace(path) as tp:
        rows = {title: [row.__dict__.copy() for row in tp.query(sql)] for title, sql in questions.items()}
    return Answered(path, report(path), rows)


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory) -> Answered:
    """The real 8-rank DLRM capture merged (V100, NCCL kernels that name no process group nor
    size, late ranks): asked who arrived late, its collectives and how its kernels were launched."""
    if not (SHARED_TRACES / "dlrm_8ranks").is_dir():
        pytest.skip("../shared/traces is absent")
    path = tmp_path_factory.mktemp("dlrm") / "dlrm.perfetto-trace"
    merge_files(sorted((SHARED_TRACES / "dlrm_8ranks").glob("rank*_trace.json.gz")), lambda group, groups: path)
    return answered(path, {title: sql for title, sql in cookbook().items()
                           if title.startswith((_STRAGGLERS, _COLLECTIVES, _MEMBERS, _LAUNCHES))})


@pytest.fixture(scope="module")
def no_steps(tmp_path_factory) -> Answered:
    """A real trace whose GPU has no profiler steps (TraceLens' B200 eager capture), compacted:
    the report gives it its active span."""
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces is absent")
    path = tmp_path_factory.mktemp("no_steps") / "tracelens_b200_eager.perfetto-trace"
    compact_file(SHARED_TRACES / "tracelens_b200_eager.json.gz", path)
    return answered(path, {title: sql for title, sql in cookbook().items() if title.startswith(_SPAN_QUESTIONS)})


@pytest.fixture(scope="module")
def stepless_merge(tmp_path_factory) -> Answered:
    """The generated pipeline's ranks with every ProfilerStep taken out of their JSON, merged:
    three GPUs, each reported over its active span, whose collectives still have a straggler."""
    folder = tmp_path_factory.mktemp("stepless")
    files = write_pp_run(folder / "ranks", pp_size=3, microbatches=2, steps=2, seed=4, graphs_per_step=2,
                         kernels_per_replay=6, clock_offsets_ns=[0, 400_000, -250_000])
    for path in files:
        document = json.loads(path.read_text())
        document["traceEvents"] = [event for event in document["traceEvents"]
                                   if not str(event.get("name", "")).startswith("ProfilerStep#")]
        write_json(path, document)
    path = folder / "merged.perfetto-trace"
    merge_files(files, lambda group, groups: path)
    return answered(path, {title: sql for title, sql in cookbook().items()
                           if title.startswith((*_SPAN_QUESTIONS, _STRAGGLERS))})


def test_every_question_of_the_cookbook_runs_on_every_trace(traces):
    assert len(cookbook()) >= 10
    assert set(traces["generated pipeline"].rows) == set(cookbook())
    assert all(trace.of("The critical path") for trace in traces.values() if "critical_path" in trace.figures)


def test_gpu_lane_group_and_step_figures_equal_the_report(traces):
    for name, trace in traces.items():
        gpu_lane_group_and_step_figures_equal(name, trace)


def gpu_lane_group_and_step_figures_equal(name: str, trace: Answered) -> None:
    """The report's GPU, lane group, step and top kernel figures are the cookbook's."""
    gpu_window_figures_equal(name, trace)
    spans = {(row["global_rank"], f"ProfilerStep#{row['step']}", row["start_ns"], row["step_ns"])
             for row in trace.of("How long each rank's steps")}
    assert {(gpu["global_rank"], step["step"], step["start_ns"], step["step_ns"]) for gpu in trace.figures["gpus"]
            for step in gpu["steps"]} <= spans, name


def gpu_window_figures_equal(name: str, trace: Answered) -> None:
    """The report's figures over each GPU's window (busy per lane group, compute and bubble per
    step, busy and exposed communication, top kernels) are the cookbook's."""
    figures = trace.figures
    busy: dict[int, Counter] = defaultdict(Counter)
    for row in trace.of("Busy time of each lane group"):
        busy[row["gpu_track_id"]][row["lane_label"]] += row["busy_ns"]
    expected = sorted(sorted((lane["group"], lane["busy_ns"]) for lane in gpu["lane_groups"] if lane["busy_ns"])
                      for gpu in figures["gpus"])
    assert sorted(sorted(groups.items()) for groups in busy.values()) == expected, name
    steps = sorted((row["compute_busy_ns"], row["bubble_ns"]) for row in trace.of("Compute and bubble"))
    assert steps == sorted((step["compute_busy_ns"], step["bubble_ns"]) for gpu in figures["gpus"]
                           for step in gpu["steps"] if step["compute_busy_ns"]), name
    gpus = sorted((row["busy_ns"], row["exposed_comm_ns"]) for row in trace.of("Busy time and"))
    assert gpus == sorted((gpu["busy_ns"], gpu["exposed_comm_ns"]) for gpu in figures["gpus"]), name
    kernels = [(row["name"], row["count"], row["total_ns"]) for row in trace.of("The kernels")]
    assert kernels == [(k["name"], k["count"], k["total_ns"]) for k in figures["top_kernels"]], name


_WINDOW_COLUMN = re.compile(r"\bwindow_(ts|end_ts|dur)\b")


def on_cpu_spans(sql: str) -> str:
    """A cookbook query asked as docs/sql.md says for `--step-windows cpu`: `cgtrace_step`'s
    CPU span columns where it reads the launched window's."""
    return _WINDOW_COLUMN.sub(r"\1", sql)


def test_cpu_step_windows_equal_the_cookbook_on_cpu_spans(traces):
    """`report --step-windows cpu`'s GPU, lane group, step, window and kernel figures are the
    cookbook's queries asked of the CPU spans; on the real trace whose GPU runs behind its
    CPU, those differ from the default's."""
    for name in ("generated pipeline", "hta_cuda_graph_rank0"):
        if name not in traces:
            continue
        on_cpu = answered_on_cpu_spans(traces[name].path, cookbook())
        gpu_lane_group_and_step_figures_equal(name, on_cpu)
        windows_lane_group_slices_and_kernels_by_op_equal(name, on_cpu)
        if name == "hta_cuda_graph_rank0":
            assert on_cpu.of("How long each rank's steps") != traces[name].of("How long each rank's steps")


def answered_on_cpu_spans(path: Path, questions: dict[str, str]) -> Answered:
    """`report --step-windows cpu` and the questions asked of the CPU spans."""
    with open_trace(path) as tp:
        rows = {title: [row.__dict__.copy() for row in tp.query(on_cpu_spans(sql))] for title, sql in questions.items()}
    on_cpu = Answered(path, report(path, "--step-windows", "cpu"), rows)
    assert on_cpu.figures["input"]["step_windows"] == "cpu"
    return on_cpu


def launched_windows(path: Path) -> dict[str, tuple[int, int]]:
    """Each ProfilerStep#N's launched window (start, length) from the Kineto JSON alone, as the
    step windows definition says: a GPU kernel, copy or set (of some length) is launched where
    the runtime call of its correlation id starts; it belongs to the step whose CPU span is the
    last to start by then, if the span has not ended; windows run on to the latest end of
    their own and earlier steps' spans and launched work, from the later of their span's start
    and the previous window's end."""
    header, events = load_events(path)
    base = header.get("baseTimeNanoseconds", 0)
    spans: dict[str, tuple[int, int]] = {}
    launches: dict[int, int] = {}
    gpu: list[tuple[int, int]] = []
    for event in events:
        if event.get("ph") != "X":
            continue
        start = base + to_ns(event["ts"])
        end = start + to_ns(event.get("dur", 0))
        category, args = event.get("cat"), event.get("args", {})
        if event.get("name", "").startswith("ProfilerStep#") and category in ("cpu_op", "user_annotation"):
            known = spans.get(event["name"], (start, end))
            spans[event["name"]] = (min(known[0], start), max(known[1], end))
        elif category in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches[args["correlation"]] = start
        elif category in ("kernel", "gpu_memcpy", "gpu_memset") and end > start:
            gpu.append((args.get("correlation"), end))
    steps = sorted(spans.items(), key=lambda item: item[1])
    own_end = {name: end for name, (_, end) in steps}
    for correlation, end in gpu:
        if correlation not in launches:
            continue
        started = [(name, span_end) for name, (span_start, span_end) in steps if span_start <= launches[correlation]]
        if started and launches[correlation] < started[-1][1]:
            own_end[started[-1][0]] = max(own_end[started[-1][0]], end)
    windows: dict[str, tuple[int, int]] = {}
    reached: int | None = None
    for name, (start, _) in steps:
        start = start if reached is None else max(start, reached)
        reached = own_end[name] if reached is None else max(reached, own_end[name])
        windows[name] = (start, reached - start)
    return windows


def test_launched_windows_of_a_gpu_running_behind_equal_its_json(traces):
    """On the real CUDA-graph trace whose GPU runs behind its CPU, each step's window (the
    report's default) is what the definition gives from the JSON, to the ns, and not its CPU
    span."""
    if "hta_cuda_graph_rank0" not in traces:
        pytest.skip("../shared/traces is absent")
    trace = traces["hta_cuda_graph_rank0"]
    expected = launched_windows(SHARED_TRACES / "hta_cuda_graph_rank0.json.gz")
    assert {f"ProfilerStep#{row['step']}": (row["start_ns"], row["step_ns"])
            for row in trace.of("How long each rank's steps")} == expected
    assert {step["step"]: (step["start_ns"], step["step_ns"]) for gpu in trace.figures["gpus"]
            for step in gpu["steps"]} == expected
    spans = query(trace.path, "select name, ts, dur from cgtrace_step")
    assert len(spans) == len(expected) and all(expected[row["name"]] != (row["ts"], row["dur"]) for row in spans)


def test_steps_cpu_compute_and_critical_path_equal_the_report_of_a_merged_cpu_pipeline(traces):
    if "torch215_interleaved1f1b_pp2v2" not in traces:
        pytest.skip("../shared/traces is absent")
    trace = traces["torch215_interleaved1f1b_pp2v2"]
    figures = trace.figures
    stages = {(row["global_rank"], row["step"]): row for row in figures["pipeline"]["stages"]}
    steps = {(row["global_rank"], f"ProfilerStep#{row['step']}"): (row["start_ns"], row["step_ns"])
             for row in trace.of("How long each rank's steps")}
    assert steps == {key: (row["start_ns"], row["step_ns"]) for key, row in stages.items()}
    computed = {(row["global_rank"], f"ProfilerStep#{row['step']}"): row["compute_ns"]
                for row in trace.of("How long each CPU-only rank")}
    assert computed == {key: row["compute_ns"] for key, row in stages.items()}
    assert {row["rank"] for row in query(trace.path, "select rank from cgtrace_rank")} == \
        {row["rank"] for row in stages.values()}
    by_kind: Counter = Counter()
    for path in figures["critical_path"]:
        for segment in path["segments"]:
            by_kind[(path["step"], segment["kind"])] += segment["end_ns"] - segment["start_ns"]
    assert {(row["step"], row["kind"]): row["total_ns"] for row in trace.of("The critical path")} == dict(by_kind)


_PARTS = {"compute": "compute_ns", "warm-up": "warmup_ns", "drain": "drain_ns", "receive wait": "recv_wait_ns",
          "exposed communication": "exposed_comm_ns", "other": "other_ns"}


def step_key(row: dict) -> tuple[int, str]:
    """A query row's rank and step as the report names them."""
    return row["global_rank"], f"ProfilerStep#{row['step']}"


def test_stage_parts_waits_and_actions_equal_the_report(traces):
    """Every trace: a stage's parts, what its receive waits were for and its compute per action
    as the report gives them; where the report finds no stage, the queries find none either."""
    stages_seen = 0
    for name, trace in traces.items():
        stages = trace.figures.get("pipeline", {}).get("stages", [])
        stages_seen += len(stages)
        parts: dict[tuple, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_PARTS.values(), 0))
        for row in trace.of("Where each pipeline stage"):
            parts[step_key(row)][_PARTS[row["part"]]] = row["ns"]
        assert dict(parts) == {(s["global_rank"], s["step"]): {key: s[key] for key in _PARTS.values()}
                               for s in stages}, name
        waits = sorted((*step_key(row), row["action"], row["stage"], row["microbatch"], row["from_stage"],
                        row["from_pp_rank"], row["from_rank"], row["wait_ns"])
                       for row in trace.of("What each stage's receive waits"))
        assert waits == sorted((s["global_rank"], s["step"], w["action"], w["stage"], w["microbatch"],
                                w["from_stage"], w["from_pp_rank"], w["from_rank"], w["wait_ns"])
                               for s in stages for w in s["recv_waits"]), name
        actions = sorted((*step_key(row), row["action"], row["stage"], row["microbatch"], row["start_ns"],
                          row["compute_ns"]) for row in trace.of("How long each stage computed"))
        assert actions == sorted((s["global_rank"], s["step"], a["action"], a["stage"], a["microbatch"],
                                  a["start_ns"], a["compute_ns"]) for s in stages for a in s["actions"]), name
    assert stages_seen, "a pipeline was reported"


def test_recv_and_send_blocks_equal_the_report(traces):
    seen = 0
    for name, trace in traces.items():
        expected = sorted((gpu["global_rank"], step["step"], step["recv_ns"], step["recv_compute_ns"],
                           step["send_ns"], step["send_compute_ns"])
                          for gpu in trace.figures["gpus"] for step in gpu["steps"] if "recv_ns" in step)
        seen += len(expected)
        assert sorted((*step_key(row), row["recv_ns"], row["recv_compute_ns"], row["send_ns"], row["send_compute_ns"])
                      for row in trace.of("Time in RECV and SEND")) == expected, name
    assert seen, "a GPU pipeline with RECV and SEND blocks was reported"


_LATE = ("late_collectives", "late_ns", "held_up_ns", "caused_wait_ns")


_STRAGGLERS = "The ranks that arrived late"


def test_stragglers_equal_the_report_of_a_merge(traces, dlrm):
    """On a merge's one clock (the generated pipeline's first stage runs the last backward, so
    reaches the step's all-reduce last; the real DLRM capture has late ranks of its own), each
    late rank's figures, who is a straggler and how many collectives were matched; where the
    report names nobody (one rank, no NCCL collectives), the query finds nobody late."""
    assert sum(stragglers_equal(name, trace) for name, trace in {**traces, "dlrm_8ranks": dlrm}.items()) == 2


def stragglers_equal(name: str, trace: Answered) -> bool:
    """The report's stragglers are the query's; whether anybody was judged late."""
    rows = trace.of(_STRAGGLERS)
    check = trace.figures.get("straggler_check")
    if check is None or check["largest_hold_up"] is None:
        assert not rows, name
        return False
    assert {row["global_rank"]: [row[key] for key in _LATE] for row in rows if row["straggler"]} == \
        {row["global_rank"]: [row[key] for key in _LATE] for row in trace.figures["stragglers"]}, name
    latest = check["largest_hold_up"]
    assert [rows[0]["global_rank"], *(rows[0][key] for key in _LATE)] == \
        [latest["global_rank"], *(latest[key] for key in _LATE)], name
    assert (rows[0]["collectives"], rows[0]["ranks"]) == (check["collectives"], check["ranks"]), name
    return True


def test_windows_lane_group_slices_and_kernels_by_op_equal_the_report(traces):
    for name, trace in traces.items():
        windows_lane_group_slices_and_kernels_by_op_equal(name, trace)


def windows_lane_group_slices_and_kernels_by_op_equal(name: str, trace: Answered) -> None:
    """The report's windows, lane groups' slices and kernels by op are the cookbook's."""
    slices: dict[int, dict[str, int]] = defaultdict(dict)
    windows = {}
    for row in trace.of("The window of each GPU"):
        slices[row["gpu_track_id"]][row["lane_label"]] = row["slices"]
        windows[row["gpu_track_id"]] = (row["window_start_ns"], row["window_end_ns"], row["window_ns"])
    assert sorted((windows[gpu], sorted(groups.items())) for gpu, groups in slices.items()) == \
        sorted(((gpu["window_start_ns"], gpu["window_end_ns"], gpu["window_ns"]),
                sorted((lane["group"], lane["slices"]) for lane in gpu["lane_groups"] if lane["slices"]))
               for gpu in trace.figures["gpus"]), name
    by_gpu: dict[int, list[dict]] = defaultdict(list)
    for row in trace.of("Each GPU's kernel time by the op"):
        by_gpu[row["gpu_track_id"]].append(row)

    def apart(rows: list[dict], launched: bool) -> dict[str, int]:
        found = [row for row in rows if row["op"] is None and bool(row["launched"]) == launched]
        return {"kernels": sum(row["kernels"] for row in found), "total_ns": sum(row["total_ns"] for row in found)}

    found = [{"ops": [{"op": row["op"], "kernels": row["kernels"], "total_ns": row["total_ns"]}
                      for row in rows if row["op"] is not None][:10],
              "no_launch": apart(rows, False), "no_op": apart(rows, True)} for rows in by_gpu.values()]
    nothing = {"ops": [], "no_launch": apart([], False), "no_op": apart([], True)}
    assert sorted(map(json.dumps, found)) == sorted(json.dumps(gpu["kernels_by_op"]) for gpu in trace.figures["gpus"]
                                                    if gpu["kernels_by_op"] != nothing), name


def test_critical_path_steps_and_ranks_equal_the_report(traces):
    paths = 0
    for name, trace in traces.items():
        steps = trace.figures.get("critical_path", [])
        paths += len(steps)
        assert [(row["step"], row["start_ns"], row["end_ns"], row["length_ns"], row["segments"])
                for row in trace.of("Each step's critical path: when")] == \
            [(step["step"], step["start_ns"], step["end_ns"], step["length_ns"], len(step["segments"]))
             for step in steps], name
        assert trace.of("Each step's critical path, segment") == \
            [{"step": step["step"], **segment} for step in steps for segment in step["segments"]], name
        assert sorted((row["step"], row["pp_rank"], row["global_rank"], row["on_path_ns"],
                       {kind: row[f"{kind}_ns"] for kind in ("compute", "transfer", "launch", "wait")},
                       (row["most_kind"], row["most_name"], row["most_ns"]))
                      for row in trace.of("Where each step's critical path ran")) == \
            sorted((step["step"], rank["pp_rank"], rank["global_rank"], rank["on_path_ns"], rank["kinds_ns"],
                    (rank["most"]["kind"], rank["most"]["name"], rank["most"]["ns"]))
                   for step in steps for rank in step["ranks"]), name
    assert paths, "a merge wrote its critical path"


def test_memory_memcpy_and_clocks_equal_the_report(traces):
    seen: Counter = Counter()
    for name, trace in traces.items():
        figures = trace.figures
        peaks: dict[tuple, dict[str, int | None]] = {}
        for row in trace.of("Peak memory of each device"):
            key = (row["rank"], "whole trace" if row["step"] is None else f"ProfilerStep#{row['step']}",
                   "CPU" if row["device"] == -1 else f"GPU {row['device']}")
            found = peaks.setdefault(key, {"peak_allocated_bytes": None, "peak_reserved_bytes": None})
            found["peak_allocated_bytes" if row["meaning"] == "memory allocated" else "peak_reserved_bytes"] = \
                int(row["peak_bytes"])
        assert peaks == {(row["rank"], row["step"], row["device"]): {key: row[key] for key in (
            "peak_allocated_bytes", "peak_reserved_bytes")} for row in figures.get("memory", [])}, name
        copies = sorted(((row["rank"], None if row["step"] is None else f"ProfilerStep#{row['step']}",
                          row["direction"], row["copies"], row["bytes"], row["copy_ns"])
                         for row in trace.of("Memcpy traffic")), key=repr)
        assert copies == sorted(((row["rank"], row["step"], row["direction"], row["copies"], row["bytes"],
                                  row["copy_ns"]) for row in figures.get("memcpy", [])), key=repr), name
        clocks = [(row["rank"], row["pp_rank"], row["global_rank"], row["clock_offset_ns"],
                   row["clock_uncertainty_ns"], json.loads(row["clock_evidence"]))
                  for row in trace.of("How a merge set each rank's clock")]
        assert clocks == [(row["rank"], row["pp_rank"], row["global_rank"], row["offset_ns"], row["uncertainty_ns"],
                           row["evidence"]) for row in figures.get("clocks", [])], name
        seen.update(memory=len(peaks), memcpy=len(copies), clocks=len(clocks))
    assert all(seen[figure] for figure in ("memory", "memcpy", "clocks")), seen


def test_transfers_join_neighbouring_ranks_forward_in_time(traces):
    for name in ("generated pipeline", "torch215_interleaved1f1b_pp2v2"):
        if name not in traces:
            continue
        transfers = query(traces[name].path, "select * from cgtrace_transfer")
        assert transfers and all(abs(t["from_pp_rank"] - t["to_pp_rank"]) == 1 for t in transfers), name
        assert all(t["arrival_ts"] >= t["send_end_ts"] for t in transfers), name


def test_printed_statements_give_the_same_rows_where_nothing_was_defined(traces):
    """`cgtrace sql` pasted into a trace processor that knows nothing of cgtrace (the UI's)."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["sql"]) == 0
    statements = out.getvalue()
    views = ("cgtrace_slice", "cgtrace_step", "cgtrace_window", "cgtrace_counter", "cgtrace_transfer", "cgtrace_track",
             "cgtrace_stage_span", "cgtrace_stage_piece", "cgtrace_collective_member")
    in_order = {view: f"select * from {view} order by 1, 2, 3, 4, 5, 6, 7" for view in views}
    for name, trace in traces.items():
        with open_trace(trace.path) as tp:  # as `cgtrace query` opens it
            ours = {view: [row.__dict__.copy() for row in tp.query(sql)] for view, sql in in_order.items()}
        with open_trace(trace.path, tables=False) as tp:
            for statement in statements.split(";\n"):
                if statement.strip():
                    tp.query(statement)
            pasted = {view: [row.__dict__.copy() for row in tp.query(sql)] for view, sql in in_order.items()}
        assert pasted == ours, name


_LAUNCHES = "How each GPU's kernels were launched"
# What the report gives a GPU without steps over its active span.
_SPAN_QUESTIONS = (_LAUNCHES, "The active span of each GPU", "Busy time of each lane group", "Compute and bubble",
                   "Busy time and", "The kernels", "The window of each GPU", "Each GPU's kernel time by the op")
_LAUNCH_FIGURES = ("step", "kernels", "launched_kernels", "launch_delay_p50_ns", "launch_delay_p90_ns",
                   "launch_delay_max_ns", "launches", "cpu_per_launch_ns", "short_kernels", "short_kernel_share",
                   "short_kernel_time_share")


def per_gpu(rows: list[dict], keys: tuple[str, ...]) -> list[str]:
    """Each GPU's rows (their `keys`, in order) as one text, the GPUs in a stable order: the
    report names a GPU as the tables do not, so GPUs are compared as a set."""
    found: dict[int, list[list]] = defaultdict(list)
    for row in rows:
        found[row["gpu_track_id"]].append([row[key] for key in keys])
    return sorted(map(json.dumps, found.values()))


def test_launch_figures_equal_the_report(traces, no_steps, dlrm):
    """Every GPU's launch delay (p50, p90, largest), CPU time per launch and short kernels, per
    step (its active span where it has none), as the report's JSON gives them, to the ns and
    the float: compacted and merged real traces (the 8 DLRM GPUs), a generated pipeline."""
    assert sum(launches_equal(name, trace)
               for name, trace in {**traces, "tracelens_b200_eager": no_steps, "dlrm_8ranks": dlrm}.items())
    assert [row["step"] for row in no_steps.of(_LAUNCHES)] == ["active span"]


def launches_equal(name: str, trace: Answered) -> int:
    """The report's launch figures of every GPU are the query's; how many kernels had a launch."""
    rows = trace.of(_LAUNCHES)
    assert per_gpu(rows, _LAUNCH_FIGURES) == sorted(
        json.dumps([[step[key] for key in _LAUNCH_FIGURES] for step in gpu["launches"]])
        for gpu in trace.figures["gpus"]), name
    return sum(row["launched_kernels"] for row in rows)


def test_the_active_span_of_a_gpu_without_steps_equals_the_report(traces, no_steps):
    """The report's window of a GPU whose trace has no ProfilerStep is its active span, and
    the query gives it; where every GPU has steps it gives none."""
    spans = [(row["window"], row["window_start_ns"], row["window_end_ns"], row["window_ns"])
             for row in no_steps.of("The active span of each GPU")]
    assert spans and spans == [(gpu["window"], gpu["window_start_ns"], gpu["window_end_ns"], gpu["window_ns"])
                               for gpu in no_steps.figures["gpus"]]
    assert not query(no_steps.path, "select * from cgtrace_step")
    for name, trace in traces.items():
        assert all(gpu["window"] == "steps" for gpu in trace.figures["gpus"]), name
        assert not trace.of("The active span of each GPU"), name


def test_window_figures_of_a_gpu_without_steps_equal_the_report(no_steps):
    """Over a stepless GPU's active span, its busy per lane group, compute and bubble, busy and
    exposed communication, top kernels, window, lane groups' slices and kernels by op are the
    report's, through the same queries as a GPU with steps."""
    [gpu] = no_steps.figures["gpus"]
    assert gpu["window"] == "active span" and gpu["busy_ns"] and no_steps.figures["top_kernels"]
    assert gpu["kernels_by_op"]["ops"] and gpu["steps"][0]["compute_busy_ns"]
    assert [(step["step"], step["start_ns"], step["step_ns"]) for step in gpu["steps"]] == \
        [(row["window"], row["window_start_ns"], row["window_ns"]) for row in no_steps.of("The active span of each GPU")]
    on_cpu = answered_on_cpu_spans(no_steps.path, {title: sql for title, sql in cookbook().items()
                                                   if title.startswith(_SPAN_QUESTIONS)})
    for answers in (no_steps, on_cpu):  # --step-windows cpu too: an active span is the same
        gpu_window_figures_equal("tracelens_b200_eager", answers)
        windows_lane_group_slices_and_kernels_by_op_equal("tracelens_b200_eager", answers)
    assert [(row["step"], row["name"]) for row in query(no_steps.path, "select step, name from cgtrace_window")] == \
        [(None, "active span")]


def test_window_figures_and_stragglers_of_a_merge_without_steps_equal_the_report(stepless_merge):
    """A merge whose ranks have no profiler steps: every GPU's figures over its active span,
    its launches, and the stragglers, judged against the median of the GPUs' windows as the
    report judges them."""
    trace = stepless_merge
    assert len(trace.figures["gpus"]) == 3 and all(gpu["window"] == "active span" for gpu in trace.figures["gpus"])
    assert not query(trace.path, "select * from cgtrace_step")
    gpu_window_figures_equal("stepless merge", trace)
    windows_lane_group_slices_and_kernels_by_op_equal("stepless merge", trace)
    assert launches_equal("stepless merge", trace)
    assert stragglers_equal("stepless merge", trace) and trace.figures["stragglers"]


_COLLECTIVES = "Each collective across the ranks"
_MEMBERS = "When each member of a collective"
_COLLECTIVE_FIGURES = ("kind", "process_group", "collective", "dtype", "in_nelems", "out_nelems", "group_size",
                       "bytes", "message_from", "members", "first_start_ns", "last_start_ns", "last_end_ns",
                       "start_skew_ns", "end_skew_ns", "effective_ns", "total_wait_ns", "held_up_ns", "algbw_gb_s",
                       "busbw_gb_s")
# What a merge wrote on each member kernel (debug.cgtrace_collective.*), as the report names it.
_WRITTEN = ("start_skew_ns", "end_skew_ns", "effective_ns", "total_wait_ns", "held_up_ns", "bytes", "algbw_gb_s",
            "busbw_gb_s", "wait_ns")


def test_collectives_equal_the_report_of_a_merge(traces, dlrm):
    """Each collective of a merge (the real DLRM capture, whose sizes come from the nccl:* ops
    that launched its kernels; the generated pipeline's, recorded on its kernels), recomputed
    from its members' times, is the report's row to the ns and the float, worst first, with
    each member's start, end and wait; the figures the merge wrote on the member kernels are
    the same. Where the report has no collectives (one rank, no NCCL), the queries find none."""
    judged = 0
    for name, trace in {**traces, "dlrm_8ranks": dlrm}.items():
        expected = trace.figures.get("collectives", {}).get("collectives", [])
        assert [[row[key] for key in _COLLECTIVE_FIGURES] + [row["kind_index"], row["ranks"], row["last_to_arrive"]]
                for row in trace.of(_COLLECTIVES)] == \
            [[row[key] for key in _COLLECTIVE_FIGURES]
             + [row["index"], ",".join(str(member["global_rank"]) for member in row["ranks"]),
                row["ranks"][-1]["global_rank"]] for row in expected], name
        members: dict[tuple, list] = defaultdict(list)
        for row in trace.of(_MEMBERS):
            members[(row["process_group"], row["kind"], row["kind_index"])].append(
                [row[key] for key in ("pp_rank", "global_rank", "start_ns", "end_ns", "duration_ns", "wait_ns")])
        assert members == {(row["process_group"], row["kind"], row["index"]): [
            [member[key] for key in ("pp_rank", "global_rank", "start_ns", "end_ns", "duration_ns", "wait_ns")]
            for member in row["ranks"]] for row in expected}, name
        written = query(trace.path, "select m.process_group, m.kind, m.kind_index, m.global_rank, "
                        + ", ".join(f"extract_arg(s.arg_set_id, 'debug.cgtrace_collective.{key}') as {key}"
                                    for key in _WRITTEN)
                        + " from cgtrace_collective_member m join slice s on s.id = m.slice_id")
        assert sorted(json.dumps([[row[key] for key in ("process_group", "kind", "kind_index", "global_rank")],
                                  [row[key] for key in _WRITTEN]]) for row in written) == \
            sorted(json.dumps([[row["process_group"], row["kind"], row["index"], member["global_rank"]],
                               [member["wait_ns"] if key == "wait_ns" else row[key] for key in _WRITTEN]])
                   for row in expected for member in row["ranks"]), name
        judged += bool(expected)
    assert judged == 2





def test_recv_and_send_blocks_of_a_merge_without_steps_equal_the_report(stepless_merge):
    """A stepless pipeline: the report gives each GPU's RECV and SEND blocks over its active
    span, and no stage anatomy (that is per profiler step); so do the queries."""
    sql = {title: text for title, text in cookbook().items()
           if title.startswith(("Time in RECV and SEND", "Where each pipeline stage", "What each stage's receive waits",
                                "How long each stage computed"))}
    assert len(sql) == 4
    answers = {title: query(stepless_merge.path, text) for title, text in sql.items()}
    blocks = sorted((gpu["global_rank"], step["step"], step["recv_ns"], step["recv_compute_ns"], step["send_ns"],
                     step["send_compute_ns"]) for gpu in stepless_merge.figures["gpus"] for step in gpu["steps"]
                    if "recv_ns" in step)
    assert len(blocks) == 3 and all(step == "active span" and recv > 0 for _, step, recv, *_ in blocks)
    [recv_send] = [rows for title, rows in answers.items() if title.startswith("Time in RECV and SEND")]
    assert sorted((row["global_rank"], "active span" if row["step"] is None else row["step"], row["recv_ns"],
                   row["recv_compute_ns"], row["send_ns"], row["send_compute_ns"]) for row in recv_send) == blocks
    assert not stepless_merge.figures.get("pipeline", {}).get("stages")
    assert all(not rows for title, rows in answers.items() if not title.startswith("Time in RECV and SEND"))
