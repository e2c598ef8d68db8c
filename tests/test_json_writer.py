"""Chrome JSON output (converter.outputs.json_writer), as trace_processor v52 reads it back.

Every check loads the written JSON with `open_trace` and compares SQL results with the model:
no slice dropped, ts/dur exact to the ns, args under `args.<key>`, one flow per model Flow
between the right slices, thread names, and nothing in `stats` at error or data_loss. v52 keeps
no sort index for JSON threads (it reads only `thread_name` and `process_name` metadata), so
the display order is checked in the JSON's `thread_sort_index` events.
"""

from __future__ import annotations

import io
import json
import math
import random
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import msgspec
import pytest

from converter import open_trace
from converter.engine.compaction import compact
from converter.errors import CgtraceError
from converter.generator import GeneratorConfig, write_trace
from converter.outputs.json_flows import V2_BIND_ID_BASE
from converter.outputs.json_writer import EXACT_LIMIT_NS, ChromeJsonWriter, write_chrome_json
from converter.lane_rules import load_lane_rules
from converter.engine.layout import separate_overlaps
from converter.model import NO_ARGS, CounterSample, Flow, Process, Thread, Trace, Track, TrackRole
from converter.inputs.kineto_reader import parse_trace_text, read_trace
from converter.tuning import Tuning

from .helpers import SHARED_TRACES

B = 1_712_195_495_519_543_604   # an absolute profiler clock, ns
ARGS_PREFIX = "args"


# -- helpers ---------------------------------------------------------------------------------

class Loaded:
    """A trace written as JSON and what trace_processor reads from it."""

    def __init__(self, trace: Trace):
        stream = io.BytesIO()
        writer = ChromeJsonWriter(stream)
        self.summary = writer.write(trace)
        self.text = stream.getvalue()
        self.base = self.summary["json_base_time_ns"]
        self.document = json.loads(self.text)
        with open_trace(self.text) as tp:
            def rows(sql):
                return [row.__dict__.copy() for row in tp.query(sql)]
            self.problems = rows("select name, value from stats "
                                 "where severity in ('error', 'data_loss') and value > 0")
            self.slices = rows("select id, name, ts, dur, arg_set_id from slice")
            self.args = rows(f"""select s.id, a.key, a.int_value, a.string_value, a.real_value
                                 from slice s join args a on a.arg_set_id = s.arg_set_id
                                 where a.key glob '{ARGS_PREFIX}*'""")
            self.flows = rows("""select so.name source, so.ts source_ts, si.name target, si.ts target_ts
                                 from flow f join cgtrace_all_slice so on f.slice_out = so.id
                                 join cgtrace_all_slice si on f.slice_in = si.id""")
            self.threads = rows("""select t.tid, t.name, p.pid from thread t
                                   left join process p using (upid) where t.name is not null""")
            self.processes = rows("select pid, name from process where name is not null")
            self.counters = rows("""select t.name, c.ts, c.value from counter c
                                    join counter_track t on c.track_id = t.id""")

    def slice_multiset(self) -> Counter:
        return Counter((r["name"], r["ts"] + self.base, r["dur"]) for r in self.slices)

    def args_by_slice(self) -> dict:
        by_id = defaultdict(dict)
        for row in self.args:
            value = next(v for v in (row["int_value"], row["string_value"], row["real_value"]) if v is not None)
            by_id[row["id"]][row["key"]] = value
        return {r["name"]: by_id.get(r["id"], {}) for r in self.slices}

    def flow_multiset(self) -> Counter:
        return Counter((r["source"], r["source_ts"] + self.base, r["target"], r["target_ts"] + self.base)
                       for r in self.flows)

    def metadata(self, name: str) -> list[dict]:
        return [e for e in self.document["traceEvents"] if e["ph"] == "M" and e["name"] == name]

    def thread_order(self) -> dict[int, list[str]]:
        """Per pid, thread names ordered by the written thread_sort_index."""
        names = {(e["pid"], e["tid"]): e["args"]["name"] for e in self.metadata("thread_name")}
        order = defaultdict(list)
        for event in sorted(self.metadata("thread_sort_index"), key=lambda e: e["args"]["sort_index"]):
            order[event["pid"]].append(names[(event["pid"], event["tid"])])
        return dict(order)


def model_slices(trace: Trace) -> Counter:
    return Counter((s.name or "[No name]", s.ts, s.dur) for s in trace.slices.rows())


