"""`cgtrace view` opens profiler output directly: a rank trace is compacted, a directory of rank
traces merged, first; the result is kept beside the input and reused until the input changes."""

from __future__ import annotations

import os
import shutil

from converter.generator import GeneratorConfig, write_pp_run, write_trace
from converter.jobs.viewable import viewable

from .helpers import LANE_CONTAINERS_SQL, rows, view_and_fetch


def test_a_rank_trace_is_compacted_once_and_reused(tmp_path):
    source = write_trace(GeneratorConfig(steps=1, graphs_per_step=2, kernels_per_replay=8), tmp_path / "t.json.gz")
    opened, done = viewable(source)
    assert opened == tmp_path / "t_compacted.perfetto-trace" and done.startswith("compacted")
    assert rows(opened, f"select count(*) n from ({LANE_CONTAINERS_SQL})")[0]["n"] == 1
    built = opened.stat().st_mtime_ns
    again, done = viewable(source)
    assert again == opened and "earlier" in done and opened.stat().st_mtime_ns == built
    os.utime(source, ns=(built + 10**9, built + 10**9))  # the input changed after the build
    rebuilt, done = viewable(source)
    assert rebuilt == opened and done.startswith("compacted") and opened.stat().st_mtime_ns != built


def test_a_directory_of_ranks_is_merged_once_and_reused(tmp_path):
    files = write_pp_run(tmp_path / "run", pp_size=2, microbatches=2, steps=1, seed=3, graphs_per_step=2,
                         kernels_per_replay=4)
    opened, done = viewable(tmp_path / "run")
    assert opened == tmp_path / "run" / "pp_traces_merged.perfetto-trace" and done.startswith("merged 2")
    assert rows(opened, "select count(*) n from track where name glob 'PP rank *'")[0]["n"] > 0
    again, done = viewable(tmp_path / "run")
    assert again == opened and "earlier" in done
    assert len(files) == 2


def test_a_perfetto_trace_opens_as_it_is(tmp_path):
    source = write_trace(GeneratorConfig(steps=1, graphs_per_step=2, kernels_per_replay=8), tmp_path / "t.json")
    compacted, _ = viewable(source)
    shutil.copy(compacted, tmp_path / "copy.perfetto-trace")
    assert viewable(tmp_path / "copy.perfetto-trace") == (tmp_path / "copy.perfetto-trace", "")


def test_the_command_compacts_then_serves_the_result(tmp_path):
    source = write_trace(GeneratorConfig(steps=1, graphs_per_step=2, kernels_per_replay=8), tmp_path / "t.json.gz")
    url, served, status, err = view_and_fetch(source, "t_compacted.perfetto-trace")
    assert url.endswith("/t_compacted.perfetto-trace") and status == 0 and "Traceback" not in err
    assert served == (tmp_path / "t_compacted.perfetto-trace").read_bytes()
    assert err.splitlines()[0] == f"cgtrace: compacted {source} -> {tmp_path / 't_compacted.perfetto-trace'} " \
                                  "(kept for the next view)"
