"""cgtrace query: SQL on any trace, printed as an aligned table, CSV or JSON; one-line errors."""

from __future__ import annotations

import csv
import io
import json

import pytest

from converter.cli import main
from .helpers import convert_file

from .helpers import write_json

EVENTS = {"traceEvents": [
    {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "trainer"}},
    {"ph": "X", "name": "step", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {"ph": "X", "name": "gemm", "cat": "kernel", "pid": 1, "tid": 7, "ts": 10, "dur": 2.5},
    {"ph": "X", "name": "gemm", "cat": "kernel", "pid": 1, "tid": 7, "ts": 20, "dur": 1000},
    {"ph": "X", "name": "a,b \"quoted\"\nline", "cat": "kernel", "pid": 1, "tid": 7, "ts": 30, "dur": 1},
]}
SQL = "select name, count(*) as n, sum(dur) as total, avg(dur) / 1000.0 as mean_us, null as missing " \
      "from slice where category = 'kernel' group by name order by total desc"


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("query")
    source = write_json(folder / "t.json.gz", EVENTS)
    converted = folder / "t.perfetto-trace"
    convert_file(source, converted)
    return source, converted


def query(capsys, *args) -> tuple[int, str, str]:
    code = main(["query", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_table_is_aligned_with_numbers_right(traces, capsys):
    code, out, _ = query(capsys, traces[1], SQL)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["name", "n", "total", "mean_us", "missing"]
    assert set(lines[1]) == {"-", " "}
    assert len(lines[1]) == max(map(len, lines))   # columns padded to one width (no trailing blanks)
    assert lines[2].index("gemm") == lines[3].index("a,b") == 0
    assert lines[2].split() == ["gemm", "2", "1002500", "501.25", "NULL"]
    assert lines[2].index("1002500") + len("1002500") == lines[0].index("total") + len("total")  # right-aligned
    assert lines[3].startswith('a,b "quoted"\\nline ')   # a newline never breaks a row


def test_csv_and_json(traces, capsys):
    _, out, _ = query(capsys, traces[1], SQL, "--format", "csv")
    rows = list(csv.reader(io.StringIO(out)))
    assert rows == [["name", "n", "total", "mean_us", "missing"], ["gemm", "2", "1002500", "501.25", ""],
                    ['a,b "quoted"\nline', "1", "1000", "1.0", ""]]
    _, out, _ = query(capsys, traces[1], SQL, "--format", "json")
    assert json.loads(out) == [
        {"name": "gemm", "n": 2, "total": 1002500, "mean_us": 501.25, "missing": None},
        {"name": 'a,b "quoted"\nline', "n": 1, "total": 1000, "mean_us": 1.0, "missing": None}]
    _, out, _ = query(capsys, traces[1], "select 1 as a, 2 as a", "--format", "json")
    assert json.loads(out) == [{"a": 1, "a_2": 2}]


def test_raw_json_trace_and_sql_file(traces, capsys, tmp_path):
    sql_file = tmp_path / "q.sql"
    sql_file.write_text("select count(*) as n from slice where name = 'gemm'")
    for trace in traces:
        code, out, _ = query(capsys, trace, "-f", sql_file, "--format", "json")
        assert (code, json.loads(out)) == (0, [{"n": 2}])


@pytest.mark.parametrize("args, message", [
    (["select nope from slice"], "SQL error at line 1, column 8 (near `nope from slice`): no such column: nope"),
    (["selec 1"], "syntax error"),
    ([], "give the query either as SQL or with -f FILE"),
    (["select 1", "-f", "x.sql"], "give the query either as SQL or with -f FILE"),
    (["-f", "/nonexistent/q.sql"], "/nonexistent/q.sql: cannot read"),
])
def test_errors_are_one_line_exit_2(traces, capsys, args, message):
    code, out, err = query(capsys, traces[1], *args)
    assert (code, out) == (2, "")
    assert err.startswith("cgtrace: error: ") and err.count("\n") == 1 and message in err


def test_missing_trace(capsys, tmp_path):
    code, _, err = query(capsys, tmp_path / "missing.perfetto-trace", "select 1")
    assert code == 2
    assert err == f"cgtrace: error: {tmp_path / 'missing.perfetto-trace'}: no such file; check the path and try again\n"


LONG = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<" + "x" * 400 + ">"
WIDE_EVENTS = {"traceEvents": [
    {"ph": "X", "name": LONG, "cat": "kernel", "pid": 1, "tid": 7, "ts": 10, "dur": 123456.789},
    {"ph": "X", "name": "gemm", "cat": "kernel", "pid": 1, "tid": 7, "ts": 200000, "dur": 1},
]}
WIDE_SQL = "select name, category, dur, count(*) as n from slice group by name order by dur desc"


def test_table_fits_the_terminal_and_wide_keeps_cells(capsys, monkeypatch, tmp_path):
    trace = write_json(tmp_path / "long.json", WIDE_EVENTS)
    monkeypatch.setenv("COLUMNS", "60")   # what the terminal says it is
    code, out, _ = query(capsys, trace, WIDE_SQL)
    lines = out.splitlines()
    assert code == 0 and max(map(len, lines)) == 60
    assert lines[2].split()[-2:] == ["123456789", "1"]   # numbers are never cut
    assert lines[2].startswith("void at::native::") and "…" in lines[2] and LONG not in out
    assert lines[3].split() == ["gemm", "kernel", "1000", "1"]
    code, out, _ = query(capsys, trace, WIDE_SQL, "--wide")
    assert code == 0 and out.splitlines()[2].startswith(LONG + "  ")


def test_raw_json_reads_as_its_conversion(capsys, tmp_path):
    """Partially overlapping slices on one thread: trace_processor's JSON importer drops one,
    our reader keeps both, so a raw trace answers as its .perfetto-trace does."""
    trace = write_json(tmp_path / "overlap.json", {"traceEvents": [
        {"ph": "X", "name": "a", "cat": "kernel", "pid": 1, "tid": 7, "ts": 0, "dur": 10},
        {"ph": "X", "name": "b", "cat": "kernel", "pid": 1, "tid": 7, "ts": 5, "dur": 10}]})
    code, out, _ = query(capsys, trace, "select count(*) as n from slice", "--format", "json")
    assert (code, json.loads(out)) == (0, [{"n": 2}])
