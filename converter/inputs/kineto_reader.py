"""Chrome-JSON (Kineto) trace -> trace model.

Decoding uses msgspec with a typed event struct: faster than orjson on Kineto traces, and
it keeps `args` as raw JSON text (no dicts built for millions of events).

Most events of a real trace are complete events (`ph` "X"), instants and flow steps
(`s`, `t`, `f`) with plain fields: int or text ids, a name, times as decimal microseconds. A piece is first
decoded with the phase as a tag, which checks those types in C and keeps the times as
written, so runs of such events become slices and flow events in bulk, a list operation per
field (`_add_plain`), their nanoseconds exact from the digits (real traces write times
beyond what a float holds to the ns). Every other event, and every piece the tagged decoding
refuses, goes event by event through one handler per phase. Both paths give the same model,
in the same order.
"""

from __future__ import annotations

import codecs
import functools
import mmap
from decimal import Decimal
from itertools import compress, repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional, Sequence, Union

import msgspec
import numpy as np

from .. import kineto, progress
from ..kineto import MAX_NS
from ..errors import CgtraceError
from ..model import NO_ARGS, ArgsStore, CounterSample, Trace, Track, decode_json, encode_json
from ..model.builder import TraceBuilder
from ..tuning import DEFAULT_TUNING, Decoding, Tuning
from .decimal_times import FLOAT_EXACT_LIMIT_US, exact_ns, numbers_ns, to_ns
from .event_pieces import (HEADER_DECODER, NON_SPACE, RAW_LIST_DECODER, EventsLayout, PiecesFailed, iter_pieces,
                           locate_events, piece_events)
from .flows import END, PHASE_CODES, FlowEvents, bind_flows
from .source import read_input_bytes

_NO_ARGS = msgspec.Raw(b"")
_THREAD_SCOPED = frozenset(("X", "B", "E", "s", "t", "f"))
# End events take their name from the begin; flow names are not shown anywhere.
_NAME_OPTIONAL = frozenset(("E", "e", "s", "t", "f"))


class _EventBody(msgspec.Struct, gc=False):
    name: Any = None
    cat: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    id: Any = None
    id2: Any = None
    bp: Any = None
    s: Any = None
    args: msgspec.Raw = _NO_ARGS


class _Event(_EventBody, gc=False):
    ph: Any = None


class _Tagged(_EventBody, tag_field="ph", gc=False):
    """An event decoded by its phase (the tag); each phase's class says its `ph`."""

    ph: ClassVar[str] = ""


class _Plain(_Tagged, gc=False):
    """An event with the field types the bulk path takes (checked by msgspec): a slice, an
    instant or a flow step. Its classes come in two kinds of times (_plain_phases)."""


# What a plain event is, as a small int per class (_PLAIN_CODES): a piece's events are told
# apart and split by numpy on these, instead of an isinstance of a msgspec class per event,
# a Python call each. Flow steps come last, in flows.py's order of phases.
_COMPLETE, _INSTANT, _FLOW = 0, 1, 2
_NOT_PLAIN = -1
_TS, _CAT, _NAME, _ARGS = map(attrgetter, ("ts", "cat", "name", "args"))
_ID, _BP = attrgetter("id"), attrgetter("bp")


def _plain_phases(time: Any) -> tuple[type[_Plain], ...]:
    """One tagged class per plain phase, with starts decoded as `time`. Durations are always
    numbers: a float holds them to the ns below 2**40 us (12 days), and an event with a longer
    one is decoded again exactly."""
    common = {"ts": time, "pid": Union[int, str], "tid": Union[int, str], "cat": Optional[str]}
    shapes: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "X": ({"dur": Union[int, float], "name": str}, {}),
        **dict.fromkeys("iI", ({"name": str, "s": Optional[str]}, {"s": None})),  # s: scope ("g", "p", thread)
        **dict.fromkeys("stf", ({"id": Union[int, str], "bp": Optional[str]}, {"bp": None}))}
    return tuple(type(f"_Plain_{ph}", (_Plain,), {"__annotations__": {**common, **fields}, "ph": ph, "cat": None,
                                                  **defaults},
                      tag=ph, kw_only=True, gc=False)
                 for ph, (fields, defaults) in shapes.items())


def _code_of_phase(ph: str) -> int:
    return _COMPLETE if ph == "X" else _INSTANT if ph in "iI" else _FLOW + PHASE_CODES[ph]


