"""Binding Chrome flow events (`s`/`t`/`f`) to slices, the way Chrome's trace viewer does.

`s` and `t` (and `f` with `bp: "e"`) bind to the deepest slice enclosing their timestamp on
their thread; any other `f` binds to the next slice to begin there. Each arrow of a chain
becomes its own Flow, so a CUDA-graph launch with one `s` and many `f`s fans out to every kernel.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from itertools import repeat
from typing import Any, Iterable

import msgspec
import numpy as np

from ..model import Flow, SliceTable, Track
from ..model.canonical import ranks, source_key
from ..model.columns import first_positions, grouped_in_order, sorted_distinct
from ..model.nesting import nesting_order

_CHUNK = 1 << 16  # indices made Python ints (or searched) at once
START, STEP, END = range(3)
PHASE_CODES = {"s": START, "t": STEP, "f": END}


class FlowEvents:
    """Flow events as the reader meets them, a column per field. Most never give an arrow
    (the capture cut their chain: on a CUDA-graph trace, most of them), yet an object
    apiece (with its time and id) was held through the whole read; binding
    reads the columns of complete chains' events. Phases are kept as `PHASE_CODES`."""

    def __init__(self) -> None:
        self.categories: list[Any] = []
        # With the category, names the chain an event belongs to: int64s while every id is one
        # (Kineto's), else the ids as read; an int object apiece would be held through the read.
        self.ids: array | list[Any] = array("q")
        self.phases = bytearray()
        self.times = array("q")
        self.tracks: list[Track] = []
        self.enclosing = bytearray()  # per event, 1: binds to the slice enclosing it (else the next one)

    def __len__(self) -> int:
        return len(self.phases)

    def append(self, category: Any, flow_id: Any, phase: str, ts: int, track: Track, enclosing: bool) -> None:
        """One event (the reader's event-by-event path): field by field, but for its id, which
        goes the one way ids go in (`_add_ids`)."""
        self.categories.append(category)
        self._add_ids([flow_id])
        self.phases.append(PHASE_CODES[phase])
        self.times.append(ts)
        self.tracks.append(track)
        self.enclosing.append(enclosing)

    def extend(self, categories: Iterable[Any], ids: Iterable[Any], phases: np.ndarray, times: np.ndarray,
               tracks: Iterable[Track], enclosing: np.ndarray) -> None:
        """Events given a field at a time, all fields equally long: their phases as codes,
        their times and whether they bind to the slice enclosing them as arrays."""
        self.categories.extend(categories)
        self._add_ids(list(ids))
        self.phases += phases.astype(np.uint8).tobytes()
        self.times.frombytes(times.astype(np.int64).tobytes())
        self.tracks.extend(tracks)
        self.enclosing += enclosing.astype(np.uint8).tobytes()

    def _add_ids(self, ids: list[Any]) -> None:
        """As int64s while every id is one (array('q') takes a list whole or not at all), else
        from the first other on, all the ids as read."""
        if isinstance(self.ids, array) and set(map(type, ids)) <= {int}:
            try:
                self.ids += array("q", ids)
                return
            except OverflowError:
                pass
        if isinstance(self.ids, array):
            self.ids = self.ids.tolist()
        self.ids.extend(ids)


    def put_in_canonical_order(self, place: dict[Track, int]) -> None:
        """The events sorted by content (category, id, time, phase, track's place, how they bind),
        so chains, the events of a chain at one time, and so the arrows come in one order
        whatever the input's (the model's canonical order, model/canonical.py)."""
        total = len(self)
        if total < 2:
            return
        categories = sorted(set(self.categories))
        category_rank = dict(zip(categories, range(len(categories))))
        if isinstance(self.ids, array):
            ids = np.frombuffer(self.ids, np.int64)
        else:
            ids = ranks(self.ids, source_key)
        columns = (np.frombuffer(self.enclosing, np.uint8), np.fromiter(map(place.__getitem__, self.tracks), np.int64,
                                                                        total),
                   np.frombuffer(self.phases, np.uint8), np.frombuffer(self.times, np.int64), ids,
                   np.fromiter(map(category_rank.__getitem__, self.categories), np.int64, total))
        order = np.lexsort(columns)
        del columns, ids
        take = order.tolist()
        self.categories = [self.categories[index] for index in take]
        self.tracks = [self.tracks[index] for index in take]
        if isinstance(self.ids, array):
            self.ids = array("q", np.frombuffer(self.ids, np.int64)[order].tobytes())
        else:
            self.ids = [self.ids[index] for index in take]
        self.phases = bytearray(np.frombuffer(self.phases, np.uint8)[order].tobytes())
        self.times = array("q", np.frombuffer(self.times, np.int64)[order].tobytes())
        self.enclosing = bytearray(np.frombuffer(self.enclosing, np.uint8)[order].tobytes())


