"""Output bytes do not depend on the order of events in the input (issue 41, "Must show" 3).

Chrome JSON gives meaning to the order of only a few events: the B/E events of one thread are
a stack, and so are the async b/n/e events of one id. Everything else may come in any order,
and the converter puts the model in one canonical order once read (model/canonical.py), so
convert, compact and merge write the same bytes for any order as for the time-sorted file.
The property tests draw random documents (tests/test_properties.py's) and generated pipelines
(merged), each in random orders; the other tests shuffle real traces, a real pipeline and a
corpus shape with a fixed seed.
"""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.generator import write_pp_run

from .helpers import SHARED_TRACES, compact_file, convert_file, merge_files, real_pipeline_copy, rows, write_json
from .test_properties import SETTINGS, Us, dump, kineto_documents

REPO = Path(__file__).resolve().parents[1]
_STACKS = {"B": "thread", "E": "thread", "b": "async", "n": "async", "e": "async"}


def _stack_of(event: dict):
    """The stack an event belongs to, whose events keep their order; None: free to move."""
    kind = _STACKS.get(event.get("ph"))
    if kind == "thread":
        return kind, repr(event.get("pid")), repr(event.get("tid"))
    if kind == "async":
        return kind, repr(event.get("pid")), repr(event.get("cat")), repr(event.get("id", event.get("id2")))
    return None


def reordered(events: list, keys: list) -> list:
    """`events` ordered by `keys` (one per event), except that the events of each stack take the
    places the keys give the stack, in the stack's own order."""
    places = sorted(range(len(events)), key=keys.__getitem__)
    stacks: dict = {}
    for index, event in enumerate(events):
        stack = _stack_of(event)
        if stack is not None:
            stacks.setdefault(stack, []).append(index)
    queued = {stack: iter(indices) for stack, indices in stacks.items()}
    return [events[next(queued[stack]) if (stack := _stack_of(events[index])) is not None else index]
            for index in places]


def _ts_of(event: dict) -> float:
    ts = event.get("ts")
    return ts.ns if isinstance(ts, Us) else float(ts) if isinstance(ts, (int, float)) else -1.0


def time_sorted(events: list) -> list:
    """Metadata first, then by time (stacks kept)."""
    return reordered(events, [(_ts_of(event), index) for index, event in enumerate(events)])


def shuffled(events: list, rng: random.Random) -> list:
    keys = list(range(len(events)))
    rng.shuffle(keys)
    return reordered(events, keys)


def _outputs(source: Path, directory: Path) -> dict[str, bytes]:
    """What convert and compact write, and compact as Chrome JSON."""
    written = {}
    for job, output_format in ((convert_file, "perfetto"), (compact_file, "perfetto"), (compact_file, "json")):
        what = f"{job.__name__} {output_format}"
        output = directory / f"{source.stem}.{job.__name__}.{output_format}"
        job(source, output, overwrite=True, output_format=output_format)
        written[what] = output.read_bytes()
    return written


@settings(max_examples=30, **SETTINGS)
@given(kineto_documents(), st.randoms(use_true_random=False))
def test_any_event_order_gives_the_bytes_of_the_time_sorted_file(drawn, rng):
    document, ensure_ascii = drawn
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        sorted_file, any_file = directory / "by_ts.json", directory / "any.json"
        sorted_file.write_bytes(dump({**document, "traceEvents": time_sorted(document["traceEvents"])}, ensure_ascii))
        any_file.write_bytes(dump({**document, "traceEvents": shuffled(document["traceEvents"], rng)}, ensure_ascii))
        want, got = _outputs(sorted_file, directory), _outputs(any_file, directory)
        for job in want:
            assert got[job] == want[job], job


