"""Contracts of the job runner and the model: args strategies agree byte for byte, --verify
covers every file written (or nothing is written), and report reads lanes from track roles."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from converter.analysis.report import build_report
from converter.cli import main
from converter.engine.window import parse_steps, parse_window
from converter.errors import CgtraceError
from converter.generator import GeneratorConfig, write_pp_run, write_trace
from converter.jobs import runner
from converter.lane_rules import DEFAULT_LANES_TOML, load_lane_rules

from .helpers import compact_file, convert_file, merge_files, rows, shared_trace_param, shared_trace_paths

SHARED = shared_trace_paths()


@pytest.mark.parametrize("source", [shared_trace_param(p) for p in SHARED])
def test_args_strategies_write_identical_bytes(tmp_path, source):
    """Whichever strategy the job picks, the same file, byte for byte (compact: the labels and
    annotation coalescing read the args too)."""
    outputs = {}
    for strategy in ("in-process", "helper"):
        outputs[strategy] = tmp_path / f"{strategy}.perfetto-trace"
        compact_file(source, outputs[strategy], args_strategy=strategy)
    assert outputs["in-process"].read_bytes() == outputs["helper"].read_bytes()


def _stepped(tmp_path: Path) -> Path:
    config = GeneratorConfig(seed=5, steps=3, graphs_per_step=4, kernels_per_replay=8, annotation_gaps=True)
    return write_trace(config, tmp_path / "steps.json")


@pytest.mark.parametrize("job", [convert_file, compact_file], ids=["convert", "compact"])
def test_verify_checks_every_step_file(tmp_path, job):
    summary = job(_stepped(tmp_path), tmp_path / "out.perfetto-trace", split_steps=True, verify=True)
    assert len(summary["steps"]) == 3
    for step in summary["steps"]:
        assert step["verified"]["slices"] == step["slices"] and step["verified"]["load_errors"] == 0
        assert Path(step["output"]).is_file()


@pytest.mark.parametrize("cut", [parse_steps("1"), parse_window("1:3")], ids=["steps", "window"])
def test_verify_checks_a_cut_trace(tmp_path, cut):
    summary = compact_file(_stepped(tmp_path), tmp_path / "out.perfetto-trace", window=cut, verify=True)
    assert summary["verified"]["slices"] == summary["slices"] + summary["instants"]
    assert summary["verified"]["flows"] == summary["flows"]


def test_verify_checks_json_output(tmp_path):
    output = tmp_path / "out.json"
    summary = compact_file(_stepped(tmp_path), output, output_format="json", verify=True)
    assert summary["verified"]["slices"] == summary["slices"] + summary["instants"]
    assert summary["verified"]["flows"] == summary["flows"] > 0


def test_verify_checks_a_merge(tmp_path):
    files = write_pp_run(tmp_path / "ranks", pp_size=2, microbatches=2, steps=1, seed=3,
                         graphs_per_step=3, kernels_per_replay=6)
    output = tmp_path / "merged.perfetto-trace"
    summary = merge_files(files, lambda group, groups: output, verify=True)
    found = rows(output, "select (select count(*) from cgtrace_all_slice) slices, (select count(*) from flow) flows")[0]
    assert summary["verified"]["slices"] == found["slices"] and summary["verified"]["flows"] == found["flows"]
    assert summary["verified"]["flows"] >= summary["pp_send_recv_pairs"] > 0


def test_a_failed_verification_writes_nothing(tmp_path):
    """A self-check that cannot pass (here: the trace_processor it must reload with is no
    program) leaves no step file and no output."""
    source = unusable = _stepped(tmp_path)  # the trace itself: a file, but no executable
    with pytest.raises(CgtraceError, match="not an executable"):
        compact_file(source, tmp_path / "out.perfetto-trace", split_steps=True, verify=True, tp_bin=str(unusable))
    with pytest.raises(CgtraceError, match="not an executable"):
        convert_file(source, tmp_path / "one.perfetto-trace", verify=True, tp_bin=str(unusable))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.json"]


def _relabelled_rules(tmp_path: Path) -> Path:
    """Every group renamed, and a new communication group for NCCL broadcast and send/recv kernels."""
    text = DEFAULT_LANES_TOML
    for label in ("Compute", "Symmetric memory", "NCCL all-gather", "NCCL reduce-scatter", "NCCL all-reduce",
                  "NCCL other", "Memcpy", "Memset"):
        text = text.replace(f'label = "{label}"', f'label = "My {label.lower()}"')
    text = text.replace('label = "My compute"', 'label = "Math"')
    text = text.replace("\n[[rules]]\n", '\n[[groups]]\nid = "p2p"\nlabel = "Point to point"\n'
                        'kind = "communication"\n\n[[rules]]\nname = \'(?i)nccl.*(broadcast|send|recv)\'\n'
                        'group = "p2p"\n\n[[rules]]\n', 1)
    path = tmp_path / "lanes.toml"
    path.write_text(text)
    return path


def _figures(report: dict) -> dict:
    return {gpu["gpu"]: (gpu["busy_ns"], gpu["exposed_comm_ns"], gpu["window_ns"]) for gpu in report["gpus"]}


@pytest.mark.parametrize("name", ["hta_nccl_a100.json.gz", "tracelens_b200_eager.json.gz"])
def test_relabelled_lanes_give_the_same_report(tmp_path, name):
    source = next((p for p in SHARED if p.name == name), None)
    if source is None:
        pytest.skip("../shared/traces is absent")
    default, relabelled = tmp_path / "default.perfetto-trace", tmp_path / "relabelled.perfetto-trace"
    compact_file(source, default)
    summary = compact_file(source, relabelled, lanes=load_lane_rules(_relabelled_rules(tmp_path)))
    assert "Math" in summary["lanes_by_group"] and "Compute" not in summary["lanes_by_group"]
    expected, found = build_report(default).figures, build_report(relabelled).figures
    assert found["input"]["lanes_from"] == "track roles"
    assert _figures(found) == _figures(expected) and _figures(found)
    groups = {lane["group"]: lane["kind"] for gpu in found["gpus"] for lane in gpu["lane_groups"]}
    assert set(groups) <= {"Math", "Point to point"} | {g for g in groups if g.startswith("My ")}
    if name == "hta_nccl_a100.json.gz":  # its NCCL kernels include broadcasts
        assert groups["Point to point"] == "communication"
        assert any(gpu["exposed_comm_ns"] > 0 for gpu in found["gpus"])


def test_report_applies_lanes_to_a_raw_trace(tmp_path):
    source = next((p for p in SHARED if p.name == "hta_nccl_a100.json.gz"), None)
    if source is None:
        pytest.skip("../shared/traces is absent")
    lanes = _relabelled_rules(tmp_path)
    out = io.StringIO()
    with redirect_stdout(out):   # the command line compacts raw JSON by these rules first
        assert main(["report", str(source), "--lanes", str(lanes), "--format", "json"]) == 0
    raw = json.loads(out.getvalue())
    compacted = tmp_path / "c.perfetto-trace"
    compact_file(source, compacted, lanes=load_lane_rules(lanes))
    assert raw["gpus"] == build_report(compacted).figures["gpus"]
    assert json.dumps(raw).count("Point to point") > 0
