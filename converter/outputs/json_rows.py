"""Output rows of the Chrome JSON writer: which thread (pid, tid, name) each track's slices
go on, and in what order.

Every track with slices becomes one thread (tid) of its process: a thread track keeps its
thread's tid and name, other tracks (lanes, annotation rows, overlap, process-scoped, async
tracks) get fresh int32 tids named after the track, and tracks of no process go in one synthetic
process. `thread_sort_index` orders a process's rows: its real threads first, then the other
tracks by their parent chain's `order`s (lanes and annotation rows as compaction ranked them), an
overlap track right after its home. v52 ignores sort indices (newer versions and other JSON
tools use them). trace_processor drops a complete event that partially overlaps another on its
thread, so a track whose slices do not nest gets extra "(overlap N)" tids instead.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..model import Process, Trace, Track, TrackRole
from ..model.columns import grouped_in_order
from ..model.ids import IdSpace
from ..model.nesting import nested_layers
from ..tuning import Tuning

_FRESH_ID_START = 1 << 24


class Row:
    """One output thread: a track, or one layer of a track whose slices do not nest."""

    __slots__ = ("track", "layer", "name", "pid", "tid", "slices", "key", "companion")

    def __init__(self, track: Track, layer: int, name: str, pid: int, slices: np.ndarray):
        self.track, self.layer, self.name, self.pid = track, layer, name, pid
        self.tid = 0
        self.companion = 0   # > 0: a row of flow ends moved off the row of (track, layer)
        self.slices = slices  # rows of the trace's SliceTable, in the order written
        self.key: tuple = ()


def layout_rows(trace: Trace, ids: OutputIds, tuning: Tuning):
    """Rows (one per track with slices, more where slices do not nest) with pids, tids and
    display keys; every process that gets a row or a counter gets its pid."""
    by_track = _rows_by_track(trace)
    position = {track: index for index, track in enumerate(trace.tracks)}
    for track in by_track:  # a track missing from trace.tracks still gets its row
        position.setdefault(track, len(position))

    processes: list[Optional[Process]] = list(trace.processes)
    known = {id(p) for p in processes}
    for track in [*by_track, *(sample.track for sample in trace.counters)]:
        process = process_of(track)
        if id(process) not in known:   # None (the synthetic process) included
            known.add(id(process))
            processes.append(process)
    pids = {id(p): ids.pid(p.pid) for p in processes if p is not None}
    if None in processes:
        pids[id(None)] = ids.pid(None)

    threads_placed: set[int] = set()
    rows: list[Row] = []
    for track in sorted(by_track, key=position.__getitem__):
        pid = pids[id(process_of(track))]
        name = _row_name(track)
        for layer, slices in enumerate(nested_layers(trace.slices, by_track[track], tuning)):
            row = Row(track, layer, name if layer == 0 else f"{name} (overlap {layer})", pid, slices)
            thread = track.thread
            if layer == 0 and thread is not None and id(thread) not in threads_placed:
                threads_placed.add(id(thread))
                row.tid = ids.tid(thread.tid)
            else:
                row.tid = ids.tid(None)
            rows.append(row)
    return rows, processes, pids, position


def process_of(track: Track) -> Optional[Process]:
    node: Optional[Track] = track
    while node is not None:
        if node.thread is not None:
            return node.thread.process
        if node.process is not None:
            return node.process
        node = node.parent
    return None


def _row_name(track: Track) -> str:
    return track.thread.display_name if track.thread is not None else track.name


def _rows_by_track(trace: Trace) -> dict[Track, np.ndarray]:
    """Each track's slices (rows, in row order), the tracks in the order of their first slice."""
    table = trace.slices
    return {table.tracks[track_id]: rows for track_id, rows in grouped_in_order(table.track)}

def sort_keys(rows: list[Row], position: dict[Track, int]) -> None:
    """Display order within a process: real threads (by sort_index, then model order), then
    other tracks by their parent chain's orders; overlap tracks (layout's, by name, and this
    writer's) and rows of isolated flow ends right after their home."""
    def base_key(track: Track) -> tuple:
        thread = track.thread
        if thread is not None:
            return (0, (thread.sort_index is None, thread.sort_index or 0), position.get(track, 0))
        chain = []
        node: Optional[Track] = track
        while node is not None:
            chain.append(node.order)
            node = node.parent
        return (1, tuple(reversed(chain)), position.get(track, 0))

    for row in rows:
        track = row.track
        home = track.home if track.role is TrackRole.OVERLAP else None
        if home is not None:
            row.key = base_key(home) + (track.layer, row.layer, row.companion, position.get(track, 0))
        else:
            row.key = base_key(track) + (0, row.layer, row.companion, 0)


class OutputIds:
    """pids and tids for the output: a model id is kept where valid (an int32; 0 only for a
    pid, as Kineto's GPU 0 has) and not yet taken, a fresh one is used otherwise;
    fresh ids never equal a pid or tid of the model."""

    def __init__(self, trace: Trace):
        avoid = {p.pid for p in trace.processes} | {t.tid for t in trace.threads}
        pids, tids = IdSpace(_FRESH_ID_START, avoid), IdSpace(_FRESH_ID_START, avoid)
        self.pid = lambda preferred: pids.claim(preferred, zero=True)
        self.tid = tids.claim
