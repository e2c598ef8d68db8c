"""The profiler handler over many cycles, as `torch.profiler.schedule(..., repeat=2)` drives
it on 4 ranks with JSON only, and `cgtrace merge` of what it wrote: a file per cycle, told
apart by the traces' ProfilerStep numbers, and a rerun that never overwrites unasked.

The stand-in profiler exports real torch 2.15 rank traces (../shared), else generated ones;
its second cycle is the same trace with its steps renumbered, as torch numbers later steps."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

import converter
from converter.cli import main
from converter.generator import write_pp_run

from .helpers import SHARED_TRACES, rows

REAL_RANKS = SHARED_TRACES / "torch_pp_cpu" / "torch215_1f1b_pp4"
STEP = re.compile(rb"ProfilerStep#(\d+)")


class Profiler:
    """What the handler uses of torch.profiler.profile: export_chrome_trace writes this cycle's trace."""

    def __init__(self, trace: bytes):
        self.trace = trace

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_bytes(self.trace)


def _rank_traces(tmp_path: Path) -> list[bytes]:
    if REAL_RANKS.is_dir():
        return [gzip.decompress(path.read_bytes()) for path in sorted(REAL_RANKS.glob("rank*_trace.json.gz"))]
    files = write_pp_run(tmp_path / "generated", pp_size=4, seed=5, graphs_per_step=2, kernels_per_replay=4)
    return [path.read_bytes() for path in sorted(files)]


def _later_cycle(trace: bytes, shift: int) -> bytes:
    return STEP.sub(lambda found: b"ProfilerStep#%d" % (int(found[1]) + shift), trace)


def _step_counts(paths: list[Path]) -> Counter[str]:
    """The oracle: the CPU ProfilerStep slices the input JSON holds, by plain loops over its
    events (their GPU projections are coalesced by compaction, so not counted here)."""
    counts: Counter[str] = Counter()
    for path in paths:
        for event in json.loads(path.read_bytes())["traceEvents"]:
            if (event.get("ph"), event.get("cat")) == ("X", "user_annotation") \
                    and str(event.get("name", "")).startswith("ProfilerStep#"):
                counts[event["name"]] += 1
    return counts


STEPS_MERGED = ("select name, count(*) n from slice where name like 'ProfilerStep#%' and category = 'user_annotation' "
                "group by name")


def _run(tmp_path: Path) -> tuple[Path, list[list[Path]]]:
    """4 ranks, 2 cycles, a handler per rank (a process each in a real run): the files each cycle wrote."""
    profiles = tmp_path / "profiles"
    traces = _rank_traces(tmp_path)
    handlers = [converter.trace_handler(profiles, compact=False) for _ in traces]
    cycles: list[list[Path]] = []
    for shift in (0, 4):
        for handler, trace in zip(handlers, traces):
            handler(Profiler(_later_cycle(trace, shift)))
        cycles.append([handler.written[-1] for handler in handlers])
    assert all(handler.failures == 0 for handler in handlers), [h.last_error for h in handlers]
    return profiles, cycles


def test_json_only_lists_files_that_exist_named_by_rank_cycle_and_steps(tmp_path):
    profiles, cycles = _run(tmp_path)
    for number, written in enumerate(cycles, start=1):
        for rank, path in enumerate(written):
            assert path.is_file()
            steps = sorted(int(name.removeprefix("ProfilerStep#")) for name in _step_counts([path]))
            assert path.name == f"rank{rank}.cycle{number}.steps{steps[0]}-{steps[-1]}.pt.trace.json"
            assert json.loads(path.read_bytes()).get("traceName", str(path)) == str(path)
    assert sorted(profiles.iterdir()) == sorted(path for written in cycles for path in written)


