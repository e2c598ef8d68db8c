"""converter.tp: traces open as perfetto's TraceProcessor, offline (WebAssembly) or through a native shell."""

import gzip
import io
import json
import os
import time

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from converter.errors import CgtraceError
from converter.tp import TraceProcessorException, open_trace

CHROME_EVENTS = [
    {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "worker"}},
    {"name": "outer", "cat": "c", "ph": "X", "ts": 10, "dur": 100, "pid": 1, "tid": 2},
    {"name": "inner", "cat": "c", "ph": "X", "ts": 20.5, "dur": 30, "pid": 1, "tid": 2},
    {"name": "gpu", "cat": "k", "ph": "X", "ts": 40, "dur": 5, "pid": 1, "tid": 3},
]
CHROME_JSON = json.dumps({"traceEvents": CHROME_EVENTS}).encode()
NATIVE_TP = os.environ.get("CGTRACE_TP_BIN")


@pytest.fixture(autouse=True)
def wasm_by_default(monkeypatch):
    """Tests use the WebAssembly trace processor even where $CGTRACE_TP_BIN is set."""
    monkeypatch.delenv("CGTRACE_TP_BIN", raising=False)


def rows(tp, sql):
    return [tuple(vars(row).values()) for row in tp.query(sql)]


def assert_chrome_slices(tp):
    assert rows(tp, "select name, ts, dur, depth from slice order by ts") == [
        ("outer", 10_000, 100_000, 0),
        ("inner", 20_500, 30_000, 1),
        ("gpu", 40_000, 5_000, 0),
    ]
    assert rows(tp, "select name from process where pid = 1") == [("worker",)]


def test_chrome_json_bytes():
    with open_trace(CHROME_JSON) as tp:
        assert_chrome_slices(tp)
        # The stats table works and reports no data loss for a well-formed trace.
        losses = rows(tp, "select name, value from stats where severity in ('error', 'data_loss') and value > 0")
        assert losses == []
        assert rows(tp, "select count(*) from stats")[0][0] > 100


def test_chrome_json_path_and_gzip(tmp_path):
    plain = tmp_path / "t.json"
    plain.write_bytes(CHROME_JSON)
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(CHROME_JSON))
    for path in (plain, str(packed)):
        with open_trace(path) as tp:
            assert_chrome_slices(tp)


def test_perfetto_protobuf(tmp_path):
    trace = pb.Trace()
    track = trace.packet.add(trusted_packet_sequence_id=1, sequence_flags=pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED)
    track.track_descriptor.uuid = 42
    track.track_descriptor.name = "stream 7"
    for ts, kind, name in [(1000, pb.TrackEvent.TYPE_SLICE_BEGIN, "kernel"), (1500, pb.TrackEvent.TYPE_SLICE_END, None)]:
        packet = trace.packet.add(timestamp=ts, trusted_packet_sequence_id=1)
        packet.track_event.type = kind
        packet.track_event.track_uuid = 42
        if name:
            packet.track_event.name = name
    path = tmp_path / "t.perfetto-trace"
    path.write_bytes(trace.SerializeToString())
    with open_trace(path) as tp:
        assert rows(tp, "select s.name, s.ts, s.dur, t.name track from slice s join track t on s.track_id = t.id") == [
            ("kernel", 1000, 500, "stream 7")
        ]


def test_sql_error_raises():
    with open_trace(CHROME_JSON) as tp:
        with pytest.raises(TraceProcessorException, match="no such table"):
            tp.query("select * from no_such_table")
        # The instance is still usable afterwards.
        assert rows(tp, "select count(*) from slice") == [(3,)]


def test_multi_megabyte_trace_loads_completely():
    """Well over the 1 MB chunks perfetto reads, so loading spans many requests."""
    n = 50_000
    events = [
        {"name": f"op{i % 50}", "ph": "X", "ts": i * 10, "dur": 5, "pid": 1, "tid": i % 4, "args": {"pad": "x" * 20}}
        for i in range(n)
    ]
    data = json.dumps({"traceEvents": events}).encode()
    assert len(data) > 5_000_000
    with open_trace(data) as tp:
        assert rows(tp, "select count(*), max(ts), count(distinct name) from slice") == [(n, (n - 1) * 10_000, 50)]


