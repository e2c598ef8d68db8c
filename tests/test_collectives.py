"""Collectives across ranks (analysis/collectives.py): every collective the ranks share, each
member's start and end, the skews, each member's wait and the bandwidths, in `report DIR` and a
merge's report. The oracle reads the input JSON with plain loops and Decimal times."""

from __future__ import annotations

import gzip
import io
import json
from collections import defaultdict
from contextlib import redirect_stdout
from decimal import Decimal
from pathlib import Path

import pytest

from converter.cli import main
from converter.generator import write_pp_run

from .helpers import SHARED_TRACES, merge_files
from .oracle import load_events, to_ns

DLRM = SHARED_TRACES / "dlrm_8ranks"
MS = 1_000_000
NCCL = ("ncclKernel_", "ncclDevKernel_")
# NCCL-tests' busbw factors (doc/PERFORMANCE.md), written out here apart from the code's.
FACTORS = {"allreduce": lambda n: 2 * (n - 1) / n, "_allgather_base": lambda n: (n - 1) / n,
           "_reduce_scatter_base": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
ELEMENT_BYTES = {"Float": 4, "BFloat16": 2}
# An nccl:* op's Input type (C++ names) and its collective's busbw factor, as the DLRM capture has them.
INPUT_TYPE_BYTES = {"float": 4, "int": 4, "long int": 8}
OP_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}
DECIMAL = "@decimal@"  # marks a Decimal as delay_rank writes it, so its digits go out unquoted


def report_json(target: Path) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(target), "--format", "json", "--jobs", "1"]) == 0
    return json.loads(out.getvalue())


def kernels(path: Path) -> list[dict]:
    """A rank file's NCCL collective kernels (pairwise send and receive left out), in start
    order: name, args, start and end in ns on the file's own clock (base time plus ts)."""
    header, events = load_events(path)
    base = header.get("baseTimeNanoseconds", 0)
    found = []
    for event in events:
        args = event.get("args") or {}
        if event.get("cat") == "kernel" and event.get("name", "").startswith(NCCL) and event.get("dur", 0) > 0 \
                and args.get("Collective name") not in ("send", "recv"):
            start = base + to_ns(event["ts"])
            found.append({"name": event["name"], "args": args, "start": start, "end": start + to_ns(event["dur"])})
    return sorted(found, key=lambda kernel: kernel["start"])


def launching_ops(path: Path) -> dict[int, dict]:
    """Per NCCL kernel's start (the file's own clock), the nccl:* op whose CUDA runtime call of
    the kernel's correlation id it encloses on the launching thread."""
    header, events = load_events(path)
    base = header.get("baseTimeNanoseconds", 0)
    span = {id(event): (base + to_ns(event["ts"]), base + to_ns(event["ts"]) + to_ns(event.get("dur", 0)))
            for event in events if "ts" in event}
    runtime = {event["args"]["correlation"]: event for event in events
               if event.get("cat") == "cuda_runtime" and "correlation" in (event.get("args") or {})}
    ops = [event for event in events if event.get("name", "").startswith("nccl:") and event.get("ph") == "X"]
    found = {}
    for event in events:
        if event.get("cat") == "kernel" and event.get("name", "").startswith(NCCL):
            launch = runtime.get(event["args"].get("correlation"))
            around = [op for op in ops if launch is not None and (op["pid"], op["tid"]) == (launch["pid"], launch["tid"])
                      and span[id(op)][0] <= span[id(launch)][0] and span[id(launch)][1] <= span[id(op)][1]]
            if around:
                found[span[id(event)][0]] = max(around, key=lambda op: span[id(op)][0])
    return found


def oracle(files: list[Path], offsets: dict[str, int]) -> dict[tuple, dict[str, dict]]:
    """Per collective (group, kind, the k-th of those on the rank): each file's kernel, moved by
    the file's clock offset. The kind is the collective and its size where the kernel records
    them, else the kernel's name up to its parameters."""
    found: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for path in files:
        seen: dict[tuple, int] = defaultdict(int)
        for kernel in kernels(path):
            args = kernel["args"]
            group = args.get("Process Group Name")
            kind = (kernel["name"].split("(")[0] if "Collective name" not in args else
                    (args["Collective name"], args.get("dtype"), args.get("In msg nelems"), args.get("Out msg nelems")))
            key = (group, kind)
            found[(*key, seen[key])][path.name] = {**kernel, "start": kernel["start"] + offsets[path.name],
                                                   "end": kernel["end"] + offsets[path.name]}
            seen[key] += 1
    return found


def expected_figures(members: dict[str, dict]) -> dict:
    starts = {name: kernel["start"] for name, kernel in members.items()}
    ends = {name: kernel["end"] for name, kernel in members.items()}
    last = max(starts.values())
    return {"start_skew_ns": last - min(starts.values()), "end_skew_ns": max(ends.values()) - min(ends.values()),
            "effective_ns": max(ends.values()) - last,
            "total_wait_ns": sum(last - start for start in starts.values()),
            "waits": {name: last - start for name, start in starts.items()}}


