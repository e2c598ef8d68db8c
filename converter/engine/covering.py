"""Which lane each GPU annotation goes above: the lane holding most of the slices it covers
on its own stream (a slice is covered when it starts and ends within the annotation).

A CUDA-graph rank has tens of thousands of annotations on thousands of replay streams, so
the covered slices are found for all annotations at once: each slice's (stream, start) is one
int key, sorted, and two searches per annotation give the slices starting inside it.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..model.columns import sorted_distinct

_EXPANDED_AT_ONCE = 1 << 20  # covered-slice candidates held at once: nested annotations repeat them


class StreamSlices:
    """A GPU's slices sorted by (stream, start): their rows (none: not needed), and the
    stream, start and end of each."""

    def __init__(self, streams: np.ndarray, starts: np.ndarray, ends: np.ndarray, rows: Optional[np.ndarray] = None):
        self.rows = rows
        self.starts = sorted_distinct(starts)  # every start, once: ranks that order like the times
        self._stride = len(self.starts) + 1
        self.keys = streams * self._stride + np.searchsorted(self.starts, starts)
        self.ends = ends

    def key(self, streams: np.ndarray, times: np.ndarray, side: str) -> np.ndarray:
        """Keys that bisect the slices as `bisect_left` (side "left") or `bisect_right`
        ("right") of `times` among the starts of their stream would."""
        return streams * self._stride + np.searchsorted(self.starts, times, side=side)  # type: ignore[call-overload]


def lanes_above(slices: StreamSlices, lane_of_slice: np.ndarray, lane_rank: dict[int, int], streams: np.ndarray,
                starts: np.ndarray, ends: np.ndarray, at_once: int = _EXPANDED_AT_ONCE) -> np.ndarray:
    """Per annotation (its stream, start and end), the lane its covered slices are on, by
    `lane_of_slice` (-1: it covers none). Covered slices split over lanes (unusual): the lane
    with the most wins, on a tie the one with the lowest `lane_rank`. `at_once`: how many
    candidate slices are looked at together (memory)."""
    first = np.searchsorted(slices.keys, slices.key(streams, starts, "left"))
    last = np.searchsorted(slices.keys, slices.key(streams, ends, "right"))
    lengths = last - first
    lanes = np.full(len(first), -1, np.int64)
    bounds = np.cumsum(lengths)
    done = 0
    while done < len(first):
        # A stretch of annotations whose candidates fit at once (at least one annotation).
        end = max(int(np.searchsorted(bounds, bounds[done] - lengths[done] + at_once, "right")), done + 1)
        _place(slices, lane_of_slice, lane_rank, first[done:end], lengths[done:end], ends[done:end],
               lanes[done:end])
        done = end
    return lanes


def _place(slices: StreamSlices, lane_of_slice: np.ndarray, lane_rank: dict[int, int], first: np.ndarray,
           lengths: np.ndarray, ends: np.ndarray, lanes: np.ndarray) -> None:
    """lanes_above for a stretch of annotations, into `lanes`."""
    owner = np.repeat(np.arange(len(first)), lengths)
    candidate = np.arange(len(owner)) + np.repeat(first - (np.cumsum(lengths) - lengths), lengths)
    covered = slices.ends[candidate] <= ends[owner]
    owner, lane = owner[covered], lane_of_slice[candidate[covered]]
    if not len(owner):
        return
    new_group = np.concatenate(([True], owner[1:] != owner[:-1]))
    group_start = np.flatnonzero(new_group)
    first_lane = lane[group_start]
    lanes[owner[group_start]] = first_lane
    group_of = np.cumsum(new_group) - 1
    split = lane != first_lane[group_of]  # in a group whose covered slices are on several lanes
    if split.any():
        _vote(owner[group_start], group_of, lane, group_of[split], lane_rank, lanes)


def _vote(annotation_of_group: np.ndarray, group_of: np.ndarray, lane: np.ndarray, split_groups: np.ndarray,
          lane_rank: dict[int, int], lanes: np.ndarray) -> None:
    """Into `lanes`, for each of `split_groups` (its covered slices on several lanes), the
    lane with the most of them, on a tie the lowest `lane_rank`: counted on columns, as a
    pipeline rank has annotations over several lanes by the ten thousand."""
    in_split = np.isin(group_of, split_groups)
    groups, voted = group_of[in_split], lane[in_split]
    known = sorted_distinct(voted)  # the lanes voted for
    ranks = np.fromiter(map(lane_rank.__getitem__, known.tolist()), np.int64, len(known))
    pairs = np.sort(groups * len(known) + np.searchsorted(known, voted))  # one (group, lane) code per vote
    distinct = sorted_distinct(pairs)
    votes = np.diff(np.searchsorted(pairs, distinct, "right"), prepend=0)
    pair_group, pair_lane = np.divmod(distinct, len(known))
    best = np.lexsort((ranks[pair_lane], -votes, pair_group))  # per group, the winner first
    winner = best[np.concatenate(([True], pair_group[best][1:] != pair_group[best][:-1]))]
    lanes[annotation_of_group[pair_group[winner]]] = known[pair_lane[winner]]
