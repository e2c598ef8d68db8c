"""Traces as they really come: 2021 Kineto traces and flow ends without a partner.

2021 traces write `X` events with `tid: "5555"` and their flow events with `tid: 5555`.
Chrome's trace viewer keys threads by the text, so both are one thread and every CPU->GPU
arrow binds; so must ours.
"""

from __future__ import annotations

import gzip
import json

import pytest

from .helpers import SHARED_TRACES, convert_file, rows, write_json

OLD_FORMAT = SHARED_TRACES / "kineto_2021_resnet50_old_format.json.gz"


def test_decimal_string_and_int_tids_are_one_thread(tmp_path):
    source = write_json(tmp_path / "old.json", {"traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": "5555", "args": {"name": "main"}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": "5555", "ts": 10, "dur": 5},
        {"ph": "s", "cat": "async", "name": "launch", "id": 1, "pid": 7, "tid": 5555, "ts": 10},
        {"ph": "X", "cat": "Kernel", "name": "gemm", "pid": 0, "tid": "stream 7", "ts": 20, "dur": 5},
        {"ph": "f", "cat": "async", "name": "launch", "id": 1, "pid": 0, "tid": "stream 7", "ts": 20, "bp": "e"},
        # Not the same text as 5555, so another thread, as in Chrome.
        {"ph": "X", "cat": "Runtime", "name": "other", "pid": 7, "tid": "05555", "ts": 30, "dur": 5},
    ]})
    output = tmp_path / "old.perfetto-trace"
    summary = convert_file(source, output)
    assert summary["flows"] == 1 and summary["flows_unbound"] == 0 and summary["flows_partner_missing"] == 0
    arrow = rows(output, """select so.name source, si.name target from flow f
                            join cgtrace_all_slice so on so.id = f.slice_out join cgtrace_all_slice si on si.id = f.slice_in""")
    assert arrow == [{"source": "cudaLaunchKernel", "target": "gemm"}]
    threads = rows(output, "select t.name, count(*) n from slice s join thread_track tt on s.track_id = tt.id "
                           "join thread t using (utid) where s.category = 'Runtime' group by 1 order by 1")
    assert [(r["name"], r["n"]) for r in threads] == [("05555", 1), ("main", 1)]


def test_ends_without_a_partner_are_counted_apart(tmp_path):
    source = write_json(tmp_path / "partial.json", {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
        {"ph": "s", "cat": "ac2g", "name": "x", "id": 1, "pid": 1, "tid": 1, "ts": 10},   # no `f` anywhere
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 20, "dur": 5},
        {"ph": "f", "cat": "ac2g", "name": "x", "id": 2, "pid": 0, "tid": 7, "ts": 20, "bp": "e"},  # no `s`
        {"ph": "s", "cat": "ac2g", "name": "x", "id": 3, "pid": 1, "tid": 1, "ts": 100},  # binds to no slice
        {"ph": "f", "cat": "ac2g", "name": "x", "id": 3, "pid": 0, "tid": 7, "ts": 20, "bp": "e"},
    ]})
    summary = convert_file(source, tmp_path / "partial.perfetto-trace")
    assert summary["flows_partner_missing"] == 2
    assert summary["flows_unbound"] == 2  # id 3: its `s` binds to no slice, so its `f` has no source


@pytest.mark.skipif(not OLD_FORMAT.is_file(), reason="../shared/traces is absent")
def test_2021_trace_binds_every_flow_trace_processor_binds(tmp_path):
    output = tmp_path / "old.perfetto-trace"
    summary = convert_file(OLD_FORMAT, output)
    expected = rows(OLD_FORMAT, "select count(*) n from flow")[0]["n"]  # Perfetto's own JSON import
    assert expected > 9000
    assert summary["flows"] == expected == rows(output, "select count(*) n from flow")[0]["n"]
    assert summary["flows_unbound"] == 0
    phases: dict = {}
    for event in json.loads(gzip.decompress(OLD_FORMAT.read_bytes()))["traceEvents"]:
        if event.get("ph") in ("s", "t", "f"):
            phases.setdefault((event.get("cat"), event.get("id")), []).append(event["ph"])
    lonely = sum(len(found) for found in phases.values() if "s" not in found or set(found) == {"s"})
    assert summary["flows_partner_missing"] == lonely
