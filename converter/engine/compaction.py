"""CUDA-graph compaction: a GPU's slices from hundreds of replay streams into a few lanes.

Each (GPU, lane group) is packed into the fewest lanes with no overlap (interval
partitioning, O(n log n)); annotations follow the slices they cover onto an annotation track
directly above that lane. Only `Slice.track` changes for measured slices: name, ts, dur,
category and args stay exactly as read, and a self-check proves it before anything is written.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter
from typing import Container, Iterator, Optional

from ..errors import CgtraceError
from ..kineto import CUDA_GRAPH_LAUNCH, KERNEL_LABEL
from ..lane_rules import LaneRules
from ..model import LaneGroup, Process, Slice, Thread, Trace, Track, TrackRole
from ..model.nesting import nested_layers, sort_by_start
from .lane_grouping import LaneGrouping, RuleLanes, hardware_streams
from .window import step_ranges

KERNEL_LABEL_CATEGORY = "cuda_graph_label"
_BY_TS = attrgetter("ts")


@dataclass
class GpuLanes:
    """The lanes built for one GPU process."""

    process: Process
    container: Track
    lanes: dict[LaneGroup, list[Track]] = field(default_factory=dict)  # group -> lanes, in order
    annotation_rows: dict[Track, list[Track]] = field(default_factory=dict)  # lane -> rows
    lane_slices: dict[Track, list[Slice]] = field(default_factory=dict)  # lane -> slices in time order
    streams: set[object] = field(default_factory=set)  # the hardware streams (lane_grouping.hardware_streams)


def compact(trace: Trace, rules: LaneRules, grouping: Optional[LaneGrouping] = None) -> dict:
    """Move GPU slices and their annotations onto lanes (grouped by the lane rules unless a
    grouping is given); returns the summary figures."""
    grouping = grouping or RuleLanes(rules)
    measured_before = _fingerprint(trace.slices, rules.annotation_categories)
    gpu_slices: dict[Process, list[Slice]] = defaultdict(list)  # model objects hash by identity
    annotations: dict[Process, list[Slice]] = defaultdict(list)
    moved_categories = rules.gpu_categories | rules.annotation_categories
    for slice_ in trace.slices:  # plain loops over the slices: Python 3.11 specializes them
        if slice_.cat not in moved_categories:
            continue
        thread = slice_.track.thread
        if thread is None:
            continue
        if slice_.cat in rules.gpu_categories:
            gpu_slices[thread.process].append(slice_)
        elif slice_.cat in rules.annotation_categories:
            annotations[thread.process].append(slice_)

    summary: Counter[str] = Counter()
    step_starts = sorted(start for start, _ in step_ranges(trace).values())
    launch_of = {id(flow.target): id(flow.source) for flow in trace.flows}
    per_gpu = []
    for process, slices in gpu_slices.items():
        by_stream = _by_stream(slices)  # before packing moves the slices off their streams
        gpu = _pack_lanes(trace, process, slices, grouping, summary)
        _place_annotations(trace, gpu, by_stream, annotations.get(process, []), summary)
        _label_kernel_runs(trace, gpu, launch_of, step_starts, summary)
        _layer_annotation_rows(trace, gpu)
        per_gpu.append(gpu)

    measured_after = _fingerprint(trace.slices, rules.annotation_categories | {KERNEL_LABEL_CATEGORY})
    _self_check(measured_before, measured_after, per_gpu)
    lanes_by_group: Counter[str] = Counter()
    for gpu in per_gpu:
        for group, lanes in gpu.lanes.items():
            lanes_by_group[group.label] += len(lanes)
    return {
        "measured_slices": measured_before[0],
        "original_streams": sum(len(gpu.streams) for gpu in per_gpu),
        "compacted_lanes": sum(lanes_by_group.values()),
        "slice_groups": {label: summary[f"group:{label}"] for label in lanes_by_group},
        "lanes_by_group": dict(lanes_by_group),
        "per_gpu": [{"gpu": gpu.process.short_name, "streams": len(gpu.streams),
                     "lanes": sum(len(lanes) for lanes in gpu.lanes.values())} for gpu in per_gpu],
        "gpu_flow_endpoints_mapped": _flow_endpoints_on_lanes(trace, per_gpu),
        "gpu_annotations_mapped": summary["annotations_mapped"],
        "gpu_annotations_coalesced": summary["annotations_coalesced"],
        "gpu_annotations_retained": summary["annotations_retained"],
        "kernel_annotations_converted": summary["kernels_labelled"],
        "kernel_annotation_blocks": summary["label_blocks"],
        "cuda_graph_launches": sum(1 for slice_ in trace.slices if slice_.name == CUDA_GRAPH_LAUNCH),
    }


def _pack_lanes(trace: Trace, process: Process, slices: list[Slice], grouping: LaneGrouping,
                summary: Counter[str]) -> GpuLanes:
    # A root-level row named after the GPU, not a track inside its process: Perfetto v52 draws
    # a collapsed process only from its threads' slices, and a collapsed plain row from what it
    # holds itself, so this row, made a busy-lanes counter (activity.py), shows the GPU's work.
    container = trace.add_track(Track(name=process.short_name, orders_children=True, role=TrackRole.LANES))
    gpu = GpuLanes(process=process, container=container, streams=hardware_streams(trace, slices))
    for lane_group, members in grouping.split(slices):
        summary[f"group:{lane_group.label}"] += len(members)
        lanes = gpu.lanes[lane_group] = []
        for lane_index, lane_members in enumerate(partition_intervals(members)):
            lane = trace.add_track(Track(name=_lane_name(lane_group.label, lane_index),
                                         process=process, parent=container, role=TrackRole.LANE,
                                         group=lane_group, layer=lane_index + 1))
            lanes.append(lane)
            for slice_ in lane_members:
                slice_.track = lane
            gpu.lane_slices[lane] = lane_members
    return gpu


def _lane_name(label: str, index: int) -> str:
    """"Compute", "Compute 2", ...; "stream 7", "stream 7 (2)" where the label ends in a number."""
    if index == 0:
        return label
    return f"{label} ({index + 1})" if label[-1:].isdigit() else f"{label} {index + 1}"


def partition_intervals(slices: list[Slice]) -> list[list[Slice]]:
    """Fewest lanes with no overlap (touching is fine): each slice takes the lowest free lane.

    The number of lanes equals the largest number of slices running at once, the optimum.
    """
    lanes: list[list[Slice]] = []
    busy: list[tuple[int, int]] = []   # (end, lane) of lanes still running a slice
    free: list[int] = []               # lanes idle now, lowest first
    ordered = list(slices)
    sort_by_start(ordered, longest_first=False)  # by (ts, dur), then as given
    for slice_ in ordered:
        while busy and busy[0][0] <= slice_.ts:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane = len(lanes)
            lanes.append([])
        lanes[lane].append(slice_)
        heapq.heappush(busy, (slice_.ts + slice_.dur, lane))
    return lanes


def _by_stream(gpu_slices: list[Slice]) -> dict[Optional[Thread], list[Slice]]:
    """GPU slices per original stream, in start order."""
    by_stream: dict[Optional[Thread], list[Slice]] = defaultdict(list)
    for slice_ in gpu_slices:
        by_stream[slice_.track.thread].append(slice_)
    for members in by_stream.values():
        members.sort(key=_BY_TS)
    return by_stream


def _place_annotations(trace: Trace, gpu: GpuLanes, by_stream: dict[Optional[Thread], list[Slice]],
                       annotations: list[Slice], summary: Counter[str]) -> None:
    """Each annotation goes above the lane holding most of the slices it covers on its stream
    (on a tie, the lane listed first)."""
    streams = {stream: (members, [s.ts for s in members]) for stream, members in by_stream.items()}
    lanes_in_order = [lane for lanes in gpu.lanes.values() for lane in lanes]
    lane_position = {lane: position for position, lane in enumerate(lanes_in_order)}
    placed: dict[Track, list[Slice]] = defaultdict(list)
    no_members: tuple[list[Slice], list[int]] = ([], [])
    for annotation in annotations:
        members, starts = streams.get(annotation.track.thread, no_members)
        start, end = annotation.ts, annotation.ts + annotation.dur
        covered = [s.track for s in members[bisect_left(starts, start):bisect_right(starts, end)]
                   if s.ts + s.dur <= end]
        if not covered:
            continue
        lane = covered[0]
        if covered.count(lane) != len(covered):  # split over lanes (unusual): the most slices win
            votes = Counter(covered)
            lane = max(votes, key=lambda key: (votes[key], -lane_position[key]))
        placed[lane].append(annotation)
    gpu.streams.update(hardware_streams(trace, annotations))
    mapped = sum(map(len, placed.values()))
    summary["annotations_mapped"] += mapped
    summary["annotations_retained"] += len(annotations) - mapped
    merged_away: set[Slice] = set()
    # Every lane's annotations' args in one sweep of the store: a sweep per lane read the
    # store's file again for each (462 MB read for a 100 MB generated pipeline rank).
    args_texts = iter(trace.args_texts([annotation for members in placed.values() for annotation in members]))
    for lane, members in placed.items():
        kept = coalesce(members, list(islice(args_texts, len(members))))
        summary["annotations_coalesced"] += len(members) - len(kept)
        merged_away.update(set(members).difference(kept))
        row = _annotation_row(trace, gpu, lane)
        for annotation in kept:
            annotation.track = row
    if merged_away:
        trace.slices[:] = [s for s in trace.slices if s not in merged_away]


def coalesce(annotations: list[Slice], args_texts: list[Optional[bytes]]) -> list[Slice]:
    """Identical annotations (name, category, args: their texts, in order) that overlap or
    touch become their union."""
    kept: list[Slice] = []
    groups: dict[tuple[str, str, Optional[bytes]], list[Slice]] = defaultdict(list)
    for annotation, args in zip(annotations, args_texts):
        groups[(annotation.name, annotation.cat, args)].append(annotation)
    for members in groups.values():
        members.sort(key=_BY_TS)
        current = members[0]
        for annotation in members[1:]:
            if annotation.ts <= current.ts + current.dur:
                current.dur = max(current.dur, annotation.ts + annotation.dur - current.ts)
            else:
                kept.append(current)
                current = annotation
        kept.append(current)
    return kept


def _annotation_row(trace: Trace, gpu: GpuLanes, lane: Track, layer: int = 1) -> Track:
    """Annotation row `layer` (from 1, upwards) above `lane`."""
    rows = gpu.annotation_rows.setdefault(lane, [])
    while len(rows) < layer:
        depth = len(rows) + 1
        rows.append(trace.add_track(Track(
            name=f"{lane.name} annotations" + (f" {depth}" if depth > 1 else ""), process=gpu.process,
            parent=gpu.container, role=TrackRole.ANNOTATIONS, home=lane, layer=depth)))
    return rows[layer - 1]


def _label_kernel_runs(trace: Trace, gpu: GpuLanes, launch_of: dict[int, int], step_starts: list[int],
                       summary: Counter[str]) -> None:
    """CUDA-graph kernels labelled with args.name: one span per run of the same label on a lane
    within one replay (the kernels one launch's arrows reach: `launch_of`, slice id -> launch
    id) and one CPU ProfilerStep (`step_starts`), so a span never joins kernels of different
    replays across the idle time between them."""
    lanes = [lane for group in gpu.lanes.values() for lane in group]
    members_of = [gpu.lane_slices[lane] for lane in lanes]
    labels_of = iter(_split(trace.args_labels([s for members in members_of for s in members], KERNEL_LABEL),
                            members_of))
    for lane, members in zip(lanes, members_of):
        labels = next(labels_of)
        summary["kernels_labelled"] += len(labels) - labels.count(None)
        run_key: Optional[tuple[str, int, int]] = None
        run_first = run_last = members[0]
        for slice_, label in zip(members, labels):
            key = None if label is None else \
                (label, launch_of.get(id(slice_), -1), bisect_right(step_starts, slice_.ts))
            if key is not None and key == run_key:
                run_last = slice_
                continue
            if run_key is not None:
                _add_label_span(trace, gpu, lane, run_key[0], run_first, run_last, summary)
            run_key, run_first, run_last = key, slice_, slice_
        if run_key is not None:
            _add_label_span(trace, gpu, lane, run_key[0], run_first, run_last, summary)


def _add_label_span(trace: Trace, gpu: GpuLanes, lane: Track, label: str, first: Slice, last: Slice,
                    summary: Counter[str]) -> None:
    trace.slices.append(Slice(first.ts, last.ts + last.dur - first.ts, label, KERNEL_LABEL_CATEGORY, None,
                              _annotation_row(trace, gpu, lane)))
    summary["label_blocks"] += 1


def _split(items: list[Optional[str]], like: list[list[Slice]]) -> Iterator[list[Optional[str]]]:
    """`items` cut into consecutive lists as long as those of `like`."""
    start = 0
    for members in like:
        yield items[start:start + len(members)]
        start += len(members)


def _layer_annotation_rows(trace: Trace, gpu: GpuLanes) -> None:
    """Annotations that partially overlap on one row move to further rows above the lane."""
    by_row: dict[Track, list[Slice]] = defaultdict(list)
    first_rows = {rows[0]: lane for lane, rows in gpu.annotation_rows.items()}
    for slice_ in trace.slices:
        if slice_.track in first_rows:
            by_row[slice_.track].append(slice_)
    for first_row, members in by_row.items():
        for depth, layer in enumerate(nested_layers(members), start=1):
            row = _annotation_row(trace, gpu, first_rows[first_row], depth)
            for annotation in layer:
                annotation.track = row
    _order_children(gpu)


def _order_children(gpu: GpuLanes) -> None:
    """Lanes in group order, each lane's annotation rows directly above it."""
    rank = 0
    for lanes in gpu.lanes.values():
        for lane in lanes:
            for row in reversed(gpu.annotation_rows.get(lane, [])):
                rank += 1
                row.order = rank
            rank += 1
            lane.order = rank


