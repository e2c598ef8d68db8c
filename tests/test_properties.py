"""Property-based tests: random VALID Kineto traces, checked through trace_processor SQL.

Hypothesis draws whole traces -- CPU processes and threads (int and string ids), GPU streams,
X slices with random nesting, partial overlaps and zero durations, kernels / memcpy / memset
(NCCL names too) on many streams, gpu_user_annotation spans, `ac2g` flows, instants of every
scope, counters, B/E pairs, async b/n/e, and args of every JSON type -- with timestamps written
as Kineto writes them: microseconds with three decimals, relative to `baseTimeNanoseconds`.

Properties:
  (a) convert keeps exactly the input's slices (name, ts, dur, args) as an independent reading
      (tests/oracle.py: the json module and Decimal) sees them, every flow has both ends, the
      flow count matches the summary and the oracle, and trace_processor reports no
      error/data_loss stats;
  (b) compact keeps every measured slice and never lets two slices on a lane overlap or nest;
  (c) converting (and compacting) the same input twice gives byte-identical files, also across
      processes with different string-hash seeds, and wherever its metadata events stand.

Seeded (derandomize) and bounded (max_examples): a passing run is reproducible and takes ~35 s.
A failing one then shrinks its example, which reloads trace_processor hundreds of times (minutes);
CGTRACE_NO_SHRINK=1 reports the first failing example as drawn instead.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from converter import open_trace
from .helpers import UNDER_GPU_SQL, compact_file, convert_file

from .oracle import expected_from

ARG_PREFIX = "debug.args."
ANNOTATION_CATEGORIES = ("gpu_user_annotation", "cuda_graph_label")
SETTINGS = dict(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
if os.environ.get("CGTRACE_NO_SHRINK"):
    SETTINGS["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
REPO = Path(__file__).resolve().parents[1]

# -- strategies ---------------------------------------------------------------------------------------
CPU_NAMES = ["aten::mm", "aten::add_", "cudaLaunchKernel", "cudaGraphLaunch", "forward", "ProfilerStep#1",
             "", "name with \"quotes\" and \\", "ünïcødé ⏱", "PP:0F0", "nccl:all_reduce"]
KERNEL_NAMES = ["void gemm_kernel<float>(float*)", "triton_poi_fused_add_0", "ncclDevKernel_AllGather_RING_LL",
                "ncclKernel_ReduceScatter_RING_LL_Sum_float", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                "ncclDevKernel_SendRecv", "symm_mem_all_reduce", "elementwise_kernel"]
MEMCPY_NAMES = ["Memcpy HtoD (Pageable -> Device)", "Memcpy DtoD (Device -> Device)", "Memcpy DtoH"]
MEMSET_NAMES = ["Memset (Device)"]
ANNOTATION_NAMES = ["forward", "backward", "PP:1F3", "optimizer", "ProfilerStep#2"]
ARG_KEYS = ["a", "grid", "stream", "External id", "Input Dims", "name", "dotted.key", "é", "correlation"]

MAX_SPAN_NS = 60_000  # relative ns: small, so slices collide, nest and partially overlap

times = st.integers(0, MAX_SPAN_NS)
durations = st.one_of(st.just(0), st.integers(0, 3_000), st.integers(0, 20_000))
huge_ints = st.sampled_from([2**31, 2**32 + 1, 2**53 + 1, 2**63 - 1, -2**63, 2**63, 2**64 - 1, 2**64, -2**63 - 1,
                             10**30, -(10**30)])
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6), huge_ints,
    st.floats(allow_nan=False, allow_infinity=False),
    # No NUL: trace_processor keeps strings as C strings and cuts them there (its limit, not ours).
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8))


def stores_nothing(value) -> bool:
    """A value trace_processor keeps no arg for: null, {} or a dict of such values."""
    return value is None or isinstance(value, dict) and all(map(stores_nothing, value.values()))


def as_array_element(value):
    # An array element that stores nothing keeps its index as JSON text ("null", "[]", "{}"). For
    # a non-empty dict of nulls the converter writes "{}" and tests/oracle.py writes nothing: both
    # defensible, so such elements are drawn as plain {}.
    return {} if isinstance(value, dict) and stores_nothing(value) else value


arg_values = st.recursive(
    scalars,
    lambda children: (st.lists(children.map(as_array_element), max_size=3)
                      | st.dictionaries(st.sampled_from(ARG_KEYS), children, max_size=3)),
    max_leaves=8)
args_dicts = st.dictionaries(st.sampled_from(ARG_KEYS), arg_values, max_size=4)


class Us:
    """A timestamp/duration in ns, written into the JSON as Kineto microseconds."""

    def __init__(self, ns: int, style: str):
        self.ns, self.style = ns, style

    def token(self) -> str:
        return f"@@{self.ns}:{self.style}@@"


_TOKEN = re.compile(r'"@@(\d+):([dif])@@"')


def _render_us(match: re.Match) -> str:
    ns, style = int(match.group(1)), match.group(2)
    if style == "i" and ns % 1000 == 0:
        return str(ns // 1000)                 # an int, as some Kineto versions write
    if style == "f":
        return repr(ns / 1000)                 # a float's shortest text ("12.5", "0.001")
    return f"{ns // 1000}.{ns % 1000:03d}"   # three decimals ("12.500"), as Kineto writes


def dump(document, ensure_ascii: bool) -> bytes:
    text = json.dumps(document, ensure_ascii=ensure_ascii,
                      default=lambda value: value.token() if isinstance(value, Us) else None)
    return _TOKEN.sub(_render_us, text).encode()


@st.composite
def us(draw, ns_strategy=times):
    return Us(draw(ns_strategy), draw(st.sampled_from("ddif")))


@st.composite
def maybe_args(draw):
    return draw(st.one_of(st.none(), st.just({}), args_dicts))


def event(ph, name, pid, tid, ts, cat=None, dur=None, args=None, **extra):
    ev = {"ph": ph, "name": name, "pid": pid, "tid": tid, "ts": ts}
    if cat is not None:
        ev["cat"] = cat
    if dur is not None:
        ev["dur"] = dur
    if args is not None:
        ev["args"] = args
    ev.update(extra)
    return ev


def kineto_traces():
    """A random valid Kineto trace, as the bytes of its file."""
    return kineto_documents().map(lambda drawn: dump(drawn[0], ensure_ascii=drawn[1]))


@st.composite
def kineto_documents(draw):
    """A random valid Kineto trace: (the document, whether its file escapes non-ASCII)."""
    events = []
    cpu_pids = draw(st.lists(st.one_of(st.integers(1, 2**31 + 5), st.sampled_from(["host", "Spans", "Traces"])),
                             min_size=1, max_size=3, unique=True))
    cpu_threads = []
    for pid in cpu_pids:
        tids = draw(st.lists(st.one_of(st.integers(0, 2**40), st.sampled_from(["main", "autograd 1", "t 7"])),
                             min_size=1, max_size=3, unique=True))
        cpu_threads += [(pid, tid) for tid in tids]
        if draw(st.booleans()):
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                           "args": {"name": draw(st.sampled_from(["python", "trainer ü", "host"]))}})
        if draw(st.booleans()):
            events.append({"ph": "M", "name": "process_labels", "pid": pid, "args": {"labels": "CPU"}})
    for pid, tid in cpu_threads:
        if draw(st.booleans()):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": f"thread {tid}"}})

    gpu_pids = draw(st.lists(st.one_of(st.integers(0, 7), st.just("GPU 1")), min_size=1, max_size=2, unique=True))
    gpu_streams = []
    for pid in gpu_pids:
        streams = draw(st.lists(st.one_of(st.integers(7, 300), st.sampled_from(["stream 7", "stream 13"])),
                                min_size=1, max_size=6, unique=True))
        gpu_streams += [(pid, tid) for tid in streams]
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"GPU {pid}"}})
        events.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": "GPU"}})

    # CPU X slices: random starts and lengths on few threads, so they nest, touch and partially overlap.
    cpu_slices = []
    for _ in range(draw(st.integers(1, 25))):
        pid, tid = draw(st.sampled_from(cpu_threads))
        ts, dur = draw(us()), draw(us(durations))
        if draw(st.integers(0, 5)) == 0 and cpu_slices:  # exactly on another slice's start or end
            other = draw(st.sampled_from(cpu_slices))
            ts = Us(other["ts"].ns + draw(st.sampled_from([0, other["dur"].ns])), "d")
        ev = event("X", draw(st.sampled_from(CPU_NAMES)), pid, tid, ts,
                   cat=draw(st.sampled_from(["cpu_op", "cuda_runtime", "user_annotation", "python_function"])),
                   dur=dur, args=draw(maybe_args()))
        cpu_slices.append(ev)
    events += cpu_slices

    # GPU work on many streams.
    kernels = []
    for _ in range(draw(st.integers(0, 30))):
        pid, tid = draw(st.sampled_from(gpu_streams))
        cat = draw(st.sampled_from(["kernel", "kernel", "kernel", "gpu_memcpy", "gpu_memset"]))
        name = draw(st.sampled_from({"kernel": KERNEL_NAMES, "gpu_memcpy": MEMCPY_NAMES,
                                     "gpu_memset": MEMSET_NAMES}[cat]))
        args = draw(maybe_args())
        if args is not None and draw(st.booleans()):
            args["name"] = draw(st.sampled_from(["graph_0", "graph_1"]))  # a CUDA-graph label
        kernels.append(event("X", name, pid, tid, draw(us()), cat=cat, dur=draw(us(durations)), args=args))
    events += kernels
    for _ in range(draw(st.integers(0, 8))):
        pid, tid = draw(st.sampled_from(gpu_streams))
        events.append(event("X", draw(st.sampled_from(ANNOTATION_NAMES)), pid, tid, draw(us()),
                            cat="gpu_user_annotation", dur=draw(us(durations)), args=draw(maybe_args())))

    # CUDA-graph replays: one annotated region of kernels, replayed on other streams of the GPU at
    # overlapping times (so identical annotations overlap and merge above one lane).
    for _ in range(draw(st.integers(0, 2))):
        pid = draw(st.sampled_from(gpu_pids))
        streams = [tid for p, tid in gpu_streams if p == pid]
        start, label = draw(times), draw(st.sampled_from(["graph_0", "graph_1", None]))
        offsets = draw(st.lists(st.tuples(st.integers(0, 2_000), st.integers(0, 1_500)), min_size=1, max_size=4))
        span = max(offset + dur for offset, dur in offsets)
        for replay, tid in enumerate(draw(st.lists(st.sampled_from(streams), min_size=1, max_size=3))):
            shift = start + replay * draw(st.integers(0, span))
            events.append(event("X", "replay region", pid, tid, Us(shift, "d"), cat="gpu_user_annotation",
                                dur=Us(span, "d"), args={"graph": 1}))
            for index, (offset, dur) in enumerate(offsets):
                kernel = event("X", KERNEL_NAMES[index % len(KERNEL_NAMES)], pid, tid, Us(shift + offset, "d"),
                               cat="kernel", dur=Us(dur, "d"), args={"stream": str(tid), **({"name": label} if label else {})})
                kernels.append(kernel)
                events.append(kernel)

    # ac2g flows: s at a CPU slice's start, f (bp e) at a kernel's start. Most kernels start after
    # their launch; some pairs are random, so the f binds nowhere or to a slice that ended earlier.
    launches = []
    for _ in range(draw(st.integers(0, 4))):
        launch = draw(st.sampled_from(cpu_slices))
        pid, tid = draw(st.sampled_from(gpu_streams))
        kernel = event("X", draw(st.sampled_from(KERNEL_NAMES)), pid, tid,
                       Us(launch["ts"].ns + draw(st.integers(0, 5_000)), "d"), cat="kernel", dur=draw(us(durations)))
        kernels.append(kernel)
        events.append(kernel)
        launches.append((launch, kernel))
    for _ in range(draw(st.integers(0, min(6, len(kernels))))):
        launches.append((draw(st.sampled_from(cpu_slices)), draw(st.sampled_from(kernels))))
    for flow_id, (launch, kernel) in enumerate(launches, start=1):
        events.append(event("s", "ac2g", launch["pid"], launch["tid"], launch["ts"], cat="ac2g", id=flow_id))
        events.append(event("f", "ac2g", kernel["pid"], kernel["tid"], kernel["ts"], cat="ac2g", id=flow_id, bp="e"))

    # B/E pairs: a balanced random sequence per thread, in time order.
    for pid, tid in draw(st.lists(st.sampled_from(cpu_threads), max_size=2)):
        now, depth = draw(times), 0
        for _ in range(draw(st.integers(0, 8))):
            now += draw(st.sampled_from([0, 1, 999, 1000, 1500]))
            if depth and draw(st.booleans()):
                events.append({"ph": "E", "pid": pid, "tid": tid, "ts": Us(now, "d"),
                               **({"args": a} if (a := draw(maybe_args())) is not None else {})})
                depth -= 1
            else:
                events.append(event("B", draw(st.sampled_from(CPU_NAMES)), pid, tid, Us(now, "d"),
                                    cat="user_annotation", args=draw(maybe_args())))
                depth += 1
        for _ in range(depth):
            now += draw(st.sampled_from([0, 1000]))
            events.append({"ph": "E", "pid": pid, "tid": tid, "ts": Us(now, "d")})

    # Instants of every scope, counters, async spans.
    for _ in range(draw(st.integers(0, 4))):
        pid, tid = draw(st.sampled_from(cpu_threads + gpu_streams))
        scope = draw(st.sampled_from(["t", "p", "g"]))
        events.append(event(draw(st.sampled_from(["i", "I"])), draw(st.sampled_from(["mark", "Iteration Start"])),
                            pid, tid, draw(us()), cat="instant", args=draw(maybe_args()), s=scope))
    for _ in range(draw(st.integers(0, 4))):
        pid = draw(st.sampled_from(cpu_pids + gpu_pids))
        values = draw(st.dictionaries(st.sampled_from(["allocated", "reserved", "Total Allocated"]),
                                      st.one_of(st.integers(-2**53, 2**53),
                                                st.floats(allow_nan=False, allow_infinity=False, width=32)),
                                      min_size=1, max_size=2))
        events.append({"ph": "C", "name": "[memory]", "pid": pid, "tid": 0, "ts": draw(us()), "args": values})
    for async_id in range(draw(st.integers(0, 2))):
        pid, tid = draw(st.sampled_from(cpu_threads))
        start = draw(times)
        end = start + draw(st.integers(0, 5000))
        events.append(event("b", "request", pid, tid, Us(start, "d"), cat="async", id=async_id + 100,
                            args=draw(maybe_args())))
        if draw(st.booleans()):
            events.append(event("n", "step", pid, tid, Us(start, "d"), cat="async", id=async_id + 100))
        events.append(event("e", "request", pid, tid, Us(end, "d"), cat="async", id=async_id + 100))

    # Kineto's order is roughly by time, with metadata first; any order is valid JSON.
    order = draw(st.sampled_from(["as_built", "by_ts", "shuffled"]))
    be_like = [e for e in events if e["ph"] in ("B", "E", "b", "e")]  # keep B/E order: a stack
    others = [e for e in events if e["ph"] not in ("B", "E", "b", "e")]
    if order == "by_ts":
        others.sort(key=lambda e: e["ts"].ns if isinstance(e.get("ts"), Us) else -1)
    elif order == "shuffled":
        others = draw(st.permutations(others))
    events = others + be_like
    base = draw(st.sampled_from([None, 0, 1_700_000_000_123_456_789, 1_000_000]))
    document = {"schemaVersion": 1, "traceEvents": events}
    if base is not None:
        document["baseTimeNanoseconds"] = base
    if draw(st.booleans()):
        document["displayTimeUnit"] = "ms"
    return document, draw(st.booleans())  # raw UTF-8 or \u escapes


def metadata_placed(document: dict, placement: str) -> dict:
    """The document with its metadata events first, last, or spread among the others (one
    before each stretch of them), as exporters place them; each kind keeps its own order."""
    metadata = [event for event in document["traceEvents"] if event["ph"] == "M"]
    others = [event for event in document["traceEvents"] if event["ph"] != "M"]
    if placement == "first":
        events = metadata + others
    elif placement == "last":
        events = others + metadata
    else:
        stretch = -(-len(others) // max(1, len(metadata)))
        events = [event for at, lead in enumerate(metadata)
                  for event in [lead, *others[at * stretch:(at + 1) * stretch]]]
        events += others[len(metadata) * stretch:]
    return {**document, "traceEvents": events}


# -- reading outputs ----------------------------------------------------------------------------------
def query(path: Path, **sqls) -> dict[str, list[dict]]:
    """Several queries on one load of the trace."""
    with open_trace(path) as tp:
        return {key: [row.__dict__.copy() for row in tp.query(sql)] for key, sql in sqls.items()}


SLICES_SQL = f"""
    select s.id, s.name, s.ts, s.dur, s.category, a.key, a.int_value, a.string_value, a.real_value, a.value_type
    from slice s left join args a on a.arg_set_id = s.arg_set_id and a.key glob '{ARG_PREFIX}*'"""
PROBLEMS_SQL = "select name, idx, value from stats where severity in ('error', 'data_loss') and value > 0"
HALF_FLOWS_SQL = "select count(*) n from flow where slice_out is null or slice_in is null"
FLOWS_SQL = """select so.name sn, so.ts sts, si.name dn, si.ts dts from flow f
               join cgtrace_all_slice so on f.slice_out = so.id join cgtrace_all_slice si on f.slice_in = si.id"""
LANE_OVERLAP_SQL = f"""
    {UNDER_GPU_SQL}, lanes as (
      select t.id from track t join under_gpu using (id) where t.name not like '% annotations%')
    select s.track_id, s.name, s.ts, s.dur, s.depth, s.next_ts from (
      select track_id, name, ts, dur, depth,
             lead(ts) over (partition by track_id order by ts, dur) next_ts
      from slice where track_id in (select id from lanes)) s
    where s.depth > 0 or s.next_ts < s.ts + s.dur"""
# Lanes alone: not annotation rows, nor the counters under a GPU (why it is idle, its queues).
LANE_COUNT_SQL = f"""{UNDER_GPU_SQL} select count(*) n from track t join under_gpu using (id)
                     where t.name not like '% annotations%' and t.type not glob '*counter*'"""


def tp_value(value):
    """What trace_processor holds for an oracle arg value: ints beyond int64 are uint64 (read back
    as signed) or, beyond that, text."""
    if type(value) is int and not -2**63 <= value < 2**63:
        return value - 2**64 if 2**63 <= value < 2**64 else str(value)
    return value


def slice_multisets(result_rows, skip_categories=()) -> tuple[Counter, Counter]:
    basics, flat = {}, {}
    for row in result_rows:
        if (row["category"] or "") in skip_categories:
            continue
        basics[row["id"]] = (row["name"], row["ts"], row["dur"])
        args = flat.setdefault(row["id"], {})
        if row["key"] is not None:
            value = next((v for v in (row["int_value"], row["string_value"], row["real_value"]) if v is not None),
                         None)
            args[row["key"][len(ARG_PREFIX):]] = value
    return Counter(basics.values()), Counter(basics[i] + (frozenset(flat[i].items()),) for i in basics)


def expected_multisets(expected) -> tuple[Counter, Counter]:
    with_args = Counter()
    for (name, ts, dur, flat), count in expected.slice_args.items():
        with_args[(name, ts, dur, frozenset((k, tp_value(v)) for k, v in flat))] += count
    return expected.slices, with_args


def assert_same(got: Counter, want: Counter) -> None:
    """Multisets equal; on failure, only the differences are shown."""
    assert got == want, {"missing from output": dict(want - got), "extra in output": dict(got - want)}


def write_input(directory: Path, document: bytes) -> Path:
    source = directory / "trace.json"
    source.write_bytes(document)
    return source


# -- (a) convert --------------------------------------------------------------------------------------
@settings(max_examples=40, **SETTINGS)
@given(kineto_traces())
def test_convert_keeps_every_slice_and_flow(document):
    with tempfile.TemporaryDirectory() as directory:
        source = write_input(Path(directory), document)
        output = Path(directory) / "out.perfetto-trace"
        summary = convert_file(source, output)
        expected = expected_from(source)
        got = query(output, slices=SLICES_SQL, problems=PROBLEMS_SQL, half_flows=HALF_FLOWS_SQL, flows=FLOWS_SQL,
                    counters="select ts, value from counter")

        assert summary["events_skipped"] == 0, summary["skipped_by_reason"]
        assert got["problems"] == []
        slices, with_args = slice_multisets(got["slices"])
        expected_slices, expected_args = expected_multisets(expected)
        assert_same(slices, expected_slices)
        assert_same(with_args, expected_args)
        assert got["half_flows"][0]["n"] == 0
        flows = Counter((r["sn"], r["sts"], r["dn"], r["dts"]) for r in got["flows"])
        assert sum(flows.values()) == summary["flows"]
        assert_same(flows, expected.flows)
        assert_same(Counter((r["ts"], r["value"]) for r in got["counters"]), expected.counter_values)


# -- (b) compact --------------------------------------------------------------------------------------
@settings(max_examples=40, **SETTINGS)
@given(kineto_traces())
def test_compact_lanes_never_overlap_and_keep_measured_slices(document):
    with tempfile.TemporaryDirectory() as directory:
        source = write_input(Path(directory), document)
        output = Path(directory) / "out.perfetto-trace"
        summary = compact_file(source, output)
        expected = expected_from(source, skip_categories=ANNOTATION_CATEGORIES)
        got = query(output, slices=SLICES_SQL, problems=PROBLEMS_SQL, overlaps=LANE_OVERLAP_SQL,
                    lanes=LANE_COUNT_SQL, half_flows=HALF_FLOWS_SQL)

        assert got["problems"] == []
        assert got["overlaps"] == []
        assert got["lanes"][0]["n"] == summary["compacted_lanes"]
        slices, with_args = slice_multisets(got["slices"], skip_categories=ANNOTATION_CATEGORIES)
        expected_slices, expected_args = expected_multisets(expected)
        assert_same(slices, expected_slices)
        assert_same(with_args, expected_args)
        assert got["half_flows"][0]["n"] == 0


# -- (c) determinism ----------------------------------------------------------------------------------
@settings(max_examples=25, **SETTINGS)
@given(kineto_traces())
def test_same_input_gives_identical_bytes(document):
    with tempfile.TemporaryDirectory() as directory:
        source = write_input(Path(directory), document)
        for job in (convert_file, compact_file):
            first, second = Path(directory) / "first.pftrace", Path(directory) / "second.pftrace"
            job(source, first, overwrite=True)
            job(source, second, overwrite=True)
            assert first.read_bytes() == second.read_bytes(), job.__name__


@settings(max_examples=25, **SETTINGS)
@given(kineto_documents())
def test_metadata_first_last_or_interleaved_gives_identical_bytes(drawn):
    """The reader sets metadata events aside wherever they stand (so they part no bulk run):
    where the exporter put them changes nothing written."""
    document, ensure_ascii = drawn
    with tempfile.TemporaryDirectory() as directory:
        for job in (convert_file, compact_file):
            outputs = set()
            for placement in ("first", "last", "interleaved"):
                source = Path(directory) / f"{placement}.json"
                source.write_bytes(dump(metadata_placed(document, placement), ensure_ascii))
                output = Path(directory) / f"{placement}.pftrace"
                job(source, output, overwrite=True)
                outputs.add(output.read_bytes())
            assert len(outputs) == 1, job.__name__


@settings(max_examples=3, **SETTINGS)
@given(kineto_traces())
def test_identical_bytes_across_processes_and_hash_seeds(document):
    """Set and dict orders of strings change with PYTHONHASHSEED; the output must not."""
    with tempfile.TemporaryDirectory() as directory:
        source = write_input(Path(directory), document)
        for command in ("convert", "compact"):
            outputs = []
            for hash_seed in ("1", "2"):
                output = Path(directory) / f"{command}{hash_seed}.perfetto-trace"
                run = subprocess.run([sys.executable, "-m", "converter.cli", command, str(source), "-o", str(output),
                                      "-q"], cwd=REPO, capture_output=True, text=True, timeout=60,
                                     env={**os.environ, "PYTHONHASHSEED": hash_seed})
                assert run.returncode == 0, run.stderr
                outputs.append(output.read_bytes())
            assert outputs[0] == outputs[1], command
