"""What the UI titles rows with: it names a process "<name> <pid>" and a thread "<name> <tid>",
so every process and thread with slices must carry an id its input had, never an invented one
(checked here through trace_processor, on real traces compacted and merged). A merge writes a
rank's threads as plain rows (pipeline order), titled "<name> <tid>" by cgtrace itself."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from converter.generator import write_pp_run


from .helpers import SHARED_TRACES, compact_file, merge_files, rows, track_roles

SHOWN = """select distinct p.pid, t.tid from slice s join thread_track tt on tt.id = s.track_id
           join thread t using (utid) join process p using (upid)"""
# A merged trace's rows with slices and no cgtrace role (a thread's own, not a lane or an
# annotation row), by their uuids.
PLAIN_ROWS = """select distinct t.name, (select a.int_value from args a where a.arg_set_id = t.source_arg_set_id
                and a.key = 'trace_id') uuid from slice s join track t on t.id = s.track_id"""


def _input_ids(files: list[Path]) -> set[int]:
    ids: set[int] = set()
    for path in files:
        raw = path.read_bytes()
        events = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)["traceEvents"]
        for event in events:
            for key in ("pid", "tid"):
                value = event.get(key)
                if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
                    ids.add(int(value))
    return ids


def _assert_only_input_ids(output: Path, files: list[Path]) -> None:
    known = _input_ids(files)
    shown = rows(output, SHOWN)
    assert shown
    invented = [r for r in shown if r["pid"] not in known or r["tid"] not in known]
    assert invented == []


@pytest.mark.parametrize("name", ["hta_cuda_graph_rank0.json.gz", "hta_nccl_a100.json.gz",
                                  "tracelens_b200_eager.json.gz"])
def test_compacted_real_traces_show_their_own_ids(tmp_path, name):
    source = SHARED_TRACES / name
    if not source.exists():
        pytest.skip("../shared/traces is absent")
    output = tmp_path / "compacted.perfetto-trace"
    compact_file(source, output)
    _assert_only_input_ids(output, [source])


@pytest.mark.parametrize("ranks", ["dlrm_8ranks", "torch_pp_cpu/interleaved1f1b_pp2v2"])
def test_merged_real_ranks_show_their_own_ids(tmp_path, ranks):
    if not (SHARED_TRACES / ranks).is_dir():
        pytest.skip("../shared/traces is absent")
    copy = tmp_path / "ranks"
    shutil.copytree(SHARED_TRACES / ranks, copy)
    output = tmp_path / "merged.perfetto-trace"
    merge_files([copy], lambda group, groups: output)
    _assert_merged_rows_show_input_tids(output, sorted(copy.glob("rank*_trace.json.gz")))


def _assert_merged_rows_show_input_tids(output: Path, files: list[Path]) -> None:
    """No process or thread in a merge; every number in a plain row's title is an input id."""
    assert rows(output, "select count(*) n from thread_track")[0]["n"] == 0
    roled = {role.uuid for role in track_roles(output)}
    plain = [r["name"] for r in rows(output, PLAIN_ROWS) if r["uuid"] not in roled]
    numbers = {int(word) for name in plain for word in name.split() if word.isdigit()}
    assert numbers and numbers <= _input_ids(files), plain


def test_a_merged_generated_pipeline_shows_its_own_ids(tmp_path):
    files = write_pp_run(tmp_path / "run", pp_size=4, microbatches=2, steps=1, seed=6, graphs_per_step=2,
                         kernels_per_replay=4)
    output = tmp_path / "merged.perfetto-trace"
    merge_files(files, lambda group, groups: output)
    _assert_merged_rows_show_input_tids(output, files)