# The other phases the handlers know, as lenient as _Event; a piece with any other phase (or
# none) fails the tagged decoding and is decoded with _Event instead.
_OTHER_PHASES = tuple(type(f"_Phase_{ph}", (_Tagged,), {"ph": ph}, tag=ph, gc=False) for ph in "BECbenM")


def _tagged_list(plain: tuple[type[_Plain], ...]) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(list.__class_getitem__(Union.__getitem__((*plain, *_OTHER_PHASES))))


# Times as numbers while a float holds them to the ns (below 2**40 us), else as written.
_PLAIN_WITH_NUMBERS, _PLAIN_WITH_TEXT = _plain_phases(Union[int, float]), _plain_phases(msgspec.Raw)
_TAGGED_NUMBERS, _TAGGED_TEXT = _tagged_list(_PLAIN_WITH_NUMBERS), _tagged_list(_PLAIN_WITH_TEXT)
_PLAIN_CODES = {cls: _code_of_phase(cls.ph) for cls in (*_PLAIN_WITH_NUMBERS, *_PLAIN_WITH_TEXT)}
_NOT_THREAD = ("g", "p")  # instant scopes with a track other than their thread's


class _ExactEvent(_Event, gc=False):
    ts: Optional[Decimal] = None
    dur: Optional[Decimal] = None


class _ExactTs(msgspec.Struct, gc=False):
    ts: Optional[Decimal] = None


_EVENT = msgspec.json.Decoder(_Event)
_EVENT_LIST = msgspec.json.Decoder(list[_Event])
_EXACT_EVENT = msgspec.json.Decoder(_ExactEvent)
_EXACT_EVENT_LIST = msgspec.json.Decoder(list[_ExactEvent])
_EXACT_TS = msgspec.json.Decoder(_ExactTs)
_UTF8_CHUNK = 1 << 24
_DECODERS = {Decoding.TAGGED_NUMBERS: (_TAGGED_NUMBERS, _EVENT_LIST), Decoding.TAGGED_TEXT: (_TAGGED_TEXT, _EVENT_LIST),
             Decoding.EVENTS: (_EVENT_LIST,), Decoding.EXACT_EVENTS: (_EXACT_EVENT_LIST,)}
_TAGGED = (Decoding.TAGGED_NUMBERS, Decoding.TAGGED_TEXT)
_EXACT = {Decoding.TAGGED_NUMBERS: Decoding.TAGGED_TEXT, Decoding.EVENTS: Decoding.EXACT_EVENTS}


class _Decodings:
    """The decoding the next piece gets, named (Decoding), and how what a piece showed changes
    it. A piece is decoded whole into events where it can be: one pass over its bytes, not two.
    Once a piece had times a float cannot hold to the ns (absolute epoch microseconds), the
    rest are decoded exactly at once rather than as floats first and again (a first piece with
    such times is decoded again at once); once the tagged decoding failed a few pieces, the
    rest skip it."""

    def __init__(self, first: Decoding, tagged_tries: int):
        self.choice = first
        self._tagged_tries = tagged_tries
        self._tagged_failures = 0

    def decoders(self) -> tuple[msgspec.json.Decoder, ...]:
        return _DECODERS[self.choice]

    def decoded(self, events: list, first_piece: bool) -> Optional[msgspec.json.Decoder]:
        """Take in how a piece decoded; the decoder to decode it again with, where its times
        need it."""
        if self.choice in _TAGGED and events and not isinstance(events[0], _Tagged):
            self._tagged_failures += 1
            if self._tagged_failures >= self._tagged_tries:
                self.choice = Decoding.EVENTS
        elif first_piece and self.choice is Decoding.TAGGED_NUMBERS and _beyond_float(events):
            self.choice = Decoding.TAGGED_TEXT
            return _TAGGED_TEXT
        return None

    def converted(self, exact_times: bool) -> None:
        """After a piece's events were converted: whether any needed its exact times."""
        if exact_times:
            self.choice = _EXACT.get(self.choice, self.choice)


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
    """The usual path: the events array a piece at a time, releasing the input behind it."""
    _check_utf8(text, 0, layout.start)
    header = {key: decode_json(raw) for key, raw in layout.header.items()}
    trace = Trace(metadata=header, args=store)
    builder = _KinetoEvents(trace, base_ns=kineto.base_time_ns(header) or 0)
    checked, total = layout.start, len(text)
    decodings = _Decodings(tuning.first_decoding, tuning.tagged_tries)
    for events, start, end in iter_pieces(text, layout, decodings.decoders, tuning.piece_bytes):
        _check_utf8(text, checked, end)
        again = decodings.decoded(events, first_piece=start == layout.start)
        if again is not None:
            events = piece_events(text, start, end, again)
        builder.add_events(events, lambda: piece_events(text, start, end))  # noqa: B023 (called at once)
        del events
        decodings.converted(builder.exact_times)
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
        raise _not_valid_json(error) from None
    trace = Trace(metadata=header, args=store)
    builder = _KinetoEvents(trace, base_ns=kineto.base_time_ns(header) or 0)
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
        raise _not_valid_json(error) from None
    events_text = top.pop("traceEvents", None)
    if events_text is None:
        raise CgtraceError("no 'traceEvents' key, so not a Chrome/Kineto trace; "
                           "pass a PyTorch profiler trace (.json or .json.gz)")
    header = {key: decode_json(raw) for key, raw in top.items()}
    return header, events_text


