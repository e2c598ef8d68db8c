"""One clock for every rank: a merge finds each rank's clock offset in its collectives and
transfers, and moves ranks whose base times disagree, whole and within the stated uncertainty."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from converter.analysis.render import render_text
from converter.analysis.report import build_report
from converter.engine.clock import Bound, Collectives, estimate_clocks
from converter.generator.writer import write_pp_run

from .helpers import SHARED_TRACES, merge_files, rows

DLRM = SHARED_TRACES / "dlrm_8ranks"
CPU_PIPELINE = SHARED_TRACES / "torch_pp_cpu" / "torch215_1f1b_pp4"
# Cross-rank arrows leave a send (rank-local arrows only ever end on one); the UI draws one
# backwards when its target starts before its source ends, unless the source starts no earlier.
BACKWARD_ARROWS_SQL = """
    select count(*) n from flow f join cgtrace_all_slice so on so.id = f.slice_out join cgtrace_all_slice si on si.id = f.slice_in
    where (so.name glob 'PP:*SEND_*' or so.name = 'c10d::send')
      and si.ts < so.ts + so.dur and so.ts < si.ts"""


def _shifted_copies(source: Path, target: Path, offsets_us: list[int]) -> list[Path]:
    """Each rank's trace with every event's ts moved by its offset (a host clock that is off)."""
    target.mkdir()
    files = []
    for path, offset in zip(sorted(source.glob("rank*_trace.json.gz")), offsets_us):
        document = json.loads(gzip.decompress(path.read_bytes()))
        for event in document["traceEvents"]:
            if "ts" in event:
                event["ts"] += offset
        files.append(target / path.name.removesuffix(".gz"))
        files[-1].write_text(json.dumps(document))
    return files


def _nccl_kernel_starts(output: Path, correlations: list[int]) -> list[int]:
    """Where the output puts each rank's NCCL kernel of that correlation id."""
    found = rows(output, "select s.ts, a.int_value correlation from slice s join args a using (arg_set_id) "
                         "where a.key = 'debug.args.correlation' and s.name glob 'ncclKernel*'")
    starts = [[row["ts"] for row in found if row["correlation"] == correlation] for correlation in correlations]
    assert all(len(ts) == 1 for ts in starts), starts
    return [ts[0] for ts in starts]


@pytest.mark.skipif(not DLRM.is_dir(), reason="../shared/traces is absent")
@pytest.mark.parametrize("shifted", [True, False])
def test_real_ranks_with_clocks_off_by_milliseconds_land_within_10us(tmp_path, shifted):
    rng = random.Random(7)
    offsets = [rng.randint(-20_000, 20_000) if shifted else 0 for _ in range(8)]
    files = _shifted_copies(DLRM, tmp_path / "ranks", offsets)
    # One all-reduce kernel per rank: the truth is where the unshifted capture has it.
    kernels = [[e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
                if e.get("cat") == "kernel" and "AllReduce" in e["name"]][0]
               for path in sorted(DLRM.glob("rank*_trace.json.gz"))]
    output = tmp_path / "merged.perfetto-trace"
    summary = merge_files(files, lambda group, groups: output)
    placed = _nccl_kernel_starts(output, [kernel["args"]["correlation"] for kernel in kernels])
    truth = [kernel["ts"] * 1000 for kernel in kernels]
    clock = summary["clock_alignment"]
    assert clock["applied"] is shifted and not clock["warnings"]
    if shifted:  # rank 0 keeps its clock: the others are placed against it
        placed = [ts - placed[0] for ts in placed]
        truth = [ts - truth[0] for ts in truth]
    assert max(abs(a - b) for a, b in zip(placed, truth)) <= 10_000
    assert all(rank["evidence"] == {"collectives": 8} for rank in clock["ranks"])


def _truth(offsets: list[int], drift_ppm: list[float], rank: int, reference: int, at: int) -> float:
    """What must be added to `rank`'s times to put them on `reference`'s clock, at `at` ns after the origin."""
    def reading(g: int) -> float:
        return offsets[g] + drift_ppm[g] * at / 1e6
    return reading(reference) - reading(rank)


