"""One trace's pieces decoded on several cores: forked worker processes make the parts of
spans of the events array (piece_parts.py) while this process builds the model from them in
input order, so the model is the one a single process builds.

Processes, not threads: msgspec holds the GIL while it decodes (two threads decoding were
no faster than one: docs/performance.md), and the per-field passes after it are Python's. Forked, the workers share the input's
pages and every module already imported; a worker takes every `workers`-th span and hands
each span's parts back pickled down its own pipe, which holds one span at a time, so a
worker runs at most a span ahead of the builder and memory stays bounded however fast it
is. A span whose parts a worker did not make (it does not decode on its own, or the worker
died) and everything after it are read in this process instead, as a single process reads
them: the same model, or the same error.
"""

from __future__ import annotations

import gc
import mmap
import os
import pickle
import signal
import struct
from typing import Any, BinaryIO, Callable, Generator, Optional

from ..signals import STOPPING, stopping_deferred
from ..tuning import Tuning, process_threads
from .event_pieces import EventsLayout, spans
from .piece_parts import PieceParts, RawPiece, decoded_parts

Parts = Generator[tuple[PieceParts, int, RawPiece], None, None]
_LENGTH = struct.Struct("<Q")  # each span's pickled parts, after their length


def workers_pay(json_bytes: int, tuning: Tuning) -> bool:
    """Whether this trace is read by workers: several are allowed, the trace has the tuning's
    least size for them (below, forking and the first span's wait are much of what a split
    could save), and this process runs no other thread (a fork copies only the calling one,
    and the child may deadlock on a lock another held)."""
    return tuning.read_workers > 1 and json_bytes >= tuning.read_workers_min_json_bytes and process_threads() == 1


def parts_in_parallel(text: Any, layout: EventsLayout, base_ns: int, tuning: Tuning,
                      in_this_process: Callable[[EventsLayout], Parts]) -> Parts:
    """The parts of every piece of `layout`, in order, made by `tuning.read_workers` workers;
    from a span they did not make on, by `in_this_process(the rest)`."""
    cuts = spans(text, layout, tuning.piece_bytes * tuning.pieces_per_span)
    count = min(tuning.read_workers, len(cuts))
    workers: list[tuple[int, BinaryIO]] = []
    try:
        for number in range(count):
            _fork(text, cuts[number::count], base_ns, tuning, workers)
        for index, span in enumerate(cuts):
            made = _received(workers[index % count][1])
            if made is None:
                _end(workers)
                yield from in_this_process(EventsLayout(layout.header, span.start, layout.end))
                return
            yield from made
    finally:
        _end(workers)


def _received(pipe: BinaryIO) -> Optional[list[tuple[PieceParts, int, RawPiece]]]:
    """A span's parts, or None where the worker made none (or died: the pipe ended early)."""
    head = pipe.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    size, = _LENGTH.unpack(head)
    payload = pipe.read(size)
    return pickle.loads(payload) if len(payload) == size else None


def _fork(text: Any, mine: list[EventsLayout], base_ns: int, tuning: Tuning,
          workers: list[tuple[int, BinaryIO]]) -> None:
    """A worker making the parts of the spans `mine`, in order, put on record in `workers`
    with the end its parts come out of. Forked with Ctrl-C held back, so it is on record
    before a stop cleans up."""
    read_end, write_end = os.pipe()
    with stopping_deferred():
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the caller's stack
            code = 1
            try:
                os.close(read_end)
                for _, earlier in workers:  # only the reader holds them: a worker gone ends its pipe
                    earlier.close()
                for number in STOPPING:  # stopped with the command (its process group), at once
                    signal.signal(number, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)
                gc.freeze()  # what came with the fork is the reader's: no collection copies its pages
                with open(write_end, "wb") as pipe:
                    _serve(text, mine, base_ns, tuning, pipe)
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        workers.append((pid, open(read_end, "rb")))


def _serve(text: Any, mine: list[EventsLayout], base_ns: int, tuning: Tuning, pipe: BinaryIO) -> None:
    for span in mine:
        try:
            made: Optional[list] = list(decoded_parts(text, span, base_ns, tuning, portable=True))
        except Exception:  # noqa: BLE001 (any failure: the reader reads this span itself, and names it)
            made = None
        payload = pickle.dumps(made, pickle.HIGHEST_PROTOCOL)
        del made
        pipe.write(_LENGTH.pack(len(payload)))
        pipe.write(payload)
        pipe.flush()
        del payload
        if isinstance(text, mmap.mmap):  # its pages are the reader's to keep, not this process's
            text.madvise(mmap.MADV_DONTNEED, span.start & ~(mmap.PAGESIZE - 1),
                         span.end - (span.start & ~(mmap.PAGESIZE - 1)))


def _end(workers: list[tuple[int, BinaryIO]]) -> None:
    """Every worker gone: those still running (the reader stopped early) killed, all reaped."""
    while workers:
        pid, pipe = workers.pop()
        pipe.close()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
