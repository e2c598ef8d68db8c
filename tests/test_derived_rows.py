"""Derived rows are kept apart from measured ones (model/derived.py, tp/tables.py).

A merged pipeline holds cgtrace's own rows beside the input's slices: arrival markers, the
critical path's copies of the work it passes through, kernel label spans. A query over
`slice`, like the README's, must count the input's work only, so its counts per name equal
an oracle's count of the input files' complete and instant events; what cgtrace derived is
one line away, in `cgtrace_derived_slice`, and `cgtrace_all_slice` holds both.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from converter.cli import main
from converter.generator import write_pp_run
from converter.tp import open_trace

from .helpers import merge_files, real_pipeline_copy
from .oracle import load_events, to_ns

README_QUERY = "select name, count(*) n, sum(dur) total from slice group by name"


def query(trace: Path, sql: str) -> list[dict]:
    """`cgtrace query --format json`, as a user runs it."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["query", str(trace), sql, "--format", "json"]) == 0
    return json.loads(out.getvalue())


def input_work(files: list[Path]) -> dict[str, tuple[int, int]]:
    """Per name, how many complete and instant events the input files hold, and their total
    duration in ns: what the input measured."""
    count: Counter = Counter()
    total: Counter = Counter()
    for file in files:
        _, events = load_events(file)
        for event in events:
            if event.get("ph") in ("X", "i", "I"):
                count[event.get("name")] += 1
                total[event.get("name")] += to_ns(event.get("dur", 0)) if event.get("ph") == "X" else 0
    return {name: (count[name], total[name]) for name in count}


def check_measured_and_derived(files: list[Path], merged: Path, summary: dict) -> None:
    found = {row["name"]: (row["n"], row["total"]) for row in query(merged, README_QUERY)}
    assert found == input_work(files)
    derived = {row["derived_as"]: row["n"] for row in query(
        merged, "select derived_as, count(*) n from cgtrace_derived_slice group by 1")}
    assert derived["critical path segment"] == summary["critical_path"]["segments"] > 0
    [every] = query(merged, "select (select count(*) from cgtrace_all_slice) all_rows, "
                            "(select count(*) from slice) measured, (select count(*) from cgtrace_derived_slice) d")
    assert every["all_rows"] == every["measured"] + every["d"] == summary["verified"]["slices"]


@pytest.mark.parametrize("name", ["torch215_1f1b_pp4", "torch215_zb_pp2v2"])
def test_a_merged_real_pipeline_counts_the_inputs_work(name, tmp_path):
    ranks = real_pipeline_copy(name, tmp_path)
    files = sorted(ranks.glob("rank*_trace.json*"))
    merged = tmp_path / "merged.perfetto-trace"
    summary = merge_files(files, lambda group, groups: merged, verify=True)
    check_measured_and_derived(files, merged, summary)
    # Every transfer's arrow lands on an arrival marker: derived, one per transfer.
    [markers] = query(merged, "select count(*) n from cgtrace_derived_slice where derived_as = 'arrival marker'")
    assert markers["n"] == summary["pp_send_recv_pairs"] > 0


def test_a_merged_cuda_graph_pipeline_counts_the_inputs_work(tmp_path):
    files = write_pp_run(tmp_path / "ranks", pp_size=2, microbatches=2, steps=2, seed=4, graphs_per_step=2,
                         kernels_per_replay=6)
    merged = tmp_path / "merged.perfetto-trace"
    summary = merge_files(files, lambda group, groups: merged, verify=True)
    check_measured_and_derived(files, merged, summary)
    [labels] = query(merged, "select count(*) n from cgtrace_derived_slice where derived_as = 'kernel label span'")
    assert labels["n"] > 0


def test_a_trace_cgtrace_did_not_write_keeps_its_slice_table(tmp_path):
    """Perfetto's own reading of a profiler trace: nothing is derived, every slice stays."""
    [file] = write_pp_run(tmp_path / "ranks", pp_size=1, microbatches=1, steps=1, seed=1, graphs_per_step=1,
                          kernels_per_replay=2)
    with open_trace(file) as tp:
        [row] = tp.query("select (select count(*) from slice) n, (select count(*) from cgtrace_all_slice) a, "
                         "(select count(*) from cgtrace_derived_slice) d")
    assert row.n == row.a > 0 and row.d == 0