class BoundFlows(msgspec.Struct):
    """The arrows drawn, and the flow ends that gave none: `partnerless` ends belong to a chain
    with no start (`s`) or no end (`t`, `f`) in the input at all (a capture cut through it:
    expected at the edges of any trace); `unbound` ends had their partner but bound to no
    slice, or to one that ended before the arrow's source began (worth a look)."""

    flows: list[Flow]
    unbound: int = 0
    partnerless: int = 0


class _Chains(msgspec.Struct):
    """The events of every chain with a start and something else, chain after chain (in the
    order the chains begin in the input), each chain's in time order (input order on a tie):
    their indices among the flow events, and per event whether it is the first of its chain,
    a start (`s`) or a step (`t`)."""

    events: np.ndarray
    first: np.ndarray
    is_start: np.ndarray
    is_step: np.ndarray


def bind_flows(events: FlowEvents, slices: SliceTable) -> BoundFlows:
    """Arrows for the given flow events, one per `s`/`t` -> `t`/`f` step of each chain, chains
    in the order they begin in the input. Done on columns: an event's source is the slice its
    chain's latest `s` or `t` before it bound to."""
    chains = _chains(events)
    result = BoundFlows([], partnerless=len(events) - len(chains.events))
    if not len(chains.events):
        return result
    bound = bind_to_slices(np.frombuffer(events.times, np.int64)[chains.events], _picked(events.tracks, chains.events),
                           np.frombuffer(events.enclosing, np.uint8)[chains.events].astype(bool), slices)
    starts, durations = slices.ts, slices.dur
    # Columns as long as the flow events: each dropped once used, as binding sets the read's peak.
    positions = np.arange(len(chains.events))
    lead = np.empty(len(positions), np.int64)  # the latest `s` or `t` before each event
    lead[0] = -1
    lead[1:] = np.maximum.accumulate(np.where(chains.is_start | chains.is_step, positions, -1))[:-1]
    chain_begins = np.maximum.accumulate(np.where(chains.first, positions, 0))
    del positions
    source = np.where(lead >= chain_begins, bound[np.maximum(lead, 0)], -1)
    del lead, chain_begins
    arrow_end = ~chains.is_start
    reaches = arrow_end & (bound >= 0) & (source >= 0)
    sources, targets = source[reaches], bound[reaches]
    drawn = np.zeros(len(chains.events), bool)
    drawn[reaches] = _drawable(starts[sources], starts[targets], durations[targets])
    result.unbound = int(np.count_nonzero(chains.is_start & (bound < 0)) + np.count_nonzero(arrow_end & ~drawn))
    arrows = drawn & (source != bound)
    result.flows = list(map(Flow, source[arrows].tolist(), bound[arrows].tolist(),
                            _picked(events.categories, chains.events[arrows])))
    return result


