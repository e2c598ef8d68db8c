"""Issue 54, Must show 2: every GPU slice of a compacted trace names the CPU call that launched
it and the op, annotation and module around that call (args the UI shows, written by default
beside the slice's own under cgtrace_launch), checked against a
plain correlation join over the input JSON; those whose launch is not in the trace are
counted by reason, never dropped."""

from __future__ import annotations

import json
from bisect import bisect_right
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from .helpers import SHARED_TRACES, compact_file, rows
from .oracle import load_events, to_ns

GPU = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME = ("cuda_runtime", "cuda_driver")
FIELDS = ("launch", "op", "annotation", "module", "reason")


def expected_attribution(source: Path) -> Counter:
    """(name, dur ns, correlation, launch, op, annotation, module, reason) per GPU slice (attributed)."""
    return Counter(record[:1] + record[2:] for record in attributed_slices(source))


def attributed_slices(source: Path) -> list[tuple]:
    """Per GPU slice (name, start ns, dur ns, correlation): its launch (the runtime call with its
    correlation id), the innermost cpu_op, user_annotation and `nn.Module: ` python_function
    on the launch's thread holding the launch (ProfilerStep#N is no op or annotation; of equal
    spans the last by name), or why no launch is in the trace."""
    _, events = load_events(source)
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    calls = {e["args"]["correlation"]: e for e in spans
             if e.get("cat") in RUNTIME and isinstance(e.get("args", {}).get("correlation"), int)}
    first_call = min(calls)
    holders: dict[str, dict] = {"op": defaultdict(list), "annotation": defaultdict(list), "module": defaultdict(list)}
    for event in spans:
        name, category = event.get("name", ""), event.get("cat")
        kind = ("op" if category == "cpu_op" and not name.startswith("ProfilerStep#")
                else "annotation" if category == "user_annotation" and not name.startswith("ProfilerStep#")
                else "module" if name.startswith("nn.Module: ") else None)
        if kind:
            start = to_ns(event["ts"])
            holders[kind][(event["pid"], event["tid"])].append((start, -to_ns(event["dur"]), name, start
                                                                 + to_ns(event["dur"])))
    for by_thread in holders.values():
        for found in by_thread.values():
            found.sort()

    def innermost(kind: str, launch: dict):
        found = holders[kind][(launch["pid"], launch["tid"])]
        start, end = to_ns(launch["ts"]), to_ns(launch["ts"]) + to_ns(launch["dur"])
        for index in range(bisect_right(found, (start, float("inf"))) - 1, -1, -1):
            if found[index][3] >= end:
                return found[index][2]
        return None

    expected = []
    for event in spans:
        if event.get("cat") not in GPU:
            continue
        number = event.get("args", {}).get("correlation")
        launch = calls.get(number)
        fields = {"launch": None, "op": None, "annotation": None, "module": None, "unattributed": None}
        if launch is not None:
            fields.update(launch=launch["name"], **{kind: innermost(kind, launch) for kind in holders})
        else:
            fields["unattributed"] = ("no correlation id" if not isinstance(number, int)
                                      else "launched before the capture" if number < first_call
                                      else "launch not recorded")
        expected.append((event["name"], to_ns(event["ts"]), to_ns(event["dur"]), number, *fields.values()))
    return expected


def written_attribution(output: Path) -> Counter:
    """The same, as trace_processor reads the compacted trace's args."""
    selected = ", ".join(f"extract_arg(arg_set_id, 'debug.cgtrace_launch.{field}') as {field}" for field in FIELDS)
    found = rows(output, f"""select name, dur, extract_arg(arg_set_id, 'debug.args.correlation') as correlation,
                                    {selected}
                             from slice where category in ({", ".join(f"'{c}'" for c in GPU)})""")
    return Counter((row["name"], row["dur"], row["correlation"], *(row[field] for field in FIELDS)) for row in found)


