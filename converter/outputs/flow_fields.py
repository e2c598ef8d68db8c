"""The flow ids each slice's BEGIN and END carry, kept as columns until a batch of packets
asks for them.

trace_processor opens a flow at the event that lists its id in flow_ids and closes it at
the next event listing it in terminating_flow_ids, in time order. An arrow whose target
began no later than its source therefore terminates at the target's END. Events at one
time go in file order: where a target that ends where it begins (an instant, or zero
duration) starts at its source's time, the source's track must be written first
(`write_order`).

A dict from slice to its encoded ids would hold Python objects per arrow end for the whole
write, a cost growing with the trace's arrows. Here an end is its
slice's row and its 10 encoded bytes, sorted by row, and a batch finds its rows' runs with
two binary searches and copies them as one column, with no Python per slice.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from operator import attrgetter

import numpy as np

from ..model import Trace, Track
from .fields import TrackEvent
from .packets import Column, gather_runs
from .wire import WIRE_FIXED64, tag

_FLOW_ID = tag(TrackEvent.FLOW_IDS, WIRE_FIXED64)
_TERMINATING_FLOW_ID = tag(TrackEvent.TERMINATING_FLOW_IDS, WIRE_FIXED64)
_TAGS = np.frombuffer(_FLOW_ID + _TERMINATING_FLOW_ID, np.uint8).reshape(2, -1)  # both tags are 2 bytes
_TAG_WIDTH = _TAGS.shape[1]
_WIDTH = _TAG_WIDTH + 8  # a tag and a fixed64 id
_ROW, _FLOW_ID_OF, _OUTGOING = attrgetter("row"), attrgetter("flow_id"), attrgetter("outgoing")


class FlowFields:
    """Every arrow end's encoded id, grouped by the row and event (BEGIN or END) carrying it;
    a row's ids in the order their arrows were given ids."""

    def __init__(self, trace: Trace, first_flow_id: int):
        """Ids `first_flow_id` onwards for `trace.flows`, in order, then the agreed ids of
        `trace.flow_ends` (cross-rank arrows of a merge)."""
        flows, table = trace.flows, trace.slices
        count = len(flows)
        sources, targets = trace.flow_rows()
        holders = np.stack((sources, targets), axis=1)  # per arrow: its source's row, then its target's
        source_ts, target_ts = table.ts[sources], table.ts[targets]
        at_begin = np.ones((count, 2), bool)  # per arrow: its source's end, then its target's
        momentary = table.instant[targets] | (table.dur[targets] == 0)
        at_begin[:, 1] = (target_ts > source_ts) | momentary
        # (source track, target track) of the arrows whose ends share their time.
        shared = np.flatnonzero(momentary & (target_ts == source_ts))
        self.sources_first = list(zip(table.tracks_of(sources[shared]), table.tracks_of(targets[shared])))
        ids = np.repeat(np.arange(first_flow_id, first_flow_id + count, dtype=np.uint64), 2)
        terminating = np.tile(np.array([False, True]), count)
        ends = trace.flow_ends
        self.next_flow_id = first_flow_id + count
        begin = at_begin.reshape(-1)
        self._begin_holders, begin_fields = _sorted_ends(
            np.concatenate([holders.reshape(-1)[begin], np.fromiter(map(_ROW, ends), np.int64, len(ends))]),
            np.concatenate([ids[begin], np.fromiter(map(_FLOW_ID_OF, ends), np.uint64, len(ends))]),
            np.concatenate([terminating[begin], ~np.fromiter(map(_OUTGOING, ends), bool, len(ends))]))
        self._end_holders, end_fields = _sorted_ends(holders.reshape(-1)[~begin], ids[~begin], terminating[~begin])
        self._fields = np.concatenate([begin_fields, end_fields])
        self._end_offset = len(begin_fields)

    def of(self, rows: np.ndarray) -> "SliceFlowFields":
        """Each of `rows`' BEGIN and END fields (empty for most: no arrow), copied out."""
        begin_starts, begin_lengths = _runs(self._begin_holders, rows)
        end_starts, end_lengths = _runs(self._end_holders, rows)
        begin_fields = gather_runs(self._fields, begin_starts, begin_lengths)
        end_fields = gather_runs(self._fields, end_starts + self._end_offset, end_lengths)
        return SliceFlowFields(np.concatenate([begin_fields, end_fields]), np.cumsum(begin_lengths) - begin_lengths,
                               begin_lengths, np.cumsum(end_lengths) - end_lengths + len(begin_fields), end_lengths)


