"""Each profiler step's critical path within one compacted trace (`compact --critical-path`).

Read back from the written trace with trace_processor and checked against a plain reading of
the input JSON: the path tiles each step from its ProfilerStep's CPU start to the end of the
step's last GPU work (what ran inside the step, or what a runtime call inside it launched: the
same `correlation`), each compute segment copies a measured slice of its name, a stream said
to be idle ran no kernel then, and `report` shows the path in text, JSON and HTML. A generated
launch-bound trace's path is mostly CPU time, a GPU-bound one's mostly kernels.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from converter.generator import write_trace
from converter.generator.config import GeneratorConfig
from converter.model import TrackRole

from .helpers import SHARED_TRACES, compact_file, track_roles
from .test_critical_path import check_report, path_segments, rank_events, step_windows

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")  # 2021 traces: capitalised
KERNELS = ("kernel", "Kernel")
RUNTIME = ("cuda_runtime", "Runtime")
KINDS = {"compute", "transfer", "launch", "wait"}
UNTRACED_ON_THREAD = "untraced time on the thread after "


def compacted_path(source: Path, tmp_path: Path) -> tuple[dict, Path, dict[int, list[dict]], list]:
    """Compacted with the path (and the self-check); its segments per step, and the input's
    complete events with their times in ns."""
    output = tmp_path / "compacted.perfetto-trace"
    summary = compact_file(source, output, critical_path=True, verify=True)
    steps = path_segments(output)
    assert summary["critical_path"] == {"steps": len(steps), "segments": sum(map(len, steps.values()))}
    return summary, output, steps, rank_events(source, 0)


def last_gpu_ends(events: list, windows: dict[int, tuple[int, int]]) -> dict[int, int]:
    """Per step, when its last GPU work ended: GPU work inside the step, or launched by a
    runtime call that began in it (the call's `correlation`, which every kernel of a
    cudaGraphLaunch replay shares)."""
    launched_at = {e["args"]["correlation"]: start for e, start, _ in events
                   if e.get("cat") in RUNTIME and "correlation" in e.get("args", {})}
    ends = {}
    for step, (first, last) in windows.items():
        ends[step] = max(end for e, start, end in events if e.get("cat") in GPU_CATEGORIES and end > start
                         and ((first <= start and end <= last)
                              or first <= launched_at.get(e.get("args", {}).get("correlation"), -1) < last))
    return ends


def check_path(steps: dict[int, list[dict]], events: list) -> None:
    """The oracle's checks of every step's path (see the module's docstring)."""
    windows = step_windows({0: events})
    ends = last_gpu_ends(events, windows)
    spans: dict[str, list[tuple[int, int]]] = {}
    for e, start, end in events:
        spans.setdefault(e["name"], []).append((start, end))
    kernels_on: dict[tuple, list[tuple[int, int]]] = {}
    for e, start, end in events:
        if e.get("cat") in KERNELS and end > start:
            kernels_on.setdefault((e["pid"], e["tid"]), []).append((start, end))
    assert steps and set(steps) <= set(windows)
    for step, segments in steps.items():
        # It tiles the step, from its CPU start to its last GPU work's end: its length is the step's.
        assert segments[0]["ts"] == windows[step][0]
        assert all(a["end_ts"] == b["ts"] for a, b in zip(segments, segments[1:]))
        assert segments[-1]["end_ts"] == ends[step]
        assert {s["kind"] for s in segments} <= KINDS
        for s in segments:
            if s["kind"] == "compute":  # a copy of (a piece of) a measured slice of its name
                assert any(start <= s["ts"] and s["end_ts"] <= end for start, end in spans.get(s["name"], [])), s
            if s["kind"] == "wait" and s["name"].startswith("stream idle after "):
                # That stream ran no kernel while the path waited: the work before it there had ended.
                before = s["name"].removeprefix("stream idle after ")
                streams = {(e["pid"], e["tid"]) for e, _, end in events
                           if e.get("cat") in GPU_CATEGORIES and e["name"] == before and end == s["ts"]}
                assert streams, s
                assert all(end <= s["ts"] or start >= s["end_ts"]
                           for stream in streams for start, end in kernels_on.get(stream, [])), s


def kind_shares(segments: list[dict]) -> Counter:
    length = segments[-1]["end_ts"] - segments[0]["ts"]
    shares: Counter = Counter()
    for s in segments:
        kind = "cpu wait" if s["kind"] == "wait" and s["name"].startswith(UNTRACED_ON_THREAD) else s["kind"]
        shares[kind] += (s["end_ts"] - s["ts"]) / length
    return shares


def generated(tmp_path: Path, launch_factor: float) -> Path:
    """One rank's CUDA-graph trace (a one-stage pipeline: each action's graphs launched on the CPU)."""
    return write_trace(GeneratorConfig(seed=3, steps=2, pp_size=1, microbatches=4, graphs_per_action=2,
                                       kernels_per_replay=8, include_memcpy=False, launch_factor=launch_factor),
                       tmp_path / f"launch{launch_factor:g}.json")


def gpu_compute_share(events: list, window: tuple[int, int]) -> float:
    """How much of the window some kernel ran, read plainly from the input."""
    first, last = window
    covered, reached = 0, first
    for start, end in sorted((max(start, first), min(end, last)) for e, start, end in events
                             if e.get("cat") == "kernel" and start < last and end > first):
        if end > reached:
            covered += end - max(start, reached)
            reached = end
    return covered / (last - first)


def replays_on_path(segments: list[dict], events: list) -> int:
    """How many times the path goes from a cudaGraphLaunch to a kernel of its replay (the same
    `correlation` in the input), waits aside."""
    work = [s for s in segments if s["kind"] != "wait"]
    found = 0
    for launch, kernel in zip(work, work[1:]):
        if launch["name"] != "cudaGraphLaunch" or kernel["kind"] != "compute":
            continue
        correlations = {e["args"]["correlation"] for e, start, end in events if e["name"] == "cudaGraphLaunch"
                        and start <= launch["ts"] and launch["end_ts"] <= end}
        found += any(e.get("cat") == "kernel" and e["name"] == kernel["name"] and start == kernel["ts"]
                     and e["args"].get("correlation") in correlations for e, start, _ in events)
    return found


@pytest.mark.parametrize("launch_factor", [1.0, 40.0])
def test_generated_cuda_graph_trace(tmp_path, launch_factor):
    """GPU-bound (launches as fast as usual) the path is mostly kernels; launch-bound (each
    cudaGraphLaunch 40 times as long, the GPU idle most of the step by the input's own kernels)
    it is mostly the CPU's: its launches, and the thread's time between them."""
    source = generated(tmp_path, launch_factor)
    summary, output, steps, events = compacted_path(source, tmp_path)
    check_path(steps, events)
    windows = step_windows({0: events})
    for step, segments in steps.items():
        shares = kind_shares(segments)
        busy = gpu_compute_share(events, (segments[0]["ts"], segments[-1]["end_ts"]))
        if launch_factor > 1:
            assert busy < 0.4 and shares["launch"] > shares["compute"], (busy, shares)
            assert shares["launch"] + shares["cpu wait"] > 0.5, shares
        else:
            assert busy > 0.6 and shares["compute"] > 0.5 and shares["launch"] < 0.1, (busy, shares)
        if launch_factor > 1:  # kernels wait for their launch: the path goes from a replay's kernel to its launch
            assert replays_on_path(segments, events) >= 1
    assert set(steps) == set(windows)
    check_report(output, steps)


def test_path_only_where_asked(tmp_path):
    """A plain compact derives no path: its rows and summary entry come with --critical-path."""
    output = tmp_path / "plain.perfetto-trace"
    summary = compact_file(generated(tmp_path, 1.0), output, verify=True)
    assert "critical_path" not in summary
    assert not [role for role in track_roles(output) if role.role is TrackRole.CRITICAL_PATH]


@pytest.mark.parametrize("name", ["hta_cuda_graph_rank0.json.gz", "hta_nccl_a100.json.gz",
                                  "kineto_2021_resnet50_old_format.json.gz"])
def test_real_gpu_traces(tmp_path, name):
    """Real GPU traces (CUDA graphs; NCCL; a 2021 trace, its CPU work named Operator and
    Runtime, its threads' ids text): a path per step, checked against the input."""
    source = SHARED_TRACES / name
    if not source.is_file():
        pytest.skip("../shared/traces is absent")
    summary, output, steps, events = compacted_path(source, tmp_path)
    check_path(steps, events)
    assert set(steps) == set(step_windows({0: events}))
    check_report(output, steps)