def model_flows(trace: Trace) -> Counter:
    """trace_processor stores an arrow from the slice that starts first (as for protobuf)."""
    slices = trace.slices.rows()
    flows = Counter()
    for flow in trace.flows:
        a, b = slices[flow.source], slices[flow.target]
        if b.ts < a.ts:
            a, b = b, a
        flows[(a.name, a.ts, b.name, b.ts)] += 1
    return flows


def tp_flat(value, prefix: str, out: dict) -> dict:
    """How trace_processor's JSON importer flattens args: a.b, a[0]; a null stores nothing and
    takes no array index, an empty list or object stores nothing but takes one."""
    if isinstance(value, dict):
        for key, item in value.items():
            tp_flat(item, f"{prefix}.{key}", out)
    elif isinstance(value, list):
        index = 0
        for item in value:
            if item is None:
                continue
            tp_flat(item, f"{prefix}[{index}]", out)
            index += 1
    elif value is not None:
        out[prefix] = int(value) if isinstance(value, bool) else value
    return out


def expected_args(trace: Trace, reference: int) -> dict:
    if reference == NO_ARGS:
        return {}
    return tp_flat(msgspec.json.decode(trace.args.text(reference)), ARGS_PREFIX, {})


def args_equal(got: dict, expected: dict) -> bool:
    """Exact, except floats: v52's JSON number parser can be one ulp off."""
    if got.keys() != expected.keys():
        return False
    for key, value in expected.items():
        if isinstance(value, float) and isinstance(got[key], float):
            if abs(got[key] - value) > math.ulp(value):
                return False
        elif got[key] != value or type(got[key]) is not type(value):
            return False
    return True


def assert_all_args(loaded: Loaded, trace: Trace) -> None:
    """Every slice's args, as a multiset per (name, ts, dur)."""
    expected = defaultdict(list)
    for slice_ in trace.slices.rows():
        expected[(slice_.name, slice_.ts, slice_.dur)].append(expected_args(trace, slice_.args))
    by_id = defaultdict(dict)
    for row in loaded.args:
        by_id[row["id"]][row["key"]] = next(
            v for v in (row["int_value"], row["string_value"], row["real_value"]) if v is not None)
    for row in loaded.slices:
        candidates = expected[(row["name"], row["ts"] + loaded.base, row["dur"])]
        got = by_id.get(row["id"], {})
        match = next((c for c in candidates if args_equal(got, c)), None)
        assert match is not None, (row, got, candidates)
        candidates.remove(match)


def assert_faithful(loaded: Loaded, trace: Trace) -> None:
    assert loaded.problems == []
    assert loaded.slice_multiset() == model_slices(trace)
    assert loaded.flow_multiset() == model_flows(trace)
    summary = loaded.summary   # every arrow written by one of the bindings
    assert summary["flows_v1"] + summary["flows_v1_next_slice"] + summary["flows_v2"] == len(trace.flows)


# -- a hand-built trace with every kind of track, slice, arg and arrow ---------------------------

