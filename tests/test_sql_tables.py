"""cgtrace's SQL tables (tp/tables.py) and the cookbook in docs/sql.md.

Every cookbook query runs as the docs write it, on a compacted real GPU trace, a merged real
CPU pipeline and a merged generated CUDA-graph pipeline; each one docs/sql.md marks "= report"
gives `cgtrace report`'s figures exactly. `cgtrace sql` prints statements that, run in a
trace processor that has not defined them (as the Perfetto UI's query page is), give the same
rows as `cgtrace query`.
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter, defaultdict
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from converter.cli import main
from converter.generator import write_pp_run
from converter.tp import open_trace

from .helpers import SHARED_TRACES, compact_file, merge_files, real_pipeline_copy

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


def report(trace: Path) -> dict:
    return cli_json("report", trace, "--format", "json", "--top", 10)  # type: ignore[return-value]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path]:
    """The traces the cookbook runs on: real where ../shared is there, generated always."""
    folder = tmp_path_factory.mktemp("sql")
    found = {}
    files = write_pp_run(folder / "generated", pp_size=2, microbatches=2, steps=2, seed=4, graphs_per_step=2,
                         kernels_per_replay=6)
    found["generated pipeline"] = folder / "generated.perfetto-trace"
    merge_files(files, lambda group, groups: found["generated pipeline"])
    if SHARED_TRACES.is_dir():
        found["hta_nccl_a100"] = folder / "nccl.perfetto-trace"
        compact_file(SHARED_TRACES / "hta_nccl_a100.json.gz", found["hta_nccl_a100"])
        ranks = real_pipeline_copy("torch215_1f1b_pp4", folder)
        found["torch215_1f1b_pp4"] = folder / "1f1b.perfetto-trace"
        merge_files(sorted(ranks.glob("rank*_trace.json*")), lambda group, groups: found["torch215_1f1b_pp4"])
    return found


def test_every_question_of_the_cookbook_runs_on_every_trace(traces):
    questions = cookbook()
    assert len(questions) >= 10
    for name, trace in traces.items():
        for title, sql in questions.items():
            query(trace, sql)  # exit 0, or the test fails naming the query's error on stderr


def test_gpu_lane_group_and_step_figures_equal_the_report(traces):
    for name, trace in traces.items():
        figures = report(trace)
        busy: dict[int, Counter] = defaultdict(Counter)
        for row in query(trace, question("Busy time of each lane group")):
            busy[row["gpu_track_id"]][row["lane_label"]] += row["busy_ns"]
        expected = sorted(sorted((lane["group"], lane["busy_ns"]) for lane in gpu["lane_groups"] if lane["busy_ns"])
                          for gpu in figures["gpus"])
        assert sorted(sorted(groups.items()) for groups in busy.values()) == expected, name
        steps = sorted((row["compute_busy_ns"], row["bubble_ns"]) for row in query(trace, question("Compute and bubble")))
        assert steps == sorted((step["compute_busy_ns"], step["bubble_ns"]) for gpu in figures["gpus"]
                               for step in gpu["steps"] if step["compute_busy_ns"]), name
        gpus = sorted((row["busy_ns"], row["exposed_comm_ns"]) for row in query(trace, question("Busy time and")))
        assert gpus == sorted((gpu["busy_ns"], gpu["exposed_comm_ns"]) for gpu in figures["gpus"]), name
        kernels = [(row["name"], row["count"], row["total_ns"]) for row in query(trace, question("The kernels"))]
        assert kernels == [(k["name"], k["count"], k["total_ns"]) for k in figures["top_kernels"]], name


def test_steps_cpu_compute_and_critical_path_equal_the_report_of_a_merged_cpu_pipeline(traces):
    if "torch215_1f1b_pp4" not in traces:
        pytest.skip("../shared/traces is absent")
    trace = traces["torch215_1f1b_pp4"]
    figures = report(trace)
    stages = {(row["global_rank"], row["step"]): row for row in figures["pipeline"]["stages"]}
    steps = {(row["global_rank"], f"ProfilerStep#{row['step']}"): row["step_ns"]
             for row in query(trace, question("How long each rank's steps"))}
    assert steps == {key: row["step_ns"] for key, row in stages.items()}
    computed = {(row["global_rank"], f"ProfilerStep#{row['step']}"): row["compute_ns"]
                for row in query(trace, question("How long each CPU-only rank"))}
    assert computed == {key: row["compute_ns"] for key, row in stages.items()}
    assert {row["rank"] for row in query(trace, "select rank from cgtrace_rank")} == \
        {row["rank"] for row in stages.values()}
    by_kind: Counter = Counter()
    for path in figures["critical_path"]:
        for segment in path["segments"]:
            by_kind[(path["step"], segment["kind"])] += segment["end_ns"] - segment["start_ns"]
    assert {(row["step"], row["kind"]): row["total_ns"] for row in query(trace, question("The critical path"))} == \
        dict(by_kind)


def test_transfers_join_neighbouring_ranks_forward_in_time(traces):
    for name in ("generated pipeline", "torch215_1f1b_pp4"):
        if name not in traces:
            continue
        transfers = query(traces[name], "select * from cgtrace_transfer")
        assert transfers and all(abs(t["from_pp_rank"] - t["to_pp_rank"]) == 1 for t in transfers), name
        assert all(t["arrival_ts"] >= t["send_end_ts"] for t in transfers), name


def test_printed_statements_give_the_same_rows_where_nothing_was_defined(traces):
    """`cgtrace sql` pasted into a trace processor that knows nothing of cgtrace (the UI's)."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["sql"]) == 0
    statements = out.getvalue()
    for name, trace in traces.items():
        for view in ("cgtrace_slice", "cgtrace_step", "cgtrace_counter", "cgtrace_transfer", "cgtrace_track"):
            ours = query(trace, f"select * from {view} order by 1, 2, 3")
            with open_trace(trace, tables=False) as tp:
                for statement in statements.split(";\n"):
                    if statement.strip():
                        tp.query(statement)
                pasted = [row.__dict__.copy() for row in tp.query(f"select * from {view} order by 1, 2, 3")]
            assert pasted == ours, (name, view)
