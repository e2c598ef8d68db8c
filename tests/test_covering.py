"""Which lane an annotation goes above (engine/covering.py), against the rule stated one
annotation at a time: the slices of its stream that start and end within it, their lanes'
majority, ties to the lane ranked first."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.engine.covering import StreamSlices, lanes_above


def _one_by_one(slices, lane_rank, annotations):
    lanes = []
    for stream, start, end in annotations:
        covered = [lane for slice_stream, slice_start, slice_end, lane in slices
                   if slice_stream == stream and start <= slice_start and slice_end <= end]
        if not covered:
            lanes.append(-1)
            continue
        votes = Counter(covered)
        lanes.append(max(votes, key=lambda key: (votes[key], -lane_rank[key])))
    return lanes


_TIMES = st.sampled_from([0, 1, 2, 5, 10, 2**40, 2**61])  # repeats, touching ends, epoch-sized times


@st.composite
def _cases(draw):
    slices = [(draw(st.integers(0, 3)), start, start + draw(st.sampled_from([0, 1, 3, 2**40])), draw(st.integers(0, 2)))
              for start in draw(st.lists(_TIMES, max_size=25))]
    annotations = [(draw(st.integers(0, 4)), start, start + draw(st.sampled_from([0, 1, 4, 9, 2**41])))
                   for start in draw(st.lists(_TIMES, max_size=12))]
    rank = draw(st.permutations([0, 1, 2]))
    return slices, {lane: position for position, lane in enumerate(rank)}, annotations, draw(st.integers(1, 8))


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_lanes_above_follows_the_rule_for_each_annotation(case):
    slices, lane_rank, annotations, at_once = case
    ordered = sorted(slices, key=lambda item: (item[0], item[1]))  # as compaction sorts them: stream, start
    columns = [np.array([item[field] for item in ordered], np.int64) for field in range(4)]
    stream_slices = StreamSlices(columns[0], columns[1], columns[2])
    queries = [np.array([item[field] for item in annotations], np.int64) for field in range(3)]
    got = lanes_above(stream_slices, columns[3], lane_rank, *queries, at_once=at_once)
    assert got.tolist() == _one_by_one(ordered, lane_rank, annotations)