@pytest.mark.parametrize("name", ["hta_cuda_graph_rank0.json.gz", "tracelens_b200_eager.json.gz"])
def test_every_gpu_slice_names_its_launch_as_the_input_says(tmp_path: Path, name: str) -> None:
    source = SHARED_TRACES / name
    if not source.is_file():
        pytest.skip("../shared/traces is absent")
    output = tmp_path / "out.perfetto-trace"
    summary = compact_file(source, output)
    expected = expected_attribution(source)
    assert written_attribution(output) == expected
    reasons = Counter()
    for key, count in expected.items():
        reasons[key[-1]] += count
    assert summary["launch_attribution"] == {
        "gpu_slices": sum(expected.values()), "attributed": reasons.pop(None, 0), "unattributed": dict(reasons)}


def test_graph_replays_and_slices_launched_before_the_capture() -> None:
    """hta_cuda_graph_rank0: graph kernels carry their cudaGraphLaunch's op; 872 GPU slices
    (59.5 ms) were launched before the capture began, as the issue measured with HTA."""
    source = SHARED_TRACES / "hta_cuda_graph_rank0.json.gz"
    if not source.is_file():
        pytest.skip("../shared/traces is absent")
    expected = expected_attribution(source)
    before = sum(count for key, count in expected.items() if key[-1] == "launched before the capture")
    assert before == 872
    _, events = load_events(source)
    graph_kernels = sum(count for key, count in expected.items() if key[3] == "cudaGraphLaunch")
    assert graph_kernels > 0 and all(key[4] is not None for key in expected if key[3] == "cudaGraphLaunch")
    calls = {e["args"]["correlation"] for e in events if isinstance(e, dict) and e.get("cat") in RUNTIME}
    missing = [e for e in events if isinstance(e, dict) and e.get("cat") in GPU and e["args"]["correlation"] not in calls]
    assert round(sum(Decimal(e["dur"]) for e in missing) / 1000, 1) == Decimal("59.5")


def test_report_sums_gpu_time_by_op_as_the_input_says(tmp_path: Path, capsys) -> None:
    """The report's GPU time by op, annotation and unattributed reason, on the compacted
    hta_cuda_graph_rank0: each GPU slice's time inside the ProfilerStep spans, summed by the
    oracle's attribution."""
    from converter.cli import main

    source = SHARED_TRACES / "hta_cuda_graph_rank0.json.gz"
    if not source.is_file():
        pytest.skip("../shared/traces is absent")
    output = tmp_path / "out.perfetto-trace"
    compact_file(source, output)
    _, events = load_events(source)
    steps = [(to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])) for e in events if isinstance(e, dict)
             and e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    totals: dict[tuple, list] = defaultdict(lambda: [0, 0])
    for name, start, dur, _, launch, op, annotation, _, reason in attributed_slices(source):
        inside = sum(max(0, min(start + dur, stop) - max(start, begin)) for begin, stop in steps)
        if inside > 0:
            for key in (("op", op), ("annotation", annotation), ("reason", reason),
                        ("no op", launch is not None and op is None)):
                if key[1]:
                    totals[key][0] += 1
                    totals[key][1] += inside
    capsys.readouterr()
    # The oracle bounds steps by their ProfilerStep spans (test_step_windows checks the default's bounds).
    assert main(["report", str(output), "--format", "json", "--top", "100000", "--step-windows", "cpu"]) == 0
    [gpu] = json.loads(capsys.readouterr().out)["gpus"]
    found = gpu["gpu_time_by_op"]
    written = {(by, row[by]): [row["gpu_slices"], row["total_ns"]] for by, key in
               (("op", "ops"), ("annotation", "annotations"), ("reason", "unattributed")) for row in found[key]}
    written[("no op", True)] = [found["no_op"]["gpu_slices"], found["no_op"]["total_ns"]]
    assert written == dict(totals)
    assert written[("reason", "launched before the capture")][0] == 872


