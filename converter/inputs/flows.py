"""Binding Chrome flow events (`s`/`t`/`f`) to slices, the way Chrome's trace viewer does.

`s` and `t` (and `f` with `bp: "e"`) bind to the deepest slice enclosing their timestamp on
their thread; any other `f` binds to the next slice to begin there. Each arrow of a chain
becomes its own Flow, so a CUDA-graph launch with one `s` and many `f`s fans out to every kernel.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from operator import attrgetter
from typing import Any, Optional

import msgspec

from ..model.nesting import nesting_order
from ..model import Flow, Slice, Track


_BY_TS = attrgetter("ts")
_CATEGORY, _FLOW_ID, _PHASE = attrgetter("cat"), attrgetter("flow_id"), attrgetter("phase")


class FlowEvent(msgspec.Struct, gc=False, eq=False):  # ~430k of them per 1M events: see model.py
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


def bind_flows(events: list[FlowEvent], slices: list[Slice]) -> BoundFlows:
    """Arrows for the given flow events, one per `s`/`t` -> `t`/`f` step of each chain."""
    chains: dict[tuple[str, Any], list[FlowEvent]] = defaultdict(list)
    for key, event in zip(zip(map(_CATEGORY, events), map(_FLOW_ID, events)), events):
        chains[key].append(event)
    result = BoundFlows([])
    complete: list[tuple[tuple[str, Any], list[FlowEvent]]] = []
    for key, chain in chains.items():
        # A chain needs a start and something else; a lone event (most partnerless ones) has neither.
        if len(chain) > 1 and 0 < list(map(_PHASE, chain)).count("s") < len(chain):
            complete.append((key, chain))
        else:
            result.partnerless += len(chain)
    _bind_to_slices([event for _, chain in complete for event in chain], slices)
    for key, chain in complete:
        chain.sort(key=_BY_TS)
        source: Optional[Slice] = None
        for event in chain:
            if event.phase == "s":
                source = event.bound
                if source is None:
                    result.unbound += 1
                continue
            target = event.bound
            if target is None or source is None or not drawable(source, target):
                result.unbound += 1
            elif target is not source:
                result.flows.append(Flow(source, target, key[0]))
            if event.phase == "t":
                source = event.bound
    return result


def drawable(source: Slice, target: Slice) -> bool:
    """Perfetto draws an arrow only if its target is still running when its source begins."""
    return target.ts >= source.ts or target.ts + target.dur > source.ts


def _bind_to_slices(events: list[FlowEvent], slices: list[Slice]) -> None:
    """Kineto stamps a flow event with the start of its slice, and the deepest slice running
    at a slice's start is the shortest one starting there (the last read, on a tie): one pass
    over the slices finds those. The other events (and `f`s binding to the next slice) sweep."""
    deepest_at: dict[Track, dict[int, Slice]] = {track: {} for track in {event.track for event in events}}
    for slice_ in slices:
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
