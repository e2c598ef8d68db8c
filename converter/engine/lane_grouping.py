"""Which lane group each GPU slice of one GPU goes to, and how many hardware streams it ran on.

Two groupings, chosen by the job, not by the compaction that uses them: the lane rules
(every trace), or the lanes torch's own export already wrote (`cudaGraphInlineAnnotated`
traces: graphed work moved to annotation-named lanes, the real stream in
`args.original_stream`), kept under their names unless the user asks to re-lane.
"""

from __future__ import annotations

from collections import Counter
from operator import attrgetter, itemgetter
from typing import Optional, Protocol

import numpy as np

from ..kineto import ORIGINAL_STREAM, inline_laned
from ..lane_rules import LaneRules
from ..model import LaneGroup, LaneKind, SliceTable, Thread, Trace
from ..model.columns import grouped_in_order, sorted_distinct

_KIND_ORDER = {kind: position for position, kind in enumerate(LaneKind)}
_THREAD = attrgetter("thread")
_KEY = itemgetter(0)


class LaneGrouping(Protocol):
    def split(self, table: SliceTable, rows: np.ndarray) -> list[tuple[LaneGroup, np.ndarray]]:
        """The rows by lane group, groups in display order, each group's rows in the order given."""


class RuleLanes:
    """Groups from the lane rules; a slice ran on the stream it is on."""

    def __init__(self, rules: LaneRules):
        self.rules = rules

    def split(self, table: SliceTable, rows: np.ndarray) -> list[tuple[LaneGroup, np.ndarray]]:
        groups = rule_groups(self.rules, table, rows)
        return [(self.rules.groups[group], rows[at]) for group, at in sorted(grouped_in_order(groups), key=_KEY)]


class ExportedLanes:
    """One group per lane the trace's exporter wrote, named as it named it; its kind is the
    one most of its slices have under the lane rules (the order of LaneKind on a tie)."""

    def __init__(self, rules: LaneRules):
        self.rules = rules

    def split(self, table: SliceTable, rows: np.ndarray) -> list[tuple[LaneGroup, np.ndarray]]:
        thread_of_track, threads = table.track_keys(_THREAD)
        rule_group = rule_groups(self.rules, table, rows)
        groups = []
        for thread, at in grouped_in_order(thread_of_track[table.track[rows]]):
            lane = threads[thread] if thread >= 0 else None
            groups.append((lane, self._group(lane, rule_group[at]), rows[at]))
        groups.sort(key=lambda item: (_KIND_ORDER[item[1].kind], _numeric_first(item[0])))
        return [(group, members) for _, group, members in groups]

    def _group(self, lane: Optional[Thread], rule_group: np.ndarray) -> LaneGroup:
        """`rule_group`: the lane rules' group of each of the lane's slices (an index into rules.groups)."""
        kinds: Counter[LaneKind] = Counter()
        counts = np.bincount(rule_group)
        for group in np.flatnonzero(counts).tolist():
            kinds[self.rules.groups[group].kind] += int(counts[group])
        kind = min(kinds, key=lambda k: (-kinds[k], _KIND_ORDER[k]))
        label = lane.display_name.strip() if lane is not None else "GPU"
        return LaneGroup(id=f"exported:{_stream_id(lane)}", label=label, kind=kind)


def rule_groups(rules: LaneRules, table: SliceTable, rows: np.ndarray) -> np.ndarray:
    """Per row, its lane rules' group (an index into rules.groups): each distinct (name,
    category) is matched once, in the order the rows first show it."""
    pairs = table.name[rows].astype(np.int64) << 32 | table.cat[rows]
    distinct, first, inverse = np.unique(pairs, return_index=True, return_inverse=True)
    group_of_pair = np.zeros(len(distinct), np.int64)
    texts = table.texts
    for index in np.argsort(first).tolist():
        name, cat = divmod(int(distinct[index]), 1 << 32)
        group_of_pair[index] = rules.group_order[rules.group_of(texts[name], texts[cat])]
    return group_of_pair[inverse]


def hardware_streams(trace: Trace, rows: np.ndarray) -> set[object]:
    """The streams slices ran on: where they are, or, in a trace its exporter laned, the
    `original_stream` of those it moved."""
    table = trace.slices
    if not inline_laned(trace.metadata):  # each track's stream once
        return {_stream_id(table.tracks[track].thread) for track in sorted_distinct(table.track[rows]).tolist()}
    moved_from = trace.args_labels(rows, ORIGINAL_STREAM)
    return {f"stream {stream}" if stream is not None else _stream_id(track.thread)
            for track, stream in zip(table.tracks_of(rows), moved_from)}


def _numeric_first(thread: Optional[Thread]) -> tuple[int, int, str]:
    """Streams by number ("stream 7" before "stream 11"), then the rest by name."""
    tid = thread.source_tid if thread is not None else None
    return (0, tid, "") if isinstance(tid, int) else (1, 0, str(tid))


def _stream_id(thread: Optional[Thread]) -> object:
    """A stream's identity within its GPU: the tid the input gave it (decimal text for ints)."""
    if thread is None:
        return None
    return f"stream {thread.source_tid}" if isinstance(thread.source_tid, int) else thread.source_tid
