"""The args helper process: the same trace as encoding in process, and harmless when it fails."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from converter.tuning import DEFAULT_TUNING, Tuning, process_threads
from converter.outputs import args_accelerator as background_args
from converter.fileio.args_file import FileArgsStore
from converter.jobs.runner import args_store as make_args_store
from converter.errors import CgtraceError
from converter.generator import GeneratorConfig, write_trace
from converter.kineto import KERNEL_LABEL
from converter.outputs import prepared_args
from converter.outputs.annotations import ArgsEncoder
from converter.outputs.interning import annotation_name_interner
from converter.outputs.perfetto_writer import PerfettoWriter
from converter.inputs.kineto_reader import read_trace

from .helpers import child_pids, compact_file, convert_file, rows, write_json
from .test_convert_roundtrip import EDGE_CASES, actual_flows, actual_slices, assert_lossless

# Args that take every encoding path: dotted keys, floats, nulls, escapes, nested values, long ints.
TRICKY_ARGS = [
    {"est. achieved occupancy %": 55, "blocks per SM": 2.962963, "grid": [2, 1, 1], "name": "layers.4"},
    {"none": None, "empty": [], "nested": {"a": [1, None, {"b": "c\n\u00e9"}]}, "big": 2 ** 62 + 1},
    {"float": 1e-300, "neg": -12, "bool": True, "name": "layers.4"},
    {"name": "", "path": "a\\b"},
]


def _source(tmp_path: Path) -> Path:
    """A generated CUDA-graph trace plus every phase and the tricky args above."""
    generated = json.loads(write_trace(GeneratorConfig(seed=7, steps=1, graphs_per_step=3, kernels_per_replay=12),
                                       tmp_path / "generated.json").read_text())
    extra = EDGE_CASES["every_phase"]["traceEvents"] + [
        {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 50.0 + i, "dur": 0.5, "args": args}
        for i, args in enumerate(TRICKY_ARGS)]
    generated["traceEvents"] += extra
    return write_json(tmp_path / "source.json", generated)


def _run(job, source: Path, output: Path, monkeypatch, ahead: bool, tuning: Tuning = DEFAULT_TUNING) -> dict:
    """The job with the args strategy chosen explicitly: the helper, or in-process encoding."""
    return job(source, output, args_strategy="helper" if ahead else "in-process", tuning=tuning)


def _recorded(monkeypatch, owner: type, method: str) -> list:
    """Every value `owner.method` returns from now on, in order."""
    returned = []
    original = getattr(owner, method)

    def record(self):
        returned.append(original(self))
        return returned[-1]

    monkeypatch.setattr(owner, method, record)
    return returned


def _record_results(monkeypatch) -> list:
    """What every helper handed back (None for one that failed)."""
    return _recorded(monkeypatch, background_args.BackgroundArgsEncoder, "result")


def _comparable(summary: dict) -> dict:
    return {key: value for key, value in summary.items() if key not in ("output", "output_bytes")}


@pytest.mark.parametrize("job", [convert_file, compact_file], ids=["convert", "compact"])
def test_helper_gives_the_trace_in_process_encoding_gives(tmp_path, monkeypatch, job):
    small_runs = Tuning(spill_bytes=512)  # dozens of runs submitted while reading
    source = _source(tmp_path)
    ahead, in_process = tmp_path / "ahead.perfetto-trace", tmp_path / "in_process.perfetto-trace"
    results = _record_results(monkeypatch)
    summary = _run(job, source, ahead, monkeypatch, ahead=True, tuning=small_runs)
    assert results and all(isinstance(result, background_args.EncodedArgs) for result in results)
    assert _comparable(summary) == _comparable(_run(job, source, in_process, monkeypatch, ahead=False,
                                                    tuning=small_runs))
    assert ahead.read_bytes() == in_process.read_bytes()
    assert _children() == []  # a small trace's helper is gone once the args are read
    assert actual_slices(ahead) == actual_slices(in_process)
    assert actual_flows(ahead) == actual_flows(in_process)
    if job is convert_file:
        assert_lossless(source, ahead, summary)
    else:
        assert summary["kernel_annotations_converted"] > 0
        labels = rows(ahead, "select name, ts, dur from cgtrace_derived_slice where category = 'cuda_graph_label' order by ts, name")
        assert labels and labels == rows(in_process, "select name, ts, dur from cgtrace_derived_slice "
                                                     "where category = 'cuda_graph_label' order by ts, name")


def _record_packets(monkeypatch) -> list:
    """Whether the helper finished each batch's packets it was given."""
    return _recorded(monkeypatch, background_args._HelperPackets, "finished")