def applied_offsets(report: dict) -> dict[str, int]:
    return {row["file"]: row["applied_offset_ns"] for row in report["clock_alignment"]["ranks"]}


def members_of(expected: dict[tuple, dict[str, dict]], row: dict) -> dict[str, dict]:
    """The oracle's collective a reported row of a job whose kernels record their collective is:
    the one of its collective, size and place in order whose members are the row's ranks."""
    reported = (row["collective"], row["in_nelems"], row["out_nelems"], row["index"])
    [members] = [kernels for (_, kind, index), kernels in expected.items()
                 if (kind[0], *kind[2:], index) == reported and set(kernels) == {member["file"] for member in row["ranks"]}]
    return members


def row_key(row: dict) -> tuple:
    """A reported collective's identity as the oracle keys it: the k-th of its kernel name here
    (the DLRM kernels record no collective: their kind is the kernel name)."""
    return (None, row["kind"], row["index"])


def check_against_oracle(report: dict, files: list[Path]) -> dict[tuple, dict[str, dict]]:
    """Every matched collective is one row, each member's start and end are its kernel's on the
    report's clock, and the skews, waits and effective duration are the oracle's."""
    expected = oracle(files, applied_offsets(report))
    rows = report["collectives"]["collectives"]
    assert report["collectives"]["could_not_tell"] is None
    assert sorted(map(row_key, rows)) == sorted(expected)
    for row in rows:
        members = expected[row_key(row)]
        assert {member["file"]: (member["start_ns"], member["end_ns"]) for member in row["ranks"]} == \
            {name: (kernel["start"], kernel["end"]) for name, kernel in members.items()}
        figures = expected_figures(members)
        assert {member["file"]: member["wait_ns"] for member in row["ranks"]} == figures.pop("waits")
        assert {key: row[key] for key in figures} == figures
    walls = [row["total_wait_ns"] for row in rows]
    assert walls == sorted(walls, reverse=True)  # worst first
    return expected


def delay_rank(source: Path, target: Path, late: str, delay: int) -> None:
    """Copies of every rank file where rank file `late` reaches each collective `delay` ns late:
    its GPU work from each collective kernel's start on runs `delay` later (cumulatively); the
    other ranks' kernels of that collective wait for it, ending `delay` later, and their GPU work
    after it runs later too. So every member of a collective still ends when it did relative to
    the others (the clocks' evidence is unchanged) and only `late`'s starts move against theirs."""
    target.mkdir()
    for path in sorted(source.iterdir()):
        header, events = load_events(path)
        mine = kernels(path)
        marks = [kernel["start"] if path.name == late else kernel["end"] for kernel in mine]
        stretched = {kernel["start"] for kernel in mine} if path.name != late else set()
        gpu = {event["pid"] for event in events if event.get("cat") == "kernel"}
        base = header.get("baseTimeNanoseconds", 0)
        for event in events:
            if event.get("pid") not in gpu or "ts" not in event:
                continue
            start = base + to_ns(event["ts"])
            shift = delay * sum(mark <= start for mark in marks)
            if start in stretched and event.get("cat") == "kernel" and event.get("name", "").startswith(NCCL):
                event["dur"] = Decimal(event["dur"]) + Decimal(delay) / 1000
            event["ts"] = Decimal(event["ts"]) + Decimal(shift) / 1000
        # Decimals go out as their own digits (a float could round a 16-digit microsecond time).
        text = json.dumps(header, default=lambda value: f"{DECIMAL}{value}{DECIMAL}")
        text = text.replace(f'"{DECIMAL}', "").replace(f'{DECIMAL}"', "")
        (target / path.name).write_bytes(gzip.compress(text.encode()))


def test_every_dlrm_collective_is_one_row_with_the_inputs_kernel_times():
    if not DLRM.is_dir():
        pytest.skip("../shared/traces is absent")
    report = report_json(DLRM)
    files = sorted(DLRM.iterdir())
    expected = check_against_oracle(report, files)
    assert len(expected) == 8 and all(len(members) == 8 for members in expected.values())
    # The capture's kernels record no size: each one's is its launching nccl:* op's first input,
    # found here by correlation id (the kernel's, its cudaLaunchKernel's) inside the op.
    ops = {path.name: launching_ops(path) for path in files}
    offsets = applied_offsets(report)
    for row in report["collectives"]["collectives"]:
        [op_of] = {(op["name"], json.dumps(op["args"]["Input Dims"][0]), op["args"]["Input type"][0])
                   for name, kernel in expected[row_key(row)].items()
                   for op in [ops[name][kernel["start"] - offsets[name]]]}
        op_name, dims, element = op_of
        size = INPUT_TYPE_BYTES[element]
        for dim in json.loads(dims):
            size *= dim
        algbw = size / row["effective_ns"]
        assert (row["collective"], row["dtype"], row["bytes"], row["message_from"]) == \
            (op_name.removeprefix("nccl:"), element, size, "launching nccl:* op's input")
        assert row["algbw_gb_s"] == pytest.approx(algbw, rel=1e-12)
        assert row["busbw_gb_s"] == pytest.approx(algbw * OP_FACTORS[row["collective"]](8), rel=1e-12)
    # One host's clocks: a collective's kernels end within microseconds, though they start ms apart.
    worst = report["collectives"]["collectives"][0]
    assert worst["start_skew_ns"] > 5 * MS and worst["end_skew_ns"] < 10_000


