"""`report DIR` and `query DIR` answer for every rank of the folder or not at all: a rank trace
whose output is missing (not written yet, or its compaction failed) and two files that hold
one global rank are each refused in one line that names the files, exit 2, nothing written.
An answer over the ranks that happen to be there would pass for the whole run's."""

from __future__ import annotations

import io
import json
import shutil
import statistics
from collections import defaultdict
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from converter.cli import main
from converter.generator import write_pp_run
from tests.helpers import real_pipeline_copy
from tests.oracle import load_events, to_ns
from tests.test_bad_input import assert_clean_error, run_cli, snapshot

COUNT = "select count(*) as n from slice"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """Four ranks' profiler output, rank 2's cut short, compacted in place: rank 2 fails, the
    other three are written."""
    folder = tmp_path_factory.mktemp("run") / "ranks"
    write_pp_run(folder, 4, events_per_rank=2_000)
    (folder / "rank2_trace.json").write_text('{"traceEvents": [')
    compact = run_cli(folder.parent, "compact", "ranks", "--jobs", "2", "-q")
    assert compact.returncode == 2 and "rank2_trace.json" in compact.stderr, compact.stderr[-1500:]
    assert json.loads(compact.stdout)["written"] == 3
    return folder


def _copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


@pytest.mark.parametrize("args", [("report",), ("query", COUNT)], ids=["report", "query"])
def test_a_rank_whose_compaction_failed_is_named_not_left_out(run_dir, tmp_path, args):
    folder = _copy(run_dir, tmp_path / "ranks")
    before = snapshot(tmp_path)

    run = run_cli(tmp_path, args[0], "ranks", *args[1:], "--jobs", "2")

    assert_clean_error(run, "ranks: 1 rank trace(s) there have no output yet (rank2_trace.json), so an answer "
                            "from the 3 outputs would leave them out", tmp_path, before)
    assert "run `cgtrace compact ranks` to write them" in run.stderr
    assert len(list(folder.glob("*.perfetto-trace"))) == 3


def test_an_output_not_written_yet_is_named_and_the_whole_run_then_answers(run_dir, tmp_path):
    folder = _copy(run_dir, tmp_path / "ranks")
    (folder / "rank2_trace.json").unlink()
    (folder / "rank1_trace_compacted.perfetto-trace").unlink()  # its batch still running, say
    before = snapshot(tmp_path)

    assert_clean_error(run_cli(tmp_path, "query", "ranks", COUNT), "(rank1_trace.json)", tmp_path, before)

    assert run_cli(tmp_path, "compact", "ranks", "-q").returncode == 0
    run = run_cli(tmp_path, "query", "ranks", COUNT, "--format", "json", "--jobs", "2")
    assert run.returncode == 0, run.stderr[-1500:]
    expected = sorted(path.name for path in folder.glob("rank*_trace.json"))  # every rank trace the folder holds
    assert [row["file"].replace("_compacted.perfetto-trace", ".json") for row in json.loads(run.stdout)] == expected


@pytest.mark.parametrize("args", [("report",), ("query", COUNT)], ids=["report", "query"])
def test_two_outputs_of_one_global_rank_are_named_both(run_dir, tmp_path, args):
    folder = tmp_path / "ranks"
    folder.mkdir()
    for name in ("rank0_trace_compacted.perfetto-trace", "rank1_trace_compacted.perfetto-trace"):
        shutil.copy(run_dir / name, folder / name)
    shutil.copy(run_dir / "rank0_trace_compacted.perfetto-trace", folder / "rerun_compacted.perfetto-trace")
    before = snapshot(tmp_path)

    run = run_cli(tmp_path, args[0], "ranks", *args[1:], "--jobs", "2")

    assert_clean_error(run, "ranks: rank0_trace_compacted.perfetto-trace and rerun_compacted.perfetto-trace both "
                            "hold global rank 0; move one of them out", tmp_path, before)


@pytest.mark.parametrize("args", [("report",), ("query", COUNT)], ids=["report", "query"])
def test_two_rank_traces_of_one_global_rank_are_named_both(run_dir, tmp_path, args):
    folder = tmp_path / "ranks"
    folder.mkdir()
    shutil.copy(run_dir / "rank0_trace.json", folder / "rank0_trace.json")
    shutil.copy(run_dir / "rank0_trace.json", folder / "rank9_trace.json")  # its header says rank 0
    before = snapshot(tmp_path)

    assert_clean_error(run_cli(tmp_path, args[0], "ranks", *args[1:], "--jobs", "2"),
                       "ranks: rank0_trace.json and rank9_trace.json both hold global rank 0; move one of them out",
                       tmp_path, before)