def hand_built() -> tuple[Trace, dict]:
    trace = Trace(metadata={"schemaVersion": 1, "displayTimeUnit": "ms",
                            "distributedInfo": {"rank": 0, "world_size": 1}})
    cpu = Process(pid=1234, source_pid=1234, name="python", labels=["CPU"], sort_index=0)
    gpu = Process(pid=7, source_pid=0, name="python", labels=["GPU 0"], sort_index=5)
    idle = Process(pid=99, source_pid=99, name="idle")
    trace.processes += [cpu, gpu, idle]
    main = Thread(cpu, 1234, 1234, "main")
    worker = Thread(cpu, 1300, 1300, "autograd")
    stream7 = Thread(gpu, 7, 7, "stream 7")
    tid_zero = Thread(cpu, 0, 0, "tid zero", sort_index=1)   # 0 is no usable tid: a fresh one
    trace.threads += [main, worker, stream7, tid_zero]
    add = trace.add_track
    t = {
        "main": add(Track("", process=cpu, thread=main)),
        "autograd": add(Track("", process=cpu, thread=worker)),
        "stream 7": add(Track("", process=gpu, thread=stream7)),
        "tid zero": add(Track("", process=cpu, thread=tid_zero)),
    }
    container = add(Track("GPU lanes", process=gpu, orders_children=True))
    t["Compute"] = add(Track("Compute", process=gpu, parent=container, order=2))
    t["NCCL all-gather"] = add(Track("NCCL all-gather", process=gpu, parent=container, order=4))
    t["Compute annotations"] = add(Track("Compute annotations", process=gpu, parent=container, order=1))
    t["NCCL all-gather annotations"] = add(Track("NCCL all-gather annotations", process=gpu, parent=container,
                                                 order=3))
    t["process-scoped instants"] = add(Track("process-scoped instants", process=cpu))
    t["Global instants"] = add(Track("Global instants"))
    t["main (overlap 1)"] = add(Track("main (overlap 1)", process=cpu, role=TrackRole.OVERLAP, home=t["main"],
                                      layer=1))
    memory = add(Track("[memory] Total Allocated", process=gpu, is_counter=True))
    clock = add(Track("clock MHz", is_counter=True))

    s = {}   # name -> row

    def slice_(name, track, offset, dur, args=None, cat="cpu_op", instant=False):
        text = args if args is None or isinstance(args, (bytes, msgspec.Raw)) else msgspec.json.encode(args)
        reference = NO_ARGS if text is None else trace.args.add(text)
        s[name] = trace.slices.append(B + offset, dur, name, cat, reference, t[track], instant)

    slice_("step", "main", 100_000, 900_001, {
        "int": 3, "big": 12345678901234567, "float": 0.25, "str": 'x"\u00e9\n', "bool": True,
        "nested": {"a": [1, None, [], {"b": "c"}, 2]}, "none": None, "dot.key": 1, "neg": -5})
    slice_("forward", "main", 100_000, 300_003)            # begins with its parent "step"
    slice_("linear", "main", 150_007, 50_000)
    slice_("zero", "main", 250_000, 0)
    slice_("inst", "main", 260_001, 0, instant=True)
    slice_("backward", "main", 400_003, 200_000, msgspec.Raw(b'{"seq": 7, "f": 2.962963, "name": "bw"}'))
    slice_("touch", "main", 600_003, 100)
    slice_("launch1", "autograd", 120_000, 5_000, msgspec.Raw(b' {"correlation": 11} '), cat="cuda_runtime")
    slice_("launch2", "autograd", 420_000, 5_000, b'{"correlation": 12}', cat="cuda_runtime")
    slice_("ov_a", "autograd", 700_000, 10_000)            # partial overlap: an extra row
    slice_("ov_b", "autograd", 705_000, 10_000, msgspec.Raw(b"[1, 2]"))   # args not an object
    slice_("memcpy", "stream 7", 130_000, 10_000, cat="gpu_memcpy")
    slice_("k1", "Compute", 140_000, 20_000, {"stream": 7, "grid": [1, 2, 3]}, cat="kernel")
    slice_("k2", "Compute", 430_000, 20_001, cat="kernel")
    slice_("k3", "Compute", 460_000, 1_001, cat="kernel")
    slice_("PP:0F0", "Compute annotations", 140_000, 40_000, cat="gpu_user_annotation")
    slice_("layers.0", "Compute annotations", 140_000, 10_000, cat="gpu_user_annotation")
    slice_("PP:0B0", "Compute annotations", 430_000, 31_001, cat="gpu_user_annotation")
    slice_("nccl:all_gather", "NCCL all-gather", 200_000, 50_000, cat="kernel")
    slice_("gather", "NCCL all-gather annotations", 200_000, 50_000, cat="gpu_user_annotation")
    slice_("gather.0", "NCCL all-gather annotations", 200_000, 50_000, cat="gpu_user_annotation")
    slice_("mark", "process-scoped instants", 300_000, 0, instant=True, cat="")
    slice_("global mark", "Global instants", 310_000, 0, instant=True)
    slice_("overlapping", "main (overlap 1)", 350_000, 100_000)
    slice_("on tid zero", "tid zero", 100_000, 1_000, {})

    def flow(a, b, cat="ac2g"):
        trace.flows.append(Flow(s[a], s[b], cat))

    flow("launch1", "k1")
    flow("launch1", "k1")                     # a second arrow between the same pair
    flow("launch2", "k2")
    flow("step", "PP:0B0")                    # "step" begins with a child: v2
    flow("step", "k3")                        # v2 again, same source
    flow("launch1", "PP:0F0")                 # target begins with a child: `f` without bp
    flow("step", "PP:0F0", "pp_dependency")   # v2 into PP:0F0 ...
    flow("PP:0F0", "k3", "pp_dependency")     # ... which cannot also be a v2 source: isolated
    flow("k2", "layers.0")                    # target begins first: stored reversed
    flow("inst", "k3")                        # from an instant
    flow("forward", "nccl:all_gather")
    flow("launch1", "gather")                 # begins with an identical child: `f` without bp

    trace.counters += [CounterSample(B + 100_000, 1024.0, memory), CounterSample(B + 200_000, 2.5, memory),
                       CounterSample(B + 300_000, 1e15, memory), CounterSample(B + 350_000, 0.1, memory),
                       CounterSample(B + 150_000, 1410.0, clock)]
    return trace, s