# Batches of 16 slices in parts of 4 packets, the helper and the writer sharing each one, as
# they do for a large trace.
MANY_BATCHES = Tuning(shared_write_entries=0, slices_at_once=16, packets_at_once=4)


@pytest.mark.parametrize("job", [convert_file, compact_file], ids=["convert", "compact"])
def test_the_helper_encodes_the_packets_the_writer_would(tmp_path, monkeypatch, job):
    """The helper stays on after the args to encode the later parts of each batch's packets;
    the file is the same, byte for byte, as one encoded here."""
    source = _source(tmp_path)
    ahead, in_process = tmp_path / "ahead.perfetto-trace", tmp_path / "in_process.perfetto-trace"
    taken = _record_packets(monkeypatch)
    _run(job, source, ahead, monkeypatch, ahead=True, tuning=MANY_BATCHES)
    assert len(taken) > 5 and all(taken)
    _run(job, source, in_process, monkeypatch, ahead=False, tuning=MANY_BATCHES)
    assert ahead.read_bytes() == in_process.read_bytes()
    assert _children() == []


def test_a_helper_gone_while_writing_only_costs_time(tmp_path, monkeypatch):
    """The helper dies at its first batch of packets: the writer encodes that batch and the
    rest itself, and writes the same file."""
    def die(requests, *_):
        requests.recv_bytes()  # the first batch
        os._exit(1)

    monkeypatch.setattr(background_args, "_serve_packets", die)  # the forked helper inherits it
    source = _source(tmp_path)
    ahead, in_process = tmp_path / "ahead.perfetto-trace", tmp_path / "in_process.perfetto-trace"
    taken = _record_packets(monkeypatch)
    _run(compact_file, source, ahead, monkeypatch, ahead=True, tuning=MANY_BATCHES)
    assert taken == [False]
    _run(compact_file, source, in_process, monkeypatch, ahead=False, tuning=MANY_BATCHES)
    assert ahead.read_bytes() == in_process.read_bytes()
    assert _children() == []


def test_labels_come_before_the_encoding_is_done(tmp_path, monkeypatch):
    """Compaction takes the helper's labels while the helper still encodes (the writer needs
    the encoding later): here the helper may finish encoding only once the labels were
    received, so a helper that sent them after encoding would have to give up waiting."""
    received, gave_up = tmp_path / "labels_received", tmp_path / "gave_up_waiting"
    encode_the_rest = background_args._encode_the_rest

    def once_labels_were_received(*arguments):
        deadline = time.monotonic() + 30
        while not received.exists():
            if time.monotonic() > deadline:
                gave_up.touch()
                break
            time.sleep(0.01)
        return encode_the_rest(*arguments)

    monkeypatch.setattr(background_args, "_encode_the_rest", once_labels_were_received)  # forked with it
    store = make_args_store("helper", compacts=True, tuning=Tuning(spill_bytes=256))  # several runs
    texts = [json.dumps({"name": f"layers.{i % 3}", "i": i, "grid": [i, 1, 1]}).encode() for i in range(60)]
    references = [store.add(text) for text in texts]
    assert store.labels(references, KERNEL_LABEL) == [f"layers.{i % 3}" for i in range(60)]
    received.touch()
    encoded = store.prepared(prepared_args.ARGS_FORM)
    assert isinstance(encoded, prepared_args.EncodedArgs) and not gave_up.exists()
    here = prepared_args.prepare_in_process(store)
    assert (encoded.interned, encoded.entries.tobytes()) == (here.interned, here.entries.tobytes())
    assert _children() == []