def test_args_keep_their_own_entries_and_a_slice_without_args_gets_one(tmp_path: Path) -> None:
    """A generated trace: a kernel without args, one whose args are no object, and a graph replay."""
    from .helpers import write_json

    def span(name, cat, ts, dur, tid, args=None, pid=1):
        event = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
        if args is not None:
            event["args"] = args
        return event

    events = [
        span("ProfilerStep#1", "user_annotation", 0, 100, 1),
        span("## fwd ##", "user_annotation", 1, 90, 1),
        span("aten::mm", "cpu_op", 2, 10, 1),
        span("cudaLaunchKernel", "cuda_runtime", 3, 2, 1, {"correlation": 11}),
        span("aten::graph", "cpu_op", 20, 10, 1),
        span("cudaGraphLaunch", "cuda_runtime", 21, 3, 1, {"correlation": 12}),
        span("gemm", "kernel", 6, 5, 7, {"correlation": 11, "stream": 7, "device": 0}, pid=0),
        span("g1", "kernel", 25, 5, 7, {"correlation": 12, "stream": 7, "device": 0}, pid=0),
        span("g2", "kernel", 31, 5, 7, {"correlation": 12, "stream": 7, "device": 0}, pid=0),
        span("early", "kernel", 0, 1, 8, {"correlation": 3, "stream": 8, "device": 0}, pid=0),
        span("bare", "kernel", 40, 1, 8, pid=0),
    ]
    source = write_json(tmp_path / "t.json", {"traceEvents": events})
    output = tmp_path / "t.perfetto-trace"
    compact_file(source, output)
    assert written_attribution(output) == expected_attribution(source)
    found = {row["name"]: row for row in rows(output, """
        select name, extract_arg(arg_set_id, 'debug.args.stream') as stream,
               extract_arg(arg_set_id, 'debug.cgtrace_launch.op') as op,
               extract_arg(arg_set_id, 'debug.cgtrace_launch.annotation') as annotation,
               extract_arg(arg_set_id, 'debug.cgtrace_launch.reason') as why from slice where category = 'kernel'""")}
    assert found["gemm"] == {"name": "gemm", "stream": 7, "op": "aten::mm", "annotation": "## fwd ##", "why": None}
    assert found["g2"]["op"] == "aten::graph" and found["early"]["why"] == "launched before the capture"
    assert found["bare"]["why"] == "no correlation id"


def test_a_window_keeps_each_kept_slices_attribution(tmp_path: Path) -> None:
    """Attribution is found before a window cuts launches away: a slice kept by --steps keeps
    what the whole trace says launched it, on the row the cut gives it."""
    source = SHARED_TRACES / "hta_cuda_graph_rank0.json.gz"
    if not source.is_file():
        pytest.skip("../shared/traces is absent")
    output = tmp_path / "out.perfetto-trace"
    from converter.engine.window import Window

    compact_file(source, output, window=Window(first_step=552, last_step=552))
    written = written_attribution(output)
    expected = expected_attribution(source)
    assert 0 < sum(written.values()) < sum(expected.values())
    assert all(expected[key] >= count for key, count in written.items())


