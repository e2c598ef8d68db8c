"""Kineto events as msgspec decodes them: the structs, the decoders, and which decoding a
piece gets.

Decoding uses msgspec with a typed event struct: faster than orjson on Kineto traces, and
it keeps `args` as raw JSON text (no dicts built for millions of events). A piece is first
decoded with the phase as a tag, which checks the plain events' field types in C and keeps
their times as written (plain_events.py takes them in bulk); other pieces are decoded with
the lenient `Event`, for the handlers of phase_handlers.py.
"""

# Annotations stay objects here (no `from __future__ import annotations`): as strings, msgspec
# would evaluate each struct field's one when the decoders below are built, at every start.
from decimal import Decimal
from typing import Any, ClassVar, Optional, Union

import msgspec

from ..errors import CgtraceError
from ..tuning import Decoding
from .decimal_times import FLOAT_EXACT_LIMIT_US
from .flows import PHASE_CODES

_NO_ARGS = msgspec.Raw(b"")


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


class Event(_EventBody, gc=False):
    ph: Any = None


class Tagged(_EventBody, tag_field="ph", gc=False):
    """An event decoded by its phase (the tag); each phase's class says its `ph`."""

    ph: ClassVar[str] = ""


class Plain(Tagged, gc=False):
    """An event with the field types the bulk path takes (checked by msgspec): a slice, an
    instant or a flow step. Its classes come in two kinds of times (_plain_phases)."""


# What a plain event is, as a small int per class (EVENT_CODES): a piece's events are told
# apart and split by numpy on these, instead of an isinstance of a msgspec class per event,
# a Python call each. Flow steps come last, in flows.py's order of phases. METADATA: a tagged
# `M` event, which only waits for the end of the read, so it parts no run of plain events.
COMPLETE, INSTANT, FLOW = 0, 1, 2
NOT_PLAIN, METADATA = -1, -2


def _plain_phases(time: Any) -> tuple[type[Plain], ...]:
    """One tagged class per plain phase, with starts decoded as `time`. Durations are always
    numbers: a float holds them to the ns below 2**40 us (12 days), and an event with a longer
    one is decoded again exactly."""
    common = {"ts": time, "pid": Union[int, str], "tid": Union[int, str], "cat": Optional[str]}
    shapes: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "X": ({"dur": Union[int, float], "name": str}, {}),
        **dict.fromkeys("iI", ({"name": str, "s": Optional[str]}, {"s": None})),  # s: scope ("g", "p", thread)
        **dict.fromkeys("stf", ({"id": Union[int, str], "bp": Optional[str]}, {"bp": None}))}
    return tuple(type(f"_Plain_{ph}", (Plain,), {"__annotations__": {**common, **fields}, "ph": ph, "cat": None,
                                                  **defaults},
                      tag=ph, kw_only=True, gc=False)
                 for ph, (fields, defaults) in shapes.items())


def _code_of_phase(ph: str) -> int:
    return COMPLETE if ph == "X" else INSTANT if ph in "iI" else FLOW + PHASE_CODES[ph]


# The other phases the handlers know, as lenient as Event; a piece with any other phase (or
# none) fails the tagged decoding and is decoded with Event instead.
_OTHER_PHASES: dict[str, type[Tagged]] = {ph: type(f"_Phase_{ph}", (Tagged,), {"ph": ph}, tag=ph, gc=False)
                                           for ph in "BECbenM"}


def _tagged_list(plain: tuple[type[Plain], ...]) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(list.__class_getitem__(Union.__getitem__((*plain, *_OTHER_PHASES.values()))))


# Times as numbers while a float holds them to the ns (below 2**40 us), else as written.
_PLAIN_WITH_NUMBERS, _PLAIN_WITH_TEXT = _plain_phases(Union[int, float]), _plain_phases(msgspec.Raw)
_TAGGED_NUMBERS, _TAGGED_TEXT = _tagged_list(_PLAIN_WITH_NUMBERS), _tagged_list(_PLAIN_WITH_TEXT)
EVENT_CODES: dict[type[Tagged], int] = {cls: _code_of_phase(cls.ph)
                                        for cls in (*_PLAIN_WITH_NUMBERS, *_PLAIN_WITH_TEXT)}
EVENT_CODES[_OTHER_PHASES["M"]] = METADATA


class _ExactEvent(Event, gc=False):
    ts: Optional[Decimal] = None
    dur: Optional[Decimal] = None


class _ExactTs(msgspec.Struct, gc=False):
    ts: Optional[Decimal] = None


EVENT = msgspec.json.Decoder(Event)
_EVENT_LIST = msgspec.json.Decoder(list[Event])
_EXACT_EVENT = msgspec.json.Decoder(_ExactEvent)
_EXACT_EVENT_LIST = msgspec.json.Decoder(list[_ExactEvent])
_EXACT_TS = msgspec.json.Decoder(_ExactTs)
_DECODERS = {Decoding.TAGGED_NUMBERS: (_TAGGED_NUMBERS, _EVENT_LIST), Decoding.TAGGED_TEXT: (_TAGGED_TEXT, _EVENT_LIST),
             Decoding.EVENTS: (_EVENT_LIST,), Decoding.EXACT_EVENTS: (_EXACT_EVENT_LIST,)}
_TAGGED = (Decoding.TAGGED_NUMBERS, Decoding.TAGGED_TEXT)
_EXACT = {Decoding.TAGGED_NUMBERS: Decoding.TAGGED_TEXT, Decoding.EVENTS: Decoding.EXACT_EVENTS}


class Decodings:
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
        if self.choice in _TAGGED and events and not isinstance(events[0], Tagged):
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


def _beyond_float(events: list) -> bool:
    """Whether a plain event's time is a float that cannot hold its nanoseconds (most real
    traces: their clocks count from boot or from the epoch)."""
    limit = FLOAT_EXACT_LIMIT_US
    return any(type(event.ts) is float and not -limit < event.ts < limit
               for event in events if isinstance(event, Plain))


def not_valid_json(error: msgspec.DecodeError) -> CgtraceError:
    """msgspec says "truncated" only where the text ends early; other errors are in the text itself."""
    advice = ("the file may be truncated: re-export it" if "truncated" in str(error) else
              "JSON has no NaN, Infinity or lone surrogate escape (\\ud800): fix the file or re-export the trace")
    return CgtraceError(f"not valid JSON ({error}); {advice}")


def decode_event(raw: msgspec.Raw) -> Optional[Event]:
    """One event, or None when it is not a JSON object; ts/dur exact to the nanosecond."""
    try:
        event = EVENT.decode(raw)
    except msgspec.ValidationError:
        try:
            return _EXACT_EVENT.decode(raw)  # a ts or dur beyond double range (1e400)
        except msgspec.ValidationError:
            return None
    except msgspec.DecodeError as error:  # e.g. invalid UTF-8 inside a string, which the list pass skips over
        raise not_valid_json(error) from None
    ts = event.ts
    if type(ts) is float and not -FLOAT_EXACT_LIMIT_US < ts < FLOAT_EXACT_LIMIT_US:
        try:
            event = _EXACT_EVENT.decode(raw)
        except msgspec.ValidationError:  # e.g. "dur": [1]: keep the event (bad_dur says why), ts exact
            event.ts = _EXACT_TS.decode(raw).ts
    return event
