"""Output bytes do not depend on the order of events in the input (issue 41, "Must show" 3).

Chrome JSON gives meaning to the order of only a few events: the B/E events of one thread are
a stack, and so are the async b/n/e events of one id. Everything else may come in any order,
and the converter puts the model in one canonical order once read (model/canonical.py), so
convert, compact and merge write the same bytes for any order as for the time-sorted file.
The property test draws random documents (tests/test_properties.py's) and random orders; the
other tests shuffle a real trace and a corpus shape with a fixed seed.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .helpers import SHARED_TRACES, compact_file, convert_file, merge_files
from .test_properties import SETTINGS, Us, dump, kineto_documents

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
    written = {}
    for job in (convert_file, compact_file):
        output = directory / f"{source.stem}.{job.__name__}.pftrace"
        job(source, output, overwrite=True)
        written[job.__name__] = output.read_bytes()
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


def _shuffled_copy(source: Path, target: Path, seed: int) -> Path:
    document = json.loads(source.read_bytes() if source.suffix != ".gz" else __import__("gzip").decompress(
        source.read_bytes()))
    document["traceEvents"] = shuffled(document["traceEvents"], random.Random(seed))
    target.write_text(json.dumps(document))
    return target
