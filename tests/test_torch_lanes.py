"""Traces torch 2.15 already laned at export (`graph_lanes="all"`): graphed work sits on
annotation-named lanes with its real stream in `args.original_stream`. Compaction keeps those
lanes and their names by default, re-lanes by the rules on request, and loses nothing."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter

import pytest

from converter.generator import GeneratorConfig, write_pp_run, write_trace
from converter.model import LaneKind, TrackRole

from .helpers import compact_file, merge_files, rows, track_roles

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
CONFIG = dict(seed=3, steps=2, graphs_per_step=8, kernels_per_replay=40, parallel_branch_fraction=0.4)
GPU_SLICES_SQL = """
    select s.name, s.ts, s.dur, t.name lane from slice s join track t on t.id = s.track_id
    where s.category in ('kernel', 'gpu_memcpy', 'gpu_memset')"""


@pytest.fixture(scope="module")
def laned(tmp_path_factory):
    return write_trace(GeneratorConfig(**CONFIG, graph_lanes="all"),
                       tmp_path_factory.mktemp("laned") / "rank0_trace.json.gz")


def _input(path):
    """(GPU events, lane name per tid, distinct hardware streams), read from the JSON here."""
    document = json.loads(gzip.decompress(path.read_bytes()))
    events = document["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]
    streams = {e["args"].get("original_stream", e["tid"]) for e in gpu}
    streams |= {e["tid"] for e in events if e.get("cat") == "gpu_user_annotation"}
    return document, gpu, names, streams


def _ns(value):
    return round(value * 1000)


def test_the_generator_writes_torchs_laned_shape(laned):
    document, gpu, names, _ = _input(laned)
    assert document["cudaGraphInlineAnnotated"] is True
    moved = [e for e in gpu if "original_stream" in e["args"]]
    assert moved and all(e["args"]["stream"] == e["tid"] != e["args"]["original_stream"] for e in moved)
    assert {names[e["tid"]] for e in moved} >= {"stream 7", "mesh_dp", "symm_mem"}
    assert all(e["args"]["Process Group Description"] == names[e["tid"]] for e in moved if e["tid"] != 7)


def test_lanes_kept_named_streams_counted_nothing_lost(laned, tmp_path):
    _, gpu, names, streams = _input(laned)
    output = tmp_path / "laned.perfetto-trace"
    summary = compact_file(laned, output, verify=True)
    assert summary["lanes_from"] == "the trace's own lanes (cudaGraphInlineAnnotated)"
    assert summary["original_streams"] == len(streams) > 20  # the graphs' streams, not the few lanes
    written = rows(output, GPU_SLICES_SQL)
    # Every GPU slice is there with its name, ts and dur, on a lane named as torch named its lane
    # ("mesh_dp", or "mesh_dp 2" and "stream 7 (2)" where slices moved there overlap).
    expected = Counter((e["name"], _ns(e["ts"]), _ns(e["dur"]), names[e["tid"]]) for e in gpu)
    lanes = set(names.values())

    def lane_of(track: str) -> str:
        return next(lane for lane in lanes if track == lane or re.fullmatch(re.escape(lane) + r" (\d+|\(\d+\))", track))

    found = Counter((r["name"], r["ts"] - summary_base(laned), r["dur"], lane_of(r["lane"])) for r in written)
    assert found == expected
    groups = summary["slice_groups"]
    assert list(groups) == ["stream 7", "stream 11", "mesh_dp", "symm_mem"]  # compute first, then comms by stream
    kinds = {t.label: t.kind for t in track_roles(output) if t.role is TrackRole.LANE}
    assert kinds["stream 7"] is LaneKind.COMPUTE and kinds["mesh_dp"] is kinds["symm_mem"] is LaneKind.COMMUNICATION


def test_relane_groups_by_the_rules_and_counts_the_same_streams(laned, tmp_path):
    _, gpu, _, streams = _input(laned)
    kept = compact_file(laned, tmp_path / "kept.perfetto-trace")
    output = tmp_path / "relaned.perfetto-trace"
    summary = compact_file(laned, output, relane=True)
    assert summary["lanes_from"] == "lane rules"
    assert summary["original_streams"] == kept["original_streams"] == len(streams)
    assert {"Compute", "Symmetric memory", "Memcpy"} <= set(summary["slice_groups"])
    assert sum(summary["slice_groups"].values()) == sum(kept["slice_groups"].values()) == len(gpu)
    assert rows(output, "select count(*) n from slice where category = 'kernel'")[0]["n"] == \
        sum(e["cat"] == "kernel" for e in gpu)


def test_an_unlaned_trace_keeps_the_rules(tmp_path):
    plain = write_trace(GeneratorConfig(**CONFIG), tmp_path / "plain.json.gz")
    summary = compact_file(plain, tmp_path / "plain.perfetto-trace")
    assert summary["lanes_from"] == "lane rules" and "Compute" in summary["slice_groups"]


def test_pp_arrows_and_labels_as_usual(tmp_path):
    counts = {}
    for lanes in ("none", "all"):
        directory = tmp_path / lanes
        files = write_pp_run(directory, 4, steps=2, kernels_per_replay=16, graph_lanes=lanes)
        output = tmp_path / f"{lanes}.perfetto-trace"
        summary = merge_files(files, lambda group, groups: output)
        labels = rows(output, "select count(*) n from cgtrace_derived_slice where category = 'cuda_graph_label'")[0]["n"]
        counts[lanes] = (summary["pp_send_recv_pairs"], summary["pp_send_recv_unmatched"],
                         summary["pp_compute_dependency_pairs"], summary["pp_unshard_compute_pairs"], labels > 0)
    assert counts["all"] == counts["none"] and counts["all"][0] > 0 and counts["all"][1] == 0


def summary_base(path) -> int:
    return json.loads(gzip.decompress(path.read_bytes()))["baseTimeNanoseconds"]
