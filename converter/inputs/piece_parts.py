"""A decoded piece of events -> parts the trace builder takes in order: columns of plain
events (their exact nanoseconds, keys, names, args texts) and the events it must take one by
one. Nothing here depends on what earlier pieces held, so a worker process can make a
piece's parts (piece_workers.py) while the builder takes an earlier piece's (plain_events.py);
the reader alone makes them in this process, with the same code.

A part made to travel (`portable`) holds plain values only: the events taken one by one go
as their raw text (the builder decodes them as it would its own raw events), and equal
names, categories and keys are one object each, so pickle writes each once.
"""

from __future__ import annotations

import functools
from itertools import compress, repeat
from operator import attrgetter, eq, itemgetter
from typing import Any, Callable, Generator, Optional, Sequence, Union

import msgspec
import numpy as np

from ..kineto import MAX_NS
from ..tuning import Tuning
from .decimal_times import FLOAT_EXACT_LIMIT_US, exact_ns, numbers_ns
from .event_pieces import EventsLayout, iter_pieces, piece_events
from .flows import END
from .kineto_events import COMPLETE, EVENT_CODES, FLOW, INSTANT, METADATA, NOT_PLAIN, Decodings

_TS, _DUR, _CAT, _NAME, _ARGS = map(attrgetter, ("ts", "dur", "cat", "name", "args"))
_ID, _BP, _PID, _TID = map(attrgetter, ("id", "bp", "pid", "tid"))
_NOT_THREAD = ("g", "p")  # instant scopes with a track other than their thread's


class PlainPart(msgspec.Struct, array_like=True, gc=False):
    """A run of plain events whose times fit, as columns: flow steps (`flow_at`, in the run)
    and the slices of the rest (complete events and instants), in the run's order."""

    keys: list            # every event's (pid, tid) as written
    scoped: list          # (index, scope) of instants scoped to their process ("p") or the trace ("g")
    flow_at: Any          # np.ndarray: where the flow steps are in the run
    flow_phases: Any      # np.ndarray: flows.py's phase codes
    flow_starts: Any      # np.ndarray: ns
    flow_enclosing: Any   # np.ndarray: binds to the slice enclosing it
    flow_categories: list
    flow_ids: list
    slice_at: Any         # np.ndarray: where the slices are in the run
    starts: Any           # np.ndarray: ns
    durations: Any        # np.ndarray: ns
    names: list
    categories: list
    instants: Any         # np.ndarray: bool
    has_args: Any         # np.ndarray: bool, which slices have args
    texts: list           # the args texts of those that have


class EachPart(msgspec.Struct, array_like=True, gc=False):
    """Events the builder takes one by one: decoded events or their raw text, which are
    events `at`.. of the piece (less its metadata set aside), for finding their raw text."""

    items: list
    at: int


Part = Union[PlainPart, EachPart]


class PieceParts(msgspec.Struct, array_like=True, gc=False):
    """A piece's events as the builder takes them: how many were read, the metadata events
    set aside for the end of the read, and the parts in order."""

    events_read: int
    metadata: list
    parts: list
    kept: Any = None  # np.ndarray: where the events of the parts are in the piece, when metadata was set aside

    def raw_events(self, raw_piece: Callable[[], list]) -> list:
        """The raw events of the parts, by the indices their EachParts give (`at`)."""
        raws = raw_piece()
        return raws if self.kept is None else list(picker(self.kept.tolist())(raws))


RawPiece = Optional[Callable[[], list]]


def decoded_parts(text: Any, layout: EventsLayout, base_ns: int, tuning: Tuning, portable: bool = False,
                  exact_times: Callable[[], bool] = bool) -> Generator[tuple[PieceParts, int, RawPiece], None, None]:
    """(a piece's parts, where the piece ends, its raw events where the parts need them) for
    each piece of the events in `layout`, in order. `exact_times()`: whether the builder had to
    decode an event again for its exact times, asked after each piece (kineto_events.Decodings)."""
    decodings = Decodings(tuning.first_decoding, tuning.tagged_tries)
    for events, start, end in iter_pieces(text, layout, decodings.decoders, tuning.piece_bytes):
        again = decodings.decoded(events, first_piece=start == layout.start)
        if again is not None:
            events = piece_events(text, start, end, again)
        raw_piece = functools.partial(piece_events, text, start, end)
        if portable:
            yield piece_parts(events, base_ns, functools.cache(raw_piece)), end, None
        else:
            yield piece_parts(events, base_ns), end, raw_piece
        del events
        decodings.converted(exact_times())


