"""Where a merge puts each rank's rows: under one pipeline root, in PP order, titled after the rank.

Perfetto v52 orders process groups by slice count and ignores a thread row's parent, so the
one ordering it honours above processes is a parent track with ordered children: every rank's
GPU lane containers and processes hang under such a root, and each rank's profiler bookkeeping
inside its CPU row. Nothing of a rank is written as an OS process, so no title
shows a pid or tid the merge would have to invent to keep ranks apart.
"""

from __future__ import annotations

from typing import Container

from ..model import CounterSample, Process, RankIdentity, Trace, Track, TrackRole
from .activity import ROOT_SCALE, add_cpu_work

PIPELINE_ROOT_NAME = "Pipeline (PP rank order)"
RANKS_ROOT_NAME = "Ranks (global rank order)"  # the root where no PP group orders the ranks
# Short, as the UI cuts longer titles.
BOOKKEEPING_ROOT_NAME = "Spans and markers (profiler)"
_ROOT_UUID = 1 << 62
# Sibling ranks under the root given to each rank: its GPU lane containers, then its processes.
_ROWS_PER_RANK = 64
_LAST = 1 << 30  # the bookkeeping's rank among its siblings: after them all
# The root as a parent, by its uuid (the root trace names it).
_ROOT_PLACE = Track(name="", orders_children=True, uuid=_ROOT_UUID)


def root_name(in_pp_group: bool) -> str:
    """The pipeline root's title: PP order where a PP group orders the ranks, else global rank order."""
    return PIPELINE_ROOT_NAME if in_pp_group else RANKS_ROOT_NAME


def place_rank(trace: Trace, position: int, rank: RankIdentity) -> None:
    """Hang the rank's rows, at `position` in the pipeline, under the pipeline root: first its GPU
    lanes, then each process as a group of rows titled after the rank (its threads' rows keep
    their input names and tids), the first that holds a slice a counter of the rank's CPU work.
    The profiler's bookkeeping (global instants, the profiler's span) goes last inside the
    rank's first CPU row: on its own it would be a row that draws nothing on the first screen."""
    trace.rank = rank
    first_row = position * _ROWS_PER_RANK + 1
    bookkeeping = [process for process in trace.processes if process.row_group]
    trace.tracks = [track for track in trace.tracks if not _tucked(track)]  # compaction's, placed anew below
    rows = [process for process in trace.processes if not process.row_group]
    for index, process in enumerate(rows):
        process.name, process.labels = f"{rank.title} · {process.short_name}", []
        process.row_group, process.parent = True, _ROOT_PLACE
        process.sort_index = first_row + _ROWS_PER_RANK // 2 + index
        for thread in trace.threads:
            if thread.process is process:  # its tid in its name, so its overlap rows' titles hold it too
                thread.name = thread.row_title
    add_cpu_work(trace, rows)
    home = next((process.activity for process in rows if process.activity is not None), _ROOT_PLACE)
    for track in trace.tracks:
        if track.role is TrackRole.GLOBAL:
            track.parent, track.order = home, _LAST
    for process in bookkeeping:
        process.name = f"{rank.title} · {process.short_name}" if home is _ROOT_PLACE else process.short_name
        process.parent, process.sort_index = home, _LAST
    containers = [t for t in trace.tracks if t.role is TrackRole.LANES]
    for rank_in_part, container in enumerate(containers):
        container.name = f"{rank.title} · {container.name}"
        container.parent = _ROOT_PLACE
        container.order = first_row + rank_in_part


def tuck_bookkeeping(trace: Trace, gpus: Container[Process]) -> None:
    """Compacted alone, the profiler's bookkeeping (global instants, Kineto's "Spans" rows) goes
    into a row inside the first CPU process: at the top level each is a row that draws nothing
    on the first screen."""
    bookkeeping = [process for process in trace.processes if process.row_group]
    cpu = next((thread.process for thread in trace.threads
                if not thread.process.row_group and thread.process not in gpus), None)
    globals_ = [track for track in trace.tracks if track.role is TrackRole.GLOBAL]
    if cpu is None or not (bookkeeping or globals_):
        return
    tucked = trace.add_track(Track(name=BOOKKEEPING_ROOT_NAME, process=cpu, order=_LAST))
    for track in globals_:
        track.parent = tucked
    for process in bookkeeping:
        process.parent = tucked


def _tucked(track: Track) -> bool:
    return track.name == BOOKKEEPING_ROOT_NAME and track.process is not None


def root_trace(name: str, busy_gpus: list[tuple[int, int]], gpus: int) -> Trace:
    """The root as a trace of its own: a counter of the percentage of the pipeline's `gpus` GPUs
    computing (of its ranks computing, CPU-only; 100 is all, whatever the pipeline's size), so the
    first screen, every group collapsed, shows the pipeline's work and its bubbles."""
    root = Track(name=name, orders_children=True, uuid=_ROOT_UUID, is_counter=bool(busy_gpus), scale=ROOT_SCALE)
    return Trace(tracks=[root],
                 counters=[CounterSample(ts, 100 * busy / gpus, root) for ts, busy in busy_gpus])