def test_a_rank_delayed_into_every_dlrm_collective_is_named_with_the_delay(tmp_path):
    if not DLRM.is_dir():
        pytest.skip("../shared/traces is absent")
    late, delay = "rank2_trace.json.gz", 10 * MS  # rank 2 is never last to arrive in the capture
    original = oracle(sorted(DLRM.iterdir()), defaultdict(int))
    delay_rank(DLRM, tmp_path / "delayed", late, delay)
    report = report_json(tmp_path / "delayed")
    check_against_oracle(report, sorted((tmp_path / "delayed").iterdir()))
    offsets = applied_offsets(report)
    rows = report["collectives"]["collectives"]
    assert len(rows) == 8
    for row in rows:
        members = original[row_key(row)]
        others = max(kernel["start"] + offsets[name] for name, kernel in members.items() if name != late)
        [last] = [member for member in row["ranks"] if member["file"] == late]
        assert row["last_to_arrive"] == last["title"] and last["wait_ns"] == 0
        # Its lead over the next latest is the delay, less how far behind them it was in the capture: exact.
        assert row["held_up_ns"] == delay - (others - members[late]["start"] - offsets[late])
    assert report["stragglers"][0]["file"] == late


def test_bandwidths_follow_nccl_tests_on_a_generated_job_and_a_merge_agrees(tmp_path):
    # Two pipelines of two: all-reduce and broadcast over the world, all-gather and reduce-scatter
    # over each data-parallel pair; rank 1 reaches its all-reduces 2 ms late.
    files = write_pp_run(tmp_path / "ranks", 2, dp_size=2, steps=2, seed=5, kernels_per_replay=4,
                         joint_pipelines=True, allreduce_delays_ns={1: 2 * MS})
    report = report_json(files[0].parent)
    expected = oracle(files, applied_offsets(report))
    rows = report["collectives"]["collectives"]
    assert len(rows) == sum(len(members) > 1 for (group, _, _), members in expected.items() if group is not None)
    kinds = set()
    for row in rows:
        members = members_of(expected, row)
        figures = expected_figures(members)
        assert {member["file"]: member["wait_ns"] for member in row["ranks"]} == figures.pop("waits")
        assert {key: row[key] for key in figures} == figures
        args = next(iter(members.values()))["args"]
        size = max(args["In msg nelems"], args["Out msg nelems"]) * ELEMENT_BYTES[args["dtype"]]
        algbw = size / row["effective_ns"]  # bytes per ns: GB/s
        assert row["bytes"] == size and row["algbw_gb_s"] == pytest.approx(algbw, rel=1e-12)
        assert row["busbw_gb_s"] == pytest.approx(algbw * FACTORS[args["Collective name"]](args["Group size"]),
                                                  rel=1e-12)
        kinds.add(args["Collective name"])
    assert kinds == set(FACTORS)
    worst = rows[0]
    assert worst["collective"] == "allreduce" and worst["last_to_arrive"].startswith("rank 1 ")
    assert worst["held_up_ns"] == pytest.approx(2 * MS, rel=0.25)

    summary = merge_files(files, lambda group, groups: tmp_path / f"pp{group}.perfetto-trace")
    assert len(summary["pipelines"]) == 2
    for pipeline in summary["pipelines"]:
        figures = report_json(Path(pipeline["output"]))
        moved = {f"rank{clock['global_rank']}_trace.json": clock["offset_ns"] for clock in figures.get("clocks", [])}
        ranks = {f"rank{rank['global_rank']}_trace.json" for rank in pipeline["pp_ranks"]}
        mine = [path for path in files if path.name in ranks]
        again = oracle(mine, {path.name: moved.get(path.name, 0) for path in mine})
        merged_rows = figures["collectives"]["collectives"]
        assert merged_rows and len(merged_rows) == sum(len(members) > 1 for (group, _, _), members in again.items()
                                       if group is not None)
        page = tmp_path / f"{Path(pipeline['output']).stem}.html"
        assert main(["report", pipeline["output"], "--format", "html", "-o", str(page)]) == 0
        table = page.read_text().split(f"Collectives across ranks (derived): all {len(merged_rows)}, ", 1)[1]
        places = [table.index(f"{row['kind']} #{row['index']}") for row in merged_rows]
        assert places == sorted(places)  # the HTML table lists them worst first, as the JSON
        for row in merged_rows:
            members = members_of(again, {**row, "ranks": [{"file": f"rank{member['global_rank']}_trace.json"}
                                                          for member in row["ranks"]]})
            assert sorted((member["start_ns"], member["end_ns"]) for member in row["ranks"]) == \
                sorted((kernel["start"], kernel["end"]) for kernel in members.values())
