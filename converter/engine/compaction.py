"""CUDA-graph compaction: a GPU's slices from hundreds of replay streams into a few lanes.

Each (GPU, lane group) is packed into the fewest lanes with no overlap (interval
partitioning, O(n log n)); annotations follow the slices they cover onto an annotation track
directly above that lane. Only the track column changes for measured slices: name, ts, dur,
category and args stay exactly as read, and a self-check proves it before anything is written.
"""

from __future__ import annotations

import heapq
from collections import Counter
from itertools import islice, repeat
from operator import attrgetter
from typing import Container, Iterator, Optional

import msgspec
import numpy as np

from ..errors import CgtraceError
from ..kineto import CUDA_GRAPH_LAUNCH, KERNEL_LABEL, device_name, kineto_thread_name
from ..lane_rules import LaneRules
from ..model import NO_ARGS, LaneGroup, Process, SliceTable, Trace, Track, TrackRole, derived
from ..model.nesting import nested_layers, sort_by_start
from ..model.columns import first_positions, grouped_in_order, sorted_distinct
from ..tuning import DEFAULT_TUNING, Tuning
from .lane_grouping import LaneGrouping, RuleLanes, hardware_streams
from .covering import StreamSlices, lanes_above
from .placement import tuck_bookkeeping
from .window import step_ranges

_THREAD = attrgetter("thread")
_TARGET, _SOURCE = attrgetter("target"), attrgetter("source")
_NO_ROWS = np.zeros(0, np.int64)
_CHECKSUM_ROWS = 1 << 20  # rows hashed at a time: the self-check's memory stays a few MB


class GpuLanes(msgspec.Struct):
    """The lanes built for one GPU process."""

    process: Process
    container: Track
    lanes: dict[LaneGroup, list[Track]] = msgspec.field(default_factory=dict)  # group -> lanes, in order
    annotation_rows: dict[Track, list[Track]] = msgspec.field(default_factory=dict)  # lane -> rows
    lane_slices: dict[Track, np.ndarray] = msgspec.field(default_factory=dict)  # lane -> its rows in time order
    streams: set[object] = msgspec.field(default_factory=set)  # the hardware streams (lane_grouping.hardware_streams)


def compact(trace: Trace, rules: LaneRules, grouping: Optional[LaneGrouping] = None,
            tuning: Tuning = DEFAULT_TUNING) -> dict:
    """Move GPU slices and their annotations onto lanes (grouped by the lane rules unless a
    grouping is given); returns the summary figures."""
    grouping = grouping or RuleLanes(rules)
    table = trace.slices
    # A trace cgtrace compacted before (its Chrome JSON read again) holds kernel label spans:
    # they are derived afresh here, so the earlier ones go, and neither counts as measured.
    earlier_labels = np.flatnonzero(table.in_categories({derived.KERNEL_LABEL}))
    measured_before = _fingerprint(table, rules.annotation_categories | {derived.KERNEL_LABEL})
    gpu_mask = table.in_categories(rules.gpu_categories)
    process_of_track, processes = table.track_keys(_process_of)
    stream_of_track, _ = table.track_keys(_THREAD)  # read before any slice leaves its stream
    annotations_of = dict(_by_process(table, table.in_categories(rules.annotation_categories) & ~gpu_mask,
                                      process_of_track))

    summary: Counter[str] = Counter()
    step_starts = sorted(start for start, _ in step_ranges(trace).values())
    launch_of = dict(zip(map(_TARGET, trace.flows), map(_SOURCE, trace.flows)))  # a kernel's row -> its launch's
    per_gpu = []
    merged_away = earlier_labels.tolist()  # dropped once every GPU is done: until then every row stays put
    for process, rows in _by_process(table, gpu_mask, process_of_track):
        by_stream = _by_stream(table, rows, stream_of_track)  # before packing moves the slices off their streams
        gpu = _pack_lanes(trace, processes[process], rows, grouping, summary)
        merged_away += _place_annotations(trace, gpu, by_stream, annotations_of.get(process, _NO_ROWS),
                                          stream_of_track, summary)
        _label_kernel_runs(trace, gpu, launch_of, step_starts, summary)
        _layer_annotation_rows(trace, gpu, tuning)
        per_gpu.append(gpu)

    measured_after = _fingerprint(table, rules.annotation_categories | {derived.KERNEL_LABEL})
    _self_check(table, measured_before, measured_after, per_gpu)
    flow_endpoints_on_lanes = _flow_endpoints_on_lanes(trace, per_gpu)
    if merged_away:
        kept = np.ones(len(table), np.bool_)
        kept[merged_away] = False
        trace.keep_slices(kept)
    shorten_thread_names(trace)
    tuck_bookkeeping(trace, {gpu.process for gpu in per_gpu})
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
        "gpu_flow_endpoints_mapped": flow_endpoints_on_lanes,
        "gpu_annotations_mapped": summary["annotations_mapped"],
        "gpu_annotations_coalesced": summary["annotations_coalesced"],
        "gpu_annotations_retained": summary["annotations_retained"],
        "kernel_annotations_converted": summary["kernels_labelled"],
        "kernel_annotation_blocks": summary["label_blocks"],
        "cuda_graph_launches": len(table.named(CUDA_GRAPH_LAUNCH.__eq__)),
    }


