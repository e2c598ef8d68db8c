"""Every report figure, computed again here from the input JSON alone: its own reading of the
events (tests/oracle.py), its own kinds of kernel and its own interval arithmetic, none of
the report's code. Real traces (B200: symmetric memory is communication) and a generated,
merged 4-rank pipeline; then raw, converted and compacted forms give one report."""

from __future__ import annotations

import io
import json
import re
from collections import defaultdict
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from converter.cli import main
from converter.generator import write_pp_run
from converter.lane_rules import load_lane_rules

from .helpers import SHARED_TRACES, compact_file, convert_file, merge_files
from .oracle import load_events, to_ns

GPU = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
MEMORY = re.compile(r"(?i)^(gpu_)?mem(cpy|set)$")
COMMUNICATION = re.compile(r"(?i)nccl|symm|multimem")
PP_BLOCK = re.compile(r"^PP:\d+(?P<action>SEND|RECV)_[FB]\d*$")


# -- interval arithmetic, written out plainly --------------------------------------------------
def merged(intervals) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(start, end) for start, end in out]


def overlap(a, b) -> list[tuple[int, int]]:
    """The intersection of two merged interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def minus(a, b) -> list[tuple[int, int]]:
    """`a` with `b` taken out, by walking every point where either changes."""
    points = sorted({p for start, end in a + b for p in (start, end)})
    inside = lambda intervals, t: any(start <= t < end for start, end in intervals)  # noqa: E731
    return merged((s, e) for s, e in zip(points, points[1:]) if inside(a, s) and not inside(b, s))


def length(intervals) -> int:
    return sum(end - start for start, end in intervals)


# -- what a trace must report ------------------------------------------------------------------
def kind(event: dict) -> str:
    if MEMORY.match(event["cat"]):
        return "memory"
    return "communication" if COMMUNICATION.search(event.get("name") or "") else "compute"


LAUNCH_ARROWS = {"ac2g", "async_cpu_to_gpu", "async"}  # Kineto's CPU -> GPU flows, newest first


def launch_times(events: list, base: int) -> dict:
    """Kineto's launch arrows: a flow start's id (a GPU slice's correlation) -> when it was launched."""
    return {e["id"]: base + to_ns(e["ts"]) for e in events if e.get("ph") == "s" and e.get("cat") in LAUNCH_ARROWS}


def owned_steps(periods, gpu, launched: dict) -> list:
    """The step windows the report draws by default: each step (CPU span) on to the end of the
    GPU work launched in it, no earlier than the previous step ends."""
    out, previous = [], None
    for name, start, cpu_end in periods:
        end = cpu_end
        for e, _, gpu_end in gpu:
            launch = launched.get((e.get("args") or {}).get("correlation"))
            if launch is not None and start <= launch < cpu_end:
                end = max(end, gpu_end)
        start = start if previous is None else max(start, previous)
        previous = max(start, end)
        out.append((name, start, previous))
    return out


def expected_gpus(path: Path, step_windows: str = "launched") -> dict[int, dict]:
    """Per GPU (its device: Kineto's GPU pid) the figures the report must give, its steps
    bounded as `--step-windows` says."""
    header, events = load_events(path)
    base = header.get("baseTimeNanoseconds", 0)
    spans = [(e, base + to_ns(e["ts"]), base + to_ns(e["ts"]) + to_ns(e["dur"])) for e in events
             if e.get("ph") == "X" and "ts" in e and to_ns(e.get("dur", 0)) > 0]
    gpu = [(e, start, end) for e, start, end in spans if e.get("cat") in GPU]
    launched = launch_times(events, base)
    devices = {e["pid"] for e, _, _ in gpu}
    steps: dict[str, list[int]] = {}
    for e, start, end in spans:
        if (e.get("name") or "").startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation" \
                and e["pid"] not in devices:
            known = steps.setdefault(e["name"], [start, end])
            known[:] = [min(known[0], start), max(known[1], end)]
    found = {}
    for device in devices:
        mine = [(e, start, end) for e, start, end in gpu if e["pid"] == device]
        by_kind = {k: merged((s, t) for e, s, t in mine if kind(e) == k) for k in ("compute", "communication")}
        everything = merged((s, t) for _, s, t in mine)
        periods = sorted(((name, s, t) for name, (s, t) in steps.items()), key=lambda p: p[1]) or \
            [("active span", everything[0][0], everything[-1][1])]
        if steps and step_windows == "launched":
            periods = owned_steps(periods, gpu, launched)  # a rank's launches, on any of its GPUs
        window = merged((s, t) for _, s, t in periods)
        blocks = {action: merged((s, t) for e, s, t in spans if e["pid"] == device
                                 and e.get("cat") == "gpu_user_annotation"
                                 and (m := PP_BLOCK.match(e["name"])) and m["action"] == action)
                  for action in ("RECV", "SEND")}
        kernels: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for e, s, t in mine:
            clipped = length(overlap([(s, t)], window))
            if e["cat"] in ("kernel", "Kernel") and any(s < b and t > a for a, b in window):
                kernels[e["name"]][0] += 1
                kernels[e["name"]][1] += clipped
        rows = []
        for name, s, t in periods:
            compute = length(overlap(by_kind["compute"], [(s, t)]))
            row = {"step": name, "step_ns": t - s, "compute_busy_ns": compute, "bubble_ns": t - s - compute}
            if any(blocks.values()):
                for action, inside in blocks.items():
                    row[f"{action.lower()}_ns"] = length(overlap(inside, [(s, t)]))
                    row[f"{action.lower()}_compute_ns"] = length(overlap(overlap(inside, by_kind["compute"]), [(s, t)]))
            rows.append(row)
        found[device] = {
            "window_ns": length(window), "window_start_ns": window[0][0], "window_end_ns": window[-1][1],
            "busy_ns": length(overlap(everything, window)),
            "exposed_comm_ns": length(overlap(minus(by_kind["communication"], by_kind["compute"]), window)),
            "compute_group_ns": length(overlap(by_kind["compute"], window)),
            "slices_by_kind": {k: sum(1 for e, s, t in mine if kind(e) == k and any(s < b and t > a for a, b in window))
                               for k in ("compute", "communication", "memory")},
            "steps": rows, "kernels": dict(kernels),
        }
    return found


def reported(path: Path, *extra: str) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(path), "--format", "json", "--top", "1000", *extra]) == 0
    return json.loads(out.getvalue())