def test_a_helper_not_sharing_the_write_leaves_once_done():
    """Its answer waits in its file, not in the pipe: the helper exits after encoding the last
    run, without waiting for the writer to ask (its memory is not held beside compaction's)."""
    store = make_args_store("helper", compacts=True)
    texts = [json.dumps({"i": i, "dims": [[i], []]}).encode() for i in range(10_000)]  # bounds: 80 KB
    references = [store.add(text) for text in texts]
    store.labels(references, KERNEL_LABEL)
    helpers = _children()
    deadline = time.monotonic() + 30
    while not all(map(_exited, helpers)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert helpers and all(map(_exited, helpers))  # exited, not yet reaped
    encoded = store.prepared(prepared_args.ARGS_FORM)
    assert isinstance(encoded, prepared_args.EncodedArgs)
    assert encoded.entries.tobytes() == prepared_args.prepare_in_process(store).entries.tobytes()
    assert _children() == []


def _exited(pid: int) -> bool:
    """A child that ended and waits to be reaped (a zombie)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"


def test_a_failed_helper_only_costs_time(tmp_path, monkeypatch):
    def fail(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(background_args, "_serve", fail)  # the forked helper inherits it
    _assert_written_without_the_helper(tmp_path, monkeypatch)
    assert _children() == []


def test_a_helper_answering_for_fewer_entries_is_not_believed(tmp_path, monkeypatch):
    """The main process receives the helper's bounds straight into arrays sized for what it
    submitted; an answer that does not fill them (a helper that lost entries) is refused and
    the writer encodes the args itself."""
    submit = background_args.BackgroundArgsEncoder.submit

    def submit_and_miscount(self, bounds):
        submit(self, bounds)
        self._entries += 1

    monkeypatch.setattr(background_args.BackgroundArgsEncoder, "submit", submit_and_miscount)
    _assert_written_without_the_helper(tmp_path, monkeypatch)


def _assert_written_without_the_helper(tmp_path, monkeypatch) -> None:
    """A convert with the helper asked for, which gives nothing back: the writer encodes the
    args itself and the output is lossless all the same."""
    source = _source(tmp_path)
    output = tmp_path / "out.perfetto-trace"
    results = _record_results(monkeypatch)
    summary = _run(convert_file, source, output, monkeypatch, ahead=True)
    assert results and all(result is None for result in results)
    assert_lossless(source, output, summary)


def test_a_writer_that_interned_names_already_encodes_itself(tmp_path):
    """The helpers of two traces numbered their annotation names independently."""
    first = write_json(tmp_path / "a.json", {"traceEvents": [
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"x. y": 1.5, "z": "one"}}]})
    second = write_json(tmp_path / "b.json", {"traceEvents": [
        {"ph": "X", "name": "b", "pid": 2, "tid": 2, "ts": 1, "dur": 1, "args": {"z": "two", "w. v": 2.5}}]})
    output = tmp_path / "both.perfetto-trace"
    with output.open("wb") as stream:
        writer = PerfettoWriter(stream)
        for source in (first, second):
            writer.write(read_trace(source, args=make_args_store("helper")))
        writer.close()
    found = {(r["name"], r["key"], r["display_value"]) for r in rows(output, """
        select s.name, a.key, a.display_value from slice s join args a using (arg_set_id)
        where a.key glob 'debug.*'""")}
    assert found == {("a", "debug.args.x_ y", "1.5"), ("a", "debug.args.z", "one"),
                     ("b", "debug.args.z", "two"), ("b", "debug.args.w_ v", "2.5")}


def test_the_helper_is_gone_when_reading_fails(tmp_path, monkeypatch):
    text = _source(tmp_path).read_bytes()
    broken = tmp_path / "broken.json"
    broken.write_bytes(text[: len(text) * 2 // 3])
    with pytest.raises(CgtraceError, match="broken.json"):
        _run(convert_file, broken, tmp_path / "out.perfetto-trace", monkeypatch, ahead=True)
    assert _children() == []
    assert not (tmp_path / "out.perfetto-trace").exists()


def test_sweep_reads_entries_across_blocks():
    generator = random.Random(3)
    store = FileArgsStore(tuning=Tuning(spill_bytes=300, sweep_bytes=200))
    texts = [json.dumps({"k": "x" * generator.randrange(0, 500), "i": i}).encode() for i in range(400)]
    references = [store.add(text) for text in texts]
    wanted = sorted(generator.sample(references, 150))
    assert list(store.sweep(wanted)) == [texts[r] for r in wanted]
    assert [store.text(r) for r in wanted] == [texts[r] for r in wanted]


def _bytes_read() -> tuple[int, int]:
    """What this process has read through read() and pread() so far, as the kernel counts it,
    and the length of the counters' own text (whose reading the next count includes)."""
    with open("/proc/self/io", "rb") as counters:
        text = counters.read()
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith(b"rchar:")), len(text)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="the kernel's read counters are Linux's")
def test_sweep_reads_no_more_than_the_entries_wanted_far_apart():
    """A block stops at the last wanted entry within reach: entries further apart than a
    block are each read alone, not with a block's worth after them."""
    store = FileArgsStore(tuning=Tuning(sweep_bytes=200))
    texts = [json.dumps({"i": i, "pad": "x" * 80}).encode() for i in range(300)]
    references = [store.add(text) for text in texts]
    wanted = references[::10]
    list(store.sweep(wanted[:1]))  # the pending entries go to the file first
    before, counting = _bytes_read()
    swept = list(store.sweep(wanted))
    read = _bytes_read()[0] - before - counting
    assert swept == [texts[r] for r in wanted]
    assert read == sum(len(texts[r]) for r in wanted)


