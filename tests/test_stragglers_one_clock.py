"""Across many ranks, a straggler is a rank that arrives late, not a clock that is off:
`report DIR` puts every trace on one clock first (the alignment merge uses), then judges each
rank by its own lateness, so several late ranks of one DP group are each named with their own
amount. Generated DP x PP jobs simulated on one true clock ("Process Group Ranks" written as
text, as Kineto writes it); the oracles read the input JSON and the generator's injected truth."""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Optional

import pytest

from converter.generator import write_pp_run

from .helpers import merge_files
from .test_stragglers import collective_kernels, median_start, report_dir, step_lengths

MS = 1_000_000
JOB = dict(steps=4, seed=3, kernels_per_replay=8, joint_pipelines=True)


def collective_starts(files: list[Path], clock_offsets: Optional[dict[str, int]] = None
                      ) -> dict[tuple, dict[str, int]]:
    """Per collective (process group, kind, the k-th of those on the rank): each file's kernel
    start as its own clock reads it (base time plus ts), plus `clock_offsets` where given. The
    graphs' NCCL kernels name no group beside those that do, so they are left out."""
    found: dict[tuple, dict[str, int]] = defaultdict(dict)
    for path in files:
        seen: dict[tuple, int] = defaultdict(int)
        for channel, kind, start in collective_kernels(path, (clock_offsets or {}).get(path.name, 0)):
            if channel is not None:
                found[(channel, kind, seen[(channel, kind)])][path.name] = start
                seen[(channel, kind)] += 1
    return found


def lateness(files: list[Path], clock_offsets: Optional[dict[str, int]] = None,
             uncertainty: Optional[dict[str, int]] = None) -> dict[str, tuple[int, int]]:
    """Per file: at how many collectives it arrives after their median arrival by more than its
    clock's `uncertainty`, and by how much beyond it in all."""
    late: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
    for starts in collective_starts(files, clock_offsets).values():
        typical = median_start(list(starts.values()))
        for name, start in starts.items():
            beyond = start - typical - (uncertainty or {}).get(name, 0)
            if beyond > 0:
                late[name] = (late[name][0] + 1, late[name][1] + beyond)
    return late


def lateness_per_step(files: list[Path], clock_offsets: Optional[dict[str, int]] = None) -> dict[str, float]:
    return {name: total / JOB["steps"] for name, (_, total) in lateness(files, clock_offsets).items()}


def median_step(files: list[Path]) -> float:
    return statistics.median(length for path in files for length in step_lengths(path))


@pytest.mark.parametrize("sign", [1, -1], ids=["ahead", "behind"])
def test_a_rank_whose_clock_is_5ms_off_is_moved_in_a_merge_and_named_by_nobody(tmp_path, sign):
    offsets = [0] * 8
    offsets[5] = sign * 5 * MS
    # Eight microbatches: on one clock the first stages' lateness into the world's all-reduce stays below the mark.
    files = write_pp_run(tmp_path / "ranks", 4, dp_size=2, microbatches=8, **JOB, clock_offsets_ns=offsets)
    if sign > 0:  # on the ranks' own clocks rank 5 looks more than a step's tenth late: the test can fail
        raw = lateness_per_step(files)
        assert raw["rank5_trace.json"] > 0.10 * median_step(files) > max(v for k, v in raw.items()
                                                                         if k != "rank5_trace.json")

    summary = merge_files(files, lambda group, groups: tmp_path / f"pp{group}.perfetto-trace")
    [pipeline] = [p for p in summary["pipelines"] if 5 in [r["global_rank"] for r in p["pp_ranks"]]]
    placed = {rank["global_rank"]: rank["applied_offset_ns"] for rank in pipeline["clock_alignment"]["ranks"]}
    for rank, offset in placed.items():  # each rank's move against another's: their true clocks' difference
        assert abs((offset - placed[5]) - (offsets[5] - offsets[rank])) <= 50_000, placed

    report = report_dir(files[0].parent)
    assert report["stragglers"] == [] and not [f for f in report["findings"] if f["key"] == "straggler"]
    alignment = report["clock_alignment"]
    assert alignment["applied"]
    moved = {row["file"]: row["applied_offset_ns"] for row in alignment["ranks"]}
    for name, offset in moved.items():
        rank = int(name[4:].split("_")[0])
        assert abs((offset - moved["rank5_trace.json"]) - (offsets[5] - offsets[rank])) <= 50_000, moved
    # What is left on one clock is the job's own lateness, below the mark: the oracle's latest rank.
    aligned = lateness_per_step(files, moved)
    latest = report["straggler_check"]["largest_hold_up"]
    assert latest["file"] == max(aligned, key=lambda name: aligned[name]) != "rank5_trace.json"
    assert latest["late_ns_per_step"] < 0.10 * report["median_step_ns"]