def assert_gpu_matches(gpu: dict, expected: dict) -> None:
    for key in ("window_ns", "window_start_ns", "window_end_ns", "busy_ns", "exposed_comm_ns"):
        assert gpu[key] == expected[key], key
    groups = {group["group"]: group for group in gpu["lane_groups"]}
    assert groups["Compute"]["busy_ns"] == expected["compute_group_ns"]
    slices = defaultdict(int)
    for group in gpu["lane_groups"]:
        slices[group["kind"]] += group["slices"]
    assert {k: v for k, v in slices.items() if v} == {k: v for k, v in expected["slices_by_kind"].items() if v}
    assert [{key: step[key] for key in row} for step, row in zip(gpu["steps"], expected["steps"])] == expected["steps"]
    assert len(gpu["steps"]) == len(expected["steps"])


def assert_kernels_match(report: dict, expected_gpus: list[dict]) -> None:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for expected in expected_gpus:
        for name, (count, total) in expected["kernels"].items():
            totals[name][0] += count
            totals[name][1] += total
    ranked = sorted(((name, count, total) for name, (count, total) in totals.items() if count),
                    key=lambda item: (-item[2], item[0]))
    assert [(k["name"], k["count"], k["total_ns"]) for k in report["top_kernels"]] == ranked


REAL = ["hta_nccl_a100.json.gz", "hta_cuda_graph_rank0.json.gz", "tracelens_b200_eager.json.gz"]


@pytest.fixture(params=REAL)
def real_trace(request) -> Path:
    path = SHARED_TRACES / request.param
    if not path.is_file():
        pytest.skip("../shared/traces is absent")
    return path


def test_real_trace_figures_match_the_input(real_trace):
    report = reported(real_trace)
    expected = expected_gpus(real_trace)
    assert sorted(gpu["device"] for gpu in report["gpus"]) == sorted(expected)
    for gpu in report["gpus"]:
        assert gpu["gpu"] == f"GPU {gpu['device']}"
        assert_gpu_matches(gpu, expected[gpu["device"]])
    assert_kernels_match(report, list(expected.values()))


def test_b200_symmetric_memory_is_exposed_communication():
    path = SHARED_TRACES / "tracelens_b200_eager.json.gz"
    if not path.is_file():
        pytest.skip("../shared/traces is absent")
    [gpu] = reported(path)["gpus"]
    groups = {group["group"]: group for group in gpu["lane_groups"]}
    assert groups["Symmetric memory"]["kind"] == "communication" and groups["Symmetric memory"]["slices"] == 73
    assert gpu["exposed_comm_ns"] > groups["Symmetric memory"]["busy_ns"] // 2 > 0
    assert load_lane_rules().group_of("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>"
                                      "(c10::BFloat16*, unsigned long)", "kernel") == "symm_mem"


def test_merged_pipeline_figures_match_each_rank_input(tmp_path):
    ranks = write_pp_run(tmp_path / "ranks", pp_size=4, microbatches=4, steps=2, seed=3, graphs_per_step=2,
                         kernels_per_replay=8)
    merged_trace = tmp_path / "merged.perfetto-trace"
    merge_files(ranks, lambda group, groups: merged_trace)
    report = reported(merged_trace)
    assert [gpu["pp_rank"] for gpu in report["gpus"]] == [0, 1, 2, 3]
    expected_all = []
    for gpu in report["gpus"]:
        [expected] = expected_gpus(ranks[gpu["global_rank"]]).values()
        assert_gpu_matches(gpu, expected)
        assert all(step["recv_ns"] > 0 or step["send_ns"] > 0 for step in gpu["steps"])
        expected_all.append(expected)
    assert_kernels_match(report, expected_all)


def test_raw_converted_and_compacted_give_one_report(real_trace, tmp_path):
    converted, compacted = tmp_path / "c.perfetto-trace", tmp_path / "k.perfetto-trace"
    convert_file(real_trace, converted)
    compact_file(real_trace, compacted)
    raw, converted_report, compacted_report = [reported(path) for path in (real_trace, converted, compacted)]
    assert raw["gpus"]

    def figures(report: dict) -> dict:
        return {k: v for k, v in report.items() if k != "input"}

    assert figures(compacted_report) == figures(raw)
    # A converted trace keeps no lanes in its track roles, but its rank as a compacted one does
    # (its distributedInfo's): the same figures, findings and rank names; only the launch
    # attribution, which compact writes and convert does not, it cannot tell, and says so.
    for gpu in converted_report["gpus"]:
        assert gpu.pop("gpu_time_by_op")["could_not_tell"].startswith("could not tell")
    for gpu in raw["gpus"]:
        assert gpu.pop("gpu_time_by_op")["gpu_slices"] > 0
    assert figures(converted_report) == figures(raw)
