"""Runs of plain Kineto events (complete events, instants, flow steps with plain fields) ->
slices and flow events in bulk, a list operation per field, their nanoseconds exact from the
digits (real traces write times beyond what a float holds to the ns). An event the bulk path
cannot take goes to its phase's handler, in its place: both paths give the same model, in
the same order.
"""

from __future__ import annotations

import functools
from itertools import compress, repeat
from operator import attrgetter, eq, is_, itemgetter
from typing import Any, Callable, Optional, Sequence

import msgspec
import numpy as np

from ..kineto import MAX_NS
from ..model import NO_ARGS, Trace, Track
from .decimal_times import FLOAT_EXACT_LIMIT_US, exact_ns, numbers_ns
from .flows import END
from .kineto_events import COMPLETE, FLOW, INSTANT, METADATA, NOT_PLAIN, EVENT_CODES
from .phase_handlers import PhaseHandlers, chrome_thread_key

_TS, _DUR, _CAT, _NAME, _ARGS = map(attrgetter, ("ts", "dur", "cat", "name", "args"))
_ID, _BP, _PID, _TID = map(attrgetter, ("id", "bp", "pid", "tid"))
_NOT_THREAD = ("g", "p")  # instant scopes with a track other than their thread's
# The first halves of the look-up keys of those scopes' tracks: objects no input pid equals.
_GLOBAL_SCOPE, _PROCESS_SCOPE = object(), object()


