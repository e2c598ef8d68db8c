"""`report DIR` names as stragglers the ranks whose late arrival into collectives holds the
others up, with the waiting they caused: recomputed here from the input JSON alone."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import statistics
from collections import defaultdict
from contextlib import redirect_stdout
from pathlib import Path
from typing import Optional

import pytest

from converter.cli import main
from converter.generator import GeneratorConfig, write_pp_run

from .helpers import SHARED_TRACES, merge_files, write_json
from .oracle import load_events, to_ns

# Six ranks simulated on one clock, their collectives ending when the last arrives.
RUN = dict(pp_size=1, dp_size=6, steps=3, seed=1, graphs_per_step=4, kernels_per_replay=8, joint_pipelines=True)


def report_dir(directory: Path) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(directory), "--format", "json", "--jobs", "1"]) == 0
    return json.loads(out.getvalue())


def collective_kernels(path: Path, offset: int = 0) -> list[tuple[object, object, int]]:
    """A rank file's NCCL collective kernels as (channel, kind, start ns), in start order: the
    channel is the process group with its ranks (Kineto writes them as a string, the generator
    as a list), or None where the kernel names none; the kind is the collective and its size,
    or the kernel's name where the kernel names no collective."""
    header, events = load_events(path)
    found = []
    for event in events:
        args = event.get("args") or {}
        if event.get("cat") != "kernel" or not event.get("name", "").startswith(("ncclKernel_", "ncclDevKernel_")) \
                or args.get("Collective name") in ("send", "recv"):
            continue
        ranks = args.get("Process Group Ranks")
        ranks = json.loads(ranks) if isinstance(ranks, str) else ranks
        channel = None if args.get("Process Group Name") is None else (args["Process Group Name"], tuple(ranks or ()))
        kind = (event["name"].split("(")[0] if args.get("Collective name") is None else
                (args["Collective name"], args.get("dtype"), args.get("In msg nelems"), args.get("Out msg nelems")))
        found.append((channel, kind, header.get("baseTimeNanoseconds", 0) + to_ns(event["ts"]) + offset))
    return sorted(found, key=lambda kernel: kernel[2])


def median_start(starts: list[int]) -> int:
    """The median of whole-ns starts as the stragglers' definition takes it: of an even number,
    the two middle starts' mean rounded down to the ns."""
    ordered = sorted(starts)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) // 2


def late_arrivals(files: list[Path], offsets: Optional[dict[str, int]] = None,
                  uncertainty: Optional[dict[str, int]] = None) -> dict[str, dict[str, int]]:
    """Per file: at how many collectives it starts after the collective's median start by more
    than its clock's `uncertainty`, by how much beyond it in all; where it starts last, how much
    later than the next latest less its uncertainty, and how long the others waited for it. A
    collective is the k-th of its kind on its process group (on no group where no kernel of
    the files names one; kernels without one beside kernels with one are left out), counted
    where every file that runs the kind runs as many of it. `offsets`: what was added to a
    file's times to put it on one clock."""
    kernels = {path.name: collective_kernels(path, (offsets or {}).get(path.name, 0)) for path in files}
    unsure = uncertainty or {}
    named = any(channel is not None for mine in kernels.values() for channel, _, _ in mine)
    arrivals: dict = defaultdict(list)
    counts: dict = defaultdict(dict)
    for name, mine in kernels.items():
        seen: dict = defaultdict(int)
        for channel, kind, start in mine:
            if named and channel is None:
                continue
            arrivals[(channel, kind, seen[(channel, kind)])].append((start, name))
            seen[(channel, kind)] += 1
        for key, count in seen.items():
            counts[key][name] = count
    matched = {key for key, per_file in counts.items() if len(per_file) > 1 and len(set(per_file.values())) == 1}
    late: dict[str, dict[str, int]] = {}

    def figures(name: str) -> dict[str, int]:
        return late.setdefault(name, {"late_collectives": 0, "late_ns": 0, "held_up_ns": 0, "caused_wait_ns": 0})

    for (channel, kind, _), starts in arrivals.items():
        if (channel, kind) in matched:
            starts.sort()
            typical = median_start([start for start, _ in starts])
            for start, name in starts:
                if start - typical - unsure.get(name, 0) > 0:
                    figures(name)["late_collectives"] += 1
                    figures(name)["late_ns"] += start - typical - unsure.get(name, 0)
            last, name = starts[-1]
            if last - starts[-2][0] - unsure.get(name, 0) > 0:
                figures(name)["held_up_ns"] += last - starts[-2][0] - unsure.get(name, 0)
                figures(name)["caused_wait_ns"] += sum(last - start for start, _ in starts[:-1])
    return late


