"""The reader's piece-by-piece path gives exactly what reading the whole document gives.

Pieces are made tiny here so every trace is cut many times, including at `}` `,` `{` bytes
that sit inside strings and nested args, where a cut must be refused. The reference is the
whole-document path (locate_events disabled), and outputs must be byte-identical.
"""

from __future__ import annotations

import json

import pytest

from converter.inputs import event_pieces
from converter.inputs import kineto_reader as reader
from converter.errors import CgtraceError
from converter.generator import GeneratorConfig, write_trace
from converter.tuning import Tuning
from .helpers import compact_file, convert_file

from .helpers import problem_stats, rows, shared_trace_paths, shared_trace_param

BASE_NS = 1_700_000_000_000_000_000
TINY_PIECES = Tuning(piece_bytes=1)


def pieces_of(document: bytes, piece_bytes: int) -> list[int]:
    """How many events each piece the reader's cutter gives holds."""
    layout = event_pieces.locate_events(document)
    assert layout is not None
    return [len(events) for events, _, _ in event_pieces.iter_pieces(document, layout, piece_bytes=piece_bytes)]


def whole_document_output(monkeypatch, convert, source, output):
    with monkeypatch.context() as patch:
        patch.setattr(reader, "locate_events", lambda text: None)
        convert(source, output)
    return output.read_bytes()


def tricky_document(events_last: bool) -> bytes:
    """Pretty-printed like Kineto, with cut-like bytes in strings and nested values, and
    header keys after the events (the base time among them)."""
    events = [
        {"ph": "X", "name": 'has },{ and }, { inside', "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10.5,
         "dur": 5, "args": {"text": "x},\n{y", "list": [{"a": 1}, {"b": [{"c": 2}, {"d": 3}]}]}},
        {"ph": "X", "name": "plain", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 11, "dur": 2},
        {"ph": "X", "name": "kernel", "cat": "kernel", "pid": 0, "tid": 7, "ts": 12.25, "dur": 3.5,
         "args": {"grid": [1, 2, 3], "est. achieved occupancy %": 12.5, "nested": {"deep": {"x": "]}"}}}},
        {"ph": "i", "s": "t", "name": "mark ]", "pid": 1, "tid": 1, "ts": 13},
    ]
    document = {"schemaVersion": 1, "traceEvents": events}
    tail = {"deviceProperties": [{"id": 0, "name": "GPU ]"}], "traceName": "a ] b",
            "baseTimeNanoseconds": BASE_NS}
    document = {**document, **tail} if events_last else {**tail, **document}
    return json.dumps(document, indent=2).encode()


@pytest.mark.parametrize("events_last", [True, False], ids=["header-after-events", "header-before-events"])
def test_tricky_cuts_match_whole_document(tmp_path, monkeypatch, events_last):
    source = tmp_path / "tricky.json"
    source.write_bytes(tricky_document(events_last))
    output = tmp_path / "pieces.perfetto-trace"
    convert_file(source, output, tuning=TINY_PIECES)
    pieces = pieces_of(source.read_bytes(), TINY_PIECES.piece_bytes)
    assert sum(pieces) == 4 and len(pieces) >= 2, pieces
    assert output.read_bytes() == whole_document_output(monkeypatch, convert_file, source, tmp_path / "whole.pt")
    got = {(r["name"], r["ts"], r["dur"]) for r in rows(output, "select name, ts, dur from slice")}
    assert got == {('has },{ and }, { inside', BASE_NS + 10_500, 5_000), ("plain", BASE_NS + 11_000, 2_000),
                   ("kernel", BASE_NS + 12_250, 3_500), ("mark ]", BASE_NS + 13_000, 0)}
    args = {r["key"]: r["display_value"] for r in rows(output, """
        select a.key, a.display_value from slice s join args a using(arg_set_id) where s.name = 'kernel'""")}
    assert args["debug.args.nested.deep.x"] == "]}" and args["debug.args.grid[2]"] == "3"


def test_generated_trace_in_many_pieces(tmp_path, monkeypatch):
    source = write_trace(GeneratorConfig(seed=5, steps=1, graphs_per_step=2, kernels_per_replay=8),
                         tmp_path / "generated.json")
    output = tmp_path / "pieces.perfetto-trace"
    compact_file(source, output, tuning=Tuning(piece_bytes=2048))
    assert output.read_bytes() == whole_document_output(monkeypatch, compact_file, source, tmp_path / "whole.pt")
    assert problem_stats(output) == []


@pytest.mark.parametrize("path", [shared_trace_param(p) for p in shared_trace_paths()[:3]])
def test_real_traces_in_many_pieces(tmp_path, monkeypatch, path):
    output = tmp_path / "pieces.perfetto-trace"
    convert_file(path, output, tuning=Tuning(piece_bytes=1 << 14))
    assert output.read_bytes() == whole_document_output(monkeypatch, convert_file, path, tmp_path / "whole.pt")


@pytest.mark.parametrize("damage, message", [("truncated", r"not valid JSON \(Input data was truncated\)"),
                                             ("bad byte mid-array", r"not valid JSON \(.*byte \d+\)")])
def test_broken_documents_still_get_the_whole_document_error(tmp_path, damage, message):
    text = tricky_document(events_last=True)
    middle = text.index(b'"plain"')
    text = text[:middle + 40] if damage == "truncated" else text[:middle] + b"@" + text[middle + 1:]
    source = tmp_path / "broken.json"
    source.write_bytes(text)
    with pytest.raises(CgtraceError, match=message):
        convert_file(source, tmp_path / "out.perfetto-trace", tuning=TINY_PIECES)
    assert not (tmp_path / "out.perfetto-trace").exists()