def _flow_endpoints_on_lanes(trace: Trace, per_gpu: list[GpuLanes]) -> int:
    lanes = {lane for gpu in per_gpu for group in gpu.lanes.values() for lane in group}
    return sum((flow.source.track in lanes) + (flow.target.track in lanes) for flow in trace.flows)


def _fingerprint(slices: list[Slice], excluded_categories: Container[str]) -> tuple[int, int]:
    """(count, order-free checksum) of the measured values of the slices outside
    `excluded_categories`: O(1) memory, where a multiset of every slice would double the peak.
    Args are compared by their reference (never copied). A plain loop: Python 3.11 specializes
    its attribute reads, where tuples an attrgetter builds took 40% longer."""
    count = checksum = 0
    for slice_ in slices:
        if slice_.cat not in excluded_categories:  # hashed: what compaction never changes
            checksum += hash((slice_.name, slice_.ts, slice_.dur, slice_.cat, slice_.is_instant, slice_.args))
            count += 1
    return count, checksum & 0xFFFFFFFFFFFFFFFF


def _self_check(before: tuple[int, int], after: tuple[int, int], per_gpu: list[GpuLanes]) -> None:
    """Refuse to write a plausible-looking wrong trace."""
    if before != after:
        raise CgtraceError(f"self-check failed: compaction changed the measured slices ({before[0]} before, "
                           f"{after[0]} after); nothing was written. Please report this with the input trace")
    for gpu in per_gpu:
        for lanes in gpu.lanes.values():
            for lane in lanes:
                members = sorted(gpu.lane_slices[lane], key=_BY_TS)
                for previous, current in zip(members, members[1:]):
                    if current.ts < previous.ts + previous.dur:
                        raise CgtraceError(
                            f"self-check failed: {gpu.process.display_name} lane {lane.name!r} holds overlapping "
                            f"slices at {current.ts} ns; nothing was written. Please report this with the input trace")
