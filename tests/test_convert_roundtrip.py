"""Must show 1-3 of the foundation: convert is lossless, as trace_processor reads the output."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from converter.model.derived import ATTRIBUTION

from .helpers import convert_file

from .helpers import problem_stats, rows, shared_trace_param, shared_trace_paths, write_json
from .oracle import expected_from

ARG_PREFIX = "debug.args."
# What a compact adds beside a GPU slice's own args (engine/attribution.py): not the input's.
ADDED_ARGS = f"{ARG_PREFIX}{ATTRIBUTION}.*"


def actual_slices(trace, skip_categories=()) -> tuple[Counter, Counter]:
    """(name, ts, dur) and (name, ts, dur, flat args) multisets as trace_processor reads them."""
    skipped = ", ".join(f"'{c}'" for c in skip_categories)
    where = f"where coalesce(s.category, '') not in ({skipped})" if skipped else ""
    args_by_slice: dict[int, dict] = {}
    basics = {}
    for row in rows(trace, f"""
            select s.id, s.name, s.ts, s.dur, a.key, a.int_value, a.string_value, a.real_value
            from slice s left join args a
              on a.arg_set_id = s.arg_set_id and a.key glob '{ARG_PREFIX}*' and a.key not glob '{ADDED_ARGS}'
            {where}"""):
        basics[row["id"]] = (row["name"], row["ts"], row["dur"])
        flat = args_by_slice.setdefault(row["id"], {})
        if row["key"] is not None:
            value = next(v for v in (row["int_value"], row["string_value"], row["real_value"]) if v is not None)
            flat[row["key"][len(ARG_PREFIX):]] = value
    slices = Counter(basics.values())
    with_args = Counter(basics[i] + (frozenset(args_by_slice[i].items()),) for i in basics)
    return slices, with_args


def actual_flows(trace) -> Counter:
    return Counter((r["sn"], r["sts"], r["dn"], r["dts"]) for r in rows(trace, """
        select so.name sn, so.ts sts, si.name dn, si.ts dts from flow f
        join cgtrace_all_slice so on f.slice_out = so.id join cgtrace_all_slice si on f.slice_in = si.id"""))


def assert_lossless(source: Path, output: Path, summary: dict) -> None:
    expected = expected_from(source)
    assert problem_stats(output) == []
    slices, with_args = actual_slices(output)
    assert slices == expected.slices
    assert with_args == expected.slice_args
    assert actual_flows(output) == expected.flows
    assert summary["flows"] == sum(expected.flows.values())
    # The input's counters, as written; memory counters are derived from its [memory] instants (test_memory.py).
    counters = Counter((r["ts"], r["value"]) for r in rows(
        output, "select ts, value from cgtrace_counter where meaning not in ('memory allocated', 'memory reserved')"))
    assert counters == expected.counter_values
    process_names = {r["name"] for r in rows(output, "select name from process")}
    thread_names = {r["name"] for r in rows(output, "select name from thread")}
    assert set(expected.process_names.values()) <= process_names
    assert set(expected.thread_names.values()) <= thread_names


def convert(tmp_path: Path, source: Path, **options) -> tuple[Path, dict]:
    output = tmp_path / "out.perfetto-trace"
    return output, convert_file(source, output, **options)


EDGE_CASES = {
    "every_phase": {
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "trainer"}},
            {"ph": "M", "name": "process_labels", "pid": 7, "tid": 0, "args": {"labels": "CPU"}},
            {"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "main"}},
            {"ph": "M", "name": "thread_sort_index", "pid": 7, "tid": 7, "args": {"sort_index": 1}},
            {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 7, "tid": 7, "ts": 1.0, "dur": 10.0,
             "args": {"int": 3, "big": 12345678901234567, "float": 0.25, "str": "x", "bool": True,
                      "nested": {"a": [1, 2, {"b": "c"}]}, "none": None}},
            {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 7, "tid": 7, "ts": 2.0, "dur": 3.0},
            {"ph": "X", "cat": "cpu_op", "name": "zero", "pid": 7, "tid": 7, "ts": 5.0, "dur": 0},
            {"ph": "X", "cat": "cpu_op", "name": "touching", "pid": 7, "tid": 7, "ts": 11.0, "dur": 1.0},
            {"ph": "B", "name": "begin-end", "pid": 7, "tid": 8, "ts": 1.5, "args": {"b": 1}},
            {"ph": "E", "pid": 7, "tid": 8, "ts": 4.5, "args": {"e": 2}},
            {"ph": "i", "name": "thread-instant", "pid": 7, "tid": 7, "ts": 3.0, "s": "t"},
            {"ph": "i", "name": "process-instant", "pid": 7, "tid": 7, "ts": 3.0, "s": "p"},
            {"ph": "I", "name": "global-instant", "pid": 7, "tid": 7, "ts": 3.0, "s": "g"},
            {"ph": "C", "name": "memory", "pid": 7, "ts": 1.0, "args": {"allocated": 10, "reserved": 12.5}},
            {"ph": "C", "name": "memory", "pid": 7, "ts": 2.0, "args": {"allocated": 11, "reserved": 13.5}},
            {"ph": "b", "cat": "async", "name": "request", "id": 1, "pid": 7, "tid": 7, "ts": 1.0},
            {"ph": "n", "cat": "async", "name": "step", "id": 1, "pid": 7, "tid": 7, "ts": 1.5},
            {"ph": "e", "cat": "async", "name": "request", "id": 1, "pid": 7, "tid": 7, "ts": 6.0},
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 9, "pid": 7, "tid": 7, "ts": 2.0},
            {"ph": "t", "cat": "ac2g", "name": "ac2g", "id": 9, "pid": 7, "tid": 8, "ts": 2.0},
            {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 9, "pid": "GPU", "tid": "stream 7", "ts": 20.0},
            {"ph": "X", "cat": "kernel", "name": "kernel", "pid": "GPU", "tid": "stream 7", "ts": 21.0, "dur": 2.0},
            {"ph": "X", "cat": "kernel", "name": "kernel", "pid": 0, "tid": 7, "ts": 21.0, "dur": 2.0},
        ],
    },
    "partial_overlaps": {
        "traceEvents": [
            {"ph": "X", "name": f"s{i}", "pid": 1, "tid": 1, "ts": float(i), "dur": 2.5} for i in range(12)
        ] + [{"ph": "X", "name": "nested", "pid": 1, "tid": 1, "ts": 0.5, "dur": 1.0}],
    },
    # Arrows whose target (zero duration) starts at its source's time: trace_processor takes
    # events of one time in file order, so each target's track must follow its source's,
    # here against the order the tracks first appear (stream 7, then threads 3, 2, 1, 4).
    "momentary_targets": {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "kernel", "pid": 0, "tid": 7, "ts": 1.0, "dur": 0},
            {"ph": "X", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 3, "ts": 2.0, "dur": 0},
            {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 2, "ts": 2.0, "dur": 0},
            {"ph": "X", "cat": "cpu_op", "name": "launch", "pid": 1, "tid": 1, "ts": 1.0, "dur": 5.0},
            {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 4, "ts": 2.0, "dur": 1.0},
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 1, "ts": 1.0},
            {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 0, "tid": 7, "ts": 1.0, "bp": "e"},
            {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 2, "pid": 1, "tid": 4, "ts": 2.0},
            {"ph": "f", "cat": "fwdbwd", "name": "fwdbwd", "id": 2, "pid": 1, "tid": 2, "ts": 2.0, "bp": "e"},
            {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 3, "pid": 1, "tid": 2, "ts": 2.0},
            {"ph": "f", "cat": "fwdbwd", "name": "fwdbwd", "id": 3, "pid": 1, "tid": 3, "ts": 2.0, "bp": "e"},
        ],
    },
    "bare_array": [
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1},
        {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 1, "dur": 1},
    ],
}


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_edge_cases_are_lossless(tmp_path, name, suffix):
    source = write_json(tmp_path / f"{name}{suffix}", EDGE_CASES[name])
    output, summary = convert(tmp_path, source)
    assert_lossless(source, output, summary)


def test_every_phase_keeps_names_tracks_and_types(tmp_path):
    source = write_json(tmp_path / "t.json", EDGE_CASES["every_phase"])
    output, summary = convert(tmp_path, source)
    assert summary["events_skipped"] == 0
    types = {r["key"]: r["value_type"] for r in rows(output, f"""
        select key, value_type from args where key glob '{ARG_PREFIX}*'""")}
    assert types[ARG_PREFIX + "int"] == "int"
    assert types[ARG_PREFIX + "big"] == "int"
    assert types[ARG_PREFIX + "float"] == "real"
    assert types[ARG_PREFIX + "bool"] == "bool"
    assert types[ARG_PREFIX + "nested.a[2].b"] == "string"
    threads = {r["name"] for r in rows(output, "select name from thread")}
    assert {"main", "stream 7", "thread 7", "thread 8"} <= threads
    # Two GPUs' "stream 7" threads stay distinct threads with distinct tids.
    tids = [r["tid"] for r in rows(output, "select tid from thread where name in ('stream 7', 'thread 7')")]
    assert len(tids) == len(set(tids)) == 2
    counter_tracks = {r["name"] for r in rows(output, "select name from counter_track")}
    assert {"memory allocated", "memory reserved"} <= counter_tracks


def test_partial_overlaps_dropped_by_json_importer_are_kept(tmp_path):
    source = write_json(tmp_path / "overlaps.json", EDGE_CASES["partial_overlaps"])
    json_drops = {r["name"]: r["value"] for r in problem_stats(source)}
    assert json_drops.get("slice_drop_overlapping_complete_event", 0) > 0
    json_slices = rows(source, "select count(*) n from slice")[0]["n"]
    output, summary = convert(tmp_path, source)
    ours = rows(output, "select count(*) n from slice")[0]["n"]
    assert ours == 13 > json_slices
    assert summary["overlaps_moved"] > 0
    overlap_tracks = rows(output, "select name from track where name glob '* (overlap *)'")
    assert overlap_tracks


def test_nineteen_digit_microsecond_timestamps_are_exact(tmp_path):
    # Old Kineto: absolute microseconds with a ns fraction, more digits than a float64 holds.
    stamps = ["1712195495519695.812", "1712195495519695.813", "1712195495519696.001",
              "1712195495519700.999"]
    events = ",".join(
        f'{{"ph":"X","name":"k{i}","pid":1,"tid":2,"ts":{ts},"dur":0.001}}' for i, ts in enumerate(stamps))
    source = tmp_path / "old.json"
    source.write_text(f'{{"traceEvents":[{events}]}}')
    assert float(stamps[0]) * 1000 != 1712195495519695812  # floats really do lose it
    output, _ = convert(tmp_path, source)
    got = {r["name"]: (r["ts"], r["dur"]) for r in rows(output, "select name, ts, dur from slice")}
    for i, text in enumerate(stamps):
        whole, fraction = text.split(".")
        assert got[f"k{i}"] == (int(whole) * 1000 + int(fraction), 1)


@pytest.mark.parametrize("source", [shared_trace_param(p) for p in shared_trace_paths()])
def test_real_traces_are_lossless(tmp_path, source):
    output, summary = convert(tmp_path, source, args_strategy="helper")  # as the command line runs it
    assert summary["events_read"] > 0
    assert_lossless(source, output, summary)