@pytest.fixture(scope="module")
def built():
    trace, s = hand_built()
    return trace, s, Loaded(trace)


def test_hand_built_slices_flows_and_counters_are_exact(built):
    trace, _, loaded = built
    assert_faithful(loaded, trace)
    # Every binding route was taken, and no arrow was lost on the way.
    summary = loaded.summary
    assert summary["flows_v1"] > 0 and summary["flows_v1_next_slice"] > 0 and summary["flows_v2"] > 0
    assert summary["flow_end_rows"] == 1
    assert summary["flows_v1"] + summary["flows_v1_next_slice"] + summary["flows_v2"] == len(trace.flows)
    assert ("layers.0", B + 140_000, "k2", B + 430_000) in loaded.flow_multiset()
    # v2 ids stay clear of the v1 ids trace_processor numbers from 0 (they share one space).
    bind_ids = [e["bind_id"] for e in loaded.document["traceEvents"] if "bind_id" in e]
    assert bind_ids and min(bind_ids) >= V2_BIND_ID_BASE
    counters = Counter((r["name"], r["ts"] + loaded.base, r["value"]) for r in loaded.counters)
    assert counters == Counter((c.track.name, c.ts, c.value) for c in trace.counters)


def test_hand_built_args(built):
    trace, s, loaded = built
    got = loaded.args_by_slice()
    references = trace.slices.args
    for name, row in s.items():
        expected = expected_args(trace, int(references[row])) if name != "ov_b" else {}
        assert args_equal(got[name], expected), (name, got[name])
    assert got["step"]["args.dot.key"] == 1 and got["step"]["args.nested.a[3]"] == 2
    assert got["launch1"] == {"args.correlation": 11}


def test_hand_built_processes_threads_and_ids(built):
    trace, _, loaded = built
    processes = {(r["pid"], r["name"]) for r in loaded.processes}
    assert {(1234, "python"), (7, "python"), (99, "idle")} <= processes
    assert sum(name == "Global tracks" for _, name in processes) == 1
    threads = {(r["pid"], r["name"]): r["tid"] for r in loaded.threads}
    assert threads[(1234, "main")] == 1234 and threads[(1234, "autograd")] == 1300
    assert threads[(7, "stream 7")] == 7
    assert threads[(1234, "tid zero")] not in (0, 1234, 1300, 7, 99)
    names = {name for _, name in threads}
    for track in trace.tracks:
        if not track.is_counter and track.name != "GPU lanes":
            assert (track.thread.display_name if track.thread else track.name) in names
    assert {"autograd (overlap 1)", "Compute annotations (flow ends)"} <= names
    tids = [tid for (pid, _), tid in threads.items()]
    assert len(tids) == len(set(tids))
    labels = {e["pid"]: e["args"]["labels"] for e in loaded.metadata("process_labels")}
    assert labels == {1234: "CPU", 7: "GPU 0"}
    sort_index = {e["pid"]: e["args"]["sort_index"] for e in loaded.metadata("process_sort_index")}
    assert sort_index == {1234: 0, 7: 5}


def test_hand_built_thread_order(built):
    _, _, loaded = built
    order = loaded.thread_order()
    assert order[1234] == ["tid zero", "main", "main (overlap 1)", "autograd", "autograd (overlap 1)",
                           "process-scoped instants"]
    assert order[7] == ["stream 7", "Compute annotations", "Compute annotations (flow ends)", "Compute",
                        "NCCL all-gather annotations", "NCCL all-gather"]


def test_header_and_time_text(built):
    trace, _, loaded = built
    document = loaded.document
    assert document["baseTimeNanoseconds"] == loaded.base == B - B % 1_000_000_000
    assert "displayTimeUnit" not in document        # older trace_processors scaled times by it
    assert document["distributedInfo"] == {"rank": 0, "world_size": 1}
    # ts and dur are "<us>.<3 digits>": absolute ns = base + ts * 1000, exactly.
    text = loaded.text.decode()
    absolute = Counter()
    for event in json.loads(text, parse_float=Decimal)["traceEvents"]:
        if event["ph"] in "Xi":
            ts = document["baseTimeNanoseconds"] + int(Decimal(event["ts"]) * 1000)
            absolute[(event["name"], ts, int(Decimal(event.get("dur", 0)) * 1000))] += 1
    assert absolute == model_slices(trace)
    assert '"ts":1.' not in text.replace('"ts":1.0', "")  # no float artefacts such as 1.0000000002