def test_a_directory_of_two_cycles_merges_to_a_file_per_cycle(tmp_path, capsys):
    profiles, cycles = _run(tmp_path)
    assert main(["merge", str(profiles), "-q"]) == 0
    for number, written in enumerate(cycles, start=1):
        merged = profiles / f"pp_traces_merged.cycle{number}.perfetto-trace"
        found = rows(merged, STEPS_MERGED)
        assert {row["name"]: row["n"] for row in found} == _step_counts(written)
    before = {path: path.stat().st_mtime_ns for path in profiles.glob("*.perfetto-trace")}
    capsys.readouterr()
    assert main(["merge", str(profiles), "-q"]) == 2
    error = capsys.readouterr().err.strip()
    assert "already exists; pass --overwrite" in error and "\n" not in error
    assert {path: path.stat().st_mtime_ns for path in profiles.glob("*.perfetto-trace")} == before
    assert main(["merge", str(profiles), "--cycle", "2", "--overwrite", "-q"]) == 0
    after = {path: path.stat().st_mtime_ns for path in profiles.glob("*.perfetto-trace")}
    assert [path.name for path in after if after[path] != before[path]] == ["pp_traces_merged.cycle2.perfetto-trace"]


def test_cycles_are_told_apart_by_steps_not_names(tmp_path):
    """Files as older handlers named them, the names lying about the steps: each cycle merges what its steps say."""
    _, cycles = _run(tmp_path)
    older = tmp_path / "older"
    older.mkdir()
    for number, written in enumerate(cycles):
        for rank, path in enumerate(written):
            (older / f"rank{rank}.step{9 - number}.pt.trace.json").write_bytes(path.read_bytes())
    assert main(["merge", str(older), "--cycle", "1", "-q"]) == 0
    found = rows(older / "pp_traces_merged.cycle1.perfetto-trace", STEPS_MERGED)
    assert {row["name"]: row["n"] for row in found} == _step_counts(cycles[0])
    assert not (older / "pp_traces_merged.cycle2.perfetto-trace").exists()


def test_one_rank_twice_with_the_same_steps_is_refused(tmp_path, capsys):
    _, cycles = _run(tmp_path)
    twice = tmp_path / "twice"
    twice.mkdir()
    for path in cycles[0]:
        (twice / path.name).write_bytes(path.read_bytes())
    (twice / "rank0.again.pt.trace.json").write_bytes(cycles[0][0].read_bytes())
    assert main(["merge", str(twice), "-q"]) == 2
    error = capsys.readouterr().err
    assert cycles[0][0].name in error and "rank0.again.pt.trace.json" in error and "both hold global rank 0" in error
    assert "appears twice with overlapping profiler steps" in error


def test_real_torch_profiler_over_two_cycles(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed; the stand-in tests cover the handler")
    handler = converter.trace_handler(tmp_path, compact=False, worker_name="rank0")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=2),
                                on_trace_ready=handler) as profiler:
        for _ in range(8):
            torch.ones(64, 64) @ torch.ones(64, 64)
            profiler.step()
    assert handler.failures == 0, handler.last_error
    assert [path.name.split(".")[1] for path in handler.written] == ["cycle1", "cycle2"]
    assert all(path.is_file() for path in handler.written)
    documents = [json.loads(path.read_bytes()) for path in handler.written]
    if not all(isinstance(document, dict) for document in documents):
        pytest.skip("this torch exports the legacy profiler's bare JSON array: no ProfilerStep, no traceName")
    for path, document in zip(handler.written, documents):
        assert document.get("traceName", str(path)) == str(path)
    first, second = (_step_counts([path]) for path in handler.written)
    assert first and second and not set(first) & set(second)


def _cpu_steps(path: Path) -> dict[str, int]:
    """The oracle: each CPU ProfilerStep of a JSON and its duration in ns, from the decimal text."""
    document = json.loads(path.read_bytes(), parse_float=Decimal)
    return {event["name"]: int(Decimal(event["dur"]) * 1000) for event in document["traceEvents"]
            if (event.get("ph"), event.get("cat")) == ("X", "user_annotation")
            and str(event.get("name", "")).startswith("ProfilerStep#")}


def test_report_of_a_directory_answers_for_the_cycle_chosen(tmp_path, capsys):
    profiles, cycles = _run(tmp_path)
    assert main(["report", str(profiles), "-q"]) == 2
    error = capsys.readouterr().err.strip()
    assert "holds 2 profiling cycles of the same ranks" in error and "--cycle N" in error and "\n" not in error
    assert main(["report", str(profiles), "--cycle", "2", "--format", "json", "-q"]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    expected = {(path.name, step): dur for path in cycles[1] for step, dur in _cpu_steps(path).items()}
    assert {(stage["file"], stage["step"]): stage["step_ns"] for stage in stages} == expected