def test_each_graph_kernel_names_its_place_in_the_replay(tmp_path: Path) -> None:
    """hta_cuda_graph_rank0: a slice a cudaGraphLaunch launched carries its place in that
    replay (by start, then end), as the input's slices sharing that launch's correlation id
    order; a slice launched otherwise carries none."""
    source = SHARED_TRACES / "hta_cuda_graph_rank0.json.gz"
    if not source.is_file():
        pytest.skip("../shared/traces is absent")
    _, events = load_events(source)
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    graph_calls = {e["args"]["correlation"] for e in spans if e.get("name") == "cudaGraphLaunch"}
    replays = defaultdict(list)
    for e in spans:
        if e.get("cat") in GPU and e["args"].get("correlation") in graph_calls:
            replays[e["args"]["correlation"]].append((to_ns(e["ts"]), to_ns(e["dur"]), e["name"]))
    expected = Counter()
    for correlation, found in replays.items():
        for place, (start, dur, name) in enumerate(sorted(found, key=lambda s: (s[0], s[0] + s[1])), 1):
            expected[(name, dur, correlation, place)] += 1
    output = tmp_path / "out.perfetto-trace"
    compact_file(source, output)
    written = Counter((row["name"], row["dur"], row["correlation"], row["place"]) for row in rows(output, f"""
        select name, dur, extract_arg(arg_set_id, 'debug.args.correlation') as correlation,
               extract_arg(arg_set_id, 'debug.cgtrace_launch.replay_order') as place
        from slice where category in ({", ".join(f"'{c}'" for c in GPU)})
          and extract_arg(arg_set_id, 'debug.cgtrace_launch.replay_order') is not null"""))
    assert len(graph_calls) == 70 and sum(written.values()) > 0 and written == expected


def test_a_correlation_id_no_launch_can_have_is_none(tmp_path: Path) -> None:
    """CUPTI numbers launches from 0 in an int64: a kernel whose args claim 2**63 or -5 has no
    correlation id (compact neither fails nor matches it), as one without any."""
    from .helpers import write_json

    def kernel(name: str, ts: int, correlation: object) -> dict:
        return {"ph": "X", "name": name, "cat": "kernel", "ts": ts, "dur": 1, "pid": 0, "tid": 7,
                "args": {"correlation": correlation, "stream": 7, "device": 0}}

    events = [{"ph": "X", "name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 0, "dur": 2, "pid": 1, "tid": 1,
               "args": {"correlation": 5}},
              kernel("fine", 3, 5), kernel("huge", 5, 1 << 63), kernel("negative", 7, -5)]
    source = write_json(tmp_path / "t.json", {"traceEvents": events})
    output = tmp_path / "t.perfetto-trace"
    compact_file(source, output)
    found = {row["name"]: (row["launch"], row["why"]) for row in rows(output, """
        select name, extract_arg(arg_set_id, 'debug.cgtrace_launch.launch') as launch,
               extract_arg(arg_set_id, 'debug.cgtrace_launch.reason') as why from slice where category = 'kernel'""")}
    assert found == {"fine": ("cudaLaunchKernel", None), "huge": (None, "no correlation id"),
                     "negative": (None, "no correlation id")}


