"""Bad input to `cgtrace convert`: never a traceback, a partial file or a touched input.

A file-level problem gives exit 2 and ONE line on stderr (`cgtrace: error: <file>: <problem>; <what to
do>`), writes nothing (no output, no `.<name>.*.tmp`) and leaves every existing file as it was.
Per-event junk is skipped and counted in the summary's `skipped_by_reason` unless --strict.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

GOOD = {"name": "good", "cat": "c", "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1}
VALID_EVENTS = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "worker"}}] + [
    {"name": f"k{i}", "cat": "kernel", "ph": "X", "ts": 10 * i, "dur": 5, "pid": 1, "tid": 1 + i % 3,
     "args": {"grid": [i, 1, 1], "stream": 7}} for i in range(200)] + [
    {"name": "mark", "ph": "i", "s": "t", "ts": 5, "pid": 1, "tid": 1}]
VALID = json.dumps({"traceEvents": VALID_EVENTS}, separators=(",", ":")).encode()
VALID_KEPT = 201  # 200 slices + 1 instant
GARBAGE = b"\x89PNG\r\n\x1a\n" + random.Random(1).randbytes(2048)
PACKED = gzip.compress(VALID, mtime=0)
DIR = "<a directory>"
FIFO = "<a FIFO>"


def trace(*events, header: bytes = b"") -> bytes:
    """A Chrome JSON document; events are Python objects or raw JSON bytes (for what json can't write)."""
    parts = [e if isinstance(e, bytes) else json.dumps(e).encode() for e in events]
    return b'{' + header + b'"traceEvents":[' + b",".join(parts) + b"]}"


def junk(*events, header: bytes = b"") -> bytes:
    return trace(GOOD, *events, header=header)


def X(**fields):
    return {**GOOD, "name": "x", **fields}


def without(event: dict, *keys):
    return {k: v for k, v in event.items() if k not in keys}


def flipped(data: bytes) -> bytes:
    data = bytearray(data)
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xFF
    return bytes(data)


def deep_x(depth: int, more_args: bytes = b"") -> bytes:
    """An X event whose args hold `depth` nested lists (raw JSON: json.dumps would recurse too deep)."""
    return b'{"name":"d","ph":"X","ts":1,"dur":1,"pid":1,"tid":1,"args":{%s"d":%s%s}}' % (
        more_args, b"[" * depth, b"]" * depth)


# -- file-level errors ---------------------------------------------------------------------------------
def E(id, data, expect, *args, name="trace.json", pre=()):
    """data: file bytes, None (no such file) or DIR; args may name {in}, {out} or {nodir} (OUT in a
    missing directory); pre: files (dirs if ending in /) that exist beforehand and must survive untouched."""
    return pytest.param(data, list(args), expect, name, pre, id=id)


ERROR_CASES = [
    E("not_json", b"hello, this is not a trace\n", "not a JSON trace"),
    E("binary_garbage", GARBAGE, "not a JSON trace"),
    E("brace_then_garbage", b"{" + GARBAGE, "not valid JSON"),
    E("empty_file", b"", "file is empty"),
    E("whitespace_only", b" \n\t\r\n  ", "file is empty"),
    E("truncated_mid_event", VALID[: VALID.index(b'{"name":"k57"') + 20], "not valid JSON"),
    E("truncated_bare_array", b'[{"name":"a","ph":"X","ts":1,', "not valid JSON"),
    E("trailing_garbage", VALID + b"\n}garbage", "not valid JSON"),
    E("truncated_gzip", PACKED[: len(PACKED) // 2], "gzip stream is truncated"),
    E("gzip_without_trailer", PACKED[:-4], "gzip stream is truncated"),
    E("gzip_magic_only", b"\x1f\x8b", "gzip"),
    E("corrupt_gzip", flipped(PACKED), "corrupt gzip data"),
    E("gzip_of_garbage", gzip.compress(GARBAGE), "not a JSON trace", name="trace.json.gz"),
    E("gzip_of_nothing", gzip.compress(b""), "file is empty", name="trace.json.gz"),
    E("top_level_number", b"42", "not a JSON trace"),
    E("top_level_string", b'"traceEvents"', "not a JSON trace"),
    E("top_level_null", b"null", "not a JSON trace"),
    E("no_traceEvents", b'{"displayTimeUnit":"ns","events":[]}', "no 'traceEvents' key"),
    E("traceEvents_object", b'{"traceEvents":{"0":{}}}', "'traceEvents' is not a list"),
    E("traceEvents_number", b'{"traceEvents":3}', "'traceEvents' is not a list"),
    E("traceEvents_null", b'{"traceEvents":null}', "'traceEvents' is not a list"),
    E("traceEvents_string", b'{"traceEvents":"[]"}', "'traceEvents' is not a list"),
    E("invalid_utf8_in_event", junk(b'{"name":"\xff\xfe","ph":"X","ts":1,"dur":1,"pid":1,"tid":1}'),
      "not valid JSON"),
    E("nested_beyond_decoder_limit", junk(deep_x(5000)), "nested"),
    E("nan_is_not_json", junk(b'{"name":"x","ph":"X","ts":NaN,"dur":1,"pid":1,"tid":1}'), "no NaN"),
    E("lone_surrogate_escape", junk(b'{"name":"a\\ud800","ph":"X","ts":1,"dur":1,"pid":1,"tid":1}'), "lone surrogate"),
    E("input_is_a_fifo", FIFO, "not a regular file"),
    E("missing_input", None, "no such file"),
    E("input_is_directory", DIR, "is a directory"),
    E("output_exists", VALID, "already exists", pre=("trace.perfetto-trace",)),
    E("output_exists_with_o", VALID, "already exists", "-o", "{out}", pre=("out.perfetto-trace",)),
    E("output_is_the_input", VALID, "is an input", "-o", "{in}"),
    E("output_dir_missing", VALID, "does not exist", "-o", "{nodir}"),
    E("output_is_directory", VALID, "is a directory", "-o", "{out}", "--overwrite",
      pre=("out.perfetto-trace/",)),
    E("output_is_directory_without_overwrite", VALID, "is a directory", "-o", "{out}", pre=("out.perfetto-trace/",)),
    E("strict_missing_ts", junk(without(X(), "ts")), "missing_ts: 1", "--strict"),
    E("strict_negative_dur", junk(X(dur=-1)), "negative_dur: 1", "--strict"),
    E("strict_both", junk(without(X(), "ts"), X(dur=-3), X(dur=-4)), "missing_ts: 1, negative_dur: 2",
      "--strict"),
]
_DO_NEXT = re.compile(r"; .*\b(pass|re-export|re-copy|check|fix|create|choose|make|run|try|free|cut|pick|save|"
                      r"simplify)\b")


def cgtrace(tmp_path: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "converter.cli", "convert", *map(str, args)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else p.stat().st_mode
            for p in sorted(root.rglob("*"))}


def make_input(tmp_path: Path, data, name: str) -> Path:
    path = tmp_path / name
    if data is DIR:
        path.mkdir()
    elif data is FIFO:
        os.mkfifo(path)
    elif data is not None:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("data, args, expect, name, pre", ERROR_CASES)
def test_bad_input_fails_cleanly(tmp_path, data, args, expect, name, pre):
    source = make_input(tmp_path, data, name)
    out = tmp_path / "out.perfetto-trace"
    paths = {"in": source, "out": out, "nodir": tmp_path / "missing" / out.name}
    for entry in pre:
        (tmp_path / entry).mkdir() if entry.endswith("/") else (tmp_path / entry).write_bytes(b"earlier output")
    before = snapshot(tmp_path)

    run = cgtrace(tmp_path, source, *[a.format(**paths) for a in args])

    assert "Traceback" not in run.stderr and run.returncode == 2, run.stderr[-1500:]
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cgtrace: error: "), run.stderr[-1500:]
    # The file the problem is about: an output in the way, else OUT if given, else the input.
    outs = [paths[key] for key in ("out", "nodir") if f"{{{key}}}" in args]
    named = tmp_path / pre[0].rstrip("/") if pre else outs[0] if outs else source
    assert str(named) in lines[0] and expect in lines[0] and _DO_NEXT.search(lines[0]), lines[0]
    assert snapshot(tmp_path) == before  # nothing written, no temp files, input and old output untouched


# -- usable files with junk events: skipped and counted, never fatal without --strict --------------------
def S(id, data, skipped, kept, name="trace.json", tp=False):
    """kept: slices + instants the summary must report; tp: also load the output in trace_processor."""
    return pytest.param(data, skipped, kept, name, tp, id=id)


SKIP_CASES = [
    S("gzip_with_json_suffix", PACKED, {}, VALID_KEPT, tp=True),
    S("plain_json_with_gz_suffix", VALID, {}, VALID_KEPT, name="trace.json.gz"),
    S("concatenated_gzip_members", gzip.compress(VALID[:1000]) + gzip.compress(VALID[1000:]), {}, VALID_KEPT),
    S("bare_event_array", b"[" + json.dumps(GOOD).encode() + b"]", {}, 1),
    S("leading_whitespace_over_64_bytes", b"\n" * 100 + junk(), {}, 1),
    S("events_not_objects", junk(42, "x", [1], None, True), {"event_not_an_object": 5}, 1),
    S("event_without_ph", junk(without(X(), "ph")), {"missing_phase": 1}, 1),
    S("ph_not_a_string", junk(X(ph=5), X(ph=["X"]), X(ph={"X": 1})), {"missing_phase": 3}, 1),
    S("unknown_phase", junk(X(ph="Z"), X(ph="")), {"unsupported_phase": 2}, 1),
    S("X_without_ts", junk(without(X(), "ts")), {"missing_ts": 1}, 1),
    S("X_without_dur", junk(without(X(), "dur")), {"missing_dur": 1}, 1),
    S("X_negative_dur", junk(X(dur=-1), X(dur=-0.5)), {"negative_dur": 2}, 1),
    S("X_string_or_bool_dur", junk(X(dur="12"), X(dur=True)), {"bad_dur": 2}, 1),
    S("args_null", junk(X(args=None)), {}, 2, tp=True),
    S("args_not_an_object", junk(X(args=[1, None]), X(args="s"), X(args=5), X(args={})), {}, 5),
    S("name_null", junk(X(name=None)), {"missing_name": 1}, 1),
    S("name_and_cat_not_strings", junk(X(name=5, cat=["c"])), {}, 2),
    S("pid_missing", junk(without(X(), "pid")), {"missing_pid": 1}, 1),
    S("pid_float_or_list", junk(X(pid=1.5), X(pid=[1]), X(tid={"a": 1})), {"bad_pid_or_tid": 3}, 1),
    S("tid_missing", junk(without(X(), "tid")), {"missing_tid": 1}, 1),
    S("E_without_B", junk(without(X(ph="E", ts=5), "dur")), {"end_without_begin": 1}, 1, tp=True),
    S("B_without_E", junk(without(X(ph="B", ts=5), "dur")), {"begin_without_end": 1}, 1),
    S("E_before_B", junk(without(X(ph="B", ts=5), "dur"), without(X(ph="E", ts=3), "dur")),
      {"end_before_begin": 1}, 1),
    S("huge_nested_args", junk(X(args={f"k{i}": {"v": [i, {"s": "y" * 40}]} for i in range(20000)}),
                               X(args={"d": [[[[[[[[[[1, None]]]]]]]]]]}), deep_x(900)),
      {}, 4, tp=True),
    S("huge_nested_args_with_null", junk(deep_x(600, b'"n":null,')), {}, 2),
    S("nan_like_strings", junk(X(ts="NaN"), X(dur="Infinity"), X(ts="-Infinity"), X(ts="1e400"),
                               X(name="NaN", pid="NaN", tid="inf", args={"v": "NaN"})),
      {"bad_ts": 3, "bad_dur": 1}, 2, tp=True),
    S("numbers_beyond_float_range_in_args",
      junk(b'{"name":"c","ph":"C","ts":1,"pid":1,"args":{"v":1e400,"w":1}}',
           b'{"name":"b","ph":"B","ts":1,"pid":1,"tid":2,"args":{"v":1}}',
           b'{"name":"b","ph":"E","ts":2,"pid":1,"tid":2,"args":{"w":-1e400}}',
           b'{"name":"x","ph":"X","ts":1,"dur":1,"pid":1,"tid":1,"args":{"v":1e400,"n":null}}',
           b'{"name":"process_name","ph":"M","pid":1,"args":{"name":"p","big":1e400}}',
           header=b'"otherData":{"big":1e400},'),
      {}, 3, tp=True),
    S("ts_beyond_float_range", junk(b'{"name":"x","ph":"X","ts":1e400,"dur":1,"pid":1,"tid":1}'),
      {"ts_out_of_range": 1}, 1),
    S("ts_outside_protobuf_range", junk(X(ts=-5), X(ts=10**30), X(ts=1e300), X(dur=10**30), X(dur=1e300)),
      {"ts_out_of_range": 5}, 1, tp=True),
    S("dur_infinite_once_in_ns", junk(X(dur=1.7976931348623157e308), X(dur=1e306), X(ts=1.7976931348623157e308)),
      {"ts_out_of_range": 3}, 1),
]


@pytest.mark.parametrize("data, skipped, kept, name, tp", SKIP_CASES)
def test_junk_events_are_skipped_and_counted(tmp_path, data, skipped, kept, name, tp):
    source = make_input(tmp_path, data, name)
    before = snapshot(tmp_path)

    run = cgtrace(tmp_path, source)

    assert "Traceback" not in run.stderr and run.returncode == 0, run.stderr[-1500:]
    assert len(run.stderr.splitlines()) == 1 and run.stderr.startswith("cgtrace: "), run.stderr[-1500:]
    summary = json.loads(run.stdout)
    out = tmp_path / "trace.perfetto-trace"
    assert snapshot(tmp_path) == {**before, out.name: (out.read_bytes(), out.stat().st_mtime_ns)}
    assert summary["skipped_by_reason"] == skipped
    assert summary["events_skipped"] == sum(skipped.values())
    assert summary["slices"] + summary["instants"] == kept
    if tp:
        from converter import open_trace

        with open_trace(out) as processor:
            assert next(iter(processor.query("select count(*) as n from slice"))).n == kept
            losses = [(r.name, r.value) for r in processor.query(
                "select name, value from stats where severity in ('error', 'data_loss') and value > 0")]
            assert losses == []


# -- every command: bad options, odd files and odd rank metadata fail as cleanly ---------------------------------
def run_cli(cwd: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "converter.cli", *map(str, args)],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def assert_clean_error(run: subprocess.CompletedProcess, expect: str, root: Path, before: dict) -> None:
    """Exit 2, one `cgtrace: error:` line that says `expect` and what to do, nothing written."""
    assert "Traceback" not in run.stderr and run.returncode == 2, run.stderr[-1500:]
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cgtrace: error: "), run.stderr[-1500:]
    assert expect in lines[0] and _DO_NEXT.search(lines[0]), lines[0]
    assert snapshot(root) == before  # no output, no temp file


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[Path]:
    from converter.generator import write_pp_run

    return write_pp_run(tmp_path_factory.mktemp("ranks"), pp_size=2, steps=1, seed=1, graphs_per_step=1,
                        kernels_per_replay=2, microbatches=2)


def O(id, expect, *args, pre=()):
    """args may name {in} (VALID), {ranks} (two rank traces), {bad} (a file that is no trace) or {dir};
    pre: files (dirs if ending in /) made beforehand."""
    return pytest.param(list(args), expect, pre, id=id)


OPTION_CASES = [
    *[O(f"window_{text or 'empty'}", "--window", "convert", "{in}", "--window", text)
      for text in ("abc", "5:1", "1:1", "nan:inf", "1e400:", ":", "", "-1:2")],
    O("window_beyond_int64", "beyond", "convert", "{in}", "--window", "99999999999999999999999:"),
    O("window_past_the_end", "spans 0 to 1.995 ms", "compact", "{in}", "--window", "500:"),
    O("steps_downwards", "--steps", "convert", "{in}", "--steps", "5-1"),
    O("steps_negative", "--steps", "convert", "{in}", "--steps", "-1"),
    O("steps_huge_range", "no ProfilerStep#1..", "compact", "{in}", "--steps", "1-99999999999999999999999"),
    O("ranks_downwards", "--ranks", "merge", "{ranks}", "--ranks", "4-1"),
    O("ranks_huge_range", "--ranks leaves 0", "merge", "{ranks}", "--ranks", "7-99999999999"),
    O("jobs_zero", "--jobs", "merge", "{ranks}", "--jobs", "0"),
    O("jobs_negative", "--jobs", "merge", "{ranks}", "--jobs", "-3"),
    O("jobs_not_a_number", "--jobs", "merge", "{ranks}", "--jobs", "two"),
    O("top_negative", "--top", "report", "{in}", "--top", "-1"),
    O("top_beyond_sql", "--top", "report", "{in}", "--top", "99999999999999999999"),
    O("output_empty", "output path is empty", "convert", "{in}", "-o", ""),
    O("output_is_a_directory", "is a directory", "compact", "{in}", "-o", "{dir}"),
    O("missing_input_argument", "required", "convert"),
    O("lanes_not_utf8", "not UTF-8", "compact", "{in}", "--lanes", "{bad}"),
    O("lanes_device", "not a regular file", "compact", "{in}", "--lanes", "/dev/zero"),
    O("query_file_device", "not a regular file", "query", "{in}", "-f", "/dev/zero"),
    # merge refuses its output before reading a rank: the inputs here are no traces at all
    O("merge_output_exists", "already exists", "merge", "{bad}", "{bad}", "-o", "{out}", pre=("out.perfetto-trace",)),
    O("merge_output_dir_missing", "does not exist", "merge", "{bad}", "{bad}", "-o", "{dir}/missing/out"),
    O("view_empty_directory", "is a directory with no trace files", "view", "{dir}", "--no-browser"),
]


@pytest.mark.parametrize("args, expect, pre", OPTION_CASES)
def test_bad_options_fail_cleanly(tmp_path, ranks, args, expect, pre):
    source = make_input(tmp_path, VALID, "trace.json")
    bad = make_input(tmp_path, b"\xff\xfe not text", "bad.toml")
    (tmp_path / "dir").mkdir()
    for entry in pre:
        (tmp_path / entry).mkdir() if entry.endswith("/") else (tmp_path / entry).write_bytes(b"earlier output")
    paths = {"in": source, "bad": bad, "dir": tmp_path / "dir", "out": tmp_path / "out.perfetto-trace"}
    expanded = [str(r) for a in args for r in (ranks if a == "{ranks}" else [a.format(**paths)])]
    before, ranks_before = snapshot(tmp_path), snapshot(ranks[0].parent)

    run = run_cli(tmp_path, *expanded)

    assert_clean_error(run, expect, tmp_path, before)
    assert snapshot(ranks[0].parent) == ranks_before


def rank_header(case: str) -> Callable[[dict], None]:
    def mutate(document: dict) -> None:
        info = document["distributedInfo"]
        pp = next(group for group in info["pg_config"] if group["pg_desc"] == "mesh_pp")
        exec(case, {"d": document, "info": info, "pp": pp})
    return mutate


@pytest.mark.parametrize("case, field", [
    ('info["world_size"] = [2]', "distributedInfo.world_size"),
    ('info["world_size"] = {"n": 2}', "distributedInfo.world_size"),
    ('pp["ranks"] = [1, [0]]', "distributedInfo.pg_config"),
    ('pp["ranks"] = [1, "0"]', "distributedInfo.pg_config"),
    ('info["rank"] = True', "distributedInfo.rank"),
    ('d["baseTimeNanoseconds"] = 2**70', "baseTimeNanoseconds"),
    ('d["baseTimeNanoseconds"] = -10**18', "baseTimeNanoseconds"),
])
def test_odd_rank_metadata_fails_cleanly(tmp_path, ranks, case, field):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for path in ranks:
        document = json.loads(path.read_text())
        if path == ranks[0]:
            rank_header(case)(document)
        (run_dir / path.name).write_text(json.dumps(document))
    before = snapshot(tmp_path)

    run = run_cli(tmp_path, "merge", run_dir)

    assert_clean_error(run, field, tmp_path, before)
    assert str(run_dir / ranks[0].name) in run.stderr


KERNELS_OF_AS = junk(X(name="a" * 33 + "b", cat="kernel"), X(name="a" * 60 + "b", cat="kernel"),
                     X(name="a" * 40, cat="kernel"))


@pytest.mark.parametrize("pattern, outcome", [("^(a+)+$", 0), ("^(a|aa)+$", 2)])
def test_lane_rules_that_backtrack_cannot_hang(tmp_path, pattern, outcome):
    """regex stops a match past its budget; one that it finishes fast gives the right lanes."""
    from converter.lane_rules import DEFAULT_LANES_TOML

    source = make_input(tmp_path, KERNELS_OF_AS, "trace.json")
    rules = tmp_path / "lanes.toml"
    rules.write_text(DEFAULT_LANES_TOML + f"\n[[rules]]\nname = '{pattern}'\ngroup = \"memset\"\n")
    before = snapshot(tmp_path)

    run = run_cli(tmp_path, "compact", source, "--lanes", rules)

    if outcome == 2:
        assert_clean_error(run, "simplify its regex", tmp_path, before)
    else:
        assert run.returncode == 0, run.stderr[-1500:]
        assert json.loads(run.stdout)["slice_groups"] == {"Compute": 2, "Memset": 1}


def test_demo_reruns_in_its_own_directory_and_says_how_to_view(tmp_path):
    for _ in range(2):
        run = run_cli(tmp_path, "demo")
        assert run.returncode == 0, run.stderr[-1500:]
    assert "cgtrace view cgtrace-demo" in run.stderr.replace(os.sep, "/")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    assert_clean_error(run_cli(tmp_path, "demo", foreign), "did not write", tmp_path, before)
