"""Binding Chrome flow events (`s`/`t`/`f`) to slices, the way Chrome's trace viewer does.

`s` and `t` (and `f` with `bp: "e"`) bind to the deepest slice enclosing their timestamp on
their thread; any other `f` binds to the next slice to begin there. Each arrow of a chain
becomes its own Flow, so a CUDA-graph launch with one `s` and many `f`s fans out to every kernel.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import defaultdict
from itertools import compress, count
from operator import attrgetter
from typing import Any, Iterable, Optional

import msgspec
import numpy as np

from ..model.nesting import nesting_order
from ..model import Flow, Slice, Track


_BY_TS = attrgetter("ts")


class FlowEvents:
    """Flow events as the reader meets them, a column per field. Most never give an arrow
    (the capture cut their chain: 141k of 208k on hta_cuda_graph_rank0), yet an object
    apiece (about 140 bytes with its time and id) was held through the whole read; only the
    events of complete chains become FlowEvents."""

    def __init__(self) -> None:
        self.categories: list[Any] = []
        self.ids: list[Any] = []  # with the category, names the chain an event belongs to
        self.phases: list[str] = []
        self.times = array("q")
        self.tracks: list[Track] = []
        self.enclosing = bytearray()  # per event, 1: binds to the slice enclosing it (else the next one)

    def __len__(self) -> int:
        return len(self.phases)

    def append(self, category: Any, flow_id: Any, phase: str, ts: int, track: Track, enclosing: bool) -> None:
        self.extend((category,), (flow_id,), (phase,), (ts,), (track,), (enclosing,))

    def extend(self, categories: Iterable[Any], ids: Iterable[Any], phases: Iterable[str], times: Iterable[int],
               tracks: Iterable[Track], enclosing: Iterable[bool]) -> None:
        """Events given a field at a time, all fields equally long."""
        self.categories.extend(categories)
        self.ids.extend(ids)
        self.phases.extend(phases)
        self.times.extend(times)
        self.tracks.extend(tracks)
        self.enclosing.extend(enclosing)

    def event(self, index: int) -> "FlowEvent":
        return FlowEvent(self.categories[index], self.ids[index], self.phases[index], self.times[index],
                         self.tracks[index], bool(self.enclosing[index]))


class FlowEvent(msgspec.Struct, gc=False, eq=False):
    """One flow event of a complete chain, with the slice it binds to."""

    cat: str
    flow_id: Any  # with cat, names the arrow chain the event belongs to
    phase: str
    ts: int
    track: Track
    bind_to_enclosing: bool
    bound: Optional[Slice] = None


class BoundFlows(msgspec.Struct):
    """The arrows drawn, and the flow ends that gave none: `partnerless` ends belong to a chain
    with no start (`s`) or no end (`t`, `f`) in the input at all (a capture cut through it:
    expected at the edges of any trace); `unbound` ends had their partner but bound to no
    slice, or to one that ended before the arrow's source began (worth a look)."""

    flows: list[Flow]
    unbound: int = 0
    partnerless: int = 0


def bind_flows(events: FlowEvents, slices: list[Slice]) -> BoundFlows:
    """Arrows for the given flow events, one per `s`/`t` -> `t`/`f` step of each chain, chains
    in the order they begin in the input."""
    result = BoundFlows([])
    chains = _chains(events)
    result.partnerless = len(events) - len(chains.events)
    _bind_to_slices(chains.events, slices)
    source: Optional[Slice] = None
    for event, first in zip(chains.events, chains.starts_chain):
        if first:
            source = None
        if event.phase == "s":
            source = event.bound
            if source is None:
                result.unbound += 1
            continue
        target = event.bound
        if target is None or source is None or not drawable(source, target):
            result.unbound += 1
        elif target is not source:
            result.flows.append(Flow(source, target, event.cat))
        if event.phase == "t":
            source = event.bound
    return result


class _Chains(msgspec.Struct):
    """The events of every chain with a start and something else, chain after chain (in the
    order the chains begin in the input), each chain's in time order (input order on a tie)."""

    events: list[FlowEvent]
    starts_chain: list[bool]  # per event: the first of its chain