class KinetoEvents(PhaseHandlers):
    """Kineto events -> trace model: runs of plain events in bulk, the others through the
    handlers."""

    def __init__(self, trace: Trace, base_ns: int):
        super().__init__(trace, base_ns)
        # (pid, tid) as written, or a scope's key (_tracks_of) -> track
        self._tracks_by_input_key: dict[tuple[Any, Any], Track] = {}

    def add_events(self, items: list, raw_piece: Optional[Callable[[], list[msgspec.Raw]]] = None) -> None:
        """Convert the events in order, releasing each as it is done: runs of `Plain` events
        in bulk, the others one by one. `items` are decoded events or raw ones (decoded here);
        an event whose decoded times cannot give its exact nanoseconds is decoded again from
        `raw_piece()`: the same events, raw. Metadata events are set aside first, so however
        the exporter placed them (first, last, or before each thread's first event) the plain
        events around them make one run, at one bulk call's cost."""
        self.trace.events_read += len(items)
        codes = np.fromiter(map(EVENT_CODES.get, map(type, items), repeat(NOT_PLAIN)), np.int8, len(items))
        metadata = np.flatnonzero(codes == METADATA)
        if len(metadata) and self._set_aside(_picker(metadata.tolist())(items)):
            kept = np.flatnonzero(codes != METADATA)
            take = _picker(kept.tolist())
            items[:] = take(items)  # in place: the caller's list is released as it is done, too
            codes = codes[kept]
            if raw_piece is not None:
                raw_piece = functools.partial(_taken, take, raw_piece)
            if not items:
                return
        if raw_piece is not None:
            raw_piece = functools.cache(raw_piece)  # decoded raw once per piece, however many runs ask
        plain = codes >= COMPLETE  # not NOT_PLAIN, nor METADATA left in place
        start = 0
        for end in [*(np.flatnonzero(plain[1:] != plain[:-1]) + 1).tolist(), len(items)]:
            if plain[start]:
                self._add_plain(items, start, end, codes[start:end], raw_piece)
            else:
                self._add_each(items, start, end, raw_piece)
            start = end

    def _set_aside(self, events: Sequence) -> bool:
        """A piece's metadata events, for the end of the read (what `_add_each` does with each),
        unless one has a time a float cannot hold (then all stay in place for `_add_each`,
        which decodes that one again, so their order is kept)."""
        limit = FLOAT_EXACT_LIMIT_US
        if any(type(event.ts) is float and not -limit < event.ts < limit for event in events):
            return False
        self.keep_metadata(events)
        return True

    def _add_plain(self, items: list, start: int, end: int, codes: np.ndarray, raw_piece) -> None:
        """items[start:end], all `Plain` (`codes`: what each is): slices and flow events made
        a field at a time. An event the bulk path cannot take (times a float cannot hold to the
        ns, not numbers, negative or out of range) goes to `_add_each`, in its place."""
        run = items[start:end]
        count = len(run)
        complete = np.flatnonzero(codes == COMPLETE)  # the others' durations are 0: instants, flows
        durations_of = list(map(_DUR, run if len(complete) == count else _picker(complete.tolist())(run)))
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
        Each field is one pass in C (a map of an attrgetter); the kinds of events are parted
        by numpy on `codes`."""
        instants = codes == INSTANT
        on: Sequence[Track] = self._tracks_of(run, np.flatnonzero(instants).tolist())
        flow_at = np.flatnonzero(codes >= FLOW)
        if len(flow_at):
            if len(flow_at) == len(run):
                self._add_flow_events(run, codes - FLOW, starts, on)
                return
            take = _picker(flow_at.tolist())
            self._add_flow_events(take(run), codes[flow_at] - FLOW, starts[flow_at], take(on))
            kept = np.flatnonzero(codes < FLOW)
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
            enclosing[ends] = np.fromiter(map(eq, map(_BP, _picker(ends.tolist())(flows)), repeat("e")), bool,
                                          len(ends))
        categories = self._categories(flows)
        self.flow_events.extend(map(self.strings.setdefault, categories, categories), map(_ID, flows), phases, starts,
                                on, enclosing)

    @staticmethod
    def _categories(events: Sequence) -> list[str]:
        cats = list(map(_CAT, events))
        return [cat if cat is not None else "" for cat in cats] if None in cats else cats

    def _tracks_of(self, run: Sequence, instant_at: list[int]) -> Sequence[Track]:
        """The track of each event of `run`: its thread's, or for an instant scoped to its
        process or to the trace (`instant_at`: where the instants are), that scope's. One
        look-up per event in C, by its key as written; tracks first met here are made in the
        order their first events come, so a run's order numbers them as one by one would."""
        keys = list(zip(map(_PID, run), map(_TID, run)))
        for at in instant_at:
            scope = run[at].s
            if scope in _NOT_THREAD:
                keys[at] = (_GLOBAL_SCOPE, None) if scope == "g" else (_PROCESS_SCOPE, keys[at][0])
        tracks = self._tracks_by_input_key
        on: list[Any] = list(map(tracks.get, keys))  # None: a track not met before
        if None in on:
            for key in dict.fromkeys(compress(keys, map(is_, on, repeat(None)))):
                tracks[key] = self._track_for_input_key(key)
            on = list(map(tracks.__getitem__, keys))
        return on

    def _track_for_input_key(self, key: tuple[Any, Any]) -> Track:
        """The track of an event keyed (pid, tid) as the input wrote them (a decimal text tid is
        its int), or of a scope's instants."""
        if key[0] is _GLOBAL_SCOPE:
            return self.global_track()
        if key[0] is _PROCESS_SCOPE:
            return self.process_track(key[1])
        return self.thread_track(key[0], chrome_thread_key(key[1]))


def _nothing(items: Sequence) -> tuple:
    return ()


def _taken(take: Callable[[Sequence], tuple], whole: Callable[[], list[msgspec.Raw]]) -> list[msgspec.Raw]:
    """The raw events of what is left of a piece, by the same indices as its decoded ones."""
    return list(take(whole()))


def _picker(indices: list[int]) -> Callable[[Sequence], tuple]:
    """Takes these items of a list, in one pass in C (itemgetter, but always a tuple)."""
    if not indices:
        return _nothing
    if len(indices) == 1:
        only = indices[0]
        return lambda items: (items[only],)
    return itemgetter(*indices)
