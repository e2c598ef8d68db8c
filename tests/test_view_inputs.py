"""`cgtrace view` opens profiler output directly: a rank trace is compacted, a directory of rank
traces merged, first; the result is kept in cgtrace's cache folder and reused until an input
changes, and nothing beside the input is written, replaced or taken for the whole trace."""

from __future__ import annotations

import os
import shutil

from converter.cli import main
from converter.generator import GeneratorConfig, write_pp_run, write_trace
from converter.jobs.viewable import KEPT, viewable

from .helpers import LANE_CONTAINERS_SQL, rows, view_and_fetch

SMALL = GeneratorConfig(steps=2, graphs_per_step=2, kernels_per_replay=8)


def test_a_rank_trace_is_compacted_once_and_reused(tmp_path):
    source = write_trace(SMALL, tmp_path / "t.json.gz")
    kept = tmp_path / "kept"
    opened, done = viewable(source, kept)
    assert opened.parent.parent == kept and opened.name == "t_compacted.perfetto-trace"
    assert done.startswith("compacted")
    assert rows(opened, f"select count(*) n from ({LANE_CONTAINERS_SQL})")[0]["n"] == 1
    built = opened.stat().st_mtime_ns
    again, done = viewable(source, kept)
    assert again == opened and "earlier" in done and opened.stat().st_mtime_ns == built
    os.utime(source, ns=(built + 10**9, built + 10**9))  # the input changed after the build
    rebuilt, done = viewable(source, kept)
    assert rebuilt != opened and rebuilt.name == opened.name and done.startswith("compacted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "t.json.gz"]  # nothing beside the input


def test_the_users_own_compacted_file_is_neither_replaced_nor_opened(tmp_path):
    """An older compaction, or a newer one cut to a step, beside the input stays the user's."""
    source = write_trace(SMALL, tmp_path / "t.json")
    mine = tmp_path / "t_compacted.perfetto-trace"
    assert main(["compact", str(source), "--steps", "1", "-q"]) == 0
    cut = mine.read_bytes()
    opened, _ = viewable(source, tmp_path / "kept")
    assert opened != mine and mine.read_bytes() == cut
    whole = rows(opened, "select count(*) n from slice")[0]["n"]
    assert whole > rows(mine, "select count(*) n from slice")[0]["n"]  # the whole trace, not the cut
    os.utime(mine, ns=(0, 0))  # older than the input, as a stale output would be
    viewable(source, tmp_path / "kept")
    assert mine.read_bytes() == cut


def test_only_the_newest_results_are_kept(tmp_path):
    kept = tmp_path / "kept"
    sources = [write_trace(GeneratorConfig(steps=1, graphs_per_step=1, kernels_per_replay=4, seed=seed),
                           tmp_path / f"t{seed}.json") for seed in range(KEPT + 2)]
    opened = [viewable(source, kept)[0] for source in sources]
    assert sorted(kept.iterdir()) == sorted(path.parent for path in opened[-KEPT:])


def test_a_directory_of_ranks_is_merged_once_and_reused(tmp_path):
    files = write_pp_run(tmp_path / "run", pp_size=2, microbatches=2, steps=1, seed=3, graphs_per_step=2,
                         kernels_per_replay=4)
    opened, done = viewable(tmp_path / "run", tmp_path / "kept")
    assert opened.name == "pp_traces_merged.perfetto-trace" and done.startswith("merged 2")
    assert rows(opened, "select count(*) n from track where name glob 'PP rank *'")[0]["n"] > 0
    again, done = viewable(tmp_path / "run", tmp_path / "kept")
    assert again == opened and "earlier" in done
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(p.name for p in files)


def test_a_perfetto_trace_opens_as_it_is(tmp_path):
    source = write_trace(SMALL, tmp_path / "t.json")
    compacted, _ = viewable(source, tmp_path / "kept")
    shutil.copy(compacted, tmp_path / "copy.perfetto-trace")
    assert viewable(tmp_path / "copy.perfetto-trace") == (tmp_path / "copy.perfetto-trace", "")


def test_the_command_compacts_then_serves_the_result(tmp_path):
    source = write_trace(SMALL, tmp_path / "t.json.gz")
    url, served, status, err = view_and_fetch(source, "t_compacted.perfetto-trace", cache=tmp_path / "cache")
    kept = next((tmp_path / "cache" / "cgtrace" / "view").glob("*/t_compacted.perfetto-trace"))
    assert url.endswith("/t_compacted.perfetto-trace") and status == 130 and "Traceback" not in err
    assert served == kept.read_bytes()
    assert err.splitlines()[0] == f"cgtrace: compacted {source} -> {kept} (kept for the next view)"


def test_the_users_own_merged_file_is_neither_replaced_nor_opened(tmp_path):
    """A merge cut to one step, in the folder where `merge DIR` puts it, then gone stale."""
    run = tmp_path / "run"
    write_pp_run(run, pp_size=2, microbatches=2, steps=2, seed=3, graphs_per_step=2, kernels_per_replay=4)
    assert main(["merge", str(run), "--steps", "1", "-q"]) == 0
    mine = run / "pp_traces_merged.perfetto-trace"
    cut = mine.read_bytes()
    os.utime(mine, ns=(0, 0))
    opened, _ = viewable(run, tmp_path / "kept")
    assert opened != mine and mine.read_bytes() == cut
    count = "select count(*) n from slice"
    assert rows(opened, count)[0]["n"] > rows(mine, count)[0]["n"]  # the whole run, not the cut


def test_the_command_beside_the_users_own_output_serves_without_suggesting_options(tmp_path):
    """view has no -o and no --overwrite: with the user's file where compact would write, it
    neither stops to suggest them nor touches the file."""
    source = write_trace(SMALL, tmp_path / "t.json")
    mine = tmp_path / "t_compacted.perfetto-trace"
    mine.write_bytes(b"the user's own")
    url, served, status, err = view_and_fetch(source, "t_compacted.perfetto-trace", cache=tmp_path / "cache")
    kept = next((tmp_path / "cache" / "cgtrace" / "view").glob("*/t_compacted.perfetto-trace"))
    assert status == 130 and "Traceback" not in err and served == kept.read_bytes()
    assert " -o" not in err and "--overwrite" not in err and "already exists" not in err, err
    assert mine.read_bytes() == b"the user's own"
