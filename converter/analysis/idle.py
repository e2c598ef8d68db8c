"""Why a GPU is idle, in the report: each step's idle time cut into causes that add up to it
exactly (ns), by model/waits.py's definitions (their one home; engine/waits.py writes them as the
GPU's "Why idle" counter) applied to what the report reads back through SQL.

Idle is time in a step when no GPU slice of the GPU runs (the step less the report's busy).
The causes need each GPU slice's launch, joined by correlation id to the CPU runtime call with
the same `correlation` arg: ids are a rank's own, so a merge's ranks are kept apart by their
track roles.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Optional

import numpy as np

from ..kineto import (GPU_CATEGORIES, HOST_SYNCHRONISATIONS, KERNEL_CATEGORIES, RECEIVE_OPS, RUNTIME_CATEGORIES,
                      is_correlation)
from ..model.derived import HOST_BEHIND, HOST_SYNC, IDLE_CAUSES, OTHER, PEER, QUEUED
from ..model.intervals import Spans, union_spans
from ..model.launch_keys import NO_ID, NO_STREAM
from ..model.waits import HostSide, Work, holding, host_side, idle_parts, sorted_work
from ..tp.sql_text import sql_list

IDLE_DEFINITIONS = {
    "idle by cause": "per GPU and step: the step's idle time (no GPU slice of the GPU runs: the step less busy) "
                     "cut into queued, host sync, peer, host behind and other, which add up to it exactly (ns); "
                     "each idle moment goes to the first of them that holds; a GPU slice's launch is the CPU runtime "
                     "call of its rank with its correlation id",
    QUEUED: "launched but waiting on earlier GPU work: the GPU work that ends the idle gap was launched (its "
            "runtime call had returned); a CUDA graph replay's kernel counts as launched only once the replay's "
            "kernels that began before it have ended (the graph runs them in order, not all at once at its "
            "cudaGraphLaunch); it claims only that work waited in the GPU's queue while the GPU ran none of the "
            "trace's work, not what it waited for (an event another stream records, a copy the CPU stages, "
            "another process on the GPU)",
    HOST_SYNC: "waiting on the host: a cudaDeviceSynchronize, cudaStreamSynchronize or cudaEventSynchronize call "
               "is in progress on the CPU",
    PEER: "waiting on a peer: a receive (c10d::recv, gloo:recv, nccl:recv) is open on the CPU",
    HOST_BEHIND: "nothing launched yet: the GPU work that ends the idle gap has its launch in the trace, and that "
                 "launch had not returned",
    OTHER: "the rest: the GPU work that ends the idle gap has no launch in the trace, or no GPU work follows",
}


RankKey = tuple[Optional[int], Optional[int]]  # (PP rank, global rank) as the track roles name it; None, None: unnamed


def host_sides(rows: Callable[[str], list[tuple[Any, ...]]]) -> dict[RankKey, HostSide]:
    """Each rank's HostSide: a rank numbers its correlation ids alone, so a merge's ranks are
    kept apart by the track roles (cgtrace_slice's ranks)."""
    calls: dict[RankKey, list[tuple[int, int, int]]] = defaultdict(list)
    for pp_rank, global_rank, correlation, start, end in rows(f"""
            select pp_rank, global_rank, extract_arg(arg_set_id, 'debug.args.correlation'), ts, ts + dur
            from cgtrace_slice where category in ({sql_list(RUNTIME_CATEGORIES)}) and dur >= 0"""):
        calls[(pp_rank, global_rank)].append((correlation if is_correlation(correlation) else NO_ID, start, end))
    receives = " or ".join(f"name glob '{prefix}*'" for prefix in RECEIVE_OPS)
    spans: dict[tuple[RankKey, bool], list[tuple[int, int]]] = defaultdict(list)
    for pp_rank, global_rank, syncing, start, end in rows(f"""
            select pp_rank, global_rank, name in ({sql_list(HOST_SYNCHRONISATIONS)}), ts, ts + dur from cgtrace_slice
            where dur > 0 and ((category in ({sql_list(RUNTIME_CATEGORIES)})
                                and name in ({sql_list(HOST_SYNCHRONISATIONS)}))
                               or (({receives}) and coalesce(category, '') not in ({sql_list(GPU_CATEGORIES)})))"""):
        spans[((pp_rank, global_rank), bool(syncing))].append((start, end))
    sides: dict[RankKey, HostSide] = {}
    for rank in dict.fromkeys([*calls, *(rank for rank, _ in spans)]):  # in the order the rows came
        ids, starts, ends = _columns(calls.get(rank, []), 3)
        sides[rank] = host_side(ids, starts, ends, _union(spans.get((rank, True), [])),
                                _union(spans.get((rank, False), [])))
    return sides


def gpu_work(rows: Callable[[str], list[tuple[Any, ...]]]) -> dict[int, Work]:
    """Per GPU (owner), its slices (Work)."""
    found: dict[int, list[tuple[int, int, int, bool, int]]] = defaultdict(list)
    for owner, start, end, correlation, kernel, stream in rows(f"""
            select owner, ts, ts + dur, extract_arg(arg_set_id, 'debug.args.correlation'),
                   category in ({sql_list(KERNEL_CATEGORIES)}), extract_arg(arg_set_id, 'debug.args.stream')
            from report_gpu"""):
        found[owner].append((start, end, correlation if is_correlation(correlation) else NO_ID, bool(kernel),
                             stream if isinstance(stream, int) else NO_STREAM))
    work: dict[int, Work] = {}
    for owner, slices in found.items():
        start, end, correlation, kernel, stream = _columns(slices, 5)
        work[owner] = sorted_work(start, end, correlation, kernel, stream)
    return work


def idle_by_cause(work: Work, ready: np.ndarray, busy: Spans, steps: list[tuple[str, int, int]],
                  host: HostSide) -> list[dict[str, Any]]:
    """Per step of one GPU: its idle time and the parts (IDLE_CAUSES) that add up to it."""
    causes = holding(work, ready, busy, host)
    rows = []
    for name, start, end in steps:
        parts = idle_parts(busy, causes, start, end)
        rows.append({"step": name, "idle_ns": sum(part.length() for part in parts.values()),
                     **{part_key(cause): parts[cause].length() for cause in IDLE_CAUSES}})
    return rows


def part_key(part: str) -> str:
    """A part's key in a step's JSON figures."""
    return part.replace(" ", "_") + "_ns"


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[np.ndarray]:
    """Rows of numbers as `width` columns."""
    table = np.array(rows, np.int64).reshape(-1, width)
    return [table[:, column] for column in range(width)]


def _union(intervals: list[tuple[int, int]]) -> Spans:
    starts, ends = _columns(intervals, 2)
    return union_spans(starts, ends)