@pytest.mark.parametrize("nccl", [True, False], ids=["collectives", "transfers only"])
def test_generated_dp_by_pp_ranks_align_within_their_uncertainty(tmp_path, nccl):
    offsets = [0, 3_000_000, -1_500_000, 700_000, 2_000_000, -400_000, 150_000, 900_000]
    drift_ppm = [0.0, 20.0, -10.0, 1500.0, 0.0, 10.0, 30.0, -20.0]
    files = write_pp_run(tmp_path / "ranks", 4, dp_size=2, steps=8, seed=3, kernels_per_replay=8,
                         include_nccl=nccl, clock_offsets_ns=offsets, clock_drift_ppm=drift_ppm)
    summary = merge_files(files, lambda group, groups: tmp_path / f"pp{group}.perfetto-trace")
    for pipeline in summary["pipelines"]:
        clock, output = pipeline["clock_alignment"], Path(pipeline["output"])
        assert clock["applied"]
        reference = pipeline["pp_ranks"][0]["global_rank"]
        span = rows(output, "select min(ts) first, max(ts + dur) last from slice where name glob 'PP:*'")[0]
        origin = 1_712_195_495_519_543_604 + offsets[reference]  # the generator's default base time
        for rank in clock["ranks"]:
            for at in (span["first"] - origin, span["last"] - origin):  # across the pipeline's work
                error = rank["applied_offset_ns"] - _truth(offsets, drift_ppm, rank["global_rank"], reference, at)
                assert abs(error) <= rank["uncertainty_ns"], (rank, at)
            assert rank["evidence"].get("collectives", 0) == (9 if nccl else 0)
        assert pipeline["pp_send_recv_pairs"] > 0
        assert rows(output, BACKWARD_ARROWS_SQL)[0]["n"] == 0  # arrivals land after their sends on one clock
    drifting = [w for p in summary["pipelines"] for w in p["clock_alignment"]["warnings"] if "drift" in w]
    # Rank 3 gains 1500 ppm: every rank of its pipeline drifts against it, and only there.
    assert len(drifting) == (3 if nccl else 0) and all("global rank 3" in warning for warning in drifting)


def test_generated_gpu_pipeline_draws_no_arrow_backwards_after_alignment(tmp_path):
    files = write_pp_run(tmp_path / "ranks", 4, steps=8, seed=3, kernels_per_replay=8,
                         clock_offsets_ns=[0, 3_000_000, -1_500_000, 700_000])
    output = tmp_path / "merged.perfetto-trace"
    assert merge_files(files, lambda group, groups: output)["clock_alignment"]["applied"]
    assert rows(output, BACKWARD_ARROWS_SQL)[0]["n"] == 0


@pytest.mark.skipif(not CPU_PIPELINE.is_dir(), reason="../shared/traces is absent")
def test_cpu_only_ranks_align_within_their_transfers_bounds(tmp_path):
    offsets = [0, 3_000_000, -1_500_000, 700_000]
    target = tmp_path / "ranks"
    target.mkdir()
    for path in sorted(CPU_PIPELINE.glob("rank*_trace.json.gz")):
        document = json.loads(gzip.decompress(path.read_bytes()))
        document["baseTimeNanoseconds"] += offsets[document["distributedInfo"]["rank"]]
        (target / path.name.removesuffix(".gz")).write_text(json.dumps(document))
    output = tmp_path / "merged.perfetto-trace"
    clock = merge_files(sorted(target.iterdir()), lambda group, groups: output)["clock_alignment"]
    assert clock["applied"]
    for rank in clock["ranks"]:
        assert abs(rank["applied_offset_ns"] + offsets[rank["global_rank"]]) <= rank["uncertainty_ns"]
        assert set(rank["evidence"]) == {"transfer bounds"}
    assert rows(output, BACKWARD_ARROWS_SQL)[0]["n"] == 0


def test_clocks_that_agree_leave_the_merge_as_it_was(tmp_path):
    files = write_pp_run(tmp_path / "ranks", 2, steps=4, seed=1, kernels_per_replay=8)
    outputs = {}
    for align in ("auto", "none"):
        outputs[align] = tmp_path / f"{align}.perfetto-trace"
        summary = merge_files(files, lambda group, groups: outputs[align], align=align)
        assert ("clock_alignment" in summary) is (align == "auto")
    assert outputs["auto"].read_bytes() == outputs["none"].read_bytes()


def test_base_time_reports_the_skew_but_keeps_the_base_times(tmp_path):
    files = write_pp_run(tmp_path / "ranks", 4, steps=8, seed=3, kernels_per_replay=8,
                         clock_offsets_ns=[0, 2_000_000, 0, 0])
    summary = merge_files(files, lambda group, groups: tmp_path / "m.perfetto-trace", align="base-time")
    clock = summary["clock_alignment"]
    assert not clock["applied"] and all(rank["applied_offset_ns"] == 0 for rank in clock["ranks"])
    assert any(abs(rank["estimated_offset_ns"]) > 1_900_000 for rank in clock["ranks"]), clock