def _children() -> list[int]:
    """This process's child processes still running or unreaped (Linux)."""
    return child_pids(os.getpid())


def test_the_command_line_runs_one_thread_so_it_may_fork_its_helper():
    """numpy's OpenBLAS would start a thread per core on import, and a second thread rules the
    args helper out (cores_to_spare): the command line keeps BLAS to one thread."""
    probe = ("import os, converter.cli, numpy\n"
             "from converter.tuning import process_threads\n"
             "print(process_threads())")
    environment = {key: value for key, value in os.environ.items() if key != "OPENBLAS_NUM_THREADS"}
    shown = subprocess.run([sys.executable, "-c", probe], env=environment, capture_output=True, text=True,
                           check=True)
    assert shown.stdout.split() == ["1"], shown.stderr


def test_no_helper_is_forked_beside_other_threads():
    assert background_args.cores_to_spare(4) == (process_threads() == 1)
    assert not background_args.cores_to_spare(1)
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        assert not background_args.cores_to_spare(4)
    finally:
        release.set()
        worker.join()


def test_encoded_entries_keep_their_bounds_across_flushes(tmp_path):
    """The encoded file is written whenever a few hundred bytes wait, runs of entries coming
    one to five at a time: each entry's bounds still give exactly its own encoding."""
    texts = [json.dumps({"i": i, "dims": [[i], []] if i % 3 else [i], "x": "y" * (i % 7)}).encode()
             for i in range(300)] + [b"null", b"[1]"]
    cuts = [0, *sorted(random.Random(7).sample(range(1, len(texts)), 80)), len(texts)]
    with open(tmp_path / "encoded", "w+b") as output:
        encoder = prepared_args.EntryEncoder(output.fileno(), Tuning(encoded_write_bytes=200))
        for first, last in zip(cuts, cuts[1:]):
            text = b"".join(texts[first:last])
            encoder.add(text, np.cumsum([0, *map(len, texts[first:last])]))
        encoder.finish()
        output.seek(0)
        blob, bounds = output.read(), encoder.bounds
    interner = annotation_name_interner([])
    for name in prepared_args.KNOWN_NAMES:  # numbered first by every encoder of a store
        interner.field(name)
    alone = ArgsEncoder(interner.field)
    assert [blob[bounds[i]:bounds[i + 1]] for i in range(len(texts))] == [alone.encode(text) for text in texts]


def test_labels_are_the_rules_whether_or_not_a_run_holds_its_marker():
    """EntryLabels asks the rule only about runs whose joined text holds its marker: a run
    without one gets no labels, one with it gets each entry's own, and a marker split across
    two entries labels neither."""
    texts = [b'{"name":"layers.1","i":1}', b'{"i":2}', b'{"x":"y","na', b'me":"z"}', b'{"name":7}',
             b'{"name":"layers.2"}', b'{"nam":"e"}', b'{"name":""}']
    runs = [texts[:2], texts[2:4], texts[4:5], texts[5:], [b'{"i":3}', b'{"j":4}']]
    labels = background_args.EntryLabels()
    for run in runs:
        labels.add(*next(prepared_args.entry_runs(run)), KERNEL_LABEL)
    expected = [KERNEL_LABEL.label(text) for run in runs for text in run]
    assert [labels.label_of(index) for index in range(len(expected))] == expected
    assert b'"name"' in b"".join(runs[1]) and expected[2:4] == [None, None]
    assert expected[:2] == ["layers.1", None] and expected[5] == "layers.2"