def _not_valid_json(error: msgspec.DecodeError) -> CgtraceError:
    """msgspec says "truncated" only where the text ends early; other errors are in the text itself."""
    advice = ("the file may be truncated: re-export it" if "truncated" in str(error) else
              "JSON has no NaN, Infinity or lone surrogate escape (\\ud800): fix the file or re-export the trace")
    return CgtraceError(f"not valid JSON ({error}); {advice}")


def decode_event(raw: msgspec.Raw) -> Optional[_Event]:
    """One event, or None when it is not a JSON object; ts/dur exact to the nanosecond."""
    try:
        event = _EVENT.decode(raw)
    except msgspec.ValidationError:
        try:
            return _EXACT_EVENT.decode(raw)  # a ts or dur beyond double range (1e400)
        except msgspec.ValidationError:
            return None
    except msgspec.DecodeError as error:  # e.g. invalid UTF-8 inside a string, which the list pass skips over
        raise _not_valid_json(error) from None
    ts = event.ts
    if type(ts) is float and not -FLOAT_EXACT_LIMIT_US < ts < FLOAT_EXACT_LIMIT_US:
        try:
            event = _EXACT_EVENT.decode(raw)
        except msgspec.ValidationError:  # e.g. "dur": [1]: keep the event (bad_dur says why), ts exact
            event.ts = _EXACT_TS.decode(raw).ts
    return event


