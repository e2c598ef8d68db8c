"""docs/sql.md, "Why the GPU waits": its three queries over what compact wrote (the idle-cause
and queue depth counters, the `cgtrace_launch` args) give the report's JSON exactly, on real
traces, with the report's default (launched) step windows, or a GPU's active span where it has
no profiler step (tracelens_b200_eager)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import SHARED_TRACES, compact_file
from .test_sql_tables import query, question, report

PARTS = ("idle_ns", "queued_ns", "host_sync_ns", "peer_ns", "host_behind_ns", "other_ns")


@pytest.fixture(scope="module", params=["hta_cuda_graph_rank0", "hta_nccl_a100", "tracelens_b200_eager"])
def compacted(request, tmp_path_factory) -> tuple[Path, dict]:
    source = SHARED_TRACES / f"{request.param}.json.gz"
    if not source.is_file():
        pytest.skip("../shared/traces is absent")
    output = tmp_path_factory.mktemp("why") / "out.perfetto-trace"
    compact_file(source, output)
    return output, report(output, "--top", 100000)


def test_idle_by_cause_is_a_sum_over_the_counter(compacted) -> None:
    output, figures = compacted
    [gpu] = figures["gpus"]
    found = query(output, question("Idle by cause per GPU and step"))
    assert found and all(row["gpu"] == gpu["gpu"] for row in found)
    assert [{"step": row["step"], **{part: row[part] for part in PARTS}} for row in found] == gpu["idle_by_cause"]


def test_queue_depth_is_read_off_the_counters(compacted) -> None:
    output, figures = compacted
    [gpu] = figures["gpus"]
    found = query(output, question("Queue depth per stream and step"))
    written = {(row["step"], row["stream"]): (row["max_depth"], row["mean_depth"]) for row in found}
    reported = {(step["step"], depth["stream"]): (depth["max_depth"], pytest.approx(depth["mean_depth"]))
                for step in gpu["launches"] for depth in step["queue_depth"]}
    assert written and written == reported


def test_gpu_time_by_op_through_the_launch_args(compacted) -> None:
    output, figures = compacted
    [gpu] = figures["gpus"]
    found = query(output, question("Each GPU's time in the steps by the op that launched it"))
    assert [{"op": row["op"], "gpu_slices": row["gpu_slices"], "total_ns": row["total_ns"]} for row in found] \
        == gpu["gpu_time_by_op"]["ops"]


def test_gpu_time_by_annotation_module_and_no_op_through_the_launch_args(compacted) -> None:
    """The rest of the report's gpu_time_by_op (with --top beyond every name, so nothing is cut)."""
    output, figures = compacted
    [gpu] = figures["gpus"]
    found = query(output, question("Each GPU's time in the steps by annotation, module, and what no op launched"))
    assert found and all(row["gpu"] == gpu["gpu"] for row in found)
    by_part: dict[str, list[dict]] = {}
    for row in found:
        by_part.setdefault(row["part"], []).append(row)

    def named(part: str, label: str) -> list[dict]:
        return [{label: row["name"], "gpu_slices": row["gpu_slices"], "total_ns": row["total_ns"]}
                for row in by_part.get(part, [])]

    reported = gpu["gpu_time_by_op"]
    assert named("annotation", "annotation") == reported["annotations"]
    assert named("module", "module") == reported["modules"]
    assert named("reason", "reason") == reported["unattributed"]
    [every] = by_part["all"]
    assert (every["gpu_slices"], every["total_ns"]) == (reported["gpu_slices"], reported["total_ns"])
    no_op = by_part.get("no op", [{"gpu_slices": 0, "total_ns": 0}])
    assert [{"gpu_slices": row["gpu_slices"], "total_ns": row["total_ns"] or 0} for row in no_op] == [reported["no_op"]]


def test_a_merge_writes_each_ranks_counters_on_the_pipelines_clock(tmp_path: Path) -> None:
    """A generated 3-rank CUDA-graph pipeline with skewed clocks, merged: each rank's GPU has
    its own "Why idle" counter, moved with its slices onto the pipeline's clock, and the query
    gives each GPU's report figures; a merge writes no queue depth rows (cli.md says why)."""
    from converter.generator import write_pp_run

    from .helpers import merge_files

    files = write_pp_run(tmp_path / "run", pp_size=3, microbatches=2, steps=2, seed=4, graphs_per_step=2,
                         kernels_per_replay=6, clock_offsets_ns=[0, 400_000, -250_000])
    merged = tmp_path / "merged.perfetto-trace"
    merge_files(files, lambda group, groups: merged)
    figures = report(merged)
    assert len(figures["gpus"]) == 3
    idle = query(merged, question("Idle by cause per GPU and step"))
    depth = query(merged, question("Queue depth per stream and step"))
    by_gpu_track = {row["gpu"] for row in idle}
    assert len(by_gpu_track) == 3  # one counter per rank's GPU
    written = sorted(tuple(row[part] for part in PARTS) for row in idle)
    assert written == sorted(tuple(step[part] for part in PARTS) for gpu in figures["gpus"]
                             for step in gpu["idle_by_cause"])
    assert depth == [] and all(step["queue_depth"] for gpu in figures["gpus"] for step in gpu["launches"])