def _chains(events: FlowEvents) -> _Chains:
    """Chains found by sorting keys, not by a list per (category, id): most flow events are
    lone, and a list and a key apiece for 140k of them was the read's peak memory."""
    total = len(events)
    if not total:
        return _Chains(*(np.zeros(0, kind) for kind in (np.int64, bool, bool, bool)))
    keys = [_id_keys(events.ids), first_positions(events.categories, total)[0]]
    order = np.lexsort(keys)  # by category, then id; stable: a chain's first event comes first
    first_of_chain = np.zeros(total, bool)
    first_of_chain[0] = True
    while keys:  # each key column (one value per flow event) dropped once compared
        ordered = keys.pop()[order]
        first_of_chain[1:] |= ordered[1:] != ordered[:-1]
        del ordered
    heads = np.flatnonzero(first_of_chain)
    del first_of_chain
    sizes = np.diff(heads, append=total)
    phases = np.frombuffer(events.phases, np.uint8)
    is_start = phases == START
    starts = np.add.reduceat(is_start[order], heads)
    # A chain needs a start and something else; a lone event (most partnerless ones) has neither.
    complete = (sizes > 1) & (starts > 0) & (starts < sizes)
    chain_begins = np.empty(total, np.int64)  # per event, where in the input its chain begins
    chain_begins[order] = np.repeat(order[heads], sizes)
    in_complete = np.empty(total, bool)
    in_complete[order] = np.repeat(complete, sizes)
    del order, heads, sizes
    chosen = np.flatnonzero(in_complete)
    del in_complete
    times = np.frombuffer(events.times, np.int64)
    chosen = chosen[np.lexsort((times[chosen], chain_begins[chosen]))]
    begins = chain_begins[chosen]
    del chain_begins
    first = np.ones(len(chosen), bool)
    first[1:] = begins[1:] != begins[:-1]
    return _Chains(chosen, first, is_start[chosen], phases[chosen] == STEP)


def _id_keys(ids: array | list[Any]) -> np.ndarray:
    """Keys equal exactly where flow ids are: the ids themselves where all are int64 (Kineto's),
    else their first positions (a text id "1" and the int 1 name different chains)."""
    if isinstance(ids, array):
        return np.frombuffer(ids, np.int64)
    return first_positions(ids, len(ids))[0]


def _picked(items: list[Any], indices: np.ndarray) -> list[Any]:
    """items[i] for each index, the indices made ints a chunk at a time: all of them at once,
    held through binding, set the read's peak on a large trace."""
    picked: list[Any] = []
    for first in range(0, len(indices), _CHUNK):
        picked.extend(map(items.__getitem__, indices[first:first + _CHUNK].tolist()))
    return picked


def _drawable(source_start: np.ndarray, target_start: np.ndarray, target_duration: np.ndarray) -> np.ndarray:
    """Perfetto draws an arrow only if its target is still running when its source begins."""
    return (target_start >= source_start) | (target_start + target_duration > source_start)


def bind_to_slices(times: np.ndarray, tracks: list[Track], enclosing: np.ndarray, slices: SliceTable) -> np.ndarray:
    """Per flow event (its time, track, and whether it binds to the slice enclosing it), the
    row of the slice it binds to, or -1.

    Kineto stamps a flow event with the start of its slice, and the deepest slice running at
    a slice's start is the shortest one starting there (the last read, on a tie): those are
    found with sorted columns. The other events (and `f`s binding to the next slice) sweep."""
    track_codes, codes = first_positions(tracks, len(tracks))
    # Per track id of the slices, the code of the events' track it is (-1: no event's).
    code_of_track = np.fromiter(map(codes.get, slices.tracks, repeat(-1)), np.int64, len(slices.tracks))
    bound = np.full(len(times), -1, np.int64)
    if enclosing.any():
        _bind_at_starts(times, track_codes, enclosing, code_of_track, slices, bound)
    rest = np.flatnonzero(bound < 0)
    if len(rest):
        _bind_the_rest(times[rest].tolist(), track_codes[rest], enclosing[rest].tolist(), code_of_track, slices,
                       bound, rest.tolist())
    return bound


