"""A merge's collective figures as args on each collective kernel (`debug.cgtrace_collective.*`),
read back through trace_processor: every collective kernel carries them, they are the input's
figures (an oracle over the input JSON) and the merge report's rows, and the kernel's own args
stay as the input recorded them."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from converter.generator import write_pp_run

from .helpers import merge_files, rows
from .oracle import flatten, load_events, to_ns
from .test_collectives import DLRM, NCCL, expected_figures, oracle, report_json

PREFIX = "debug.cgtrace_collective."
# The figures every member kernel of a collective carries alike, as the report's row names them.
SHARED = ("kind", "index", "members", "start_skew_ns", "end_skew_ns", "effective_ns", "total_wait_ns", "held_up_ns")

KERNEL_ARGS_SQL = f"""
select s.id, s.ts, s.dur, s.name, s.global_rank, a.key, a.int_value, a.string_value, a.real_value
from cgtrace_slice s join args a using (arg_set_id)
where s.category = 'kernel' and ({" or ".join(f"s.name glob '{prefix}*'" for prefix in NCCL)})
  and (a.key glob '{PREFIX}*' or a.key glob 'debug.args.*')"""


def merged_kernels(trace: Path) -> dict[int, dict]:
    """Every NCCL kernel of a merged trace by slice id: its rank, start, end, name, its own args
    (`debug.args.*`) and the merge's (`debug.cgtrace_collective.*`, prefix dropped)."""
    found: dict[int, dict] = {}
    for row in rows(trace, KERNEL_ARGS_SQL):
        kernel = found.setdefault(row["id"], {"rank": row["global_rank"], "start": row["ts"],
                                              "end": row["ts"] + row["dur"], "name": row["name"], "own": {},
                                              "collective": {}})
        value = next(v for v in (row["int_value"], row["string_value"], row["real_value"]) if v is not None)
        if row["key"].startswith(PREFIX):
            kernel["collective"][row["key"][len(PREFIX):]] = value
        else:
            kernel["own"][row["key"]] = value
    return found


def input_args(files: list[Path], offsets: dict[str, int]) -> dict[tuple, dict]:
    """Each input NCCL kernel's args, flattened as trace_processor keys them, by (file, start
    on the merge's clock, name)."""
    found = {}
    for path in files:
        header, events = load_events(path)
        base = header.get("baseTimeNanoseconds", 0)
        for event in events:
            if event.get("cat") == "kernel" and event.get("name", "").startswith(NCCL):
                start = base + to_ns(event["ts"]) + offsets[path.name]
                found[(path.name, start, event["name"])] = flatten(event.get("args") or {}, "debug.args", {})
    return found


