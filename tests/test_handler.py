"""`trace_handler` as torch.profiler calls it: a stand-in profiler whose export writes a real
Kineto trace (a real GPU trace from ../shared, else a generated one), and real torch.profiler
where torch is installed. The written files are read back with trace_processor."""

from __future__ import annotations

import gzip
import json
import logging
import re
from pathlib import Path

import pytest

import converter
from converter.cli import main
from converter.generator import GeneratorConfig, write_pp_run, write_trace

from .helpers import SHARED_TRACES, rows

REAL = SHARED_TRACES / "hta_triton_small.json.gz"


class StandIn:
    """What the handler uses of torch.profiler.profile: export_chrome_trace."""

    def __init__(self, trace: bytes):
        self.trace = trace

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_bytes(self.trace)


def _kineto_bytes(tmp_path: Path) -> bytes:
    if REAL.is_file():
        return gzip.decompress(REAL.read_bytes())
    return write_trace(GeneratorConfig(seed=4, steps=2, graphs_per_step=4, kernels_per_replay=8),
                       tmp_path / "generated.json").read_bytes()


def _steps(kineto: bytes) -> str:
    """The oracle for a file's name: `steps<first>-<last>` of the ProfilerSteps the JSON holds."""
    steps = sorted({int(event["name"].removeprefix("ProfilerStep#")) for event in json.loads(kineto)["traceEvents"]
                    if str(event.get("name", "")).startswith("ProfilerStep#")})
    return f"steps{steps[0]}-{steps[-1]}" if len(steps) > 1 else f"steps{steps[0]}"


def _apart_from_trace_name(kineto: bytes) -> bytes:
    """The JSON as exported, but for traceName, which the handler sets to the file's own name."""
    return re.sub(rb'"traceName": "[^"]*"', b"", kineto)


def test_the_handler_writes_the_json_and_the_compacted_trace(tmp_path):
    kineto = _kineto_bytes(tmp_path)
    handler = converter.trace_handler(tmp_path / "out", worker_name="trainer")
    handler(StandIn(kineto))
    compacted, exported = handler.written
    name = f"trainer.cycle1.{_steps(kineto)}.pt.trace"
    assert (compacted.name, exported.name) == (f"{name}.perfetto-trace", f"{name}.json")
    assert handler.failures == 0
    assert _apart_from_trace_name(exported.read_bytes()) == _apart_from_trace_name(kineto)
    assert json.loads(exported.read_bytes()).get("traceName", str(exported)) == str(exported)
    by_hand = converter.compact(exported, tmp_path / "by_hand.perfetto-trace").output   # `cgtrace compact`
    count = "select count(*) n, count(distinct track_id) tracks, sum(dur) busy from slice"
    assert rows(compacted, count) == rows(by_hand, count) and rows(compacted, count)[0]["n"] > 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([compacted.name, exported.name])


def test_the_json_is_gzipped_or_dropped_as_asked(tmp_path):
    kineto = _kineto_bytes(tmp_path)
    packed = converter.trace_handler(tmp_path / "gz", worker_name="w", gzip_json=True)
    packed(StandIn(kineto))
    unpacked = gzip.decompress(packed.written[-1].read_bytes())
    assert _apart_from_trace_name(unpacked) == _apart_from_trace_name(kineto)
    assert json.loads(unpacked).get("traceName", str(packed.written[-1])) == str(packed.written[-1])
    dropped = converter.trace_handler(tmp_path / "none", keep_json=False, worker_name="w")
    dropped(StandIn(kineto))
    assert list((tmp_path / "none").iterdir()) == dropped.written   # the dropped JSON is not listed
    assert [p.name for p in dropped.written] == [f"w.cycle1.{_steps(kineto)}.pt.trace.perfetto-trace"]


def test_a_failure_is_logged_and_counted_never_raised(tmp_path, caplog):
    handler = converter.trace_handler(tmp_path, keep_json=False, worker_name="w")
    with caplog.at_level(logging.ERROR, logger="cgtrace"):
        handler(StandIn(b'{"traceEvents": [{"ph": "X", "name": "cut off'))
    assert handler.failures == 1 and "cgtrace compact" in (handler.last_error or "")
    assert [p.name for p in tmp_path.iterdir()] == ["w.cycle1.pt.trace.json"]   # kept, to convert later; no steps in it
    assert "cgtrace compact" in caplog.text


def test_a_distributed_run_is_named_by_rank_and_merges(tmp_path):
    """No torch.distributed here: each rank comes from its trace's header."""
    ranks = write_pp_run(tmp_path / "ranks", pp_size=2, seed=3, graphs_per_step=2, kernels_per_replay=4)
    handler = converter.trace_handler(tmp_path / "run")
    for rank in ranks:
        handler(StandIn(rank.read_bytes()))
    steps = _steps(ranks[0].read_bytes())
    assert {p.name for p in handler.written} >= {f"rank0.cycle1.{steps}.pt.trace.json", f"rank1.cycle1.{steps}.pt.trace.json"}
    assert main(["merge", str(tmp_path / "run"), "-q"]) == 0
    [merged] = rows(tmp_path / "run" / "pp_traces_merged.perfetto-trace", "select count(*) n from flow")
    assert merged["n"] > 0


def test_real_torch_profiler(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed; the stand-in tests cover the handler")
    handler = converter.trace_handler(tmp_path)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=2),
                                on_trace_ready=handler) as profiler:
        for _ in range(4):
            torch.ones(64, 64) @ torch.ones(64, 64)
            profiler.step()
    assert handler.failures == 0, handler.last_error
    compacted = next(p for p in handler.written if p.name.endswith(".perfetto-trace"))
    assert rows(compacted, "select count(*) n from slice where name like 'aten::%'")[0]["n"] > 0
