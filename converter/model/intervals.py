"""Set arithmetic on time intervals: sorted, disjoint [start, end) lists in integer ns.

The report's figures, and the idle causes the engine writes as counters (engine/waits.py),
are unions, differences and overlaps of busy intervals; on sorted lists each is one linear
sweep, cheaper than another round of SQL. A figure per step takes the step's part of a whole-trace list by
bisection (`clip`, `covered`), so a step costs what it holds, not the whole trace: the
report stays n log n in steps. `Spans` is the same set on columns, for sets of a whole trace's
slices (a GPU's idle gaps), where a loop per interval would be most of the cost.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Callable, Iterable, NamedTuple, Sequence, TypeVar

import numpy as np

from .columns import sorted_distinct

Intervals = list[tuple[int, int]]
Item = TypeVar("Item")


def union(intervals: Iterable[tuple[int, int]]) -> Intervals:
    """Any intervals as the sorted, disjoint list the other operations take."""
    merged: Intervals = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def subtract(base: Intervals, cut: Intervals) -> Intervals:
    """Parts of `base` that no interval of `cut` covers."""
    out: Intervals = []
    j = 0
    for start, end in base:
        while j < len(cut) and cut[j][1] <= start:
            j += 1
        k = j
        while k < len(cut) and cut[k][0] < end:
            if cut[k][0] > start:
                out.append((start, cut[k][0]))
            start = max(start, cut[k][1])
            k += 1
        if start < end:
            out.append((start, end))
    return out


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Parts of `a` that `b` also covers."""
    return subtract(a, subtract(a, b))


def clip(intervals: Intervals, start: int, end: int) -> Intervals:
    """The parts of `intervals` inside [start, end)."""
    first = bisect_right(intervals, start, key=_end)
    last = bisect_left(intervals, end, lo=first, key=_start)
    inside = intervals[first:last]
    if inside:
        inside[0] = (max(inside[0][0], start), inside[0][1])
        inside[-1] = (inside[-1][0], min(inside[-1][1], end))
    return inside


def covered(intervals: Intervals, windows: Intervals) -> list[int]:
    """For each window, how much of it `intervals` covers."""
    return [sum(end - start for start, end in clip(intervals, window_start, window_end))
            for window_start, window_end in windows]


def by_window(items: Sequence[Item], span: Callable[[Item], tuple[int, int]], windows: Intervals) -> list[list[Item]]:
    """For each of `windows` (sorted by start; a profile's steps), the items whose span
    overlaps it, in the items' order: each item is placed by bisection, so this costs the
    items and what they overlap, not items times windows."""
    found: list[list[Item]] = [[] for _ in windows]
    reach = list(accumulate((end for _, end in windows), max))  # no earlier window ends later
    for item in items:
        start, end = span(item)
        at = bisect_right(reach, start)
        while at < len(windows) and windows[at][0] < end:
            if windows[at][1] > start:
                found[at].append(item)
            at += 1
    return found


def latest_open(spans: Sequence[tuple[int, int]], moments: Iterable[int]) -> list[int]:
    """For each moment, the index of the last of `spans` (sorted by start) open then, or -1:
    scanned back from the last one begun by then only while an earlier one may still be open,
    so the usual answer, the latest begun, costs a bisection."""
    reach = list(accumulate((end for _, end in spans), max))
    found = []
    for at in moments:
        index = bisect_right(spans, at, key=_start) - 1
        while index >= 0 and reach[index] > at and spans[index][1] <= at:
            index -= 1
        found.append(index if index >= 0 and spans[index][1] > at else -1)
    return found


def _start(interval: tuple[int, int]) -> int:
    return interval[0]


def _end(interval: tuple[int, int]) -> int:
    return interval[1]


class Spans(NamedTuple):
    """Sorted, disjoint [start, end) intervals as two int64 columns (an Intervals list's twin)."""

    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def of(cls, intervals: Intervals) -> "Spans":
        """A sorted, disjoint list's spans."""
        starts, ends = (np.array(column, np.int64) for column in zip(*intervals)) if intervals else (
            np.zeros(0, np.int64), np.zeros(0, np.int64))
        return cls(starts, ends)

    def pairs(self) -> Intervals:
        """As an Intervals list."""
        return list(zip(self.starts.tolist(), self.ends.tolist()))

    def length(self) -> int:
        """The time they cover."""
        return int((self.ends - self.starts).sum())


def union_spans(starts: np.ndarray, ends: np.ndarray) -> Spans:
    """Any intervals as Spans, touching ones joined (as `union` joins them)."""
    if not len(starts):
        return Spans(starts.astype(np.int64), ends.astype(np.int64))
    order = np.lexsort((ends, starts))
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    first = np.flatnonzero(np.concatenate(([True], starts[1:] > reach[:-1])))
    last = np.append(first[1:], len(starts)) - 1
    return Spans(starts[first], reach[last])


def subtract_spans(base: Spans, cut: Spans) -> Spans:
    """Parts of `base` that no span of `cut` covers."""
    return _combined(base, cut, np.logical_and, True)


def intersect_spans(a: Spans, b: Spans) -> Spans:
    """Parts of `a` that `b` also covers."""
    return _combined(a, b, np.logical_and, False)


def clip_spans(spans: Spans, start: int, end: int) -> Spans:
    """The parts of `spans` inside [start, end)."""
    return intersect_spans(spans, Spans(np.array([start], np.int64), np.array([end], np.int64)))


def _combined(a: Spans, b: Spans, op: Callable[[np.ndarray, np.ndarray], np.ndarray], b_inverted: bool) -> Spans:
    """Where op(in a, in b (or not in b)) holds, cut at every bound of either, and the pieces
    that touch joined again."""
    bounds = sorted_distinct(np.concatenate([a.starts, a.ends, b.starts, b.ends]))
    if len(bounds) < 2:
        return Spans(bounds[:0], bounds[:0])
    pieces = bounds[:-1]
    holds = op(_covers(a, pieces), _covers(b, pieces) != b_inverted)
    edges = np.diff(np.concatenate(([0], holds.view(np.int8), [0])))
    return Spans(bounds[np.flatnonzero(edges == 1)], bounds[np.flatnonzero(edges == -1)])


def _covers(spans: Spans, moments: np.ndarray) -> np.ndarray:
    """Per moment, whether a span holds it."""
    at = np.searchsorted(spans.starts, moments, side="right") - 1
    return (at >= 0) & (spans.ends[np.maximum(at, 0)] > moments) if len(spans.starts) else np.zeros(
        len(moments), np.bool_)