class _KinetoEvents(TraceBuilder):
    """Turns decoded Kineto events into the trace model, one handler per Chrome phase."""

    def __init__(self, trace: Trace, base_ns: int):
        super().__init__(trace)
        self.base_ns = base_ns
        self.open_begins: dict[tuple[Any, Any], list[tuple[int, _Event]]] = {}
        self.open_async: dict[tuple[Any, ...], list[tuple[int, _Event]]] = {}
        self.flow_events = FlowEvents()
        self.metadata_events: list[_Event] = []
        self.exact_times = False  # whether an event had to be decoded again for its exact times
        self._tracks_by_input_key: dict[tuple[Any, Any], Track] = {}  # (pid, tid) as written -> track

    # -- events -------------------------------------------------------------------------
    def add_events(self, items: list, raw_piece: Optional[Callable[[], list[msgspec.Raw]]] = None) -> None:
        """Convert the events in order, releasing each as it is done: runs of `_Plain` events
        in bulk, the others one by one. `items` are decoded events or raw ones (decoded here);
        an event whose decoded times cannot give its exact nanoseconds is decoded again from
        `raw_piece()`: the same events, raw."""
        self.trace.events_read += len(items)
        if raw_piece is not None:
            raw_piece = functools.cache(raw_piece)  # decoded raw once per piece, however many runs ask
        codes = np.fromiter(map(_PLAIN_CODES.get, map(type, items), repeat(_NOT_PLAIN)), np.int8, len(items))
        plain = codes != _NOT_PLAIN
        start = 0
        for end in [*(np.flatnonzero(plain[1:] != plain[:-1]) + 1).tolist(), len(items)]:
            if plain[start]:
                self._add_plain(items, start, end, codes[start:end], raw_piece)
            else:
                self._add_each(items, start, end, raw_piece)
            start = end

    def _add_plain(self, items: list, start: int, end: int, codes: np.ndarray, raw_piece) -> None:
        """items[start:end], all `_Plain` (`codes`: what each is): slices and flow events made
        a field at a time. An event the bulk path cannot take (times a float cannot hold to the
        ns, not numbers, negative or out of range) goes to `_add_each`, in its place."""
        run = items[start:end]
        count = len(run)
        durations_of = [event.dur if code == _COMPLETE else 0  # 0: instants, flows
                        for event, code in zip(run, codes.tolist())]
        if type(run[0].ts) is msgspec.Raw:  # which of the two tagged decoders made the piece
            starts, starts_known = exact_ns(list(map(_TS, run)))
            durations, durations_known = numbers_ns(durations_of)
            known = starts_known & durations_known
        else:  # starts and durations in one conversion: half the fixed cost of a numpy pass
            times, both_known = numbers_ns([*map(_TS, run), *durations_of])
            starts, durations = times[:count], times[count:]
            known = both_known[:count] & both_known[count:]
        # 0 <= ts + base and 0 <= dur <= MAX_NS - ts - base, in int64 without overflow.
        headroom = MAX_NS - self.base_ns
        fits = known & (starts >= -self.base_ns) & (starts <= headroom) & (durations >= 0)
        fits &= durations <= headroom - np.where(fits, starts, 0)
        items[start:end] = [None] * count
        odd = np.flatnonzero(~fits).tolist()
        starts = np.where(fits, starts, 0) + self.base_ns
        for index in odd:  # back for _add_each to find
            items[start + index] = run[index]
        edges = [-1, *odd, count]
        for before, after in zip(edges, edges[1:]):
            if after - before > 1:
                part = slice(before + 1, after)
                self._add_plain_run(run[part], codes[part], starts[part], durations[part])
            if after < count:
                self._add_each(items, start + after, start + after + 1, raw_piece)

    def _add_plain_run(self, run: Sequence, codes: np.ndarray, starts: np.ndarray, durations: np.ndarray) -> None:
        """Slices of the complete events and instants of `run`, flow events of the rest, in
        order, with their exact start and duration in ns; tracks are made in the order of `run`.
        Each field is one pass: a map of an attrgetter, or a comprehension where it reads two
        fields (Python 3.11 specializes its attribute reads); the two kinds are parted by numpy
        on `codes`."""
        known = self._tracks_by_input_key.get
        on: Sequence[Any] = [known((event.pid, event.tid)) for event in run]
        instants = codes == _INSTANT
        if None in on or instants.any():  # a thread met for the first time, or an instant's scope
            find = self._track_for_input_key
            on = [track or find((e.pid, e.tid)) if not instant or e.s not in _NOT_THREAD else self._instant_track(e)
                  for e, instant, track in zip(run, instants.tolist(), on)]
        flow_at = np.flatnonzero(codes >= _FLOW)
        if len(flow_at):
            if len(flow_at) == len(run):
                self._add_flow_events(run, codes - _FLOW, starts, on)
                return
            take = _picker(flow_at.tolist())
            self._add_flow_events(take(run), codes[flow_at] - _FLOW, starts[flow_at], take(on))
            kept = np.flatnonzero(codes < _FLOW)
            pick = _picker(kept.tolist())
            run, on, starts, durations, instants = pick(run), pick(on), starts[kept], durations[kept], instants[kept]
        texts = list(map(_ARGS, run))
        has_args = np.fromiter(map(len, texts), np.int64, len(texts)) > 2  # "{}" or absent: no args
        if has_args.all():
            references = np.arange(len(texts)) + self.args.add_many(texts)
        else:
            references = np.full(len(texts), NO_ARGS, np.int64)
            references[has_args] = np.arange(np.count_nonzero(has_args)) + self.args.add_many(
                list(compress(texts, has_args.tolist())))
        self.trace.slices.extend(starts, durations, list(map(_NAME, run)), self._categories(run), references, on,
                                 instants)

    def _add_flow_events(self, flows: Sequence, phases: np.ndarray, starts: np.ndarray, on: Sequence[Track]) -> None:
        """Flow events of the bulk path (`phases`: flows.py's codes): an `f` binds to the slice
        enclosing it only with `bp: "e"`. Categories are interned (the slices' are ids): each
        event's own copy of the text was held to the end of the read (and an arrow's to the
        end): on a large trace, millions of copies of a few texts such as "fwdbwd"."""
        enclosing = phases != END
        ends = np.flatnonzero(~enclosing)
        if len(ends):
            enclosing[ends] = [bp == "e" for bp in map(_BP, _picker(ends.tolist())(flows))]
        categories = self._categories(flows)
        self.flow_events.extend(map(self.strings.setdefault, categories, categories), map(_ID, flows), phases, starts,
                                on, enclosing)

    @staticmethod
    def _categories(events: Sequence) -> list[str]:
        cats = list(map(_CAT, events))
        return [cat if cat is not None else "" for cat in cats] if None in cats else cats

    def _instant_track(self, event: Any) -> Track:
        return self.global_track() if event.s == "g" else self.process_track(event.pid)

    def _track_for_input_key(self, key: tuple[Any, Any]) -> Track:
        """The thread track of (pid, tid) as the input wrote them (a decimal text tid is its int)."""
        track = self._tracks_by_input_key[key] = self.thread_track(key[0], chrome_thread_key(key[1]))
        return track

    def _add_each(self, items: list, start: int, end: int, raw_piece) -> None:
        skipped = self.trace.skipped
        handlers = {
            "X": self._complete, "B": self._begin, "E": self._end,
            "i": self._instant, "I": self._instant, "C": self._counter,
            "s": self._flow, "t": self._flow, "f": self._flow,
            "b": self._async_begin, "e": self._async_end, "n": self._async_instant,
        }
        decode, raws = _EVENT.decode, None
        for index in range(start, end):
            item = items[index]
            items[index] = None
            raw = None
            if type(item) is not msgspec.Raw:
                event = item
            else:  # decode_event's usual case, inline (a call per event is measurable)
                raw = item
                try:
                    event = decode(raw)
                except msgspec.MsgspecError:
                    event = None
            beyond_float = event is not None and type(event.ts) is float and \
                not -FLOAT_EXACT_LIMIT_US < event.ts < FLOAT_EXACT_LIMIT_US
            if event is None or beyond_float or isinstance(event, _Plain):
                # Not an object, a ts needing Decimal, or an event the bulk path left (msgspec
                # made its times floats): decoded again, as written.
                if raw is None:
                    assert raw_piece is not None  # items were decoded only where their raw piece is at hand
                    raws = raws or raw_piece()
                    raw = raws[index]
                if beyond_float or not isinstance(item, _Tagged):
                    self.exact_times = True
                event = decode_event(raw)
            if event is None:
                skipped["event_not_an_object"] += 1
                continue
            ph = event.ph
            if ph == "M":
                self.metadata_events.append(event)
                continue
            handler = handlers.get(ph) if type(ph) is str else None
            if handler is None:
                skipped["unsupported_phase" if isinstance(ph, str) else "missing_phase"] += 1
                continue
            if type(event.pid) is int and type(event.tid) is int and type(event.name) is str \
                    and type(event.cat) is str:
                problem = handler(event)  # identities all well typed: nothing for _identity_problem to do
            else:
                problem = self._identity_problem(event) or handler(event)
            if problem is not None:
                skipped[problem] += 1

    def _identity_problem(self, event: _Event) -> Optional[str]:
        kind = type(event.pid)
        if kind is not int and kind is not str:
            return "missing_pid" if event.pid is None else "bad_pid_or_tid"
        if event.ph in _THREAD_SCOPED or (event.ph in "iI" and event.s not in ("g", "p")):
            kind = type(event.tid)
            if kind is not int and kind is not str:
                return "missing_tid" if event.tid is None else "bad_pid_or_tid"
            event.tid = chrome_thread_key(event.tid)
        name = event.name
        if type(name) is not str:
            if name is None and event.ph not in _NAME_OPTIONAL:
                return "missing_name"
            event.name = "" if name is None else str(name)
        cat = event.cat
        if type(cat) is not str:
            event.cat = "" if cat is None else str(cat)
        return None

    def _times(self, event: _Event, need_dur: bool):
        ts = to_ns(event.ts)
        if ts is None:
            return None, None, "missing_ts" if event.ts is None else "bad_ts"
        ts += self.base_ns
        if not 0 <= ts <= MAX_NS:
            return None, None, "ts_out_of_range"
        if not need_dur:
            return ts, None, None
        dur = to_ns(event.dur)
        if dur is None:
            return None, None, "missing_dur" if event.dur is None else "bad_dur"
        if dur < 0:
            return None, None, "negative_dur"
        if dur > MAX_NS - ts:
            return None, None, "ts_out_of_range"
        return ts, dur, None

    def _args(self, event: _Event) -> int:
        """A reference to the raw JSON args text, or NO_ARGS when absent or empty ("{}")."""
        raw = event.args
        return self.args.add(raw) if len(raw) > 2 else NO_ARGS

    def _complete(self, event: _Event):
        ts, dur = event.ts, event.dur
        if type(ts) is float and type(dur) is float and 0 <= dur < FLOAT_EXACT_LIMIT_US:
            ts, dur = round(ts * 1000) + self.base_ns, round(dur * 1000)  # the common case, inline
            if not 0 <= ts <= MAX_NS - dur:
                return "ts_out_of_range"
        else:
            ts, dur, problem = self._times(event, need_dur=True)
            if problem:
                return problem
        key = (event.pid, event.tid)
        track = self.thread_tracks.get(key) or self.thread_track(*key)
        args = event.args
        self.trace.slices.append(ts, dur, event.name, event.cat, self.args.add(args) if len(args) > 2 else NO_ARGS,
                                 track)  # _args, inline
        return None

    def _begin(self, event: _Event):
        ts, _, problem = self._times(event, need_dur=False)
        if problem:
            return problem
        self.open_begins.setdefault((event.pid, event.tid), []).append((ts, event))
        return None

    def _end(self, event: _Event):
        ts, _, problem = self._times(event, need_dur=False)
        if problem:
            return problem
        stack = self.open_begins.get((event.pid, event.tid))
        if not stack:
            return "end_without_begin"
        begin_ts, begin = stack.pop()
        if ts < begin_ts:
            return "end_before_begin"
        args = self._merged_args(begin, event)
        track = self.thread_track(begin.pid, begin.tid)
        self.trace.slices.append(begin_ts, ts - begin_ts, begin.name, begin.cat, args, track)
        return None

    def _merged_args(self, begin: _Event, end: _Event):
        """Chrome merges an E event's args into its B slice."""
        if len(end.args) <= 2:
            return self._args(begin)
        if len(begin.args) <= 2:
            return self._args(end)
        return self.args.add(encode_json({**_decoded_args(begin), **_decoded_args(end)}))

    def _instant(self, event: _Event):
        ts, _, problem = self._times(event, need_dur=False)
        if problem:
            return problem
        scope = event.s
        if scope == "g":
            track = self.global_track()
        elif scope == "p":
            track = self.process_track(event.pid)
        else:
            track = self.thread_track(event.pid, event.tid)
        self.trace.slices.append(ts, 0, event.name, event.cat, self._args(event), track, instant=True)
        return None

    def _counter(self, event: _Event):
        ts, _, problem = self._times(event, need_dur=False)
        if problem:
            return problem
        values = _decoded_args(event)
        series_name = event.name if event.id is None else f"{event.name} {event.id}"
        added = False
        for key, value in values.items():
            if type(value) not in (int, float) or value != value or type(value) is int and abs(value) >= 1 << 1000:
                continue  # not a number, NaN, or an int beyond double range
            self.trace.counters.append(CounterSample(ts, float(value), self.counter_track(event.pid, series_name, key)))
            added = True
        return None if added else "counter_without_values"

    def _flow(self, event: _Event):
        ts = event.ts
        if type(ts) is float:  # the common case, inline (as in _complete)
            ts = round(ts * 1000) + self.base_ns
            if not 0 <= ts <= MAX_NS:
                return "ts_out_of_range"
        else:
            ts, _, problem = self._times(event, need_dur=False)
            if problem:
                return problem
        flow_id = event.id if event.id is not None else event.id2
        if flow_id is None:
            return "flow_without_id"
        if type(flow_id) is not int:
            flow_id = _hashable(flow_id)
        ph = event.ph
        key = (event.pid, event.tid)
        category = self.intern(event.cat)  # a str by now: the identity checks made it one
        self.flow_events.append(category, flow_id, ph, ts, self.thread_tracks.get(key) or self.thread_track(*key),
                                ph != "f" or event.bp == "e")
        return None

    def _async_key(self, event: _Event):
        async_id = event.id if event.id is not None else event.id2
        if async_id is None:
            return None
        return (event.pid, event.cat, _hashable(async_id))

    def _async_begin(self, event: _Event):
        ts, _, problem = self._times(event, need_dur=False)
        key = self._async_key(event)
        if problem or key is None:
            return problem or "async_without_id"
        self.open_async.setdefault(key, []).append((ts, event))
        return None

    def _async_end(self, event: _Event):
        ts, _, problem = self._times(event, need_dur=False)
        key = self._async_key(event)
        if problem or key is None:
            return problem or "async_without_id"
        stack = self.open_async.get(key)
        if not stack:
            return "async_end_without_begin"
        begin_ts, begin = stack.pop()
        if ts < begin_ts:
            return "end_before_begin"
        track = self.async_track(key, begin.name)
        self.trace.slices.append(begin_ts, ts - begin_ts, begin.name, begin.cat, self._merged_args(begin, event), track)
        return None

    def _async_instant(self, event: _Event):
        ts, _, problem = self._times(event, need_dur=False)
        key = self._async_key(event)
        if problem or key is None:
            return problem or "async_without_id"
        track = self.async_track(key, event.name)
        self.trace.slices.append(ts, 0, event.name, event.cat, self._args(event), track, instant=True)
        return None

    # -- after all events -----------------------------------------------------------------
    def finish(self) -> None:
        skipped = self.trace.skipped
        for stack in self.open_begins.values():
            if stack:
                skipped["begin_without_end"] += len(stack)
        for stack in self.open_async.values():
            if stack:
                skipped["async_begin_without_end"] += len(stack)
        for event in self.metadata_events:
            problem = self._metadata(event)
            if problem:
                skipped[problem] += 1
        for process in self.trace.processes:
            process.row_group = process.source_pid in kineto.BOOKKEEPING_PIDS
        bound = bind_flows(self.flow_events, self.trace.slices)
        self.trace.flows.extend(bound.flows)
        self.trace.unbound_flows += bound.unbound
        self.trace.partnerless_flow_ends += bound.partnerless

    def _metadata(self, event: _Event) -> Optional[str]:
        kind = type(event.pid)
        if kind is not int and kind is not str:
            return "missing_pid"
        args = _decoded_args(event)
        if not args:
            return "metadata_without_args"
        name = event.name
        if name == "process_name":
            value = args.get("name")
            if isinstance(value, str):
                self.process(event.pid).name = value
                return None
        elif name == "process_labels":
            value = args.get("labels")
            if isinstance(value, str):
                self.process(event.pid).labels = [label for label in value.split(",") if label]
                return None
        elif name == "process_sort_index":
            value = args.get("sort_index")
            if type(value) is int:
                self.process(event.pid).sort_index = value
                return None
        elif name in ("thread_name", "thread_sort_index"):
            kind = type(event.tid)
            if kind is not int and kind is not str:
                return "missing_tid"
            event.tid = chrome_thread_key(event.tid)
            # A named thread keeps its name even with no events of its own, so give it its track.
            thread = self.thread_track(event.pid, event.tid).thread
            assert thread is not None  # a thread track has its thread
            if name == "thread_name" and isinstance(args.get("name"), str):
                thread.name = args["name"]
                return None
            if name == "thread_sort_index" and type(args.get("sort_index")) is int:
                thread.sort_index = args["sort_index"]
                return None
        else:
            return "unsupported_metadata"
        return "bad_metadata_value"


