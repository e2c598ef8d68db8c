"""Where each slice's END packet goes among the BEGINs of its track.

Perfetto closes the most recent open slice of a track at an END, so a writer of BEGIN/END
pairs must put every END where its own slice is the most recent one open: at its run's next
BEGIN at or after its end, latest opened first.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


def events_in_write_order(starts: np.ndarray, ends: np.ndarray, instant: np.ndarray, run_lengths: list[int]) -> np.ndarray:
    """The packets of runs of slices (a track's each, in nesting order), in write order: 2i is
    slice i's BEGIN (or instant), 2i + 1 its END, written before the first later BEGIN at or
    after its end or at the run's end, the latest opened first (Perfetto closes the most recent
    open slice of its track). Placed all at once where every run nests properly, as layout
    leaves every track; else as a stack of open slices places them, one slice at a time."""
    placed = _placed_at_once(starts, ends, instant, run_lengths)
    return placed if placed is not None else _placed_by_stack(starts, ends, instant, run_lengths)


def _placed_at_once(starts: np.ndarray, ends: np.ndarray, instant: np.ndarray,
                    run_lengths: list[int]) -> Optional[np.ndarray]:
    """Each END before the first later BEGIN of its run starting at or after its end, the ENDs
    there latest slice first; None unless that closes every slice as the most recent open one."""
    count = len(starts)
    before = np.empty(count, np.int64)  # the BEGIN an END precedes (a run's starts ascend)
    first = 0
    for length in run_lengths:
        last = first + length
        before[first:last] = np.searchsorted(starts[first:last], ends[first:last]) + first
        first = last
    np.maximum(before, np.arange(1, count + 1), out=before)
    closing = np.flatnonzero(~instant)[::-1]
    closing = closing[np.argsort(before[closing], kind="stable")]  # by place, the latest opened first
    ends_up_to = np.cumsum(np.bincount(before[closing], minlength=count + 1))
    events = np.empty(count + len(closing), np.int64)
    events[np.arange(count) + ends_up_to[:count]] = np.arange(0, 2 * count, 2)
    events[np.arange(len(closing)) + before[closing]] = 2 * closing + 1
    # Properly nested: at each depth, the events alternate BEGIN i, END i (an END closing
    # anything but the most recent open slice pairs with another slice's BEGIN there).
    is_end = (events & 1).astype(bool)
    spans = events[is_end | ~instant[events >> 1]]
    opens = (spans & 1) == 0
    depth = np.cumsum(np.where(opens, 1, -1)) + ~opens  # an END's depth is the one before it
    paired = spans[np.argsort(depth, kind="stable")]
    if np.array_equal(paired[1::2], paired[0::2] + 1) and not np.any(paired[0::2] & 1):
        return events
    return None


def _placed_by_stack(starts: np.ndarray, ends: np.ndarray, instant: np.ndarray, run_lengths: list[int]) -> np.ndarray:
    events: list[int] = []
    add = events.append
    start_of, end_of, is_instant = starts.tolist(), ends.tolist(), instant.tolist()
    first = 0
    for length in run_lengths:
        open_ends: list[int] = []
        open_slices: list[int] = []
        for index in range(first, first + length):
            start = start_of[index]
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
                add(2 * open_slices.pop() + 1)
            add(2 * index)
            if not is_instant[index]:
                open_ends.append(end_of[index])
                open_slices.append(index)
        events.extend(2 * index + 1 for index in reversed(open_slices))
        first += length
    return np.array(events, np.int64)