def _bind_at_starts(times: np.ndarray, track_codes: np.ndarray, enclosing: np.ndarray, code_of_track: np.ndarray,
                    slices: SliceTable, bound: np.ndarray) -> None:
    """bound[i] for the enclosing events that some slice on their track starts at."""
    starts, durations, instant = slices.ts, slices.dur, slices.instant
    stamps = sorted_distinct(times[enclosing])
    pieces = [np.zeros(0, np.int64)]
    for offset in range(0, len(starts), _CHUNK):  # a chunk at a time: whole, two int64 temporaries per slice
        part = starts[offset:offset + _CHUNK]
        pieces.append(np.flatnonzero(stamps[np.minimum(np.searchsorted(stamps, part), len(stamps) - 1)] == part) + offset)
    at_stamp = np.concatenate(pieces)
    del pieces
    at_stamp = at_stamp[~instant[at_stamp]]
    on = code_of_track[slices.track[at_stamp]]
    keep = on >= 0
    candidates, on = at_stamp[keep], on[keep]
    del at_stamp, keep
    if not len(candidates):
        return
    begins = starts[candidates]
    # Per (track, start), the shortest slice, the last read on a tie: first in this order.
    order = np.lexsort((-candidates, durations[candidates], begins, on))
    on, begins, candidates = on[order], begins[order], candidates[order]
    del order
    first = np.ones(len(candidates), bool)
    first[1:] = (on[1:] != on[:-1]) | (begins[1:] != begins[:-1])
    # (track, time) pairs compared as one key: the track's code, then the time's place among
    # the stamps (every candidate starts at one).
    wanted = np.flatnonzero(enclosing)
    width = len(stamps)
    keys = on[first] * width + np.searchsorted(stamps, begins[first])
    event_keys = track_codes[wanted] * width + np.searchsorted(stamps, times[wanted])
    found = np.minimum(np.searchsorted(keys, event_keys), len(keys) - 1)
    hit = keys[found] == event_keys
    bound[wanted[hit]] = candidates[first][found[hit]]


def _bind_the_rest(times: list[int], track_codes: np.ndarray, enclosing: list[bool], code_of_track: np.ndarray,
                   slices: SliceTable, bound: np.ndarray, positions: list[int]) -> None:
    """bound[positions[i]] for the events no slice's start gave, by a sweep per track over its
    slices in nesting order."""
    on = code_of_track[slices.track]
    candidates = np.flatnonzero(np.isin(on, track_codes) & ~slices.instant)
    candidates = candidates[np.argsort(on[candidates], kind="stable")]  # per track, in row order
    candidate_codes = on[candidates]
    for code, on_track in grouped_in_order(track_codes):  # the events on each track
        first, last = np.searchsorted(candidate_codes, [code, code + 1]).tolist()
        ordered = nesting_order(slices, candidates[first:last])
        begins, finishes = (part.tolist() for part in slices.spans(ordered))
        events = on_track.tolist()
        for binds_enclosing in (True, False):
            chosen = [index for index in events if enclosing[index] is binds_enclosing]
            at = [times[index] for index in chosen]
            found_at = _sweep_enclosing(at, begins, finishes) if binds_enclosing else _bind_next(at, begins)
            for index, found in zip(chosen, found_at):
                if found >= 0:
                    bound[positions[index]] = ordered[found]


def _sweep_enclosing(times: list[int], starts: list[int], ends: list[int]) -> list[int]:
    """Sweep in time over slices in nesting order (their `starts` and `ends`): a stack of
    started slices; the deepest one still running encloses ts. Positions among them, -1: none."""
    result = [-1] * len(times)
    stack: list[int] = []
    position = 0
    for event in sorted(range(len(times)), key=times.__getitem__):
        ts = times[event]
        while position < len(starts) and starts[position] <= ts:
            stack.append(position)
            position += 1
        # Slices that ended before ts are dropped lazily; a partially overlapping one lower
        # down is checked again once everything above it has ended.
        while stack and ends[stack[-1]] < ts:
            stack.pop()
        if stack:
            result[event] = stack[-1]
    return result


def _bind_next(times: list[int], starts: list[int]) -> list[int]:
    """The first slice in nesting order (their `starts`) starting at or after each time (-1: none)."""
    return [index if index < len(starts) else -1 for index in (bisect_left(starts, ts) for ts in times)]