def _picker(indices: list[int]) -> Callable[[Sequence], tuple]:
    """Takes these items of a list, in one pass in C (itemgetter, but always a tuple)."""
    if len(indices) == 1:
        only = indices[0]
        return lambda items: (items[only],)
    return itemgetter(*indices)


def _beyond_float(events: list) -> bool:
    """Whether a plain event's time is a float that cannot hold its nanoseconds (most real
    traces: their clocks count from boot or from the epoch)."""
    limit = FLOAT_EXACT_LIMIT_US
    return any(type(event.ts) is float and not -limit < event.ts < limit
               for event in events if isinstance(event, _Plain))


def chrome_thread_key(tid: Any) -> Any:
    """Chrome's trace viewer keys threads by the tid's text, so `"5555"` and `5555` are one
    thread (2021 Kineto traces write the first on slices, the second on flow events); a
    decimal string is read as the int it spells. Other text ("stream 7", "05555") stays."""
    if type(tid) is str and tid.isascii() and len(tid) <= 18:
        digits = tid[1:] if tid[:1] == "-" else tid
        if digits.isdigit() and str(int(tid)) == tid:
            return int(tid)
    return tid


def _decoded_args(event: _Event) -> dict:
    raw = event.args
    value = decode_json(raw) if len(raw) > 2 else None
    return value if isinstance(value, dict) else {}


def _hashable(value):
    return value if isinstance(value, (int, str, float)) else repr(value)