def check_merged_args(output: Path, files: list[Path], summary: dict) -> int:
    """Every collective kernel of the merge carries the oracle's figures and the report's row's;
    its own args are the input's. Returns how many kernels carry them."""
    file_of = {rank["global_rank"]: Path(rank["file"]).name for rank in summary["pp_ranks"]}
    offsets = {file_of[clock["global_rank"]]: clock["applied_offset_ns"]
               for clock in summary["clock_alignment"]["ranks"]}
    expected = oracle(files, offsets)
    kernels = merged_kernels(output)
    by_place = {(file_of[kernel["rank"]], kernel["start"], kernel["end"]): kernel for kernel in kernels.values()}
    report = {(row["kind"], row["index"], row["process_group"]): row
              for row in report_json(output)["collectives"]["collectives"]}
    carried = set()
    ordinals = set()
    for members in (members for members in expected.values() if len(members) > 1):
        figures = expected_figures(members)
        waits = figures.pop("waits")
        by_start = sorted(members, key=lambda name: members[name]["start"])
        rank_of = {name: rank for rank, name in file_of.items()}
        for name, kernel in members.items():
            merged = by_place[(name, kernel["start"], kernel["end"])]
            args = merged["collective"]
            carried.add(id(merged))
            ordinals.add(args["ordinal"])
            # The oracle's figures, from the input JSON alone.
            assert args["wait_ns"] == waits[name]
            assert {key: args[key] for key in figures} == figures
            assert args["members"] == len(members)
            assert [args[f"ranks[{k}]"] for k in range(len(members))] == [rank_of[other] for other in by_start]
            assert args["last_to_arrive"] == rank_of[by_start[-1]]
            # The merge's report, read from the written trace, agrees.
            row = report[(args["kind"], args["index"], args.get("process_group"))]
            assert {key: args[key] for key in SHARED} == {key: row[key] for key in SHARED}
            for key in ("bytes", "algbw_gb_s", "busbw_gb_s", "dtype", "collective", "message_from"):
                assert args.get(key) == (pytest.approx(row[key], rel=1e-12) if isinstance(row[key], float)
                                         else row[key])
            assert args["wait_ns"] == next(member["wait_ns"] for member in row["ranks"]
                                           if member["global_rank"] == merged["rank"])
    # Every collective kernel, and only those, carries the figures; the ordinals number them all.
    assert {id(kernel) for kernel in kernels.values() if kernel["collective"]} == carried
    assert ordinals == set(range(len(report)))
    # A kernel's own args are as the input recorded them, figures or not.
    recorded = input_args(files, offsets)
    for kernel in kernels.values():
        assert kernel["own"] == recorded[(file_of[kernel["rank"]], kernel["start"], kernel["name"])]
    return len(carried)


def test_every_dlrm_collective_kernel_carries_its_figures(tmp_path):
    if not DLRM.is_dir():
        pytest.skip("../shared/traces is absent")
    files = sorted(DLRM.iterdir())
    output = tmp_path / "dlrm.perfetto-trace"
    summary = merge_files(files, lambda group, groups: output, jobs=1)
    assert check_merged_args(output, files, summary) == 8 * 8
    # `report DIR` places each rank's clock as the merge does: the same offset, and the same
    # uncertainty (the drift reaching over the whole capture, not the collectives' span alone).
    merged = {rank["global_rank"]: (rank["estimated_offset_ns"], rank["uncertainty_ns"])
              for rank in summary["clock_alignment"]["ranks"]}
    global_rank = {path.name: load_events(path)[0]["distributedInfo"]["rank"] for path in files}
    across = {global_rank[row["file"]]: (row["estimated_offset_ns"], row["uncertainty_ns"])
              for row in report_json(DLRM)["clock_alignment"]["ranks"]}
    assert across == merged and len(merged) == 8 and any(uncertainty for _, uncertainty in merged.values())


def test_a_generated_job_carries_sizes_and_bandwidths(tmp_path):
    # Two pipelines of two ranks, each merged apart, through worker processes; the world's
    # collectives are shared within each; rank 1 reaches its all-reduces 2 ms late.
    files = write_pp_run(tmp_path / "ranks", 2, dp_size=2, steps=2, seed=5, kernels_per_replay=4,
                         allreduce_delays_ns={1: 2_000_000})
    summary = merge_files(files, lambda group, groups: tmp_path / f"pp{group}.perfetto-trace", jobs=2)
    pipelines = summary.get("pipelines", [summary])
    carried = 0
    for pipeline in pipelines:
        mine = [path for path in files if str(path) in {rank["file"] for rank in pipeline["pp_ranks"]}]
        carried += check_merged_args(Path(pipeline["output"]), mine, pipeline)
    assert carried
    sized = [kernel["collective"] for pipeline in pipelines
             for kernel in merged_kernels(Path(pipeline["output"])).values() if "bytes" in kernel["collective"]]
    assert sized and all(args["busbw_gb_s"] > 0 for args in sized)
    counts: dict[str, int] = defaultdict(int)
    for args in sized:
        counts[args["collective"]] += 1
    assert "allreduce" in counts