def shorten_thread_names(trace: Trace) -> None:
    """Kineto's "thread 4515 (python3.8)" becomes "python3.8", a nameless thread "thread": the
    v52 UI titles a thread "<name> <tid>", so the tid would show twice and cut the title."""
    for thread in trace.threads:
        source = thread.source_tid
        if isinstance(source, str):
            continue
        if thread.name is None:
            thread.name = "thread"
        elif (inner := kineto_thread_name(thread.name, source)) is not None:
            thread.name = inner


def _process_of(track: Track) -> Optional[Process]:
    return track.thread.process if track.thread is not None else None


def _by_process(table: SliceTable, chosen: np.ndarray, process_of_track: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """The `chosen` rows (a mask) on a thread's track, per process (`process_of_track` of their
    track), processes in the order their first row comes, each one's rows in order."""
    rows = np.flatnonzero(chosen)
    process_of = process_of_track[table.track[rows]]
    on_thread = process_of >= 0
    rows = rows[on_thread]
    return [(process, rows[at]) for process, at in grouped_in_order(process_of[on_thread])]


def _pack_lanes(trace: Trace, process: Process, rows: np.ndarray, grouping: LaneGrouping,
                summary: Counter[str]) -> GpuLanes:
    # A root-level row named after the GPU, not a track inside its process: Perfetto v52 draws
    # a collapsed process (and its minimap) from its threads' slices only, and lanes written as
    # threads would be titled "Compute (0)" and sorted by name. Collapsed, this row shows the
    # GPU's work through its busy-lanes counter (activity.py).
    if process.name is None and not process.labels:  # Kineto writes a GPU's work under its device index as pid
        process.labels = [device_name(process.source_pid)]  # so users read "GPU 0", as the report says, not "Process 0"
    container = trace.add_track(Track(name=process.short_name, orders_children=True, role=TrackRole.LANES))
    gpu = GpuLanes(process=process, container=container, streams=hardware_streams(trace, rows))
    for lane_group, members in grouping.split(trace.slices, rows):
        summary[f"group:{lane_group.label}"] += len(members)
        lanes = gpu.lanes[lane_group] = []
        for lane_index, lane_members in enumerate(partition_intervals(trace.slices, members)):
            lane = trace.add_track(Track(name=_lane_name(lane_group.label, lane_index),
                                         process=process, parent=container, role=TrackRole.LANE,
                                         group=lane_group, layer=lane_index + 1))
            lanes.append(lane)
            trace.slices.move(lane_members, lane)
            gpu.lane_slices[lane] = lane_members
    return gpu


def _lane_name(label: str, index: int) -> str:
    """"Compute", "Compute 2", ...; "stream 7", "stream 7 (2)" where the label ends in a number."""
    if index == 0:
        return label
    return f"{label} ({index + 1})" if label[-1:].isdigit() else f"{label} {index + 1}"


def partition_intervals(table: SliceTable, rows: np.ndarray) -> list[np.ndarray]:
    """Fewest lanes with no overlap (touching is fine): each slice takes the lowest free lane;
    each lane's rows in start order.

    The number of lanes equals the largest number of slices running at once, the optimum.
    """
    if not len(rows):
        return []
    ordered = sort_by_start(table, rows, longest_first=False)  # by (ts, dur), then as given
    starts, ends = table.spans(ordered)
    # A slice that starts once every slice before it has ended, and ends before the next one
    # starts, finds every lane free and takes lane 0, whatever the loop below has done: only
    # the slices of runs that overlap need it (a GPU's slices mostly follow each other).
    clear = np.concatenate(([True], starts[1:] >= np.maximum.accumulate(ends)[:-1], [True]))
    alone = clear[:-1] & clear[1:]
    lanes = np.zeros(len(ordered), np.int64)
    overlapping = np.flatnonzero(~alone)
    lanes[overlapping] = _lowest_free_lanes(starts[overlapping].tolist(), ends[overlapping].tolist())
    by_lane = ordered[np.argsort(lanes, kind="stable")]
    return np.split(by_lane, np.cumsum(np.bincount(lanes))[:-1])


def _lowest_free_lanes(starts: list[int], ends: list[int]) -> list[int]:
    """Each slice (in start order) in the lowest lane free at its start."""
    lane_of: list[int] = []
    lane_count = 0
    busy: list[tuple[int, int]] = []   # (end, lane) of lanes still running a slice
    free: list[int] = []               # lanes idle now, lowest first
    for start, end in zip(starts, ends):
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane = lane_count
            lane_count += 1
        lane_of.append(lane)
        heapq.heappush(busy, (end, lane))
    return lane_of


def _by_stream(table: SliceTable, gpu_rows: np.ndarray, stream_of_track: np.ndarray) -> StreamSlices:
    """GPU slices per original stream (`stream_of_track` of their track), in start order. One
    sort for all streams: a CUDA-graph rank has thousands."""
    streams = stream_of_track[table.track[gpu_rows]]
    order = np.lexsort((table.ts[gpu_rows], streams))  # stable: equal starts stay in row order
    rows = gpu_rows[order]
    return StreamSlices(streams[order], *table.spans(rows), rows=rows)


def _place_annotations(trace: Trace, gpu: GpuLanes, by_stream: StreamSlices,
                       annotations: np.ndarray, stream_of_track: np.ndarray, summary: Counter[str]) -> list[int]:
    """Each annotation goes above the lane holding most of the slices it covers on its stream
    (on a tie, the lane listed first). Identical ones on one lane are coalesced: returns the
    rows merged into others, to drop."""
    table = trace.slices
    tracks = table.track
    lanes_in_order = [lane for lanes in gpu.lanes.values() for lane in lanes]
    lane_rank = {table.track_id(lane): position for position, lane in enumerate(lanes_in_order)}
    assert by_stream.rows is not None
    lanes = lanes_above(by_stream, tracks[by_stream.rows], lane_rank, stream_of_track[tracks[annotations]],
                        *table.spans(annotations))
    placed = [(lane, annotations[members].tolist()) for lane, members in grouped_in_order(lanes) if lane >= 0]
    gpu.streams.update(hardware_streams(trace, annotations))
    mapped = sum(len(members) for _, members in placed)
    summary["annotations_mapped"] += mapped
    summary["annotations_retained"] += len(annotations) - mapped
    merged_away: list[int] = []
    # Every lane's annotations' args in one sweep of the store: a sweep per lane would read
    # the store's file again for each lane, many times the trace's args on a pipeline rank.
    args_texts = iter(trace.args_texts(np.array([row for _, members in placed for row in members], np.int64)))
    for lane, members in placed:
        kept = coalesce(table, members, list(islice(args_texts, len(members))))
        summary["annotations_coalesced"] += len(members) - len(kept)
        merged_away += set(members).difference(kept)
        table.move(kept, _annotation_row(trace, gpu, table.tracks[lane]))
    return merged_away


def coalesce(table: SliceTable, annotations: list[int], args_texts: list[Optional[bytes]]) -> list[int]:
    """Identical annotations (name, category, args: their texts, in order) that overlap or
    touch become their union: the first one's duration grows to it; returns the rows kept
    (by identity, in the order each first comes, and within one by start). Found on columns:
    a pipeline rank's lane has tens of thousands of annotations."""
    if not annotations:
        return []
    picked = np.array(annotations, np.int64)
    identity = first_positions(zip(table.name[picked].tolist(), table.cat[picked].tolist(), args_texts),
                               len(picked))[0]
    order = np.lexsort((table.ts[picked], identity))  # stable: equal starts stay in the order given
    picked, identity = picked[order], identity[order]
    starts, ends = table.spans(picked)
    # Ranks of the times, lifted by identity, so one running maximum never carries an end from
    # one identity into the next: each one's union so far ends at its running maximum.
    times = sorted_distinct(np.concatenate((starts, ends)))
    lift = np.searchsorted(sorted_distinct(identity), identity) * len(times)
    reach = np.maximum.accumulate(np.searchsorted(times, ends) + lift)
    begins = np.ones(len(picked), bool)
    begins[1:] = (identity[1:] != identity[:-1]) | (np.searchsorted(times, starts[1:]) + lift[1:] > reach[:-1])
    firsts = np.flatnonzero(begins)
    union_ends = np.maximum.reduceat(ends, firsts)
    for first in np.flatnonzero(union_ends != ends[firsts]).tolist():
        table.set_duration(int(picked[firsts[first]]), int(union_ends[first] - starts[firsts[first]]))
    return picked[firsts].tolist()


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
    within one replay (the kernels one launch's arrows reach: `launch_of`, row -> launch's
    row) and one CPU ProfilerStep (`step_starts`), so a span never joins kernels of different
    replays across the idle time between them. Runs are found on columns: a lane holds
    hundreds of thousands of kernels."""
    lanes = [lane for group in gpu.lanes.values() for lane in group]
    members_of = [gpu.lane_slices[lane] for lane in lanes]
    labels_of = iter(_split(trace.args_labels(np.concatenate(members_of), KERNEL_LABEL), members_of))
    steps_begin = np.array(step_starts, np.int64)
    for lane, members in zip(lanes, members_of):
        labels = next(labels_of)
        starts, ends = trace.slices.spans(members)
        codes, first_at = first_positions(labels, len(labels))
        labelled = codes != first_at.get(None, -1)
        summary["kernels_labelled"] += int(np.count_nonzero(labelled))
        launches = np.fromiter(map(launch_of.get, members.tolist(), repeat(-1)), np.int64, len(members))
        steps = np.searchsorted(steps_begin, starts, "right")
        goes_on = labelled[1:] & labelled[:-1] & (codes[1:] == codes[:-1]) & (launches[1:] == launches[:-1]) & \
            (steps[1:] == steps[:-1])  # a kernel that continues the run of the one before it
        begins = np.flatnonzero(labelled & np.concatenate(([True], ~goes_on)))
        # A run lasts until the next kernel that begins a run or has no label.
        breaks = np.flatnonzero(~labelled | np.concatenate(([True], ~goes_on)))
        lasts = np.append(breaks, len(members))[np.searchsorted(breaks, begins, "right")] - 1
        if not len(begins):
            continue
        count = len(begins)
        trace.slices.extend(starts[begins], ends[lasts] - starts[begins], [labels[at] for at in begins.tolist()],
                            [derived.KERNEL_LABEL] * count, np.full(count, NO_ARGS, np.int64),
                            [_annotation_row(trace, gpu, lane)] * count)
        summary["label_blocks"] += count


def _split(items: list[Optional[str]], like: list[np.ndarray]) -> Iterator[list[Optional[str]]]:
    """`items` cut into consecutive lists as long as those of `like`."""
    start = 0
    for members in like:
        yield items[start:start + len(members)]
        start += len(members)


def _layer_annotation_rows(trace: Trace, gpu: GpuLanes, tuning: Tuning) -> None:
    """Annotations that partially overlap on one row move to further rows above the lane."""
    table = trace.slices
    first_rows = {rows[0]: lane for lane, rows in gpu.annotation_rows.items()}
    tracks = table.track
    on_first_rows = np.flatnonzero(table.track_mask(first_rows.__contains__)[tracks])
    copies = set()
    for first_row, at in grouped_in_order(tracks[on_first_rows]):  # rows in the order their slices first come
        lane = first_rows[table.tracks[first_row]]
        if _copies(table, gpu.lane_slices[lane], on_first_rows[at]):
            copies.add(lane)
        for depth, layer in enumerate(nested_layers(table, on_first_rows[at], tuning), start=1):
            table.move(layer, _annotation_row(trace, gpu, lane, depth))
    _order_children(gpu, copies)


def _copies(table: SliceTable, lane_rows: np.ndarray, annotations: np.ndarray) -> bool:
    """Whether each annotation brackets exactly one of the lane's slices, which fills at least
    half of it, and touches no other (Kineto's per-kernel ranges, a nanosecond wider): the row
    would copy the lane's shape."""
    starts, ends = table.spans(lane_rows)  # a lane's slices never overlap: both ascending
    first, last = table.spans(annotations)
    inside = np.searchsorted(ends, last, "right") - np.searchsorted(starts, first, "left")
    touched = np.searchsorted(starts, last, "left") - np.searchsorted(ends, first, "right")
    if not np.all((inside == 1) & (touched == 1)):
        return False
    bracketed = np.searchsorted(starts, first, "left")
    return bool(np.all(2 * (ends[bracketed] - starts[bracketed]) >= last - first))


def _order_children(gpu: GpuLanes, copies: set[Track]) -> None:
    """Lanes in group order, each lane's annotation rows directly above it, numbered top-down
    ("Compute annotations", "Compute annotations 2", "Compute") so the eye reads them in order.
    Opening a GPU shows a row per lane group and the annotation rows that add something; a
    click on a lane shows what is folded under it: its group's further lanes (there only
    where its slices overlap) and annotation rows that copy a lane (`copies`)."""
    rank = 0
    for lanes in gpu.lanes.values():
        for lane in lanes:
            shown_under = None if lane is lanes[0] else lanes[0]
            for row in gpu.annotation_rows.get(lane, []):
                rank += 1
                row.order, row.folded_under = rank, lane if lane in copies else shown_under
            rank += 1
            lane.order, lane.folded_under = rank, shown_under
        lanes[0].orders_children = len(lanes) > 1 or lanes[0] in copies
        for lane in lanes[1:]:
            lane.orders_children = lane in copies


def _flow_endpoints_on_lanes(trace: Trace, per_gpu: list[GpuLanes]) -> int:
    table = trace.slices
    lanes = {lane for gpu in per_gpu for group in gpu.lanes.values() for lane in group}
    on_lane = table.track_mask(lanes.__contains__)[table.track]
    return sum(int(np.count_nonzero(on_lane[ends])) for ends in trace.flow_rows())


def _fingerprint(table: SliceTable, excluded_categories: Container[str]) -> tuple[int, int]:
    """(count, order-free checksum) of the measured values of the rows outside
    `excluded_categories`: each row's values hashed into 64 bits and summed, a block of rows
    at a time, where a copy of the columns would double the peak. Names and categories are
    compared by text id (a stage only adds texts, so an id keeps its text), args by reference."""
    counted = ~table.in_categories(excluded_categories)
    columns = (table.ts, table.dur, table.name, table.cat, table.args, table.instant)
    checksum = 0
    for first in range(0, len(table), _CHECKSUM_ROWS):
        block = slice(first, first + _CHECKSUM_ROWS)
        chosen = counted[block]
        digest = np.zeros(np.count_nonzero(chosen), np.uint64)
        for column in columns:
            digest = _mix(digest ^ column[block][chosen].astype(np.uint64))
        checksum += int(digest.sum(dtype=np.uint64))
    return int(np.count_nonzero(counted)), checksum & 0xFFFFFFFFFFFFFFFF


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every bit of a value moves about half the bits of its hash."""
    values = (values ^ (values >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    values = (values ^ (values >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def _self_check(table: SliceTable, before: tuple[int, int], after: tuple[int, int], per_gpu: list[GpuLanes]) -> None:
    """Refuse to write a plausible-looking wrong trace."""
    if before != after:
        raise CgtraceError(f"self-check failed: compaction changed the measured slices ({before[0]} before, "
                           f"{after[0]} after); nothing was written. Please report this with the input trace")
    starts, ends = table.ts, table.end
    for gpu in per_gpu:
        for lanes in gpu.lanes.values():
            for lane in lanes:
                members = gpu.lane_slices[lane]
                members = members[np.argsort(starts[members], kind="stable")]
                overlapping = np.flatnonzero(starts[members[1:]] < ends[members[:-1]])
                if len(overlapping):
                    raise CgtraceError(
                        f"self-check failed: {gpu.process.display_name} lane {lane.name!r} holds overlapping "
                        f"slices at {starts[members[overlapping[0] + 1]]} ns; nothing was written. Please report "
                        "this with the input trace")
