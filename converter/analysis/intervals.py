"""Set arithmetic on time intervals: sorted, disjoint [start, end) lists in integer ns.

The report's figures are unions, differences and overlaps of busy intervals that SQL has
already merged per lane group; on sorted lists each is one linear sweep, cheaper here than
another round of SQL.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterable

Intervals = list[tuple[int, int]]


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


def covered(intervals: Intervals, windows: Intervals) -> list[int]:
    """For each window, how much of it `intervals` covers."""
    ends = [end for _, end in intervals]
    totals = []
    for window_start, window_end in windows:
        total = 0
        i = bisect_right(ends, window_start)
        while i < len(intervals) and intervals[i][0] < window_end:
            total += min(intervals[i][1], window_end) - max(intervals[i][0], window_start)
            i += 1
        totals.append(total)
    return totals