def uncertainties(report: dict) -> dict[str, int]:
    """How far `report DIR` says each trace's clock may be off (its parameter, not its answer)."""
    return {row["file"]: row["uncertainty_ns"] or 0 for row in report["clock_alignment"]["ranks"]}


def test_the_slow_rank_and_only_it_is_named_with_the_waiting_it_caused(tmp_path):
    steady_files = write_pp_run(tmp_path / "steady", **RUN)
    steady = report_dir(steady_files[0].parent)
    # No rank is late enough to be named; the latest is shown, below the mark.
    assert steady["stragglers"] == [] and [f for f in steady["findings"] if f["key"] == "straggler"] == []
    check = steady["straggler_check"]
    assert check["could_not_tell"] is None and check["left_out"]  # the graphs' nameless kernels, beside named ones
    most = max(late_arrivals(steady_files, uncertainty=uncertainties(steady)).items(),
               key=lambda item: item[1]["late_ns"])
    largest = check["largest_hold_up"]
    assert (largest["file"], largest["late_ns"], largest["straggler"]) == (most[0], most[1]["late_ns"], False)
    assert largest["late_ns_per_step"] < 0.10 * steady["median_step_ns"]
    files = write_pp_run(tmp_path / "slow", **RUN, slow_rank=4, slow_factor=1.5)
    report = report_dir(files[0].parent)
    [straggler] = report["stragglers"]
    expected = late_arrivals(files, uncertainty=uncertainties(report))["rank4_trace.json"]
    assert (straggler["file"], straggler["global_rank"]) == ("rank4_trace.json", 4)
    assert {key: straggler[key] for key in expected} == expected
    assert straggler["late_ns_per_step"] == round(expected["late_ns"] / 3)
    assert straggler["held_up_ns_per_step"] == round(expected["held_up_ns"] / 3)
    # Named by what it did, not by its step time's distance from the median.
    assert straggler["late_ns_per_step"] >= 0.10 * report["median_step_ns"]
    [finding] = [f for f in report["findings"] if f["key"] == "straggler"]
    assert finding["key"] == "straggler" and finding["where"]["global_rank"] == 4
    assert finding["figure"] == round(straggler["late_ns_per_step"] / report["median_step_ns"], 4)


def step_lengths(path: Path) -> list[int]:
    _, events = load_events(path)
    return [to_ns(e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
            and e["name"].startswith("ProfilerStep#")]


def test_a_merge_names_the_rank_that_holds_collectives_up(tmp_path):
    """On a merged pipeline's one clock the first stage reaches the step's all-reduce last: it
    runs the last backward while the others wait for it (of three stages: with two, the median
    arrival lies halfway between them)."""
    files = write_pp_run(tmp_path / "ranks", pp_size=3, microbatches=2, steps=3, seed=2, graphs_per_step=2,
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
                if figures["late_ns"] / 3 >= 0.10 * median}
    assert expected, "the schedule makes someone late"
    found = {s["global_rank"]: {key: s[key] for key in ("late_collectives", "late_ns", "held_up_ns", "caused_wait_ns")}
             for s in report["stragglers"]}
    assert found == expected
    first_stage = next(gpu["global_rank"] for gpu in report["gpus"] if gpu["pp_rank"] == 0)
    assert list(found) == [first_stage]


def test_slow_rank_knob_is_checked():
    with pytest.raises(ValueError, match="slow_rank must be a global rank"):
        GeneratorConfig(world_size=2, slow_rank=2)


def dlrm_files() -> list[Path]:
    """The real 8-rank DLRM capture (V100, NCCL kernels that name no process group); skips
    where ../shared is absent."""
    if not (SHARED_TRACES / "dlrm_8ranks").is_dir():
        pytest.skip("../shared/traces is absent")
    return sorted((SHARED_TRACES / "dlrm_8ranks").glob("rank*_trace.json.gz"))


def report_text(directory: Path) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(directory), "--jobs", "1"]) == 0
    return out.getvalue()


