"""Steps own the GPU work they launched (`--step-windows launched`, the default): checked
against the input JSON read plainly (tests/oracle.py, test_report_oracle's interval
arithmetic), on the real CUDA-graph trace whose GPU runs a step behind its CPU."""

from __future__ import annotations

import json

import numpy as np
import pytest

from converter import CgtraceError, report
from converter.cli import main
from converter.analysis.step_windows import owned_step_windows

from .helpers import SHARED_TRACES
from .oracle import load_events, to_ns
from .test_report_oracle import GPU, expected_gpus, kind, launch_times, length, merged, reported

CUDA_GRAPH = SHARED_TRACES / "hta_cuda_graph_rank0.json.gz"


@pytest.fixture(scope="module")
def cuda_graph() -> dict:
    """The trace's last step as the input says: its CPU span, and the GPU slices launched in it."""
    if not CUDA_GRAPH.is_file():
        pytest.skip("../shared/traces is absent")
    _, events = load_events(CUDA_GRAPH)  # no baseTimeNanoseconds: times are absolute
    launched = launch_times(events, 0)
    steps = sorted((to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])) for e in events
                   if (e.get("name") or "").startswith("ProfilerStep#") and e.get("cat") == "user_annotation")
    start, end = steps[-1]
    gpu = [(e, to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])) for e in events
           if e.get("ph") == "X" and e.get("cat") in GPU and to_ns(e["dur"]) > 0]
    mine = [(e, s, t) for e, s, t in gpu if start <= launched.get(e["args"].get("correlation"), -1) < end]
    return {"cpu_end": end, "launched": mine}


def test_the_last_step_owns_the_gpu_tail_it_launched(cuda_graph):
    tail = [(max(s, cuda_graph["cpu_end"]), t) for _, s, t in cuda_graph["launched"] if t > cuda_graph["cpu_end"]]
    assert len(tail) == 880  # the count: slices the last step launched that ran after its CPU side
    owned, cpu = reported(CUDA_GRAPH), reported(CUDA_GRAPH, "--step-windows", "cpu")
    [gpu], [gpu_cpu] = owned["gpus"], cpu["gpus"]
    assert (owned["input"]["step_windows"], cpu["input"]["step_windows"]) == ("launched", "cpu")
    # Without the option: today's figures, the CPU spans' (the oracle's cpu windows).
    [expected_cpu] = expected_gpus(CUDA_GRAPH, "cpu").values()
    assert (gpu_cpu["busy_ns"], gpu_cpu["window_end_ns"]) == (expected_cpu["busy_ns"], expected_cpu["window_end_ns"])
    # With it: the last window ends where the last GPU work the step launched ends, and the
    # GPU's busy time gains exactly that work's time after the CPU side (57 ms), which no
    # CPU span held.
    assert gpu["window_end_ns"] == max(t for _, _, t in cuda_graph["launched"])
    assert gpu["busy_ns"] - gpu_cpu["busy_ns"] == length(merged(tail)) > 50_000_000
    # The last step's compute: the compute its launches ran, less what ran while the previous
    # step's own work was still running (concurrent streams at the boundary, counted there).
    last = gpu["steps"][-1]
    launched_compute = merged((s, t) for e, s, t in cuda_graph["launched"] if kind(e) == "compute")
    before = merged((s, min(t, last["start_ns"])) for s, t in launched_compute if s < last["start_ns"])
    assert last["compute_busy_ns"] == length(launched_compute) - length(before)
    # Steps never overlap and cover the CPU spans.
    windows = [(step["start_ns"], step["start_ns"] + step["step_ns"]) for step in gpu["steps"]]
    assert all(end <= start for (_, end), (start, _) in zip(windows, windows[1:]))
    assert [step["start_ns"] for step in gpu_cpu["steps"]][0] == windows[0][0]


def test_a_step_whose_predecessor_outlasts_it_is_empty_never_overlapping():
    # Step 2's CPU span [10, 20) launches nothing; step 1's GPU work (launched at 5) runs to 30.
    windows = owned_step_windows([(0, 10), (10, 20), (20, 40)], np.array([5, 25]), np.array([30, 45]))
    assert windows == [(0, 30), (30, 30), (30, 45)]
    assert owned_step_windows([(0, 10), (12, 20)], np.array([], np.int64), np.array([], np.int64)) == [(0, 10),
                                                                                                        (12, 20)]


def test_diff_bounds_both_sides_as_asked(cuda_graph, capsys):
    """diff's mean step is report's under the same step windows; A against A stays zero."""
    for mode in ("launched", "cpu"):
        assert main(["diff", str(CUDA_GRAPH), str(CUDA_GRAPH), "--format", "json", "--jobs", "1",
                     "--step-windows", mode]) == 0
        diff = json.loads(capsys.readouterr().out)
        [step] = [row for row in diff["gpus"] if row["figure"] == "step"]
        [expected] = expected_gpus(CUDA_GRAPH, mode).values()
        assert step["a_ns"] == round(sum(row["step_ns"] for row in expected["steps"]) / len(expected["steps"]))
        assert step["delta_ns"] == 0 and diff["a"]["step_windows"] == mode


def test_a_wrong_step_windows_is_one_line(tmp_path, capsys):
    with pytest.raises(CgtraceError, match="step_windows='gpu': expected one of 'launched', 'cpu'"):
        report(tmp_path / "absent.json", step_windows="gpu")
    assert main(["report", str(tmp_path / "absent.json"), "--step-windows", "gpu"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "--step-windows: invalid choice: 'gpu'" in line


@pytest.mark.parametrize("name", ["hta_cuda_graph_big_graphs_v100.json.gz", "kineto_2021_resnet50_old_format.json.gz",
                                  "hta_trace_diff_control_a100.json.gz"])
def test_each_step_window_is_the_oracles(name):
    """GPUs behind their CPU (a V100 CUDA-graph run; a 2021 trace, older flow names) and one that
    keeps up: every step's length and figures as the input's launches bound it."""
    path = SHARED_TRACES / name
    if not path.is_file():
        pytest.skip("../shared/traces is absent")
    expected = expected_gpus(path)
    for gpu in reported(path)["gpus"]:
        rows = expected[gpu["device"]]["steps"]
        assert [{key: step[key] for key in row} for step, row in zip(gpu["steps"], rows)] == rows
        assert len(gpu["steps"]) == len(rows) > 1
