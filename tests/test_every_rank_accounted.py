"""Every rank accounted for: a run's directory with one rank's trace missing (every header
records world_size) and another's cut short. compact, report, query and merge over it each
name both, in their summary or report and on stderr; merge writes every pipeline that has all
its ranks and names the ones that do not, exit 2. The truth is read from the headers and the
events of the input JSON."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from converter.generator import write_pp_run

from .helpers import rows
from .oracle import load_events
from .test_bad_input import run_cli


def pipelines_of(files: list[Path]) -> list[list[int]]:
    """The run's pipelines in their PP order, as the headers' pg_config (mesh_pp) lists them."""
    groups = {tuple(group["ranks"]) for path in files for group in load_events(path)[0]["distributedInfo"]["pg_config"]
              if group["pg_desc"] == "mesh_pp"}
    return sorted(map(list, groups), key=min)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, list[list[int]], int, int]:
    """Three pipelines of four ranks: pipeline 0 lacks one rank's trace, pipeline 1 has one cut
    in the middle of its events; (the folder, the pipelines, the missing rank, the cut rank)."""
    folder = tmp_path_factory.mktemp("run") / "ranks"
    files = write_pp_run(folder, 4, dp_size=3, steps=2, seed=4, kernels_per_replay=8)
    pipelines = pipelines_of(files)
    missing, cut = pipelines[0][1], pipelines[1][2]
    (folder / f"rank{missing}_trace.json").unlink()
    text = (folder / f"rank{cut}_trace.json").read_bytes()
    (folder / f"rank{cut}_trace.json").write_bytes(text[:len(text) // 2])
    return folder, pipelines, missing, cut


def copy_of(run, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run[0], tmp_path / "ranks"))


def says_both(line: str, missing: int, cut: int) -> bool:
    return f"rank{cut}_trace.json" in line and f"global rank(s) {missing}" in line and "of 12 ranks" in line


def test_compact_names_the_missing_rank_and_the_unreadable_one(run, tmp_path):
    folder = copy_of(run, tmp_path)
    _, _, missing, cut = run
    done = run_cli(tmp_path, "compact", folder, "--jobs", "2")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    summary = json.loads(done.stdout)
    assert (summary["written"], summary["failed"]) == (10, 1)
    assert [r["input"] for r in summary["ranks"] if r["status"] == "failed"] == [str(folder / f"rank{cut}_trace.json")]
    assert summary["rank_account"]["world_size"] == 12 and summary["rank_account"]["missing_ranks"] == [missing]
    assert says_both(done.stderr.splitlines()[-1], missing, cut), done.stderr


@pytest.mark.parametrize("args", [("report",), ("query", "select count(*) n from slice")], ids=["report", "query"])
def test_report_and_query_refuse_to_answer_for_part_of_the_run_naming_both(run, tmp_path, args):
    folder = copy_of(run, tmp_path)
    _, _, missing, cut = run
    done = run_cli(tmp_path, args[0], folder, *args[1:], "--jobs", "2")
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("cgtrace: error: ") and says_both(line, missing, cut), line


def test_a_missing_rank_alone_is_named_beside_the_answer(run, tmp_path):
    folder = copy_of(run, tmp_path)
    _, pipelines, missing, cut = run
    (folder / f"rank{cut}_trace.json").unlink()
    done = run_cli(tmp_path, "report", folder, "--format", "json", "--jobs", "2")
    assert done.returncode == 0, done.stderr[-1500:]
    report = json.loads(done.stdout)
    assert report["rank_account"]["missing_ranks"] == sorted([missing, cut]) and report["traces"] == 10
    assert f"global rank(s) {min(missing, cut)}, {max(missing, cut)}" in done.stderr
    text = run_cli(tmp_path, "report", folder, "--jobs", "2")
    assert f"Not every rank is here: 2 of 12 ranks" in text.stdout
    query = run_cli(tmp_path, "query", folder, "select count(*) n from slice", "--format", "json", "--jobs", "2")
    assert query.returncode == 0 and f"global rank(s) {min(missing, cut)}, {max(missing, cut)}" in query.stderr


def test_merge_writes_the_intact_pipeline_and_names_the_broken_ones(run, tmp_path):
    folder = copy_of(run, tmp_path)
    _, pipelines, missing, cut = run
    done = run_cli(tmp_path, "merge", folder, "--jobs", "2")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-1500:]
    summary = json.loads(done.stdout)
    [written] = summary["pipelines"]
    assert written["pp_group"] == 2 and [r["global_rank"] for r in written["pp_ranks"]] == pipelines[2]
    assert [(b["pp_group"], b["lacking"]) for b in summary["broken_pipelines"]] == [(0, [missing]), (1, [cut])]
    assert [f["input"] for f in summary["failed"]] == [str(folder / f"rank{cut}_trace.json")]
    assert says_both(done.stderr.splitlines()[-1], missing, cut) and "pipeline 1" in done.stderr.splitlines()[-1]
    assert sorted(p.name for p in folder.glob("*.perfetto-trace")) == ["pp_group2_merged.perfetto-trace"]
    # The output holds that pipeline's kernels, every one of them: counted in its ranks' JSON.
    kernels = sum(1 for rank in pipelines[2] for e in load_events(folder / f"rank{rank}_trace.json")[1]
                  if e.get("ph") == "X" and e.get("cat") == "kernel")
    assert rows(folder / "pp_group2_merged.perfetto-trace",
                "select count(*) n from slice where category = 'kernel'")[0]["n"] == kernels
    # The intact pipeline alone (--pp-group) merges and exits 0.
    alone = run_cli(tmp_path, "merge", folder, "--pp-group", "2", "-o", tmp_path / "alone.perfetto-trace")
    assert alone.returncode == 0, alone.stderr[-1500:]
    broken = run_cli(tmp_path, "merge", folder, "--pp-group", "0", "-o", tmp_path / "broken.perfetto-trace")
    assert broken.returncode == 2 and f"lacks the trace of global rank(s) {missing}" in broken.stderr