def test_kernels_that_name_no_group_are_matched_by_name_and_order_on_the_real_dlrm_ranks():
    """Rank 7 of the real DLRM capture starts last in most collectives: `report DIR` names it as
    the latest rank with the figures an oracle computes from the JSON. One host,
    one clock: the ranks' collectives agree with their base times, so no clock is moved."""
    files = dlrm_files()
    report = report_dir(files[0].parent)
    assert not report["clock_alignment"]["applied"]
    assert all(row["evidence"] == {"collectives": 8} for row in report["clock_alignment"]["ranks"])
    late = late_arrivals(files, uncertainty=uncertainties(report))
    check = report["straggler_check"]
    assert (check["could_not_tell"], check["collectives"], check["ranks"], check["left_out"]) == (None, 8, 8, [])
    median = statistics.median(length for path in files for length in step_lengths(path))
    assert report["median_step_ns"] == median
    largest = check["largest_hold_up"]
    assert max(late, key=lambda name: late[name]["late_ns"]) == "rank7_trace.json.gz"
    assert (largest["file"], largest["global_rank"]) == ("rank7_trace.json.gz", 7)
    assert {key: largest[key] for key in late["rank7_trace.json.gz"]} == late["rank7_trace.json.gz"]
    assert largest["late_share"] == round(late["rank7_trace.json.gz"]["late_ns"] / median, 4)
    # Judged by its own lateness (not only by how far it trails the next latest), rank 7 is named
    # first, and so is every rank whose kernels start well after the typical arrival.
    steps = {path.name: len(step_lengths(path)) for path in files}
    named = [s["file"] for s in report["stragglers"]]
    assert named[0] == "rank7_trace.json.gz" and sorted(named) == \
        sorted(name for name, figures in late.items() if figures["late_ns"] / steps[name] >= 0.10 * median)
    text = report_text(files[0].parent)
    assert (f"latest: rank 7 (rank7_trace.json.gz), {largest['late_ns_per_step'] / 1e6:.3f} ms late per step, "
            f"{largest['late_share']:.1%} of the median step, at or above the 10% threshold") in text


def _copy_dlrm(files: list[Path], to: Path, change=None) -> Path:
    """The DLRM ranks copied into `to`, each document passed through `change(name, document)`."""
    to.mkdir()
    for path in files:
        document = json.loads(gzip.decompress(path.read_bytes()))
        write_json(to / path.name, change(path.name, document) if change else document)
    return to


def test_a_kind_whose_counts_differ_is_left_out_and_named_and_one_rank_could_not_tell(tmp_path):
    files = dlrm_files()

    def drop_last_allreduce(name: str, document: dict) -> dict:
        if name == "rank3_trace.json.gz":
            events = document["traceEvents"]
            last = max((e for e in events if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_AllReduce")),
                       key=lambda e: e["ts"])
            events.remove(last)
        return document

    folder = _copy_dlrm(files, tmp_path / "dropped", drop_last_allreduce)
    report = report_dir(folder)
    check = report["straggler_check"]
    [why] = check["left_out"]
    assert why.startswith("ncclKernel_AllReduce_RING_LL_Sum_float: ") and "rank 3 (rank3_trace.json.gz) 2" in why
    assert "so order cannot match them" in why
    assert check["collectives"] == 5 and check["could_not_tell"] is None  # the SendRecv kernels, 5 on every rank
    late = late_arrivals(sorted(folder.iterdir()), uncertainty=uncertainties(report))
    most, largest = max(late, key=lambda name: late[name]["late_ns"]), check["largest_hold_up"]
    assert largest["file"] == most and {key: largest[key] for key in late[most]} == late[most]

    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(files[0], alone / files[0].name)
    report = report_dir(alone)
    assert report["stragglers"] == [] and report["straggler_check"]["could_not_tell"] == \
        "only rank 0 (rank0_trace.json.gz) runs NCCL collective kernels: nobody to wait for it"
    assert "stragglers: could not tell, because only rank 0 (rank0_trace.json.gz) runs" in report_text(alone)


def test_group_ranks_written_as_a_string_match_those_written_as_a_list(tmp_path):
    """Real Kineto (and the generator) write "Process Group Ranks" as a string ("[0, 1]"), other
    writers as a list: the same run written either way gives the same stragglers."""
    files = write_pp_run(tmp_path / "strings", **RUN, slow_rank=4, slow_factor=1.5)
    as_strings = report_dir(files[0].parent)
    lists = tmp_path / "lists"
    lists.mkdir()
    for index, path in enumerate(files):
        document = json.loads(path.read_text())
        for event in document["traceEvents"]:
            ranks = (event.get("args") or {}).get("Process Group Ranks")
            if isinstance(ranks, str) and index % 2:
                event["args"]["Process Group Ranks"] = json.loads(ranks)
        write_json(lists / path.name, document)
    as_lists = report_dir(lists)
    assert as_strings["stragglers"] == as_lists["stragglers"] != []
    assert as_strings["straggler_check"] == as_lists["straggler_check"]
