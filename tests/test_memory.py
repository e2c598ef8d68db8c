"""Memory counters and memcpy traffic (issue 55): what cgtrace writes, read back through
trace_processor, against an oracle computed from the input JSON with plain loops."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from converter.generator import GeneratorConfig, write_trace
from .helpers import SHARED_TRACES, compact_file, convert_file, merge_files, rows, write_json
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
        join cgtrace_track t on t.track_id = c.track_id join cgtrace_track g on g.track_id = t.gpu_track_id
        where c.meaning glob 'memory *'""")
    assert {row["meaning"] for row in placed} == {"memory allocated", "memory reserved"}
    assert all(row["gpu_role"] == "lanes" and row["gpu_row"] == f"GPU {row['device']}" for row in placed)
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


def expected_steps(path: Path) -> list[tuple[str, int, int]]:
    """The CPU-side ProfilerStep spans (name, start, end) in ns, by start."""
    header, events = load_events(path)
    base = header.get("baseTimeNanoseconds", 0)
    steps = [(event["name"], base + to_ns(event["ts"]), base + to_ns(event["ts"]) + to_ns(event["dur"]))
             for event in events if event.get("ph") == "X" and str(event.get("name", "")).startswith("ProfilerStep#")
             and event.get("cat") != "gpu_user_annotation"]
    return sorted(steps, key=lambda step: step[1])


def expected_peaks(path: Path, series: dict[int, dict[int, Decimal]]) -> dict[tuple[str, int], int]:
    """Per (step, device): the highest value in the step, the one held as it begins included."""
    peaks = {}
    for name, start, end in expected_steps(path):
        for device, at in series.items():
            held = [value for ts, value in sorted(at.items()) if ts <= start]
            inside = [value for ts, value in at.items() if start <= ts < end] + held[-1:]
            if inside:
                peaks[(name, device)] = int(max(inside))
    return peaks


def expected_memcpy(path: Path) -> dict[tuple[str, str], tuple[int, int, int]]:
    """Per (step, direction): copies, bytes and summed duration of the copies starting in the step."""
    header, events = load_events(path)
    base = header.get("baseTimeNanoseconds", 0)
    steps = expected_steps(path)
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for event in events:
        if event.get("ph") == "X" and event.get("cat") in ("gpu_memcpy", "Memcpy"):
            ts = base + to_ns(event["ts"])
            step = next((name for name, start, end in steps if start <= ts < end), None)
            total = totals[(step, event["name"].split()[1])]
            total[0] += 1
            total[1] += event["args"]["bytes"]
            total[2] += to_ns(event["dur"])
    return {key: tuple(value) for key, value in totals.items()}


def report_of(trace: Path) -> dict:
    from converter.analysis.report import build_report

    return build_report(trace).figures


def device_number(name: str) -> int:
    return -1 if name == "CPU" else int(name.split()[1])


@pytest.mark.parametrize("source", ["generated", "old_format"])
def test_report_peaks_and_memcpy_equal_the_oracles(source, generated, tmp_path):
    path = generated if source == "generated" else OLD_FORMAT
    if not path.is_file():
        pytest.skip("../shared/traces is absent")
    compact_file(path, tmp_path / "c.pftrace")
    figures = report_of(tmp_path / "c.pftrace")
    for field, series in (("peak_allocated_bytes", expected_allocated(path)),
                          ("peak_reserved_bytes", expected_reserved(path))):
        expected = expected_peaks(path, series)
        assert len(expected) >= 2 or (field == "peak_reserved_bytes" and source == "old_format")
        assert {(row["step"], device_number(row["device"])): row[field] for row in figures["memory"]
                if row[field] is not None} == expected
    copies = expected_memcpy(path)
    assert copies
    assert {(row["step"], row["direction"]): (row["copies"], row["bytes"], row["copy_ns"])
            for row in figures["memcpy"]} == copies
    assert all(row["bandwidth_gb_s"] == row["bytes"] / row["copy_ns"] for row in figures["memcpy"])


def test_report_memcpy_per_direction_on_real_traces(tmp_path):
    """Copies of several directions (the B200 capture: HtoD and DtoD) sum per direction and step."""
    path = SHARED_TRACES / "tracelens_b200_eager.json.gz"
    if not path.is_file():
        pytest.skip("../shared/traces is absent")
    compact_file(path, tmp_path / "c.pftrace")
    figures = report_of(tmp_path / "c.pftrace")
    expected = expected_memcpy(path)
    assert {direction for _, direction in expected} == {"HtoD", "DtoD"}
    assert {(row["step"], row["direction"]): (row["copies"], row["bytes"], row["copy_ns"])
            for row in figures["memcpy"]} == expected
    assert "memory" not in figures, "no [memory] events: no memory figures"


@pytest.mark.parametrize("reverse", [False, True])
def test_at_one_timestamp_the_last_events_total_holds(tmp_path, reverse):
    """Three allocations at one time (90 -> 100 -> 50 -> 80 bytes): the last one's total holds,
    whatever order the file lists them in (the model's order comes from content alone)."""
    chain = [(100, 10, 2), (50, -50, 2), (80, 30, 2), (60, -20, 3)]
    memory = [{"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
               "args": {"Device Id": -1, "Device Type": 0, "Total Allocated": total, "Total Reserved": 128,
                        "Bytes": size}} for total, size, ts in chain]
    ordered = memory[2::-1] + memory[3:] if reverse else memory
    source = write_json(tmp_path / "t.json", {"traceEvents": [
        {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 1, "dur": 5},
        *ordered]})
    convert_file(source, tmp_path / "c.pftrace")
    expected = {-1: {2000: Decimal(80), 3000: Decimal(60)}}
    if not reverse:  # listed in the chain's order, the file's last event is the oracle's
        assert expected_allocated(source) == expected
    assert counters(tmp_path / "c.pftrace", "memory allocated") == expected
    assert counters(tmp_path / "c.pftrace", "memory reserved") == {-1: {2000: Decimal(128), 3000: Decimal(128)}}
    figures = report_of(tmp_path / "c.pftrace")
    assert [(row["step"], row["peak_allocated_bytes"]) for row in figures["memory"]] == [("ProfilerStep#1", 80)]