def test_two_late_ranks_of_one_dp_group_are_each_named_with_their_own_amount(tmp_path):
    # Six pipelines of two; ranks 2k and 2k+1 form pipeline k, so PP position 0's DP group is 0, 2, ..., 10.
    delays = {2: 3 * MS, 6: 2 * MS}
    files = write_pp_run(tmp_path / "ranks", 2, dp_size=6, shuffle_global_ranks=False, allreduce_over="dp",
                         allreduce_delays_ns=delays, **JOB)
    report = report_dir(files[0].parent)
    named = report["stragglers"]
    assert [s["global_rank"] for s in named] == [2, 6]  # the later first
    clocks = {row["file"]: row["uncertainty_ns"] for row in report["clock_alignment"]["ranks"]}
    truth = lateness(files, uncertainty=clocks)  # one true clock: the files' own
    for straggler in named:
        injected = delays[straggler["global_rank"]]
        assert abs(straggler["late_ns_per_step"] - injected) <= 0.10 * injected, straggler
        # Beyond what the clock's uncertainty leaves unsure, as the oracle finds it.
        assert (straggler["late_collectives"], straggler["late_ns"]) == truth[straggler["file"]]
    assert {s["file"] for s in named} == {name for name, (_, total) in truth.items()
                                          if total / JOB["steps"] >= 0.10 * report["median_step_ns"]}
    # What each costs the others stays reported: the last to arrive held each all-reduce up about
    # 1 ms past the next latest; the other, nearly never last, held little up.
    steps_ms = JOB["steps"] * MS
    assert named[0]["held_up_ns"] >= 0.8 * steps_ms and named[0]["caused_wait_ns"] > named[1]["caused_wait_ns"]
    assert named[1]["held_up_ns"] < 0.1 * steps_ms
    assert report["straggler_check"]["summary"].startswith("2 named (")


def test_hosts_whose_clocks_disagree_name_nobody(tmp_path):
    rng = random.Random(11)
    hosts = [round(rng.gauss(0, 1 * MS)) for _ in range(4)]
    pp = 2  # ranks 2k and 2k+1: pipeline k, on host k
    offsets = [hosts[rank // pp] for rank in range(4 * pp)]
    files = write_pp_run(tmp_path / "ranks", pp, dp_size=4, shuffle_global_ranks=False, allreduce_over="dp",
                         clock_offsets_ns=offsets, **JOB)
    raw = lateness_per_step(files)
    assert max(raw.values()) > 0.10 * median_step(files)  # on the hosts' clocks someone looks late

    report = report_dir(files[0].parent)
    assert report["stragglers"] == []
    alignment = report["clock_alignment"]
    assert alignment["applied"]
    moved = {int(row["file"][4:].split("_")[0]): row for row in alignment["ranks"]}
    for rank, row in moved.items():  # within its DP group (PP position), placed against the group's first
        first = moved[rank % pp]
        error = (row["applied_offset_ns"] - first["applied_offset_ns"]) - (offsets[rank % pp] - offsets[rank])
        assert abs(error) <= row["uncertainty_ns"] + first["uncertainty_ns"], (rank, error, row)