def _cgtrace(*args: str) -> None:
    """The command line as users run it (the args strategy `auto`: the helper for large inputs)."""
    done = subprocess.run([sys.executable, "-m", "converter.cli", *args, "-q"], capture_output=True, text=True,
                          cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr


def _document(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _shuffled_copy(source: Path, target: Path, seed: Optional[int]) -> Path:
    """The trace's events shuffled with `seed` (None: as they are), written as json writes them,
    so the copies differ only in their order (args keep the text json gives them)."""
    document = _document(source)
    if seed is not None:
        document["traceEvents"] = shuffled(document["traceEvents"], random.Random(seed))
    target.write_text(json.dumps(document))
    return target


def _written(source: Path, directory: Path, jobs=("convert", "compact")) -> dict[str, bytes]:
    written = {}
    for job in jobs:
        output = directory / f"{source.name}.{job}.perfetto-trace"
        _cgtrace(job, str(source), "-o", str(output))
        written[job] = output.read_bytes()
    return written


@pytest.mark.parametrize("name", ["kineto_2021_resnet50_old_format", "hta_nccl_a100"])
def test_a_shared_trace_shuffled_gives_the_same_bytes(tmp_path, name):
    """The real file as exported, and its events shuffled (fixed seed): the same bytes."""
    source = SHARED_TRACES / f"{name}.json.gz"
    if not source.is_file():
        pytest.skip("../shared/traces is absent")
    as_written = _shuffled_copy(source, tmp_path / "as_written.json", seed=None)
    shuffled_file = _shuffled_copy(source, tmp_path / "shuffled.json", seed=41)
    assert _written(shuffled_file, tmp_path) == _written(as_written, tmp_path)


def test_a_corpus_shape_shuffled_gives_the_same_bytes(tmp_path):
    """The many-replay-streams corpus shape (benchmarks/corpus.py, metadata interleaved), large
    enough for the args helper, as written and shuffled."""
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces is absent (the corpus tiles from it)")
    _run_corpus(tmp_path, "cuda_graph_20k_streams_interleaved", "6MB")
    source = tmp_path / "cuda_graph_20k_streams_interleaved_6MB.json"
    as_written = _shuffled_copy(source, tmp_path / "as_written.json", seed=None)
    shuffled_file = _shuffled_copy(source, tmp_path / "shuffled.json", seed=41)
    assert _written(shuffled_file, tmp_path) == _written(as_written, tmp_path)


def _run_corpus(out: Path, name: str, size: str) -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "corpus.py"), "--sizes", size, "--only", name,
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr


def test_a_merge_of_shuffled_ranks_gives_the_same_bytes(tmp_path):
    """A real torch pipelining set merged as exported, and with every rank's events shuffled."""
    source = real_pipeline_copy("torch215_1f1b_pp4", tmp_path)
    folder, shuffled_folder = tmp_path / "as_written", tmp_path / "shuffled"
    folder.mkdir()
    shuffled_folder.mkdir()
    for seed, rank in enumerate(sorted(source.glob("*.json*"))):
        _shuffled_copy(rank, folder / rank.name.removesuffix(".gz"), None)
        _shuffled_copy(rank, shuffled_folder / rank.name.removesuffix(".gz"), seed)
    merged = {}
    for which in (folder, shuffled_folder):
        output = tmp_path / f"{which.name}.perfetto-trace"
        _cgtrace("merge", str(which), "-o", str(output))
        merged[which.name] = output.read_bytes()
    assert merged[folder.name] == merged[shuffled_folder.name]


def test_names_met_out_of_order_give_the_same_bytes_with_the_helper(tmp_path):
    """Args keys Kineto does not write, met in opposite orders: the helper encodes the entries
    again with the names in text order, as the in-process encoding does."""
    events = [{"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1, "cat": "cpu_op",
               "args": {key: 1.5, "nested": {f"{key} inside": None, "z.": 2}}}
              for i, key in enumerate(["zeta", "alpha", "mid", "beta"])]
    written = []
    for order, strategy in ((events, "helper"), (events[::-1], "helper"), (events[::-1], "in-process")):
        source = tmp_path / "trace.json"
        source.write_text(json.dumps({"traceEvents": order}))
        output = tmp_path / f"{len(written)}.perfetto-trace"
        convert_file(source, output, args_strategy=strategy)
        written.append(output.read_bytes())
    assert written[0] == written[1] == written[2]


@pytest.mark.parametrize("names", [["thread 5 (pt_main_thread)", "thread 5 (pt_autograd_0)"],
                                   ["worker", "loader"]])
def test_a_thread_named_twice_shows_every_name_whatever_their_order(tmp_path, names):
    """Kineto renames a thread that takes a new role, both names at one time: no order of the
    two says which is right, so the thread shows both, in text order (Kineto's form kept)."""
    titles = {}
    for order, written in (("as_read", names), ("swapped", names[::-1])):
        events = [*({"ph": "M", "name": "thread_name", "pid": 1, "tid": 5, "ts": 0, "args": {"name": name}}
                    for name in written),
                  {"ph": "X", "name": "work", "cat": "cpu_op", "pid": 1, "tid": 5, "ts": 1, "dur": 2}]
        source = write_json(tmp_path / f"{order}.json", {"traceEvents": events})
        convert_file(source, tmp_path / f"{order}.perfetto-trace", overwrite=True)
        titles[order] = [row["name"] for row in rows(tmp_path / f"{order}.perfetto-trace",
                                                     "select name from thread where tid = 5")]
    expected = "thread 5 (pt_autograd_0 / pt_main_thread)" if names[0].startswith("thread") else "loader / worker"
    assert titles == {"as_read": [expected], "swapped": [expected]}


def test_a_value_given_twice_is_the_last_in_content_order_whatever_the_input_order(tmp_path):
    """A thread's or process's sort index, or a process's labels, given twice with different
    values: the one whose event comes last in content order (its args text) wins, in either
    input order. Thread 5's sort index (5 or 7) puts it before or after thread 6's (6)."""
    given_twice = [({"name": "thread_sort_index", "tid": 5, "args": {"sort_index": 7}},
                    {"name": "thread_sort_index", "tid": 5, "args": {"sort_index": 5}}),
                   ({"name": "process_sort_index", "tid": 0, "args": {"sort_index": 3}},
                    {"name": "process_sort_index", "tid": 0, "args": {"sort_index": 9}}),
                   ({"name": "process_labels", "tid": 0, "args": {"labels": "GPU 1"}},
                    {"name": "process_labels", "tid": 0, "args": {"labels": "GPU 0"}})]
    seen = {}
    for order in ("as_listed", "swapped"):
        events = [{"ph": "X", "name": "work", "cat": "cpu_op", "pid": 1, "tid": tid, "ts": 1, "dur": 2}
                  for tid in (5, 6)]
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": 6, "ts": 0, "args": {"sort_index": 6}})
        for pair in given_twice:
            events += [{"ph": "M", "pid": 1, "ts": 0, **event}
                       for event in (pair if order == "as_listed" else pair[::-1])]
        source = write_json(tmp_path / f"{order}.json", {"traceEvents": events})
        convert_file(source, tmp_path / f"{order}_out.json", output_format="json")
        metadata = [event for event in json.loads((tmp_path / f"{order}_out.json").read_text())["traceEvents"]
                    if event.get("ph") == "M"]
        seen[order] = ([event["tid"] for event in sorted((e for e in metadata if e["name"] == "thread_sort_index"),
                                                         key=lambda e: e["args"]["sort_index"])],
                       {event["name"]: event["args"] for event in metadata
                        if event["name"] in ("process_sort_index", "process_labels")})
    assert seen["as_listed"] == seen["swapped"] == ([6, 5], {"process_sort_index": {"sort_index": 9},
                                                            "process_labels": {"labels": "GPU 1"}})


@settings(max_examples=8, **SETTINGS)
@given(st.sampled_from([(2, 1, "1f1b"), (3, 1, "zero_bubble"), (2, 2, "interleaved"), (2, 1, "gpipe")]),
       st.integers(0, 2**16), st.integers(0, 2**32))
def test_a_merge_of_generated_ranks_in_any_event_order_gives_the_same_bytes(shape, seed, order):
    """Generated pipelines (schedules, stages per rank, GPipe names; CUDA-graph replays, NCCL
    and c10d transfers, clocks to align): every rank's events in a random order merge into the
    bytes of the ranks as generated."""
    pp_size, stages_per_rank, schedule = shape
    names = {"pp_annotations": "gpipe"} if schedule == "gpipe" else {}
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        files = write_pp_run(directory / "generated", pp_size, schedule="1f1b" if schedule == "gpipe" else schedule,
                             stages_per_rank=stages_per_rank, microbatches=2, steps=1, seed=seed, **names)
        for folder in ("as_written", "shuffled"):
            (directory / folder).mkdir()
        for path in files:  # both copies written by json, so they differ only in their order
            document = json.loads(path.read_text())
            (directory / "as_written" / path.name).write_text(json.dumps(document))
            document["traceEvents"] = shuffled(document["traceEvents"], random.Random(f"{order}:{path.name}"))
            (directory / "shuffled" / path.name).write_text(json.dumps(document))
        merged = []
        for folder in ("as_written", "shuffled"):
            output = directory / f"{folder}.perfetto-trace"
            merge_files(sorted((directory / folder).glob("*.json")), lambda group, count, output=output: output)
            merged.append(output.read_bytes())
        assert merged[0] == merged[1]
