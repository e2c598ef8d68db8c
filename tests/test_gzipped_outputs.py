"""An output named `*.perfetto-trace.gz` is written gzipped: the same trace as the plain output
(its bytes gunzipped), loaded by trace_processor as it is, the same bytes every run, and found
by `report DIR` beside plain outputs. Plain stays the default (docs/performance.md)."""

from __future__ import annotations

import gzip
from pathlib import Path

from converter.cli import main
from converter.generator import write_pp_run

from .helpers import compact_file, merge_files, rows


def test_a_gz_name_writes_the_plain_trace_gzipped_and_trace_processor_loads_it(tmp_path):
    files = write_pp_run(tmp_path / "ranks", pp_size=2, microbatches=2, steps=1, seed=5)
    plain, packed, again = (tmp_path / name for name in ("a.perfetto-trace", "a.perfetto-trace.gz", "b.perfetto-trace.gz"))
    compact_file(files[0], plain)
    summary = compact_file(files[0], packed, verify=True)
    compact_file(files[0], again)
    data = packed.read_bytes()
    assert data[:2] == b"\x1f\x8b" and len(data) < plain.stat().st_size / 3
    assert gzip.decompress(data) == plain.read_bytes()
    assert again.read_bytes() == data  # no time or name in the gzip header
    count = "select count(*) as n from cgtrace_all_slice"
    assert rows(packed, count) == rows(plain, count) and summary["verified"]["slices"] == rows(plain, count)[0]["n"]


def test_a_merge_written_gzipped_is_reported_and_found_in_a_folder(tmp_path, capsys):
    files = write_pp_run(tmp_path / "ranks", pp_size=2, microbatches=2, steps=1, seed=6)
    merged = tmp_path / "merged.perfetto-trace.gz"
    merge_files(files, lambda group, groups: merged)
    assert main(["report", str(merged), "--format", "json"]) == 0
    assert '"pipeline"' in capsys.readouterr().out
    # report DIR answers across per-rank outputs, gzipped or not, and leaves the merge out.
    folder = tmp_path / "outputs"
    folder.mkdir()
    for rank, name in enumerate(("rank0_trace.perfetto-trace.gz", "rank1_trace.perfetto-trace")):
        compact_file(files[rank], folder / name)
    (folder / "pp_traces_merged.perfetto-trace.gz").write_bytes(merged.read_bytes())
    assert main(["report", str(folder), "--format", "json"]) == 0
    answer = capsys.readouterr().out
    assert "rank0_trace.perfetto-trace.gz" in answer and "rank1_trace.perfetto-trace" in answer
    assert "pp_traces_merged" not in answer


def test_step_files_of_a_gz_output_are_gzipped_too(tmp_path):
    files = write_pp_run(tmp_path / "ranks", pp_size=2, microbatches=2, steps=2, seed=7)
    written = compact_file(files[0], tmp_path / "run.perfetto-trace.gz", split_steps=True)["steps"]
    names = [Path(entry["output"]).name for entry in written]
    assert names == [f"run_step{entry['step']}.perfetto-trace.gz" for entry in written] and len(names) == 2
    for entry in written:
        assert rows(Path(entry["output"]), "select count(*) as n from cgtrace_all_slice")[0]["n"] == entry["slices"]