def piece_parts(items: list, base_ns: int, raw_piece: Optional[Callable[[], list]] = None) -> PieceParts:
    """The parts of a decoded piece. Metadata events are set aside first, so however the
    exporter placed them (first, last, or before each thread's first event) the plain events
    around them make one run, at one bulk pass's cost. With `raw_piece` (the piece's events,
    raw: the same events), the parts are portable: every event taken one by one, and the
    metadata, as raw text, equal values as one object."""
    read, portable = len(items), raw_piece is not None
    codes = np.fromiter(map(EVENT_CODES.get, map(type, items), repeat(NOT_PLAIN)), np.int8, len(items))
    metadata_at = np.flatnonzero(codes == METADATA)
    metadata: list = []
    kept = None
    if len(metadata_at):
        events = picker(metadata_at.tolist())(items)
        if _can_set_aside(events):
            metadata = list(events) if raw_piece is None else \
                list(map(_detached, picker(metadata_at.tolist())(raw_piece())))
            kept = np.flatnonzero(codes != METADATA)
            items = list(picker(kept.tolist())(items))
            codes = codes[kept]
    parts: list[Part] = []
    plain = codes >= COMPLETE  # not NOT_PLAIN, nor METADATA left in place
    start = 0
    intern: Optional[dict] = {} if portable else None
    for end in [*(np.flatnonzero(plain[1:] != plain[:-1]) + 1).tolist(), len(items)] if len(items) else []:
        if plain[start]:
            _plain_parts(parts, items, start, end, codes[start:end], base_ns, intern)
        else:
            parts.append(EachPart(items[start:end], start))
        start = end
    made = PieceParts(read, metadata, parts, kept)
    if raw_piece is not None:
        _detach(made, raw_piece)
    return made


def _can_set_aside(events: Sequence) -> bool:
    """Unless a metadata event has a time a float cannot hold (then all stay in place for the
    builder to take one by one, which decodes that one again, so their order is kept)."""
    limit = FLOAT_EXACT_LIMIT_US
    return not any(type(event.ts) is float and not -limit < event.ts < limit for event in events)


def _detached(raw: msgspec.Raw) -> msgspec.Raw:
    """A raw event's own copy of its text (a decoded Raw holds the whole piece)."""
    return msgspec.Raw(bytes(raw))


def _detach(made: PieceParts, raw_piece: Callable[[], list]) -> None:
    """Events taken one by one, as their raw text: they travel without their classes, and
    the builder's raw path decodes them as it would its own."""
    raws = None
    for part in made.parts:
        if isinstance(part, EachPart):
            raws = raws or made.raw_events(raw_piece)
            part.items = list(map(_detached, raws[part.at:part.at + len(part.items)]))
    made.kept = None


