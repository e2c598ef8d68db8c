"""cgtrace report: figures on small hand-built traces equal values computed by hand (all in µs below)."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout

import pytest

from html import escape
from pathlib import Path

from converter.analysis.report import DEFINITIONS
from converter.cli import main
from converter.generator import write_pp_run
from .helpers import compact_file, convert_file

from .helpers import write_json

US = 1000  # ns per µs: the report speaks ns, the hand-built traces µs


def meta(pid, name, labels=None, tid=0):
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": tid, "args": {"name": name}}]
    if labels:
        events.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": tid, "args": {"labels": labels}})
    return events


def span(name, cat, pid, tid, start, end):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": start, "dur": end - start}


def kernel(name, stream, start, end, cat="kernel", pid=0):
    return span(name, cat, pid, stream, start, end)


# One GPU, one step [5, 95]. Compute: gemm_a/gemm_b partially overlap on stream 7 (the converter
# moves one to an overlap track) and gemm_a runs again on stream 8: union [10, 40], plus gemm_c.
SINGLE_GPU = {"traceEvents": [
    *meta(100, "python", "CPU"), *meta(0, "python", "GPU 0"),
    span("ProfilerStep#1", "user_annotation", 100, 100, 5, 95),
    span("ProfilerStep#1", "gpu_user_annotation", 0, 7, 5, 95),   # the GPU-side copy is not a step
    kernel("gemm_a", 7, 10, 30), kernel("gemm_b", 7, 20, 35), kernel("gemm_a", 8, 25, 40),
    kernel("gemm_c", 7, 75, 78),
    kernel("ncclDevKernel_AllGather_RING_LL", 20, 35, 60),
    kernel("ncclDevKernel_ReduceScatter_Sum", 21, 70, 80),
    kernel("ncclDevKernel_SendRecv", 8, 90, 100),                 # half outside the step
    kernel("symm_mem_one_shot_all_reduce", 9, 50, 52),
    kernel("Memcpy HtoD (Pageable -> Device)", 8, 0, 8, cat="gpu_memcpy"),  # 3 µs inside the step
]}
STEP = 90
GROUPS = {  # group: (busy µs, slices)
    "Compute": (33, 4), "Symmetric memory": (2, 1), "NCCL all-gather": (25, 1),
    "NCCL reduce-scatter": (10, 1), "NCCL other": (5, 1), "Memcpy": (3, 1),
}
# all-gather [35,60] minus compute [10,40] -> 20; reduce-scatter [70,80] minus gemm_c [75,78] -> 7;
# SendRecv [90,95] inside the step -> 5.
EXPOSED = 20 + 7 + 5
BUSY = 3 + 50 + 10 + 5   # [5,8] [10,60] [70,80] [90,95]


def report_json(path, *extra) -> dict:
    return run_report(path, "--format", "json", *extra)


def run_report(path, *args):
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(path), *args]) == 0
    text = out.getvalue()
    return json.loads(text) if "json" in args else text


@pytest.fixture(scope="module")
def single_gpu(tmp_path_factory):
    folder = tmp_path_factory.mktemp("single")
    source = write_json(folder / "single.json", SINGLE_GPU)
    converted, compacted = folder / "single.perfetto-trace", folder / "single_compacted.perfetto-trace"
    convert_file(source, converted)
    compact_file(source, compacted)
    return source, converted, compacted


def assert_single_gpu(report: dict, lanes_from: str) -> None:
    assert report["input"]["lanes_from"] == lanes_from
    [gpu] = report["gpus"]
    assert (gpu["gpu"], gpu["pp_rank"], gpu["window"], len(gpu["steps"])) == ("GPU 0", None, "steps", 1)
    assert (gpu["window_start_ns"], gpu["window_end_ns"], gpu["window_ns"]) == (5 * US, 95 * US, STEP * US)
    assert gpu["busy_ns"] == BUSY * US
    assert gpu["exposed_comm_ns"] == EXPOSED * US
    assert gpu["exposed_comm_share"] == pytest.approx(EXPOSED / STEP, abs=1e-6)
    groups = {g["group"]: (g["busy_ns"] // US, g["slices"]) for g in gpu["lane_groups"]}
    assert groups == GROUPS
    assert [g["group"] for g in gpu["lane_groups"]] == [
        "Compute", "Symmetric memory", "NCCL all-gather", "NCCL reduce-scatter", "NCCL other", "Memcpy"]
    compute = gpu["lane_groups"][0]
    assert compute["share"] == pytest.approx(33 / STEP, abs=1e-6)
    [step] = gpu["steps"]   # compute [10,40] and gemm_c [75,78] in [5,95]; not a pipeline: no RECV/SEND
    assert step == {"step": "ProfilerStep#1", "start_ns": 5 * US, "step_ns": STEP * US, "compute_busy_ns": 33 * US,
                    "bubble_ns": 57 * US, "bubble_share": round(57 / STEP, 6)}


def test_busy_time_is_a_union_and_exposed_comm_subtracts_compute(single_gpu):
    _, converted, _ = single_gpu
    report = report_json(converted)
    assert_single_gpu(report, "lane rules on GPU slice names and categories")


def test_compacted_lanes_and_raw_json_give_the_same_figures(single_gpu):
    source, converted, compacted = single_gpu
    assert_single_gpu(report_json(compacted), "track roles")
    assert_single_gpu(report_json(source), "track roles")   # raw JSON is compacted by our reader first
    forms = [report_json(path) for path in (source, converted, compacted)]
    # Only compact names each GPU slice's launch (args cgtrace_launch.*): a converted trace's
    # GPU time by op could not be told; every other figure is the same in every form.
    by_op = [gpu.pop("gpu_time_by_op") for form in forms for gpu in form["gpus"]]
    assert "ops" in by_op[0] and by_op[0] == by_op[2] and set(by_op[1]) == {"could_not_tell"}
    assert all(without(form, "input") == without(forms[0], "input") for form in forms)


def test_top_kernels_are_cut_to_the_window(single_gpu):
    _, converted, _ = single_gpu
    kernels = report_json(converted, "--top", "6")["top_kernels"]
    assert [(k["name"], k["count"], k["total_ns"] // US) for k in kernels] == [
        ("gemm_a", 2, 35), ("ncclDevKernel_AllGather_RING_LL", 1, 25), ("gemm_b", 1, 15),
        ("ncclDevKernel_ReduceScatter_Sum", 1, 10), ("ncclDevKernel_SendRecv", 1, 5),  # [90,100] in [5,95]
        ("gemm_c", 1, 3)]   # ties by name; memcpy is not a kernel
    assert kernels[0]["mean_ns"] == 17.5 * US


def test_raw_json_and_no_steps_use_the_active_span(tmp_path):
    source = write_json(tmp_path / "nosteps.json", {"traceEvents": [
        *meta(0, "python", "GPU 0"), kernel("k1", 7, 100, 110), kernel("k2", 8, 105, 130),
        kernel("ncclDevKernel_AllReduce_Sum", 9, 140, 150)]})
    [gpu] = report_json(source)["gpus"]
    assert (gpu["window"], gpu["window_ns"], gpu["busy_ns"]) == ("active span", 50 * US, 40 * US)
    assert [(step["step"], step["bubble_ns"]) for step in gpu["steps"]] == [("active span", 20 * US)]
    assert gpu["exposed_comm_ns"] == 10 * US
    assert {g["group"]: g["busy_ns"] // US for g in gpu["lane_groups"]} == {"Compute": 30, "NCCL all-reduce": 10}


def pp_rank_events(pp_rank, global_rank, cpu_pid, gpu_pid, steps, blocks, kernels):
    prefix = f"PP rank {pp_rank} (global rank {global_rank}) | "
    events = [*meta(cpu_pid, prefix + "python", "CPU"), *meta(gpu_pid, prefix + "GPU " + str(pp_rank), "GPU")]
    events += [span(f"ProfilerStep#{n}", "user_annotation", cpu_pid, cpu_pid, a, b) for n, a, b in steps]
    events += [span(name, "gpu_user_annotation", gpu_pid, stream, a, b) for name, stream, a, b in blocks]
    events += [kernel(name, stream, a, b, pid=gpu_pid) for name, stream, a, b in kernels]
    return events


# PP rank 0: step 3 [0,100]: F0 on two streams, SEND_F0 [32,40], RECV_B0 [50,60], B0 [60,90], W0 [95,105]
# across the step boundary; compute kernels [10,30] and [55,70] (5 of it inside RECV_B0): busy 35, bubble 65.
# Step 4 [100,200]: UNSHARD, F1, I1, W1; one kernel [150,160]: bubble 90.
# PP rank 1 (global 5): step 3 [0,100]: F0 [40,60], an OVERLAP_F_B [60,80]; kernel [40,60]: bubble 80.
PP_TRACE = {"traceEvents": [
    *pp_rank_events(0, 0, 1, 2, [(3, 0, 100), (4, 100, 200)], [
        ("PP:0F0", 7, 10, 30), ("PP:0F0", 8, 12, 32), ("PP:0SEND_F0", 7, 32, 40), ("PP:0RECV_B0", 8, 50, 60),
        ("PP:0B0", 7, 60, 90), ("PP:0W0", 7, 95, 105), ("PP:0UNSHARD", 7, 100, 110), ("PP:0F1", 7, 120, 150),
        ("PP:0I1", 7, 150, 170), ("PP:0W1", 7, 170, 190)],
        [("gemm", 7, 10, 30), ("gemm", 7, 55, 70), ("gemm", 7, 150, 160)]),
    *pp_rank_events(1, 5, 3, 4, [(3, 0, 100)], [
        ("PP:1F0", 7, 40, 60), ("PP:(1F1;1B0)OVERLAP_F_B", 7, 60, 80)], [("gemm", 7, 40, 60)]),
    span("PP:0F0", "user_annotation", 1, 1, 1, 5),   # the CPU side of a PP block does not count
]}
PP_EXPECTED = [  # (step, compute µs, bubble µs, RECV, RECV with compute, SEND, SEND with compute)
    ("ProfilerStep#3", 35, 65, 10, 5, 8, 0),
    ("ProfilerStep#4", 10, 90, 0, 0, 0, 0),
    ("ProfilerStep#3", 20, 80, 0, 0, 0, 0),
]


def test_pp_bubble_per_rank_and_step(tmp_path):
    """Each rank's trace on its own: a trace that cgtrace did not merge has no rank identity
    (process names are display text, never read back), so its rows carry no PP rank."""
    events = PP_TRACE["traceEvents"]
    ranks = {0: [e for e in events if e.get("pid") in (1, 2)], 1: [e for e in events if e.get("pid") in (3, 4)]}
    got = []
    for pp_rank in (0, 1):
        source = write_json(tmp_path / f"pp{pp_rank}.json", {"traceEvents": ranks[pp_rank]})
        converted = tmp_path / f"pp{pp_rank}.perfetto-trace"
        convert_file(source, converted)
        [gpu] = report_json(converted)["gpus"]
        assert (gpu["pp_rank"], gpu["global_rank"]) == (None, None)
        got += [(row["step"], row["compute_busy_ns"] // US, row["bubble_ns"] // US, row["recv_ns"] // US,
                 row["recv_compute_ns"] // US, row["send_ns"] // US, row["send_compute_ns"] // US)
                for row in gpu["steps"]]
        assert all(row["bubble_share"] == round(row["bubble_ns"] / row["step_ns"], 6) for row in gpu["steps"])
    assert got == PP_EXPECTED


def test_text_and_html(single_gpu, tmp_path):
    _, converted, _ = single_gpu
    text = run_report(converted)
    assert re.search(r"GPU 0\s+Compute\s+compute\s+0\.033\s+36\.7%\s+4\n", text)
    assert re.search(r"GPU 0\s+ProfilerStep#1\s+0\.090\s+0\.033\s+0\.057\s+63\.3%\n", text)
    legend = text.split("\nDefinitions\n", 1)[1]
    assert all(f"  {term}: {meaning}\n" in legend for term, meaning in DEFINITIONS.items())
    page = tmp_path / "report.html"
    run_report(converted, "--format", "html", "-o", str(page))
    html = page.read_text()
    assert html.startswith("<!doctype html>") and "gemm_a" in html
    assert all(escape(meaning) in html for meaning in DEFINITIONS.values())
    assert "Pipeline timeline" not in html   # no PP blocks, no timeline
    assert not re.search(r"https?:|src=|<script|<link", html)   # self-contained
    assert main(["report", str(converted), "--format", "html", "-o", str(page)]) == 2   # no --overwrite


def test_missing_trace(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope.perfetto-trace")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.perfetto-trace: no such file" in err


def test_merged_pipeline_matches_each_rank_alone(tmp_path):
    """`cgtrace merge` puts each rank's lanes under a track named after its GPU, outside any
    process; every figure must still equal that rank's own trace read alone."""
    ranks = write_pp_run(tmp_path / "ranks", pp_size=2, microbatches=2, steps=2, kernels_per_replay=4)
    merged = tmp_path / "merged.perfetto-trace"
    assert main(["merge", str(tmp_path / "ranks"), "-o", str(merged), "-q"]) == 0
    report = report_json(merged)
    assert [gpu["pp_rank"] for gpu in report["gpus"]] == [0, 1]   # the generator's device is the global rank
    assert all(gpu["gpu"] == f"GPU {gpu['global_rank']}" == f"GPU {gpu['device']}" for gpu in report["gpus"])
    for gpu in report["gpus"]:
        [alone] = report_json(next(p for p in ranks if p.name == f"rank{gpu['global_rank']}_trace.json"))["gpus"]
        assert without(gpu, "pp_rank", "global_rank") == without(alone, "pp_rank", "global_rank")
        assert {"recv_ns", "send_compute_ns"} <= set(gpu["steps"][0])


def without(row: dict, *keys) -> dict:
    return {k: v for k, v in row.items() if k not in keys}


def test_docs_define_each_figure_as_the_report_does():
    reference = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    section = reference.split("<!-- report definitions", 1)[1].split("<!-- end of report definitions", 1)[0]
    flat = " ".join(section.split())
    assert all(f"**{term}**: {meaning}." in flat for term, meaning in DEFINITIONS.items())