class SliceFlowFields:
    """The flow id fields of a batch's rows: their bytes, and where each one's BEGIN and END
    fields lie in them."""

    def __init__(self, fields: np.ndarray, begin_starts: np.ndarray, begin_lengths: np.ndarray,
                 end_starts: np.ndarray, end_lengths: np.ndarray):
        self._fields = fields
        self._begin, self._end = (begin_starts, begin_lengths), (end_starts, end_lengths)

    def column(self, index: np.ndarray, is_end: np.ndarray) -> Column:
        """For packets each of which is slice `index[i]`'s BEGIN, or its END where `is_end[i]`
        (runs of the batch's own fields: `FlowFields.of` copied them out)."""
        return Column(self._fields, np.where(is_end, self._end[0][index], self._begin[0][index]),
                      np.where(is_end, self._end[1][index], self._begin[1][index]))

    def columns(self) -> list[np.ndarray]:
        """What the constructor takes, in its order."""
        return [self._fields, *self._begin, *self._end]


def _sorted_ends(holders: np.ndarray, ids: np.ndarray, terminating: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the holding rows sorted, each end's encoded field in that order): sorted stably, so
    a row's ids keep the order their arrows were given them."""
    order = np.argsort(holders, kind="stable")
    fields = np.empty((len(order), _WIDTH), np.uint8)
    fields[:, :_TAG_WIDTH] = _TAGS[terminating[order].astype(np.intp)]
    fields[:, _TAG_WIDTH:] = ids[order].astype("<u8").view(np.uint8).reshape(-1, 8)
    return holders[order], fields.reshape(-1)


def _runs(holders: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(where each row's fields start, their length in bytes), by two binary searches."""
    first = np.searchsorted(holders, rows, "left")
    last = np.searchsorted(holders, rows, "right")
    return first * _WIDTH, (last - first) * _WIDTH


def write_order(tracks: list[Track], sources_first: list[tuple[Track, Track]]) -> list[Track]:
    """`tracks` in the order their slices are written: as given, except that a track waits
    for the tracks of the arrows it is the target of in `sources_first` (FlowFields). Where
    every track left waits (a cycle of such arrows), the first one left goes next:
    trace_processor then drops the arrows whose target is written first (--verify reports
    them). An arrow from or to a track not in `tracks` (whose slices are not written) orders
    nothing."""
    position = {track: index for index, track in enumerate(tracks)}
    waits_for: dict[Track, set[Track]] = defaultdict(set)
    followers: dict[Track, list[Track]] = defaultdict(list)
    for source, target in sources_first:
        if source is not target and source in position and target in position and source not in waits_for[target]:
            waits_for[target].add(source)
            followers[source].append(target)
    if not waits_for:
        return tracks
    ready = [index for index, track in enumerate(tracks) if not waits_for.get(track)]
    heapq.heapify(ready)
    written = [False] * len(tracks)
    ordered: list[Track] = []
    first_unwritten = 0
    while len(ordered) < len(tracks):
        if ready:
            index = heapq.heappop(ready)
            if written[index]:
                continue
        else:  # only cycles are left
            while written[first_unwritten]:
                first_unwritten += 1
            index = first_unwritten
        written[index] = True
        ordered.append(tracks[index])
        for target in followers.get(tracks[index], ()):
            waiting = waits_for[target]
            waiting.discard(tracks[index])
            if not waiting:
                heapq.heappush(ready, position[target])
    return ordered