def _plain_parts(parts: list[Part], items: list, start: int, end: int, codes: np.ndarray, base_ns: int,
                 intern: Optional[dict]) -> None:
    """items[start:end], all `Plain` (`codes`: what each is), as PlainParts; an event the bulk
    path cannot take (times a float cannot hold to the ns, not numbers, negative or out of
    range) becomes an EachPart, in its place."""
    run = items[start:end]
    count = len(run)
    complete = np.flatnonzero(codes == COMPLETE)  # the others' durations are 0: instants, flows
    durations_of = list(map(_DUR, run if len(complete) == count else picker(complete.tolist())(run)))
    if type(run[0].ts) is msgspec.Raw:  # which of the two tagged decoders made the piece
        starts, known = exact_ns(list(map(_TS, run)))
        complete_durations, durations_known = numbers_ns(durations_of)
    else:  # starts and durations in one conversion: half the fixed cost of a numpy pass
        times, both_known = numbers_ns([*map(_TS, run), *durations_of])
        starts, known = times[:count], both_known[:count]
        complete_durations, durations_known = times[count:], both_known[count:]
    durations = np.zeros(count, np.int64)
    durations[complete] = complete_durations
    known[complete] &= durations_known
    # 0 <= ts + base and 0 <= dur <= MAX_NS - ts - base, in int64 without overflow.
    headroom = MAX_NS - base_ns
    fits = known & (starts >= -base_ns) & (starts <= headroom) & (durations >= 0)
    fits &= durations <= headroom - np.where(fits, starts, 0)
    odd = np.flatnonzero(~fits).tolist()
    starts = np.where(fits, starts, 0) + base_ns
    edges = [-1, *odd, count]
    for before, after in zip(edges, edges[1:]):
        if after - before > 1:
            part = slice(before + 1, after)
            parts.append(_plain_part(run[part], codes[part], starts[part], durations[part], intern))
        if after < count:
            parts.append(EachPart([run[after]], start + after))


def _plain_part(run: Sequence, codes: np.ndarray, starts: np.ndarray, durations: np.ndarray,
                intern: Optional[dict]) -> PlainPart:
    """Each field of `run` is one pass in C (a map of an attrgetter); the kinds of events are
    parted by numpy on `codes`. `intern`: where equal values become one object (portable parts)."""
    instants = codes == INSTANT
    keys = _interned(intern, list(zip(map(_PID, run), map(_TID, run))))
    scoped = [(at, scope) for at in np.flatnonzero(instants).tolist() if (scope := run[at].s) in _NOT_THREAD]
    flow_at = np.flatnonzero(codes >= FLOW)
    slice_at = np.flatnonzero(codes < FLOW)
    flows: Sequence = ()
    if len(flow_at):
        flows = run if len(flow_at) == len(run) else picker(flow_at.tolist())(run)
        run = () if len(slice_at) == 0 else picker(slice_at.tolist())(run)
        starts, durations, instants, flow_starts = starts[slice_at], durations[slice_at], instants[slice_at], \
            starts[flow_at]
    else:  # no copies where the run is all slices, as most runs are
        flow_starts = starts[:0]
    phases = codes[flow_at] - FLOW
    enclosing = phases != END  # an `f` binds to the slice enclosing it only with `bp: "e"`
    ends = np.flatnonzero(~enclosing)
    if len(ends):
        enclosing[ends] = np.fromiter(map(eq, map(_BP, picker(ends.tolist())(flows)), repeat("e")), bool, len(ends))
    texts = list(map(_ARGS, run))
    has_args = np.fromiter(map(len, texts), np.int64, len(texts)) > 2  # "{}" or absent: no args
    if not has_args.all():
        texts = list(compress(texts, has_args.tolist()))
    if intern is not None:  # portable: bytes pickle as they are, a Raw by a call each
        texts = list(map(bytes, texts))
    return PlainPart(keys, scoped, flow_at, phases, flow_starts, enclosing, _categories(intern, flows),
                     list(map(_ID, flows)), slice_at, starts, durations, _interned(intern, list(map(_NAME, run))),
                     _categories(intern, run), instants, has_args, texts)


def _interned(intern: Optional[dict], values: list) -> list:
    """Equal values as one object (pickle writes each once); as they are without `intern`."""
    if intern is None:
        return values
    setdefault = intern.setdefault
    return list(map(setdefault, values, values))


def _categories(intern: Optional[dict], events: Sequence) -> list[str]:
    cats = _interned(intern, list(map(_CAT, events)))
    return [cat if cat is not None else "" for cat in cats] if None in cats else cats


def _nothing(items: Sequence) -> tuple:
    return ()


def picker(indices: list[int]) -> Callable[[Sequence], tuple]:
    """Takes these items of a list, in one pass in C (itemgetter, but always a tuple)."""
    if not indices:
        return _nothing
    if len(indices) == 1:
        only = indices[0]
        return lambda items: (items[only],)
    return itemgetter(*indices)