def test_reads_back_with_cgtrace_reader(built):
    """cgtrace's own reader (Chrome's flow rules, no v2) gets the same absolute slices back."""
    trace, _, loaded = built
    again = parse_trace_text(loaded.text)
    assert model_slices(again) == model_slices(trace)
    assert loaded.summary["flows_v2"] == 3


# -- timestamps ------------------------------------------------------------------------------

def sequential_trace(rng: random.Random, first: int, spread: int, count: int) -> Trace:
    """`count` slices with random ns starts and durations, on a few threads, never overlapping."""
    trace = Trace()
    process = Process(pid=1, source_pid=1, name="p")
    trace.processes.append(process)
    per_track = count // 4
    for index in range(4):
        thread = Thread(process, 10 + index, 10 + index)
        trace.threads.append(thread)
        track = trace.add_track(Track("", process=process, thread=thread))
        ts = first + rng.randrange(1000)
        gap = spread // per_track
        for n in range(per_track):
            dur = rng.randrange(0, 2 * gap // 3)
            trace.slices.append(ts, dur, f"t{index}s{n}", "c", NO_ARGS, track)
            ts += dur + rng.randrange(1, gap // 3 + 2)
    return trace


@pytest.mark.parametrize("first, spread", [
    pytest.param(B, 10 ** 12, id="absolute-1.7e18-ns-over-17-min"),
    pytest.param(B + 7, EXACT_LIMIT_NS - 2 * 10 ** 9, id="absolute-over-26-days"),
    pytest.param(5_000, 10 ** 9, id="small-relative"),
])
def test_thousands_of_random_ns_timestamps_come_back_exact(first, spread):
    trace = sequential_trace(random.Random(first), first, spread, 4000)
    loaded = Loaded(trace)
    assert loaded.problems == []
    assert loaded.slice_multiset() == model_slices(trace)
    if first + spread < EXACT_LIMIT_NS:
        assert loaded.base == 0          # everything fits: trace_processor shows absolute ns


def test_trace_spanning_more_than_the_exact_range_is_refused():
    trace = sequential_trace(random.Random(1), B, 10 ** 6, 8)
    trace.slices.append(B + EXACT_LIMIT_NS, 1_000, "late", "c", NO_ARGS, trace.tracks[-1])
    with pytest.raises(CgtraceError, match="days"):
        write_chrome_json(trace, io.BytesIO())


# -- generated CUDA-graph traces, compacted -----------------------------------------------------

GENERATED = {
    "compacted-pp": dict(pp_size=2, pp_rank=1, microbatches=2, annotation_gaps=True),
    "compacted-absolute-time": dict(time_format="absolute"),
}


@pytest.fixture(scope="module", params=sorted(GENERATED))
def generated(request, tmp_path_factory):
    config = GeneratorConfig(seed=3, steps=2, graphs_per_step=4, kernels_per_replay=16, **GENERATED[request.param])
    path = write_trace(config, tmp_path_factory.mktemp("generated") / "trace.json")
    trace = read_trace(path)
    compact(trace, load_lane_rules())
    separate_overlaps(trace)
    return trace, Loaded(trace)


def test_generated_compacted_trace_is_faithful(generated):
    trace, loaded = generated
    assert_faithful(loaded, trace)
    assert len(trace.flows) > 100 and loaded.summary["flows_v1"] == len(trace.flows)
    assert_all_args(loaded, trace)


def test_generated_rows_are_named_and_ordered_like_the_lanes(generated):
    trace, loaded = generated
    order = loaded.thread_order()
    written = {(e["pid"], e["args"]["name"]) for e in loaded.metadata("thread_name")}
    assert written <= {(r["pid"], r["name"]) for r in loaded.threads}   # trace_processor has them all
    with_slices = {id(s.track) for s in trace.slices.rows()}

    def owner(track):  # a row's process: its thread's, its own, or (bookkeeping rows) its parent's
        return track.thread.process if track.thread else track.process or (track.parent and owner(track.parent))

    for process in trace.processes:
        tracks = [t for t in trace.tracks if id(t) in with_slices and owner(t) is process]
        if not tracks:
            continue
        lanes = sorted((t for t in tracks if t.parent is not None), key=lambda t: t.order)
        threads = [t.thread.display_name for t in tracks if t.thread is not None]
        names = order[process.pid]
        assert sorted(names) == sorted(threads + [t.name for t in tracks if t.thread is None])
        assert set(names[:len(threads)]) == set(threads)            # real threads first
        in_container = [n for n in names if n in {t.name for t in lanes}]
        assert in_container == [t.name for t in lanes]              # then lanes by their order
        for lane in lanes:                                         # annotation rows right above
            if lane.name.endswith("annotations"):
                continue
            row = f"{lane.name} annotations"
            if row in names:
                assert names.index(row) < names.index(lane.name)


def test_generated_round_trip_through_cgtrace_reader(generated):
    trace, loaded = generated
    again = parse_trace_text(loaded.text)
    assert model_slices(again) == model_slices(trace)
    assert model_flows(again) == model_flows(trace)
    assert not again.skipped and again.unbound_flows == 0


# -- arrows between every kind of slice ----------------------------------------------------------

def nested_random(rng, track, t0, t1, depth, out, prefix):
    """Appends to `out` the fields of SliceTable.append for each slice."""
    t = t0
    while t < t1 and len(out) < 200:
        if rng.random() < 0.15:
            out.append((t, 0, f"{prefix}{len(out)}", "c", NO_ARGS, track, rng.random() < 0.5))
        start = t if rng.random() < 0.4 else rng.randrange(t, t1 + 1)
        end = start if rng.random() < 0.1 else rng.randrange(start, t1 + 1) if rng.random() < 0.7 else t1
        out.append((start, end - start, f"{prefix}{len(out)}", "c", NO_ARGS, track))
        if depth < 4 and end > start:
            nested_random(rng, track, start, end, depth + 1, out, prefix)
        t = end if rng.random() < 0.5 else end + rng.randrange(0, 50)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_arrows_between_nested_slices_and_instants(seed):
    """Children beginning with their parents, zero-length slices, instants, arrows in any
    direction and several per slice: every arrow between exactly its two slices."""
    rng = random.Random(seed)
    trace = Trace()
    process = Process(pid=10, source_pid=10, name="p")
    trace.processes.append(process)
    tracks = []
    for index in range(3):
        thread = Thread(process, 11 + index, 11 + index, f"t{index}")
        trace.threads.append(thread)
        tracks.append(trace.add_track(Track("", process=process, thread=thread)))
    tracks.append(trace.add_track(Track("lane", process=process)))
    for index, track in enumerate(tracks):
        out = []
        nested_random(rng, track, B, B + 5000, 0, out, f"s{index}_")
        for fields in out:
            trace.slices.append(*fields)
    rows = range(len(trace.slices))
    trace.flows = [Flow(rng.choice(rows), rng.choice(rows), "f") for _ in range(200)]
    loaded = Loaded(trace)
    assert_faithful(loaded, trace)   # names are unique: the arrows join exactly the right slices


# -- streaming and real traces ------------------------------------------------------------------

def test_output_streams_in_chunks(built):
    trace, _, loaded = built
    writes = []

    class Recorder(io.RawIOBase):
        def write(self, data):
            writes.append(bytes(data))
            return len(data)

    ChromeJsonWriter(Recorder(), Tuning(flush_bytes=512)).write(trace)
    assert len(writes) > 5 and max(map(len, writes)) < 4096
    assert b"".join(writes) == loaded.text


REAL = ["hta_triton_small.json.gz", "dlrm_8ranks/rank0_trace.json.gz"]


@pytest.mark.parametrize("name", REAL)
def test_real_trace_is_faithful(name):
    path = SHARED_TRACES / name
    if not path.is_file():
        pytest.skip("../shared/traces is not present: real-trace tests need it")
    trace = read_trace(path)
    separate_overlaps(trace)
    loaded = Loaded(trace)
    assert_faithful(loaded, trace)
    assert_all_args(loaded, trace)


def test_empty_trace_is_valid_json():
    stream = io.BytesIO()
    write_chrome_json(Trace(), stream)
    assert json.loads(stream.getvalue()) == {"baseTimeNanoseconds": 0, "traceEvents": []}


def test_written_file_opens_from_disk(tmp_path: Path, built):
    trace, _, loaded = built
    path = tmp_path / "out.json"
    with open(path, "wb") as stream:
        write_chrome_json(trace, stream)
    assert path.read_bytes() == loaded.text
    with open_trace(path) as tp:
        assert next(iter(tp.query("select count(*) n from slice"))).n == len(trace.slices)
