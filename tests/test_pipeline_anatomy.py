"""The report's pipeline anatomy, recomputed from each rank's input JSON by a reading of our
own (tests/oracle.py's events, plain interval loops): on real torch pipelining sets (CPU only,
gloo) and on a generated CUDA-graph pipeline, merged. The parts add up to the step, the oracle
agrees with every part, and warm-up and drain have the schedule's shape."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout
from html import escape
from pathlib import Path
from statistics import mean

import pytest

from converter.cli import main
from converter.generator import write_pp_run

from .helpers import merge_files, real_pipeline_copy
from .oracle import load_events, to_ns
from .test_report_oracle import kind, length, merged, overlap, reported

PARTS = ("compute_ns", "warmup_ns", "drain_ns", "recv_wait_ns", "exposed_comm_ns", "other_ns")
ACTION = re.compile(r"^PP:(?P<stage>\d+)(?P<action>F|B|I|W|SEND_F|SEND_B|RECV_F|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)"
                    r"(?P<mb>\d*)$")
GPIPE = re.compile(r"^(?P<action>Forward|Backward) (?P<mb>\d+)$")
COMMUNICATION_OP = ("c10d::", "gloo:", "nccl:", "record_param_comms")
BUFFER_OP = ("aten::empty", "aten::detach", "detach")
KERNELS = {"kernel", "gpu_memcpy", "gpu_memset"}


def minus(a, b) -> list[tuple[int, int]]:
    """`a` less `b`, by cutting each interval of `a` at every interval of `b` it meets."""
    out = []
    for start, end in a:
        pieces = [(start, end)]
        for cut_start, cut_end in b:
            if cut_end <= start or cut_start >= end:
                continue
            pieces = [piece for s, e in pieces for piece in ((s, min(e, cut_start)), (max(s, cut_end), e))
                      if piece[0] < piece[1]]
        out += pieces
    return merged(out)


def expected_parts(path: Path) -> dict[str, dict[str, int]]:
    """Per step of one rank's input: the parts the report must give."""
    header, events = load_events(path)
    base = header.get("baseTimeNanoseconds", 0)
    spans = [(e, base + to_ns(e["ts"]), base + to_ns(e["ts"]) + to_ns(e["dur"])) for e in events
             if e.get("ph") == "X" and "ts" in e and to_ns(e.get("dur", 0)) > 0]
    on_gpu = any(e.get("cat") in KERNELS for e, _, _ in spans)
    if on_gpu:
        gpu = [(e, s, t) for e, s, t in spans if e.get("cat") in KERNELS]
        compute = merged((s, t) for e, s, t in gpu if kind(e) == "compute")
        communication = merged((s, t) for e, s, t in gpu if kind(e) == "communication")
        annotations = [(e["name"], s, t) for e, s, t in spans if e.get("cat") == "gpu_user_annotation"]
        receive_ops: list[tuple[int, int]] = []
    else:
        def is_communication(name: str) -> bool:
            return name.startswith(COMMUNICATION_OP)
        ops = [(e["name"], s, t) for e, s, t in spans if e.get("cat") == "cpu_op" or is_communication(e["name"])]
        ops = [(name, s, t) for name, s, t in ops if not name.startswith(BUFFER_OP)]
        blocking = merged((s, t) for e, s, t in spans if e.get("cat") == "cpu_op" and is_communication(e["name"]))
        compute = minus(merged((s, t) for name, s, t in ops if not is_communication(name)), blocking)
        communication = merged((s, t) for name, s, t in ops if is_communication(name))
        annotations = [(e["name"], s, t) for e, s, t in spans if e.get("cat") == "user_annotation"]
        receive_ops = [(s, t) for name, s, t in ops if re.match(r"^(c10d::recv|gloo:recv|nccl:recv)", name)]
    by_action: dict[tuple, list] = {}  # (action, stage, microbatch) -> its blocks
    for name, s, t in annotations:
        if m := GPIPE.match(name):
            by_action.setdefault((m["action"][0], None, int(m["mb"])), []).append((s, t))
        elif (m := ACTION.match(name)) and m["action"] in "FBIW":
            by_action.setdefault((m["action"], int(m["stage"]), int(m["mb"])), []).append((s, t))
    computing = merged(span for spans in by_action.values() for span in spans)
    receives = merged([(s, t) for name, s, t in annotations
                       if (m := ACTION.match(name)) and m["action"].startswith("RECV")] + receive_ops)
    steps = {e["name"]: (s, t) for e, s, t in spans
             if e["name"].startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"}
    found = {}
    for name, (start, end) in steps.items():
        work = overlap(compute, [(start, end)])
        bounds = overlap(work, computing) or work
        first, last = (bounds[0][0], bounds[-1][1]) if bounds else (end, end)
        idle = minus([(start, end)], work)
        warmup, drain = overlap(idle, [(start, first)]), overlap(idle, [(last, end)])
        middle = overlap(idle, [(first, last)])
        waiting = overlap(middle, receives)
        exposed = overlap(minus(middle, waiting), communication)
        actions = {key: length(overlap(work, merged(spans))) for key, spans in by_action.items()
                   if any(s < end and t > start for s, t in spans)}
        found[name] = {"actions": actions, "step_ns": end - start, "compute_ns": length(work), "warmup_ns": length(warmup),
                       "drain_ns": length(drain), "recv_wait_ns": length(waiting), "exposed_comm_ns": length(exposed),
                       "other_ns": length(minus(minus(middle, waiting), exposed))}
    return found


def check_pipeline(merged_trace: Path, rank_file) -> list[dict]:
    """The report's stage rows, each checked against the oracle; returned for shape checks."""
    stages = reported(merged_trace)["pipeline"]["stages"]
    assert stages
    for row in stages:
        assert sum(row[part] for part in PARTS) == row["step_ns"]
        assert sum(wait["wait_ns"] for wait in row["recv_waits"]) == row["recv_wait_ns"]
        expected = expected_parts(rank_file(row["global_rank"]))[row["step"]]
        actions = {(a["action"], a["stage"], a["microbatch"]): a["compute_ns"] for a in row["actions"]}
        parts = {key: value for key, value in expected.items() if key != "actions"}
        assert {key: row[key] for key in parts} == parts, (row["pp_rank"], row["step"])
        assert actions == expected["actions"]
    return stages


def assert_schedule_shape(stages: list[dict]) -> None:
    """The last stage waits longest for its first microbatch (warm-up) and idles at the end
    while the backward wave travels back to the first stage (drain), in every step."""
    first, last = min(row["pp_rank"] for row in stages), max(row["pp_rank"] for row in stages)
    for step in {row["step"] for row in stages}:
        head = next(row for row in stages if row["pp_rank"] == first and row["step"] == step)
        tail = next(row for row in stages if row["pp_rank"] == last and row["step"] == step)
        assert tail["warmup_ns"] > head["warmup_ns"], step
        assert tail["drain_ns"] > head["drain_ns"], step


REAL_SETS = ["torch215_zb_pp2v2", "torch215_gpipe_pp4", "torch215_interleaved1f1b_pp2v2", "interleaved1f1b_pp2v2"]


@pytest.mark.parametrize("name", REAL_SETS + ["torch215_1f1b_pp4"])
def test_real_torch_pipelines(name, tmp_path):
    ranks = real_pipeline_copy(name, tmp_path)
    output = tmp_path / "merged.perfetto-trace"
    merge_files([ranks], lambda group, groups: output)
    stages = check_pipeline(output, lambda rank: ranks / f"rank{rank}_trace.json.gz")
    assert all(row["recv_wait_ns"] > 0 for row in stages)
    if name in REAL_SETS:  # Schedule1F1B names no actions: its stages' bounds are any compute
        assert_schedule_shape(stages)
    if name != "torch215_gpipe_pp4" and name in REAL_SETS:  # `PP:` actions name the stage waited for
        assert any(wait["from_pp_rank"] is not None for row in stages for wait in row["recv_waits"])


def test_generated_cuda_graph_pipeline(tmp_path):
    files = write_pp_run(tmp_path / "ranks", pp_size=4, microbatches=4, steps=2, seed=3, graphs_per_step=2,
                         kernels_per_replay=8)
    output = tmp_path / "merged.perfetto-trace"
    merge_files(files, lambda group, groups: output)
    stages = check_pipeline(output, lambda rank: files[rank])
    assert [row["pp_rank"] for row in stages] == sorted(row["pp_rank"] for row in stages)
    assert_schedule_shape(stages)
    # Each stage but the first waits on what the stage before sends it, and says so.
    waits = {(row["pp_rank"], wait["action"], wait["from_pp_rank"]) for row in stages for wait in row["recv_waits"]}
    assert {(rank, "RECV_F", rank - 1) for rank in (1, 2, 3)} <= waits
    check_findings(output, files)


def check_findings(merged_trace: Path, files: list[Path]) -> None:
    """Findings say, in words and figures, what the oracle's parts say; text and HTML lead with them."""
    report = reported(merged_trace)
    by_rank: dict[int, list[dict]] = {}
    for row in report["pipeline"]["stages"]:
        by_rank.setdefault(row["pp_rank"], []).append(expected_parts(files[row["global_rank"]])[row["step"]])
    findings = report["findings"]
    assert findings == sorted(findings, key=lambda f: -f["figure"])
    waiting = [f for f in findings if f["key"] == "recv_wait"]
    assert waiting
    for finding in waiting:
        share = mean(part["recv_wait_ns"] / part["step_ns"] for part in by_rank[finding["where"]["pp_rank"]])
        assert finding["figure"] == round(share, 4) >= 0.10
        assert f"waits {share:.0%} of each step on receives, most for RECV_" in finding["text"]
    bubble = [f for f in findings if f["key"] == "pipeline_bubble"]
    worst = max(by_rank, key=lambda rank: mean((p["warmup_ns"] + p["drain_ns"]) / p["step_ns"] for p in by_rank[rank]))
    assert bubble[0]["where"]["pp_rank"] == worst == max(by_rank)  # the last stage idles most
    text = run(merged_trace)
    assert text.split("\n")[2:3 + len(findings)] == ["Findings"] + [f"  - {f['text']}" for f in findings]
    assert "Pipeline stages: each step cut into parts that add up to it" in text
    page = run(merged_trace, "--format", "html")
    assert all(escape(f["text"]) in page for f in findings)
    assert page.index("<h2>Findings</h2>") < page.index("Pipeline stages") and 'data-part="recv_wait_ns"' in page


def run(trace: Path, *options: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(trace), *options]) == 0
    return out.getvalue()
