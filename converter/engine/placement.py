"""Where a merge puts each rank's rows: under one pipeline root, in PP order, titled after the rank.

Perfetto v52 orders process groups by slice count and ignores a thread row's parent, so the
one ordering it honours above processes is a parent track with ordered children: every rank's
GPU lane containers and processes hang under such a root, and the profiler's bookkeeping rows
of every rank under a second one. Nothing of a rank is written as an OS process, so no title
shows a pid or tid the merge would have to invent to keep ranks apart.
"""

from __future__ import annotations

from ..model import CounterSample, RankIdentity, Trace, Track, TrackRole

PIPELINE_ROOT_NAME = "Pipeline (PP rank order)"
RANKS_ROOT_NAME = "Ranks (global rank order)"  # the root where no PP group orders the ranks
# v52 orders top-level tracks by name: this one must sort after both ranks' roots; short, as the
# UI cuts longer titles.
BOOKKEEPING_ROOT_NAME = "Spans and markers (profiler)"
_ROOT_UUID = 1 << 62
_GLOBAL_INSTANTS_UUID = _ROOT_UUID + 1  # every rank's global instants on one shared row
_BOOKKEEPING_UUID = _ROOT_UUID + 2      # where the profiler's bookkeeping rows of every rank hang
# Sibling ranks under the root given to each rank: its GPU lane containers, then its processes.
_ROWS_PER_RANK = 64
# The two roots as parents, by their uuids (the root trace names them).
_ROOT_PLACE = Track(name="", orders_children=True, uuid=_ROOT_UUID)
_BOOKKEEPING_PLACE = Track(name="", orders_children=True, uuid=_BOOKKEEPING_UUID)


def root_name(in_pp_group: bool) -> str:
    """The pipeline root's title: PP order where a PP group orders the ranks, else global rank order."""
    return PIPELINE_ROOT_NAME if in_pp_group else RANKS_ROOT_NAME


def place_rank(trace: Trace, position: int, rank: RankIdentity, in_pp_group: bool) -> None:
    """Hang the rank's rows, at `position` in the pipeline, under the pipeline root: first its GPU
    lanes, then each process as a group of rows titled after the rank (its threads' rows keep
    their input names and tids); its global instants go on the row all ranks share and its
    profiler span under the bookkeeping root."""
    trace.rank = rank
    prefix = f"{'PP rank' if in_pp_group else 'rank'} {rank.pp_rank} (global {rank.global_rank})"
    first_row = position * _ROWS_PER_RANK + 1
    for track in trace.tracks:
        if track.role is TrackRole.GLOBAL:
            track.uuid, track.parent = _GLOBAL_INSTANTS_UUID, _BOOKKEEPING_PLACE
    for index, process in enumerate(trace.processes):
        process.name = f"{prefix} · {process.short_name}"
        process.labels = []
        if process.row_group:
            process.parent, process.sort_index = _BOOKKEEPING_PLACE, position + 1
            continue
        process.row_group, process.parent = True, _ROOT_PLACE
        process.sort_index = first_row + _ROWS_PER_RANK // 2 + index
    containers = [t for t in trace.tracks if t.role is TrackRole.LANES]
    for rank_in_part, container in enumerate(containers):
        container.name = f"{prefix} · {container.name}"
        container.parent = _ROOT_PLACE
        container.order = first_row + rank_in_part


def root_trace(name: str, busy_gpus: list[tuple[int, int]]) -> Trace:
    """The two roots as a trace of their own; the pipeline's is a counter of its busy GPUs, so the
    first screen, every group collapsed, shows the pipeline's work and its bubbles."""
    root = Track(name=name, orders_children=True, uuid=_ROOT_UUID, is_counter=bool(busy_gpus))
    return Trace(tracks=[root, Track(name=BOOKKEEPING_ROOT_NAME, orders_children=True, uuid=_BOOKKEEPING_UUID)],
                 counters=[CounterSample(ts, busy, root) for ts, busy in busy_gpus])