def test_requests_larger_than_the_request_buffer():
    """parse() splits trace data into requests that fit the module's buffer; the transport feeds longer ones in pieces."""
    from converter.tp.time_limit import TimeLimit
    from converter.tp.wasm_backend import WasmTraceProcessor
    from converter.tp.wasm_host import WasmTransport

    buffer_size = 64 * 1024
    sent = []

    class CountingTransport(WasmTransport):
        def send(self, data: bytes) -> None:
            sent.append(len(data))
            super().send(data)

    events = [{"name": "s", "ph": "X", "ts": i, "dur": 1, "pid": 1, "tid": 1} for i in range(20_000)]
    data = json.dumps(events).encode()
    assert len(data) > 10 * buffer_size
    transport = CountingTransport(request_buffer_size=buffer_size)
    with WasmTraceProcessor(io.BytesIO(data), TimeLimit("requests", len(data)), transport) as tp:
        assert len(sent) > 10 and max(sent) <= buffer_size
        assert rows(tp, "select count(*) from slice") == [(20_000,)]
        long_sql = "select count(*) from slice where name != '" + "y" * 3 * buffer_size + "'"
        assert rows(tp, long_sql) == [(20_000,)]


@pytest.mark.parametrize(
    "data, error",
    [
        (b"\x00not a trace" * 10, "Unknown trace type"),
        (CHROME_JSON[:-20], "incomplete"),
    ],
)
def test_bad_trace_raises_cgtrace_error(data, error):
    with pytest.raises(CgtraceError, match=error) as info:
        open_trace(data)
    assert f"<{len(data)} bytes>" in info.value.message


def test_wasm_crash_is_reported_with_its_cause():
    """Running out of wasm memory aborts the module; the error says why and suggests the native shell."""
    with pytest.raises(CgtraceError, match=r"crashed: abort\(\).*Cannot enlarge memory.*--tp-bin"):
        open_trace(CHROME_JSON, heap_limit_bytes=1)  # no growth at all


def test_closed_trace_processor_refuses_queries():
    tp = open_trace(CHROME_JSON)
    tp.close()
    with pytest.raises(TraceProcessorException, match="not running: it was closed"):
        tp.query("select 1")


def test_unreadable_file_names_it(tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(CgtraceError, match="missing.json.*No such file"):
        open_trace(missing)


def test_bad_tp_bin_is_reported(tmp_path, monkeypatch):
    with pytest.raises(CgtraceError, match="--tp-bin .*nope is not an executable"):
        open_trace(CHROME_JSON, tp_bin=str(tmp_path / "nope"))
    monkeypatch.setenv("CGTRACE_TP_BIN", str(tmp_path))  # a directory
    with pytest.raises(CgtraceError, match="is not an executable"):
        open_trace(CHROME_JSON)


def test_memory64_build_for_huge_traces(tmp_path):
    """The size that picks the 64-bit build is the uncompressed one, read from the gzip trailer."""
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(CHROME_JSON))
    assert packed.stat().st_size < len(CHROME_JSON)
    with open_trace(packed, memory64_above=len(CHROME_JSON) - 1) as tp:
        assert tp._backend.transport.wasm.name == "trace_processor_memory64.wasm"
        assert_chrome_slices(tp)


@pytest.fixture
def compile_calls(monkeypatch, tmp_path):
    """An empty module cache, and compiling replaced by handing out the module already compiled (seconds saved)."""
    from converter.tp import wasm_host

    wasm = wasm_host.find_wasm(memory64=False)
    engine, module = wasm_host.compiled_module(wasm, False)
    calls = []
    monkeypatch.setattr(wasm_host.wasmtime.Module, "from_file", lambda engine, path: calls.append(path) or module)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return lambda: wasm_host._load_or_compile(engine, wasm, "reserved"), calls


def test_module_cache_is_reused_and_corruption_detected(compile_calls, tmp_path):
    load, calls = compile_calls
    load()
    load()
    assert len(calls) == 1
    (entry,) = (tmp_path / "cgtrace").glob("*.cwasm")
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(data)
    load()
    assert len(calls) == 2
    (fresh,) = (tmp_path / "cgtrace").glob("*.cwasm")
    assert fresh.read_bytes() != data


def test_unwritable_module_cache_still_loads(compile_calls, tmp_path, monkeypatch):
    load, calls = compile_calls
    (tmp_path / "file").write_bytes(b"")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # cannot become a directory
    assert load() is not None
    assert len(calls) == 1


def test_second_open_is_fast():
    open_trace(CHROME_JSON).close()  # compiles or loads the module once per process
    start = time.perf_counter()
    with open_trace(CHROME_JSON) as tp:
        assert rows(tp, "select count(*) from slice") == [(3,)]
    assert time.perf_counter() - start < 1.0


@pytest.mark.skipif(not NATIVE_TP, reason="set CGTRACE_TP_BIN to a trace_processor_shell")
def test_native_shell(tmp_path, monkeypatch):
    monkeypatch.setenv("CGTRACE_TP_BIN", NATIVE_TP)
    path = tmp_path / "t.json"
    path.write_bytes(CHROME_JSON)
    with open_trace(path) as tp:
        assert type(tp).__name__ == "TraceProcessor"
        assert_chrome_slices(tp)
