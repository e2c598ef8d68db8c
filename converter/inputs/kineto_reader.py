"""Chrome-JSON (Kineto) trace file -> trace model.

The events array is read a piece at a time where it can be cut cleanly (event_pieces.py),
each piece decoded as kineto_events.py chooses and converted by plain_events.py; any other
valid document is decoded whole, which also names the error in an invalid one. Both paths
give the same model.
"""

from __future__ import annotations

import codecs
import contextlib
import mmap
from pathlib import Path
from typing import Any, Optional

import msgspec

from .. import kineto, progress
from ..errors import CgtraceError
from ..model import ArgsStore, Trace, decode_json
from ..tuning import DEFAULT_TUNING, Tuning
from .event_pieces import HEADER_DECODER, NON_SPACE, RAW_LIST_DECODER, EventsLayout, PiecesFailed, locate_events
from .kineto_events import not_valid_json
from .piece_parts import decoded_parts
from .piece_workers import Parts, parts_in_parallel, workers_pay
from .plain_events import KinetoEvents
from .source import read_input_bytes

_UTF8_CHUNK = 1 << 24


def read_trace(path: Path, strict: bool = False, args: Optional[ArgsStore] = None,
               tuning: Tuning = DEFAULT_TUNING) -> Trace:
    """Parse a Kineto/Chrome JSON trace file; malformed files raise CgtraceError. The slices'
    raw args go to `args` (the caller's choice of store; default: in memory)."""
    text = read_input_bytes(path)
    try:
        return parse_trace_text(text, strict=strict, args=args, tuning=tuning)
    except CgtraceError as error:
        raise CgtraceError(f"{path}: {error.message}") from None
    except RecursionError:
        raise CgtraceError(f"{path}: JSON nested too deeply to read (about 1000 levels or more); "
                           "re-export the trace without such deeply nested args") from None


def parse_trace_text(text: bytes | bytearray | mmap.mmap, strict: bool = False,
                     args: Optional[ArgsStore] = None, tuning: Tuning = DEFAULT_TUNING) -> Trace:
    layout, trace = locate_events(text), None
    store = args if args is not None else ArgsStore()
    if layout is not None:
        try:
            trace = _parse_in_pieces(text, layout, store, tuning)
        except PiecesFailed:
            pass  # not cut cleanly: read whole below, which also names any JSON error
    if trace is None:
        trace = _parse_whole(text, store)
    if strict and trace.skipped:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(trace.skipped.items()))
        raise CgtraceError(f"unusable events ({reasons}); fix the trace or run without --strict to skip them")
    return trace


def _parse_in_pieces(text: Any, layout: EventsLayout, store: ArgsStore, tuning: Tuning) -> Trace:
    """The usual path: the events array a piece at a time (on several cores where it pays:
    piece_workers.py), releasing the input behind it."""
    _check_utf8(text, 0, layout.start)
    header = {key: decode_json(raw) for key, raw in layout.header.items()}
    trace = Trace(metadata=header, args=store)
    builder = KinetoEvents(trace, base_ns=kineto.base_time_ns(header) or 0)
    checked, total = layout.start, len(text)

    def in_this_process(rest: EventsLayout) -> Parts:
        return decoded_parts(text, rest, builder.base_ns, tuning, exact_times=lambda: builder.exact_times)

    pieces = parts_in_parallel(text, layout, builder.base_ns, tuning, in_this_process) \
        if workers_pay(len(text), tuning) else in_this_process(layout)
    with contextlib.closing(pieces):  # workers ended at once, however the read ends (a stop included)
        for made, end, raw_piece in pieces:
            _check_utf8(text, checked, end)
            builder.add_parts(made, raw_piece)
            del made
            if isinstance(text, mmap.mmap):
                # Finished pages go (read again, they refault from the page cache).
                text.madvise(mmap.MADV_DONTNEED, 0, end & ~(mmap.PAGESIZE - 1))
            progress.report(f"parsing events: {end * 100 // total}%")
            checked = end
    _check_utf8(text, layout.end, total)
    builder.finish()
    return trace


def _parse_whole(text: Any, store: ArgsStore) -> Trace:
    """Any other valid document (or the precise error for an invalid one), decoded at once."""
    header, events_text = _split_document(text)
    _check_utf8(text, 0, len(text))
    try:
        events = RAW_LIST_DECODER.decode(events_text)
    except msgspec.ValidationError:
        raise CgtraceError("'traceEvents' is not a list, so not a Chrome/Kineto trace; "
                           "pass a PyTorch profiler trace (.json or .json.gz)") from None
    except msgspec.DecodeError as error:
        raise not_valid_json(error) from None
    trace = Trace(metadata=header, args=store)
    builder = KinetoEvents(trace, base_ns=kineto.base_time_ns(header) or 0)
    builder.add_events(events)
    del events
    builder.finish()
    return trace


def _check_utf8(text, start: int, end: int) -> None:
    """msgspec checks UTF-8 only in the strings it decodes, and args stay raw JSON until written.

    Checked in chunks (the text may be a memory-mapped file); ASCII chunks, nearly all of a
    Kineto trace, skip the decoder."""
    decoder, view = codecs.getincrementaldecoder("utf-8")(), memoryview(text)
    offset = start
    try:
        for offset in range(start, end, _UTF8_CHUNK):
            chunk = bytes(view[offset:min(offset + _UTF8_CHUNK, end)])
            if not (chunk.isascii() and not decoder.getstate()[0]):
                decoder.decode(chunk)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as error:
        raise CgtraceError(f"not valid JSON (invalid UTF-8 at byte {offset + error.start}); the file is corrupt: "
                           "re-export the trace") from None
    finally:
        view.release()


def _split_document(text) -> tuple[dict, msgspec.Raw]:
    first = NON_SPACE.search(text)
    if first is None:
        raise CgtraceError("file is empty; pass a PyTorch profiler trace (.json or .json.gz)")
    stripped = text[first.start():first.start() + 1]
    if stripped[:1] == b"[":
        # The bare JSON-array form of the Chrome trace format: the events alone.
        return {}, msgspec.Raw(text)
    if stripped[:1] != b"{":
        raise CgtraceError("not a JSON trace (it must start with '{' or '['); pass a PyTorch profiler trace")
    try:
        top = HEADER_DECODER.decode(text)
    except msgspec.DecodeError as error:
        raise not_valid_json(error) from None
    events_text = top.pop("traceEvents", None)
    if events_text is None:
        raise CgtraceError("no 'traceEvents' key, so not a Chrome/Kineto trace; "
                           "pass a PyTorch profiler trace (.json or .json.gz)")
    header = {key: decode_json(raw) for key, raw in top.items()}
    return header, events_text