@pytest.mark.parametrize("args", [("report",), ("query", COUNT)], ids=["report", "query"])
def test_a_rank_that_fails_while_answering_is_named_and_leaves_no_scratch(run_dir, tmp_path, args):
    """From profiler output each rank is converted into a scratch trace first; a rank that
    fails stops the answer, and neither its scratch nor the others' stays in TMPDIR."""
    import os
    import subprocess
    import sys

    folder = tmp_path / "ranks"
    folder.mkdir()
    for name in ("rank0_trace.json", "rank1_trace.json", "rank2_trace.json", "rank3_trace.json"):
        shutil.copy(run_dir / name, folder / name)  # rank 2's is cut short
    (tmp_path / "tmp").mkdir()
    run = subprocess.run([sys.executable, "-m", "converter.cli", args[0], "ranks", *args[1:], "--jobs", "2"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TMPDIR=str(tmp_path / "tmp")))
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-1500:]
    line = run.stderr.splitlines()[-1]
    assert line.startswith("cgtrace: error: ranks: 1 of 4 traces could not be read (rank2_trace.json), first "
                           f"{Path('ranks/rank2_trace.json')}: "), run.stderr
    # Its header is cut off too, so its rank is one the run lacks (tests/test_every_rank_accounted.py).
    assert "1 of 4 ranks (world_size in distributedInfo) have no readable trace here: global rank(s) 2" in line
    assert list((tmp_path / "tmp").iterdir()) == []
    assert sorted(p.name for p in folder.iterdir()) == ["rank0_trace.json", "rank1_trace.json", "rank2_trace.json",
                                                        "rank3_trace.json"]


def test_rows_from_profiler_output_carry_the_rank_its_header_names(run_dir, tmp_path):
    """Each rank trace is converted to answer from, and the converted trace records the global
    rank of its distributedInfo, as a compacted one does (it was NULL, so duplicates passed)."""
    folder = tmp_path / "ranks"
    folder.mkdir()
    names = ["rank0_trace.json", "rank1_trace.json", "rank3_trace.json"]
    for name in names:
        shutil.copy(run_dir / name, folder / name)
    headers = {name: json.loads((folder / name).read_text())["distributedInfo"]["rank"] for name in names}

    run = run_cli(tmp_path, "query", "ranks", COUNT, "--format", "json", "--jobs", "2")

    assert run.returncode == 0, run.stderr[-1500:]
    assert {row["file"]: row["rank"] for row in json.loads(run.stdout)} == headers


CPU_PIPELINES = ["dp2_pp2", "interleaved1f1b_pp2v2", "torch215_1f1b_pp4", "torch215_gpipe_pp4",
                 "torch215_interleaved1f1b_pp2v2", "torch215_zb_pp2v2"]


def _answer(*argv: str) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main([*argv, "--format", "json"]) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize("name", CPU_PIPELINES)
def test_report_dir_on_a_cpu_pipeline_gives_each_ranks_stages_as_the_merged_report_does(name, tmp_path):
    """Real gloo pipelines (DDP too) have no GPU rows: `report DIR` gives each rank's pipeline
    stage rows, whose step and compute lengths equal the merged directory's report (its times
    move with clock alignment, lengths do not), a median step from them, their findings, and
    says it could not tell stragglers: no NCCL kernels."""
    folder = real_pipeline_copy(name, tmp_path)
    across = _answer("report", str(folder), "--jobs", "1")
    assert main(["merge", str(folder), "-q"]) == 0  # one merged trace per pipeline, beside the ranks
    merged = [_answer("report", str(path)) for path in sorted(folder.glob("pp_*merged.perfetto-trace"))]
    assert merged and across["ranks"] == []
    expected = {(stage["global_rank"], stage["step"]): (stage["step_ns"], stage["compute_ns"])
                for report in merged for stage in report["pipeline"]["stages"]}
    assert {(stage["global_rank"], stage["step"]): (stage["step_ns"], stage["compute_ns"])
            for stage in across["stages"]} == expected
    steps: dict = defaultdict(list)  # per rank file: its ProfilerStep lengths, from the JSON
    for path in sorted(folder.glob("rank*_trace.json.gz")):
        _, events = load_events(path)
        steps[path.name] = [to_ns(e["dur"]) for e in events if e.get("ph") == "X"
                            and str(e.get("name", "")).startswith("ProfilerStep#")]
    assert sorted((stage["file"], stage["step_ns"]) for stage in across["stages"]) == \
        sorted((file, length) for file, lengths in steps.items() for length in lengths)
    assert across["median_step_ns"] == statistics.median(sum(lengths) / len(lengths) for lengths in steps.values())
    shares: dict = defaultdict(list)  # the receive-wait rule of one trace's findings, per rank of the directory
    for stage in across["stages"]:
        shares[stage["global_rank"]].append(stage["recv_wait_ns"] / stage["step_ns"])
    waits = {f["where"]["global_rank"] for f in across["findings"] if f["key"] == "recv_wait"}
    assert waits == {rank for rank, mine in shares.items() if statistics.mean(mine) >= 0.10} and waits
    assert across["stragglers"] == [] and \
        across["straggler_check"]["could_not_tell"] == "no rank runs NCCL collective kernels"