def test_a_rank_sharing_nothing_keeps_its_prior_and_says_so():
    clocks = estimate_clocks([Collectives(), Collectives(), Collectives()], [Bound(0, 1, 5_000, 2_000)],
                             ["rank a", "rank b", "rank c"])
    assert clocks.ranks[2].offset_ns == 0 and clocks.ranks[2].uncertainty_ns is None
    assert clocks.warnings == ["rank c: no collective or transfer shared with the other ranks; keeps its base time"]
    # A one-sided bound moves rank b just far enough that its receive ends after the send began.
    assert clocks.ranks[1].offset_ns == 3_000 and clocks.skewed()


def test_the_report_of_a_merge_says_how_each_rank_was_moved(tmp_path):
    """What the merge's summary says of the clocks travels in the trace (its track roles), so
    `cgtrace report` on the merged file gives the same offsets, uncertainties and evidence."""
    files = write_pp_run(tmp_path / "ranks", 4, steps=4, seed=3, kernels_per_replay=8,
                         clock_offsets_ns=[0, 3_000_000, -1_500_000, 700_000])
    output = tmp_path / "merged.perfetto-trace"
    summary = merge_files(files, lambda group, groups: output)
    placed = {rank["global_rank"]: rank for rank in summary["clock_alignment"]["ranks"]}
    figures = build_report(output).figures
    assert len(figures["clocks"]) == 4
    assert [clock["pp_rank"] for clock in figures["clocks"]] == [0, 1, 2, 3]
    for clock in figures["clocks"]:
        rank = placed[clock["global_rank"]]
        assert (clock["offset_ns"], clock["uncertainty_ns"], clock["evidence"]) == \
            (rank["applied_offset_ns"], rank["uncertainty_ns"], rank["evidence"])
    assert any(clock["offset_ns"] for clock in figures["clocks"])
    assert "Clocks: how the merge moved each rank's times" in render_text(figures)


def _plain_ddp(tmp_path: Path) -> list[Path]:
    """Real DDP ranks: global ranks 0 and 1 of the torch 2.15 DP x PP set share their gloo
    all-reduces (their mesh_dp group); written as plain DDP does, a world of two with only
    default_pg and no point-to-point transfer, so the all-reduces are all they share."""
    source = SHARED_TRACES / "torch_pp_cpu" / "dp2_pp2"
    if not source.is_dir():
        pytest.skip("../shared/traces is absent")
    files = []
    for rank in (0, 1):
        document = json.loads(gzip.decompress((source / f"rank{rank}_trace.json.gz").read_bytes()))
        document["distributedInfo"].update(world_size=2, pg_config=[
            {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo,cuda:gloo", "pg_size": 2,
             "ranks": [0, 1]}])
        document["traceEvents"] = [event for event in document["traceEvents"] if not str(event.get("name", ""))
                                   .startswith(("c10d::send", "c10d::recv", "gloo:send", "gloo:recv"))]
        files.append(tmp_path / f"rank{rank}_trace.json")
        files[-1].write_text(json.dumps(document))
    return files


def test_plain_ddp_ranks_align_on_their_gloo_all_reduces(tmp_path):
    """No NCCL kernel and no transfer: the gloo all-reduce spans end together on both ranks (one
    host: their base times agree), so the merge uses them and warns of nothing shared."""
    summary = merge_files(_plain_ddp(tmp_path), lambda group, groups: tmp_path / "ddp.perfetto-trace")
    clock = summary["clock_alignment"]
    assert not [warning for warning in clock["warnings"] if "shared" in warning]
    for rank in clock["ranks"]:
        assert rank["evidence"].get("collectives") == 2
        assert abs(rank["estimated_offset_ns"]) <= max(rank["uncertainty_ns"], 0) <= 100_000
    assert not clock["applied"]


def test_gloo_spans_of_groups_smaller_than_the_world_are_no_evidence(tmp_path):
    """In DP x PP the two ranks of a pipeline all-reduce in different DP groups: their gloo
    spans name no group, so they are not matched as one collective."""
    source = SHARED_TRACES / "torch_pp_cpu" / "dp2_pp2"
    if not source.is_dir():
        pytest.skip("../shared/traces is absent")
    summary = merge_files(sorted(source.glob("rank*_trace.json.gz")),
                          lambda group, groups: tmp_path / f"pp{group}.perfetto-trace")
    for pipeline in summary["pipelines"]:
        assert all("collectives" not in rank["evidence"] for rank in pipeline["clock_alignment"]["ranks"])
