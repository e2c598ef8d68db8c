"""Memory counters and memcpy traffic (issue 55): what cgtrace writes, read back through
trace_processor, against an oracle computed from the input JSON with plain loops."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from converter.generator import GeneratorConfig, write_trace
from .helpers import SHARED_TRACES, compact_file, convert_file, merge_files, rows
from .oracle import load_events, to_ns

OLD_FORMAT = SHARED_TRACES / "kineto_2021_resnet50_old_format.json.gz"


def expected_allocated(path: Path) -> dict[int, dict[int, Decimal]]:
    """Per device, per memory event timestamp (ns), the allocated total after the last event at
    that time: `Total Allocated` where every event of the device has it, else the running sum
    of `Bytes` from its first event, in timestamp order (the file's order among equal times)."""
    header, events = load_events(path)
    base = header.get("baseTimeNanoseconds", 0)
    by_device: dict[int, list[tuple[int, dict]]] = defaultdict(list)
    for event in events:
        if event.get("name") == "[memory]" and event.get("ph") == "i":
            by_device[event["args"]["Device Id"]].append((base + to_ns(event["ts"]), event["args"]))
    expected: dict[int, dict[int, Decimal]] = {}
    for device, found in by_device.items():
        found.sort(key=lambda item: item[0])
        totals = all("Total Allocated" in args for _, args in found)
        running, at = Decimal(0), {}
        for ts, args in found:
            running += Decimal(args["Bytes"])
            at[ts] = Decimal(args["Total Allocated"]) if totals else running
        expected[device] = at
    return expected


def expected_reserved(path: Path) -> dict[int, dict[int, Decimal]]:
    header, events = load_events(path)
    base = header.get("baseTimeNanoseconds", 0)
    expected: dict[int, dict[int, Decimal]] = defaultdict(dict)
    for event in sorted((e for e in events if e.get("name") == "[memory]" and "Total Reserved" in e["args"]),
                        key=lambda e: Decimal(e["ts"])):
        expected[event["args"]["Device Id"]][base + to_ns(event["ts"])] = Decimal(event["args"]["Total Reserved"])
    return dict(expected)


def counters(trace: Path, meaning: str) -> dict[int, dict[int, Decimal]]:
    found: dict[int, dict[int, Decimal]] = defaultdict(dict)
    for row in rows(trace, f"select device, ts, value from cgtrace_counter where meaning = '{meaning}'"):
        assert row["ts"] not in found[row["device"]], "one sample per time"
        found[row["device"]][row["ts"]] = Decimal(row["value"])
    return dict(found)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    return write_trace(GeneratorConfig(seed=3, steps=3, graphs_per_step=2, kernels_per_replay=8),
                       tmp_path_factory.mktemp("memory") / "t.json")


def test_generated_counters_equal_each_events_totals(generated, tmp_path):
    compact_file(generated, tmp_path / "c.pftrace")
    allocated, reserved = expected_allocated(generated), expected_reserved(generated)
    assert allocated and reserved, "the generator writes [memory] events with totals"
    assert counters(tmp_path / "c.pftrace", "memory allocated") == allocated
    assert counters(tmp_path / "c.pftrace", "memory reserved") == reserved


def test_counters_sit_in_their_gpus_row_group(generated, tmp_path):
    compact_file(generated, tmp_path / "c.pftrace")
    placed = rows(tmp_path / "c.pftrace", """
        select distinct c.device, c.meaning, g.name as gpu_row, g.role as gpu_role from cgtrace_counter c
        join cgtrace_track t on t.track_id = c.track_id join cgtrace_track g on g.track_id = t.parent_id
        where c.meaning glob 'memory *'""")
    assert placed and all(row["gpu_role"] == "lanes" and row["gpu_row"] == f"GPU {row['device']}" for row in placed)
    # The instants stay as they were.
    _, events = load_events(generated)
    instants = sum(1 for event in events if event.get("name") == "[memory]")
    assert rows(tmp_path / "c.pftrace", "select count(*) as n from slice where name = '[memory]' and dur = 0")[0]["n"] \
        == instants


def test_converted_and_merged_traces_carry_the_counters(tmp_path):
    ranks = [write_trace(GeneratorConfig(seed=5, steps=2, graphs_per_step=2, kernels_per_replay=8, pp_size=2,
                                         pp_rank=rank), tmp_path / f"r{rank}.json") for rank in range(2)]
    convert_file(ranks[0], tmp_path / "c.pftrace")
    assert counters(tmp_path / "c.pftrace", "memory allocated") == expected_allocated(ranks[0])
    merge_files(ranks, lambda group, groups: tmp_path / "m.pftrace")
    merged = rows(tmp_path / "m.pftrace", """select global_rank, device, count(*) as n from cgtrace_counter
                                             where meaning = 'memory allocated' group by 1, 2""")
    assert {(row["global_rank"], row["device"]): row["n"] for row in merged} == {
        (rank, device): len(samples) for rank, path in enumerate(ranks)
        for device, samples in expected_allocated(path).items()}


def test_old_format_allocated_is_the_running_sum_of_bytes(tmp_path):
    if not OLD_FORMAT.is_file():
        pytest.skip("../shared/traces is absent")
    compact_file(OLD_FORMAT, tmp_path / "c.pftrace")
    expected = expected_allocated(OLD_FORMAT)
    assert set(expected) == {-1, 0}
    assert counters(tmp_path / "c.pftrace", "memory allocated") == expected
    assert counters(tmp_path / "c.pftrace", "memory reserved") == {}, "2021 traces write no reserved total"
