"""One trace read by several worker processes (inputs/piece_workers.py) writes the bytes one
process writes, a span the workers could not make (a cut inside a string, a corrupt piece, a
worker killed) is read in the main process with the same outcome, and the worker counts
follow --jobs and the cores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest

from converter.inputs import event_pieces, piece_workers
from converter.inputs.source import read_input_bytes
from converter.errors import CgtraceError
from converter.generator import GeneratorConfig, write_trace
from converter.tuning import Tuning

from .helpers import child_pids, compact_file, convert_file, rows, shared_trace_param, shared_trace_paths
from .test_event_pieces import tricky_document, whole_document_output

ONE = Tuning(cores=4, read_workers=1)
# Three workers on any trace, spans of two 16 KB pieces: many spans per worker.
THREE = Tuning(cores=4, read_workers=3, read_workers_min_json_bytes=0, piece_bytes=1 << 14, pieces_per_span=2)
SMALL_SPANS = Tuning(cores=4, read_workers=3, read_workers_min_json_bytes=0, piece_bytes=1 << 12, pieces_per_span=1)
TOP_LEVEL = [p for p in shared_trace_paths() if p.parent.name == "traces"]


@pytest.fixture
def forks(monkeypatch) -> list[int]:
    """The workers forked, counted. pytest's numpy runs idle BLAS threads, which the command
    line does not (test_background_args), and which would rule the workers out here."""
    forked: list[int] = []
    fork = piece_workers._fork

    def counted(*args):
        forked.append(1)
        fork(*args)

    monkeypatch.setattr(piece_workers, "_fork", counted)
    monkeypatch.setattr(piece_workers, "process_threads", lambda: 1)
    return forked


def spans_of(path, tuning: Tuning) -> int:
    text = read_input_bytes(path)
    layout = event_pieces.locate_events(text)
    return 0 if layout is None else len(event_pieces.spans(text, layout, tuning.piece_bytes * tuning.pieces_per_span))


@pytest.mark.parametrize("path", [shared_trace_param(p) for p in TOP_LEVEL])
def test_real_traces_read_by_three_workers_are_byte_identical(tmp_path, forks, path):
    others = set(child_pids(os.getpid()))  # another test's in this process (a browser driver, an executor)
    one, three = tmp_path / "one.perfetto-trace", tmp_path / "three.perfetto-trace"
    summary_one = convert_file(path, one, tuning=ONE)
    assert forks == []
    summary_three = convert_file(path, three, tuning=THREE)
    assert len(forks) == min(3, spans_of(path, THREE))
    assert three.read_bytes() == one.read_bytes()
    assert {k: v for k, v in summary_three.items() if k != "output"} == \
        {k: v for k, v in summary_one.items() if k != "output"}
    assert not set(child_pids(os.getpid())) - others  # every reader it forked is gone


def test_a_generated_trace_read_by_workers_is_byte_identical_and_complete(tmp_path, monkeypatch, forks):
    source = write_trace(GeneratorConfig(seed=7, steps=2, graphs_per_step=3, kernels_per_replay=12),
                         tmp_path / "generated.json")
    compacted = tmp_path / "three.perfetto-trace"
    compact_file(source, compacted, tuning=THREE)
    assert len(forks) == 3
    assert compacted.read_bytes() == whole_document_output(monkeypatch, compact_file, source, tmp_path / "whole.pt")
    # Converted, every complete event and instant of the input is a slice (oracle: the JSON itself).
    converted = tmp_path / "converted.perfetto-trace"
    convert_file(source, converted, tuning=THREE)
    document = json.loads(source.read_bytes())
    base = document.get("baseTimeNanoseconds", 0)
    expected = Counter((e["name"], base + round(e["ts"] * 1000), round(e.get("dur", 0) * 1000))
                       for e in document["traceEvents"] if e["ph"] in "XiI")
    assert Counter((r["name"], r["ts"], r["dur"]) for r in rows(converted, "select name, ts, dur from slice")) \
        == expected


@pytest.mark.parametrize("events_last", [True, False])
def test_spans_cut_inside_strings_are_read_here_with_the_same_bytes(tmp_path, monkeypatch, forks, events_last):
    """The tricky document's strings and nested values hold `},{`: cut there, a span does not
    decode, and the main process reads from its start on."""
    tiny = Tuning(cores=4, read_workers=2, read_workers_min_json_bytes=0, piece_bytes=1, pieces_per_span=1)
    source = tmp_path / "tricky.json"
    source.write_bytes(tricky_document(events_last))
    output = tmp_path / "pieces.perfetto-trace"
    convert_file(source, output, tuning=tiny)
    assert len(forks) == 2
    assert output.read_bytes() == whole_document_output(monkeypatch, convert_file, source, tmp_path / "whole.pt")


def test_a_worker_killed_mid_read_leaves_the_read_to_this_process(tmp_path, monkeypatch, forks):
    others = set(child_pids(os.getpid()))
    source = write_trace(GeneratorConfig(seed=3, steps=2, graphs_per_step=2, kernels_per_replay=8),
                         tmp_path / "generated.json")
    expected = tmp_path / "one.perfetto-trace"
    compact_file(source, expected, tuning=ONE)
    made = piece_workers.decoded_parts
    reader_pid = os.getpid()

    def dies_on_its_second_span(text, span, *args, **kwargs):
        if os.getpid() != reader_pid and span.start > 1 << 16:
            os.kill(os.getpid(), signal.SIGKILL)
        return made(text, span, *args, **kwargs)

    monkeypatch.setattr(piece_workers, "decoded_parts", dies_on_its_second_span)
    output = tmp_path / "three.perfetto-trace"
    assert spans_of(source, SMALL_SPANS) > 6
    compact_file(source, output, tuning=SMALL_SPANS)
    assert len(forks) == 3
    assert output.read_bytes() == expected.read_bytes()
    assert not set(child_pids(os.getpid())) - others  # every reader it forked is gone


@pytest.mark.parametrize("damage, message", [("truncated", r"not valid JSON \(Input data was truncated\)"),
                                             ("bad byte mid-array", r"not valid JSON \(.*byte \d+\)")])
def test_a_corrupt_piece_gives_the_error_one_process_gives(tmp_path, forks, damage, message):
    others = set(child_pids(os.getpid()))
    source = write_trace(GeneratorConfig(seed=4, steps=2, graphs_per_step=2, kernels_per_replay=8),
                         tmp_path / "generated.json")
    text = source.read_bytes()
    middle = text.index(b'"ph"', len(text) // 2)
    source.write_bytes(text[:middle] if damage == "truncated" else text[:middle] + b"@" + text[middle + 1:])
    errors = []
    for name, tuning in (("one", ONE), ("three", SMALL_SPANS)):
        with pytest.raises(CgtraceError, match=message) as raised:
            compact_file(source, tmp_path / f"{name}.perfetto-trace", tuning=tuning)
        errors.append(raised.value.message)
        assert not (tmp_path / f"{name}.perfetto-trace").exists()
    assert errors[0] == errors[1] and "\n" not in errors[0]
    assert len(forks) == (0 if damage == "truncated" else 3)  # a truncated document has no events array to cut
    assert not set(child_pids(os.getpid())) - others  # every reader it forked is gone


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "converter.cli", *argv], capture_output=True, text=True)


def test_the_command_line_s_jobs_sets_the_workers_and_jobs_1_reads_in_one_process(tmp_path, monkeypatch, forks):
    """In-process main(), so the forks are counted; a trace just over the size the workers start at."""
    from converter.cli import main

    source = write_trace(GeneratorConfig(seed=9, steps=2, graphs_per_step=2, kernels_per_replay=8),
                         tmp_path / "generated.json")
    events = json.loads(source.read_bytes())
    base = events["traceEvents"]
    copies = Tuning().read_workers_min_json_bytes // len(source.read_bytes()) + 1
    events["traceEvents"] = base * copies
    source.write_text(json.dumps(events))
    for jobs, expected_forks in (("1", 0), ("2", 2)):
        forks.clear()
        assert main(["convert", str(source), "-o", str(tmp_path / f"jobs{jobs}.perfetto-trace"), "--jobs", jobs,
                     "-q"]) == 0
        assert len(forks) == expected_forks, jobs
    assert (tmp_path / "jobs1.perfetto-trace").read_bytes() == (tmp_path / "jobs2.perfetto-trace").read_bytes()


def test_a_corrupt_trace_read_by_workers_is_one_line_exit_2_and_nothing_written(tmp_path):
    source = write_trace(GeneratorConfig(seed=9, steps=2, graphs_per_step=2, kernels_per_replay=8),
                         tmp_path / "generated.json")
    document = json.loads(source.read_bytes())
    copies = Tuning().read_workers_min_json_bytes // len(source.read_bytes()) + 1
    document["traceEvents"] = document["traceEvents"] * copies
    text = json.dumps(document).encode()
    middle = text.index(b'"ph"', len(text) // 2)
    source.write_bytes(text[:middle] + b"@" + text[middle + 1:])
    outcomes = []
    for jobs in ("1", "2"):
        output = tmp_path / f"jobs{jobs}.perfetto-trace"
        done = _cli("convert", str(source), "-o", str(output), "--jobs", jobs)
        assert done.returncode == 2 and not output.exists()
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        outcomes.append(done.stderr)
    assert outcomes[0] == outcomes[1] and "not valid JSON" in outcomes[0]


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 8, 16])
def test_ranks_at_once_share_the_cores_with_their_readers(monkeypatch, cores):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    machine = Tuning.for_this_machine()
    assert machine.cores == cores
    # Workers only beside this process and its args helper, only two or more, and no more than
    # can keep the main process busy.
    assert machine.read_workers == {1: 1, 2: 1, 3: 1, 4: 2, 8: 3, 16: 3}[cores]
    for jobs in range(1, cores + 1):
        shared = machine.shared_by(jobs)
        assert shared.read_workers >= 1 and (shared.read_workers == 1 or jobs * shared.read_workers <= cores)
    assert machine.reading_with(1).read_workers == 1 and machine.reading_with(3).read_workers == 3
