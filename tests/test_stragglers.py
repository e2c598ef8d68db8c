"""`report DIR` names as stragglers the ranks whose late arrival into collectives holds the
others up, with the waiting they caused: recomputed here from the input JSON alone."""

from __future__ import annotations

import io
import json
import statistics
from collections import defaultdict
from contextlib import redirect_stdout
from pathlib import Path
from typing import Optional

import pytest

from converter.cli import main
from converter.generator import GeneratorConfig, write_pp_run

from .helpers import merge_files
from .oracle import load_events, to_ns

RUN = dict(pp_size=1, dp_size=6, steps=3, seed=1, graphs_per_step=4, kernels_per_replay=8)


def report_dir(directory: Path) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(directory), "--format", "json", "--jobs", "1"]) == 0
    return json.loads(out.getvalue())


def late_arrivals(files: list[Path], offsets: Optional[dict[str, int]] = None) -> dict[str, dict[str, int]]:
    """Per file: the collectives it reached last, how much later than the next latest, and how
    long the others waited for it; a collective is the k-th of its kind on its process group.
    `offsets`: what a merge added to a file's times."""
    arrivals = defaultdict(list)
    offsets = offsets or {}
    for path in files:
        header, events = load_events(path)
        seen: dict = defaultdict(int)
        kernels = sorted(((to_ns(e["ts"]), e) for e in events if e.get("cat") == "kernel"
                          and e["name"].startswith(("ncclKernel_", "ncclDevKernel_"))), key=lambda item: item[0])
        for ts, event in kernels:
            args = event.get("args", {})
            if args.get("Collective name") in (None, "send", "recv") or args.get("Process Group Name") is None:
                continue  # which ranks share a kernel that names no group, nothing says
            key = (args["Process Group Name"], tuple(args.get("Process Group Ranks", ())), args["Collective name"])
            start = header["baseTimeNanoseconds"] + ts + offsets.get(path.name, 0)
            arrivals[(*key, seen[key])].append((start, path.name))
            seen[key] += 1
    late: dict[str, dict[str, int]] = {}
    for starts in arrivals.values():
        if len(starts) > 1:
            starts.sort()
            last, name = starts[-1]
            mine = late.setdefault(name, {"late_collectives": 0, "held_up_ns": 0, "caused_wait_ns": 0})
            mine["late_collectives"] += 1
            mine["held_up_ns"] += last - starts[-2][0]
            mine["caused_wait_ns"] += sum(last - start for start, _ in starts[:-1])
    return late


def test_the_slow_rank_and_only_it_is_named_with_the_waiting_it_caused(tmp_path):
    steady = report_dir(write_pp_run(tmp_path / "steady", **RUN)[0].parent)
    assert steady["stragglers"] == [] and steady["findings"] == []
    files = write_pp_run(tmp_path / "slow", **RUN, slow_rank=4, slow_factor=1.5)
    report = report_dir(files[0].parent)
    [straggler] = report["stragglers"]
    expected = late_arrivals(files)["rank4_trace.json"]
    assert (straggler["file"], straggler["global_rank"]) == ("rank4_trace.json", 4)
    assert {key: straggler[key] for key in expected} == expected
    assert straggler["held_up_ns_per_step"] == round(expected["held_up_ns"] / 3)
    # Named by what it did, not by its step time's distance from the median.
    assert straggler["held_up_ns_per_step"] >= 0.10 * report["median_step_ns"]
    [finding] = report["findings"]
    assert finding["key"] == "straggler" and finding["where"]["global_rank"] == 4
    assert finding["figure"] == round(straggler["held_up_ns_per_step"] / report["median_step_ns"], 4)


def step_lengths(path: Path) -> list[int]:
    _, events = load_events(path)
    return [to_ns(e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
            and e["name"].startswith("ProfilerStep#")]


def test_a_merge_names_the_rank_that_holds_collectives_up(tmp_path):
    """On a merged pipeline's one clock the first stage reaches the step's all-reduce last: it
    runs the last backward while the others wait for it."""
    files = write_pp_run(tmp_path / "ranks", pp_size=2, microbatches=2, steps=3, seed=2, graphs_per_step=2,
                         kernels_per_replay=8)
    output = tmp_path / "merged.perfetto-trace"
    merge_files(files, lambda group, groups: output)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(output), "--format", "json"]) == 0
    report = json.loads(out.getvalue())
    offsets = {f"rank{c['global_rank']}_trace.json": c["offset_ns"] for c in report.get("clocks", [])}
    late = late_arrivals(files, offsets)
    median = statistics.median(length for path in files for length in step_lengths(path))
    expected = {int(name[4:].split("_")[0]): figures for name, figures in late.items()
                if figures["held_up_ns"] / 3 >= 0.10 * median}
    assert expected, "the schedule makes someone late"
    found = {s["global_rank"]: {key: s[key] for key in ("late_collectives", "held_up_ns", "caused_wait_ns")}
             for s in report["stragglers"]}
    assert found == expected
    first_stage = next(gpu["global_rank"] for gpu in report["gpus"] if gpu["pp_rank"] == 0)
    assert list(found) == [first_stage]


def test_slow_rank_knob_is_checked():
    with pytest.raises(ValueError, match="slow_rank must be a global rank"):
        GeneratorConfig(world_size=2, slow_rank=2)
