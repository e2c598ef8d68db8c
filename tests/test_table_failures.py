"""A cgtrace view that fails in a trace_processor (one lacking a table or column a view
reads, or a view's own mistake) is blamed on the views and that trace_processor's version,
in one line that says what to do; never on the trace, nor on the user's query."""

from __future__ import annotations

import json

import pytest

from converter import open_trace
from converter.cli import main
from converter.errors import CgtraceError
from converter.tp import tables

EVENTS = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "worker"}},
          {"name": "step", "cat": "cpu_op", "ph": "X", "ts": 10, "dur": 100, "pid": 1, "tid": 2}]


@pytest.fixture
def trace(tmp_path, monkeypatch):
    monkeypatch.delenv("CGTRACE_TP_BIN", raising=False)  # the built-in trace_processor
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": EVENTS}))
    return path


def with_view(monkeypatch, body: str) -> None:
    """One more view, as a trace_processor that cannot run it sees it."""
    monkeypatch.setattr(tables, "_VIEWS", (*tables._VIEWS, ("cgtrace_broken", body)))


def blamed_on_the_views(message: str) -> None:
    assert "\n" not in message.strip()
    assert f"cgtrace's SQL view cgtrace_broken (tables version {tables.VERSION}) fails in Perfetto v52" in message
    assert "the trace is not at fault" in message and "report this line" in message
    assert "fix the query" not in message and "cannot open trace" not in message


def test_a_view_that_reads_a_missing_column_is_blamed_where_a_query_reads_it(trace, monkeypatch, capsys):
    # SQLite compiles a view only where a query reads it: the failure comes inside the query.
    with_view(monkeypatch, " select no_such_column from slice")
    assert main(["query", str(trace), "select count(*) as n from cgtrace_broken"]) == 2
    out, err = capsys.readouterr()
    assert not out and err.startswith(f"cgtrace: error: {trace}: ")
    blamed_on_the_views(err)
    assert "no such column: no_such_column" in err


def test_a_view_that_cannot_be_created_is_blamed_when_the_trace_opens(trace, monkeypatch):
    with_view(monkeypatch, " select from where")
    with pytest.raises(CgtraceError) as raised:
        open_trace(trace)
    assert isinstance(raised.value, tables.TablesUndefined)
    blamed_on_the_views(str(raised.value))


def test_the_query_is_blamed_where_the_views_work(trace, capsys):
    assert main(["query", str(trace), "select no_such_column from cgtrace_slice"]) == 2
    err = capsys.readouterr().err
    assert "no such column: no_such_column; fix the query" in err and "not at fault" not in err
    assert main(["query", str(trace), "select count(*) as n from cgtrace_slice where name = 'step'"]) == 0
    assert capsys.readouterr().out.split() == ["n", "-", "1"]