def test_the_innermost_holder_is_the_last_by_nesting_order_however_spans_cross(tmp_path: Path) -> None:
    """A generated trace of the cases the innermost search must get right, and a seeded crowd of
    spans on more threads, against a brute-force oracle: of the op, annotation and module
    spans on the launch's thread that hold it, the last by (start, longest first, name)."""
    import random

    from .helpers import write_json

    def span(name, cat, ts, dur, tid, args=None, pid=1):
        event = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
        return {**event, "args": args} if args is not None else event

    containers = [
        # Thread 1: B crosses A; D is open at L3's start but ends before it, C holds it.
        span("A", "cpu_op", 0, 100, 1), span("B", "cpu_op", 50, 100, 1),
        span("C", "cpu_op", 200, 200, 1), span("D", "cpu_op", 210, 40, 1),
        span("E", "cpu_op", 500, 20, 1), span("F", "cpu_op", 600, 10, 1),  # start with their launch
        span("G2", "cpu_op", 700, 50, 1), span("G1", "cpu_op", 700, 50, 1),  # one span: the last by name
        span("H", "cpu_op", 800, 10, 1), span("I", "cpu_op", 810, 10, 1),  # touching
        span("## crossed ##", "user_annotation", 40, 300, 1), span("## inner ##", "user_annotation", 45, 20, 1),
        span("nn.Module: Outer", "python_function", 0, 1000, 1), span("nn.Module: Inner", "python_function", 205, 30, 1),
        # Thread 2: an op over everything thread 1 does, which none of thread 1's launches is in.
        span("other thread", "cpu_op", 0, 2000, 2),
    ]
    launches = [(60, 5, 1), (120, 20, 1), (240, 20, 1), (500, 5, 1), (600, 10, 1), (710, 5, 1), (810, 0, 1),
                (805, 5, 1), (900, 50, 1), (1500, 10, 1), (300, 5, 2)]
    crowd = random.Random(54)
    for tid in (3, 4, 5):  # many spans, so the search crosses blocks of every size
        for index in range(120):
            start = crowd.randrange(0, 400)
            kind = crowd.choice([("cpu_op", "op"), ("user_annotation", "## note ##"),
                                 ("python_function", "nn.Module: M")])
            containers.append(span(f"{kind[1]}{crowd.randrange(3)}", kind[0], start, crowd.randrange(0, 80), tid))
        launches += [(crowd.randrange(0, 420), crowd.randrange(0, 30), tid) for _ in range(60)]
    events = list(containers)
    for number, (start, dur, tid) in enumerate(launches, 1):
        events.append(span("cudaLaunchKernel", "cuda_runtime", start, dur, tid, {"correlation": number}))
        events.append(span(f"k{number}", "kernel", 5000 + 10 * number, 5, 7,
                           {"correlation": number, "stream": 7, "device": 0}, pid=0))
    source = write_json(tmp_path / "t.json", {"traceEvents": events})
    output = tmp_path / "t.perfetto-trace"
    compact_file(source, output)

    def innermost(kind: str, start: int, dur: int, tid: int):
        holders = [(event["ts"], -event["dur"], event["name"]) for event in containers if event["tid"] == tid
                   and _kind(event) == kind and event["ts"] <= start and event["ts"] + event["dur"] >= start + dur]
        return max(holders)[2] if holders else None

    expected = Counter((f"k{number}", 5000, number, "cudaLaunchKernel",
                        *(innermost(kind, *launch) for kind in ("op", "annotation", "module")), None)
                       for number, launch in enumerate(launches, 1))
    assert written_attribution(output) == expected
    ops = {name: op for name, _, _, _, op, *_ in expected}
    assert [ops[f"k{number}"] for number in range(1, 12)] == ["B", "B", "C", "E", "F", "G2", "I", "H", None,
                                                               None, "other thread"]


def _kind(event: dict):
    """Which container an event is to attribution: op, annotation or module (None: none)."""
    return ("op" if event["cat"] == "cpu_op" else "annotation" if event["cat"] == "user_annotation"
            else "module" if event["name"].startswith("nn.Module: ") else None)


def test_launch_keys_read_once_follow_the_rows_a_cut_keeps() -> None:
    """The launch keys read for attribution are kept on the trace and reused by the idle causes
    after a window or a compaction drops rows: every row's keys, after dropping every third row
    (keep_slices) and then every other one (subset), are those its own args say."""
    source = SHARED_TRACES / "hta_cuda_graph_rank0.json.gz"
    if not source.is_file():
        pytest.skip("../shared/traces is absent")
    import numpy as np

    from converter import kineto
    from converter.engine.launch_keys import launch_keys
    from converter.inputs.kineto_reader import read_trace
    from converter.model.launch_keys import NO_ID, NO_STREAM

    trace = read_trace(source)
    everything = np.arange(len(trace.slices))
    launch_keys(trace, everything[::2])  # half read now, the rest on the next ask
    trace.keep_slices(everything % 3 != 0)
    trace = trace.subset(np.arange(len(trace.slices)) % 2 == 0)
    rows = np.arange(len(trace.slices))
    correlation, stream = launch_keys(trace, rows)
    expected = [kineto.launch_keys(text) for text in trace.args_texts(rows)]
    assert correlation.tolist() == [NO_ID if key is None else key for key, _ in expected]
    assert stream.tolist() == [NO_STREAM if key is None else key for _, key in expected]
    assert sum(key is not None for key, _ in expected) > 1000