def _chains(events: FlowEvents) -> _Chains:
    """Chains found by sorting keys, not by a list per (category, id): most flow events are
    lone, and a list and a key apiece for 140k of them was the read's peak memory."""
    total = len(events)
    if not total:
        return _Chains([], [])
    categories, ids = _codes(events.categories), _id_keys(events.ids)
    order = np.lexsort((ids, categories))  # stable: a chain's first event comes first
    first_of_chain = np.ones(total, bool)
    first_of_chain[1:] = (categories[order][1:] != categories[order][:-1]) | (ids[order][1:] != ids[order][:-1])
    heads = np.flatnonzero(first_of_chain)
    sizes = np.diff(heads, append=total)
    is_start = np.fromiter(map("s".__eq__, events.phases), bool, total)
    starts = np.add.reduceat(is_start[order], heads)
    # A chain needs a start and something else; a lone event (most partnerless ones) has neither.
    complete = (sizes > 1) & (starts > 0) & (starts < sizes)
    chain_begins = np.empty(total, np.int64)  # per event, where in the input its chain begins
    chain_begins[order] = np.repeat(order[heads], sizes)
    in_complete = np.empty(total, bool)
    in_complete[order] = np.repeat(complete, sizes)
    chosen = np.flatnonzero(in_complete)
    times = np.frombuffer(events.times, np.int64)
    chosen = chosen[np.lexsort((times[chosen], chain_begins[chosen]))]
    begins = chain_begins[chosen]
    first = np.ones(len(chosen), bool)
    first[1:] = begins[1:] != begins[:-1]
    return _Chains(list(map(events.event, chosen.tolist())), first.tolist())


def _codes(values: list[Any]) -> np.ndarray:
    """Equal values, equal codes (for the few distinct categories, or ids that are not int64)."""
    known: dict[Any, int] = {}
    return np.fromiter(map(known.setdefault, values, count()), np.int64, len(values))


def _id_keys(ids: list[Any]) -> np.ndarray:
    """Keys equal exactly where flow ids are: the ids themselves where all are int64 (Kineto's),
    else codes (a text id "1" and the int 1 name different chains)."""
    if set(map(type, ids)) == {int}:
        try:
            return np.fromiter(ids, np.int64, len(ids))
        except OverflowError:
            pass
    return _codes(ids)


def drawable(source: Slice, target: Slice) -> bool:
    """Perfetto draws an arrow only if its target is still running when its source begins."""
    return target.ts >= source.ts or target.ts + target.dur > source.ts


def _bind_to_slices(events: list[FlowEvent], slices: list[Slice]) -> None:
    """Kineto stamps a flow event with the start of its slice, and the deepest slice running
    at a slice's start is the shortest one starting there (the last read, on a tie): one pass
    over the slices finds those. The other events (and `f`s binding to the next slice) sweep."""
    deepest_at: dict[Track, dict[int, Slice]] = {track: {} for track in {event.track for event in events}}
    # Only slices starting at some event's time (sifted in C): a table of every slice's start
    # was the read's memory peak at 1 GB.
    stamps = set(map(_BY_TS, events))
    for slice_ in compress(slices, map(stamps.__contains__, map(_BY_TS, slices))):
        if not slice_.is_instant:
            starts = deepest_at.get(slice_.track)
            if starts is not None:
                other = starts.get(slice_.ts)
                if other is None or slice_.dur <= other.dur:
                    starts[slice_.ts] = slice_
    rest: dict[Track, list[FlowEvent]] = defaultdict(list)
    for event in events:
        if event.bind_to_enclosing:
            event.bound = deepest_at[event.track].get(event.ts)
            if event.bound is not None:
                continue
        rest[event.track].append(event)
    if not rest:
        return
    track_slices: dict[Track, list[Slice]] = {track: [] for track in rest}
    for slice_ in slices:
        if not slice_.is_instant:
            candidates = track_slices.get(slice_.track)
            if candidates is not None:
                candidates.append(slice_)
    for track, track_events in rest.items():
        candidates = nesting_order(track_slices[track])
        enclosed = [e for e in track_events if e.bind_to_enclosing]
        if enclosed:
            _sweep_enclosing(enclosed, candidates)
        if len(enclosed) < len(track_events):
            _bind_next([e for e in track_events if not e.bind_to_enclosing], candidates)


def _sweep_enclosing(events: list[FlowEvent], candidates: list[Slice]) -> None:
    """Sweep in time: a stack of started slices; the deepest one still running encloses ts."""
    events.sort(key=_BY_TS)
    stack: list[Slice] = []
    position = 0
    for event in events:
        while position < len(candidates) and candidates[position].ts <= event.ts:
            stack.append(candidates[position])
            position += 1
        # Slices that ended before ts are dropped lazily; a partially overlapping one lower
        # down is checked again once everything above it has ended.
        while stack and stack[-1].ts + stack[-1].dur < event.ts:
            stack.pop()
        event.bound = stack[-1] if stack else None


def _bind_next(events: list[FlowEvent], candidates: list[Slice]) -> None:
    starts = [s.ts for s in candidates]
    for event in events:
        index = bisect_left(starts, event.ts)
        event.bound = candidates[index] if index < len(candidates) else None
