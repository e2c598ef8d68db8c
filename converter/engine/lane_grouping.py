"""Which lane group each GPU slice of one GPU goes to, and how many hardware streams it ran on.

Two groupings, chosen by the job, not by the compaction that uses them: the lane rules
(every trace), or the lanes torch's own export already wrote (`cudaGraphInlineAnnotated`
traces: graphed work moved to annotation-named lanes, the real stream in
`args.original_stream`), kept under their names unless the user asks to re-lane.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Optional, Protocol

from ..kineto import ORIGINAL_STREAM, inline_laned
from ..lane_rules import LaneRules
from ..model import LaneGroup, LaneKind, Slice, Thread, Trace

_KIND_ORDER = {kind: position for position, kind in enumerate(LaneKind)}


class LaneGrouping(Protocol):
    def split(self, slices: list[Slice]) -> list[tuple[LaneGroup, list[Slice]]]:
        """The slices by lane group, groups in display order."""



class RuleLanes:
    """Groups from the lane rules; a slice ran on the stream it is on."""

    def __init__(self, rules: LaneRules):
        self.rules = rules

    def split(self, slices: list[Slice]) -> list[tuple[LaneGroup, list[Slice]]]:
        by_group: dict[str, list[Slice]] = defaultdict(list)
        for slice_ in slices:
            by_group[self.rules.group_of(slice_.name, slice_.cat)].append(slice_)
        order = self.rules.group_order
        return [(self.rules.group(group), by_group[group]) for group in sorted(by_group, key=order.__getitem__)]



class ExportedLanes:
    """One group per lane the trace's exporter wrote, named as it named it; its kind is the
    one most of its slices have under the lane rules (the order of LaneKind on a tie)."""

    def __init__(self, rules: LaneRules):
        self.rules = rules

    def split(self, slices: list[Slice]) -> list[tuple[LaneGroup, list[Slice]]]:
        by_lane: dict[Optional[Thread], list[Slice]] = defaultdict(list)
        for slice_ in slices:
            by_lane[slice_.track.thread].append(slice_)
        groups = [(lane, self._group(lane, members), members) for lane, members in by_lane.items()]
        groups.sort(key=lambda item: (_KIND_ORDER[item[1].kind], _numeric_first(item[0])))
        return [(group, members) for _, group, members in groups]

    def _group(self, lane: Optional[Thread], members: list[Slice]) -> LaneGroup:
        kinds = Counter(self.rules.group(self.rules.group_of(s.name, s.cat)).kind for s in members)
        kind = min(kinds, key=lambda k: (-kinds[k], _KIND_ORDER[k]))
        label = lane.display_name.strip() if lane is not None else "GPU"
        return LaneGroup(id=f"exported:{_stream_id(lane)}", label=label, kind=kind)


def hardware_streams(trace: Trace, slices: list[Slice]) -> set[object]:
    """The streams slices ran on: where they are, or, in a trace its exporter laned, the
    `original_stream` of those it moved."""
    if not inline_laned(trace.metadata):
        return set(map(_stream_id, {slice_.track.thread for slice_ in slices}))  # each thread's id once
    moved_from = trace.args_labels(slices, ORIGINAL_STREAM)
    return {f"stream {stream}" if stream is not None else _stream_id(slice_.track.thread)
            for slice_, stream in zip(slices, moved_from)}


def _numeric_first(thread: Optional[Thread]) -> tuple[int, int, str]:
    """Streams by number ("stream 7" before "stream 11"), then the rest by name."""
    tid = thread.source_tid if thread is not None else None
    return (0, tid, "") if isinstance(tid, int) else (1, 0, str(tid))


def _stream_id(thread: Optional[Thread]) -> object:
    """A stream's identity within its GPU: the tid the input gave it (decimal text for ints)."""
    if thread is None:
        return None
    return f"stream {thread.source_tid}" if isinstance(thread.source_tid, int) else thread.source_tid
