"""The UI's summary counters mean what the report says: read back from merged pipelines with
trace_processor and integrated over each step, a rank row's computing time (level 1) is the
report's stage compute (a GPU's: its step's compute_busy_ns) and an oracle's, computed here
from the input JSON with plain loops; its level-1/2 time is its communication outside compute;
the pipeline root's integral is the mean over ranks of their computing.

On every real torch pipelining set (CPU-only gloo ranks, skipped where ../shared is absent)
and on a generated CUDA-graph pipeline whose ranks' clocks the merge must correct.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from converter.engine.placement import PIPELINE_ROOT_NAME, RANKS_ROOT_NAME
from converter.generator import write_pp_run
from converter.model import TrackRole, roles_document

from .helpers import SHARED_TRACES, merge_files, real_pipeline_copy, rows
from .oracle import load_events, to_ns
from .test_report_oracle import GPU, kind, length, merged, minus, overlap, reported

Intervals = list[tuple[int, int]]
Series = list[tuple[int, float]]
COMMUNICATION_OPS = ("c10d::", "gloo:", "nccl:", "record_param_comms")
TRANSFER_BUFFERS = ("aten::empty", "aten::detach", "detach")
TOLERANCE = 0.01  # of the step: the bound


def real_sets() -> list[str]:
    found = SHARED_TRACES / "torch_pp_cpu"
    return sorted(p.name for p in found.iterdir() if p.is_dir()) if found.is_dir() else ["absent"]


class RankOracle:
    """One rank's input read plainly, on the merge's clock (its base time plus the offset the
    merge applied): its steps, its CPU compute and communication by the report's definition of
    a CPU-only stage, its GPU compute (kernels of compute kind)."""

    def __init__(self, path: Path, offset: int):
        header, events = load_events(path)
        base = int(header.get("baseTimeNanoseconds", 0)) + offset
        spans = [(e, base + to_ns(e["ts"]), base + to_ns(e["ts"]) + to_ns(e["dur"])) for e in events
                 if e.get("ph") == "X" and "ts" in e and to_ns(e.get("dur", 0)) > 0]
        self.steps = {e["name"]: (s, t) for e, s, t in spans
                      if e["name"].startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"}
        work, blocking, communication = [], [], []
        for e, s, t in spans:
            name, category = e["name"], e.get("cat")
            if category in GPU or category == "gpu_user_annotation":
                continue  # a GPU's, not its CPU's
            communicates = name.startswith(COMMUNICATION_OPS)
            if communicates:
                communication.append((s, t))
                if category == "cpu_op":
                    blocking.append((s, t))
            elif category == "cpu_op" and not name.startswith(TRANSFER_BUFFERS):
                work.append((s, t))
        self.cpu_compute = minus(merged(work), merged(blocking))
        self.cpu_communication = minus(merged(communication), self.cpu_compute)
        self.gpu_compute = merged((s, t) for e, s, t in spans if e.get("cat") in GPU and kind(e) == "compute")


def time_at(series: Series, level: float, window: tuple[int, int]) -> int:
    """How long a counter (each value holding until the next sample) is at `level` in `window`."""
    start, end = window
    total = 0
    for (ts, value), (next_ts, _) in zip(series, series[1:] + [(max(end, series[-1][0]), 0.0)]):
        if value == level:
            total += max(0, min(next_ts, end) - max(ts, start))
    return total


def counter_series(output: Path, where: str) -> dict[int, Series]:
    """Per counter track id matching `where` (SQL on track t), its samples in time order."""
    found: dict[int, Series] = {}
    for row in rows(output, f"""select c.track_id, c.ts, c.value from counter c join track t on t.id = c.track_id
                               where {where} order by c.track_id, c.ts"""):
        found.setdefault(row["track_id"], []).append((row["ts"], row["value"]))
    return found


def rank_rows(output: Path) -> dict[int, tuple[Series, list[Series]]]:
    """Per global rank, its CPU row's counter and its GPU rows' counters, found by the track
    roles the merge wrote (the rank's row groups, its lane containers), not by titles."""
    uuid_of = "(select a.int_value from args a where a.arg_set_id = t.source_arg_set_id and a.key = 'trace_id')"
    by_uuid = {row["uuid"]: row["id"] for row in rows(output, f"select t.id, {uuid_of} as uuid from track t")}
    series = counter_series(output, "1")
    found = {}
    for row in rows(output, roles_document.SQL):
        document = roles_document.decode(row["str_value"], output)
        if document.rank is None:
            continue
        cpu = [series[by_uuid[uuid]] for uuid in document.rank.groups if by_uuid.get(uuid) in series]
        gpus = [series[by_uuid[track.uuid]] for track in document.tracks if track.role is TrackRole.LANES]
        assert len(cpu) == 1, document.rank  # one CPU row per rank counts its work
        found[document.rank.global_rank] = (cpu[0], gpus)
    return found


def merge_and_check(files: list[Path], tmp_path: Path, on_gpu: bool) -> int:
    """Merge `files` (one output per pipeline), check every output's counters; the steps checked."""
    summary = merge_files(files, lambda group, groups: tmp_path / f"merged{group}.perfetto-trace")
    checked = 0
    for pipeline in summary.get("pipelines", [summary]):
        output = Path(pipeline["output"])
        offsets = {rank["global_rank"]: rank["applied_offset_ns"]
                   for rank in pipeline.get("clock_alignment", {}).get("ranks", [])}
        oracles = {place["global_rank"]: RankOracle(Path(place["file"]), offsets.get(place["global_rank"], 0))
                   for place in pipeline["pp_ranks"]}
        checked += check_pipeline(output, oracles, on_gpu)
    return checked


def check_pipeline(output: Path, oracles: dict[int, RankOracle], on_gpu: bool) -> int:
    report = reported(output)
    counters = rank_rows(output)
    assert set(counters) == set(oracles)
    stages = {(row["global_rank"], row["step"]): row for row in report["pipeline"]["stages"]}
    gpu_steps = {(gpu["global_rank"], step["step"]): step for gpu in report["gpus"] for step in gpu["steps"]}
    checked = 0
    for rank, oracle in oracles.items():
        cpu, gpus = counters[rank]
        assert len(gpus) == (1 if on_gpu else 0)
        for name, window in oracle.steps.items():
            step = window[1] - window[0]
            close = within(TOLERANCE * step)
            stage = stages[rank, name]
            assert (stage["start_ns"], stage["step_ns"]) == (window[0], step)  # one clock for all three
            # The CPU row: compute by the CPU-only stage's definition, communication outside it at 1/2.
            assert close(time_at(cpu, 1.0, window), length(overlap(oracle.cpu_compute, [window]))), (rank, name)
            assert close(time_at(cpu, 0.5, window), length(overlap(oracle.cpu_communication, [window]))), (rank, name)
            if on_gpu:
                computing = time_at(gpus[0], 1.0, window)
                assert close(computing, gpu_steps[rank, name]["compute_busy_ns"]), (rank, name)
                assert close(computing, length(overlap(oracle.gpu_compute, [window]))), (rank, name)
            else:
                assert close(time_at(cpu, 1.0, window), stage["compute_ns"]), (rank, name)
            checked += 1
    check_root(output, oracles, on_gpu)
    return checked


def check_root(output: Path, oracles: dict[int, RankOracle], on_gpu: bool) -> None:
    """Over each step across ranks (its first start to its last end), the root's % computing
    integrates to the mean of the ranks' computing time, GPU compute or CPU-only compute."""
    [root] = counter_series(output, f"t.name in ('{PIPELINE_ROOT_NAME}', '{RANKS_ROOT_NAME}')").values()
    levels = sorted({value for _, value in root})
    for name in set.intersection(*(set(oracle.steps) for oracle in oracles.values())):
        window = (min(o.steps[name][0] for o in oracles.values()), max(o.steps[name][1] for o in oracles.values()))
        integral = sum(level / 100 * time_at(root, level, window) for level in levels)
        computing = [length(overlap(o.gpu_compute if on_gpu else o.cpu_compute, [window])) for o in oracles.values()]
        assert within(TOLERANCE * (window[1] - window[0]))(integral, sum(computing) / len(computing)), name
        assert 0 < integral < window[1] - window[0]  # dips and rises within the step: neither flat nor empty


def within(tolerance: float) -> Callable[[float, float], bool]:
    return lambda measured, expected: abs(measured - expected) <= tolerance


@pytest.mark.parametrize("name", real_sets())
def test_real_cpu_pipelines(name, tmp_path):
    ranks = real_pipeline_copy(name, tmp_path)
    assert merge_and_check([ranks], tmp_path, on_gpu=False) >= 4


def test_generated_cuda_graph_pipeline(tmp_path):
    # Clocks apart by milliseconds: the counters and the oracle meet only on the merge's clock.
    files = write_pp_run(tmp_path / "ranks", pp_size=4, microbatches=4, steps=2, seed=3, graphs_per_step=2,
                         kernels_per_replay=8, clock_offsets_ns=[0, 3_000_000, -2_000_000, 5_000_000])
    assert merge_and_check(files, tmp_path, on_gpu=True) == 8
