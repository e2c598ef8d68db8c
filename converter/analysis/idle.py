"""Why a GPU is idle: each step's idle time cut into causes that add up to it exactly (ns).

Idle is time in a step when no GPU slice of the GPU runs (the step less the report's busy).
Each idle moment goes to the first cause, in IDLE_PARTS' order, that holds then. The causes
need each GPU slice's launch, joined by correlation id to the CPU runtime call with the same
`correlation` arg: ids are a rank's own, so a merge's ranks are kept apart by their track roles.

A CUDA graph is graph-aware here: its replay's kernels all carry their cudaGraphLaunch's id,
yet the graph runs them in order, so a kernel counts as launched once the launch returned and
the replay's kernels that started before it ended, not all at once at the launch.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, NamedTuple, Optional

from ..kineto import GPU_CATEGORIES, HOST_SYNCHRONISATIONS, KERNEL_CATEGORIES, RECEIVE_OPS, RUNTIME_CATEGORIES
from .intervals import Intervals, clip, intersect, subtract, union
from ..tp.sql_text import sql_list

QUEUED, HOST_SYNC, PEER, HOST_BEHIND, OTHER = "queued", "host sync", "peer", "host behind", "other"
IDLE_PARTS = (QUEUED, HOST_SYNC, PEER, HOST_BEHIND, OTHER)
IDLE_DEFINITIONS = {
    "idle by cause": "per GPU and step: the step's idle time (no GPU slice of the GPU runs: the step less busy) "
                     "cut into queued, host sync, peer, host behind and other, which add up to it exactly (ns); "
                     "each idle moment goes to the first of them that holds; a GPU slice's launch is the CPU runtime "
                     "call of its rank with its correlation id",
    QUEUED: "launched but waiting on earlier GPU work: the GPU work that ends the idle gap was launched (its "
            "runtime call had returned); a CUDA graph replay's kernel counts as launched only once the replay's "
            "kernels that began before it have ended (the graph runs them in order, not all at once at its "
            "cudaGraphLaunch)",
    HOST_SYNC: "waiting on the host: a cudaDeviceSynchronize, cudaStreamSynchronize or cudaEventSynchronize call "
               "is in progress on the CPU",
    PEER: "waiting on a peer: a receive (c10d::recv, gloo:recv, nccl:recv) is open on the CPU",
    HOST_BEHIND: "nothing launched yet: the GPU work that ends the idle gap has its launch in the trace, and that "
                 "launch had not returned",
    OTHER: "the rest: the GPU work that ends the idle gap has no launch in the trace, or no GPU work follows",
}


class Work(NamedTuple):
    """A GPU slice as the causes and launch figures need it."""

    start: int
    end: int
    correlation: Optional[int]
    kernel: bool
    stream: Optional[int]  # args.stream, where the slice names one


RankKey = tuple[Optional[int], Optional[int]]  # (PP rank, global rank) as the track roles name it; None, None: unnamed


class HostSide:
    """What one rank's CPU did, as the causes need it: each correlation id's runtime call, and
    the time synchronisations and receives were open."""

    def __init__(self) -> None:
        self.launch: dict[int, tuple[int, int]] = {}  # correlation id -> its runtime call's (start, end)
        self.syncs: Intervals = []
        self.receives: Intervals = []


def host_sides(rows: Callable[[str], list[tuple[Any, ...]]]) -> dict[RankKey, HostSide]:
    """Each rank's HostSide: a rank numbers its correlation ids alone, so a merge's ranks are
    kept apart by the track roles (cgtrace_slice's ranks)."""
    sides: dict[RankKey, HostSide] = defaultdict(HostSide)
    for pp_rank, global_rank, correlation, start, end in rows(f"""
            select pp_rank, global_rank, extract_arg(arg_set_id, 'debug.args.correlation'), ts, ts + dur
            from cgtrace_slice where category in ({sql_list(RUNTIME_CATEGORIES)}) and dur >= 0"""):
        if isinstance(correlation, int):
            sides[(pp_rank, global_rank)].launch.setdefault(correlation, (start, end))
    receives = " or ".join(f"name glob '{prefix}*'" for prefix in RECEIVE_OPS)
    spans: dict[tuple[RankKey, bool], Intervals] = defaultdict(list)
    for pp_rank, global_rank, syncing, start, end in rows(f"""
            select pp_rank, global_rank, name in ({sql_list(HOST_SYNCHRONISATIONS)}), ts, ts + dur from cgtrace_slice
            where dur > 0 and ((category in ({sql_list(RUNTIME_CATEGORIES)})
                                and name in ({sql_list(HOST_SYNCHRONISATIONS)}))
                               or (({receives}) and coalesce(category, '') not in ({sql_list(GPU_CATEGORIES)})))"""):
        spans[((pp_rank, global_rank), bool(syncing))].append((start, end))
    for (rank, syncing), found in spans.items():
        if syncing:
            sides[rank].syncs = union(found)
        else:
            sides[rank].receives = union(found)
    return sides


def gpu_work(rows: Callable[[str], list[tuple[Any, ...]]]) -> dict[int, list[Work]]:
    """Per GPU (owner), its slices (Work), by start."""
    found: dict[int, list[Work]] = defaultdict(list)
    for owner, start, end, correlation, kernel, stream in rows(f"""
            select owner, ts, ts + dur, extract_arg(arg_set_id, 'debug.args.correlation'),
                   category in ({sql_list(KERNEL_CATEGORIES)}), extract_arg(arg_set_id, 'debug.args.stream')
            from report_gpu order by owner, ts, ts + dur"""):
        found[owner].append(Work(start, end, correlation if isinstance(correlation, int) else None, bool(kernel),
                                 stream if isinstance(stream, int) else None))
    return found


def idle_by_cause(work: list[Work], ready: list[Optional[int]], busy: Intervals, steps: list[tuple[str, int, int]],
                  host: HostSide) -> list[dict[str, Any]]:
    """Per step of one GPU: its idle time and the parts (IDLE_PARTS) that add up to it."""
    queued, behind = _waiting(work, ready, busy)
    rows = []
    for name, start, end in steps:
        left = subtract([(start, end)], busy)
        figures: dict[str, Any] = {"step": name, "idle_ns": _length(left)}
        for part, holds in ((QUEUED, queued), (HOST_SYNC, host.syncs), (PEER, host.receives), (HOST_BEHIND, behind)):
            taken = intersect(left, clip(holds, start, end))
            figures[part_key(part)] = _length(taken)
            left = subtract(left, taken)
        figures[part_key(OTHER)] = _length(left)
        rows.append(figures)
    return rows


def ready_times(work: list[Work], launch: dict[int, tuple[int, int]]) -> list[Optional[int]]:
    """Per slice of `work` (by start), when it was launched, graph-aware (None: no launch in the
    trace): its runtime call's end, and for a CUDA graph replay's kernel no earlier than the end
    of the replay's kernels begun before it."""
    replay_end: dict[int, int] = {}  # per correlation id: the latest end of its slices begun so far
    found: list[Optional[int]] = []
    for start, end, correlation, *_ in work:
        if correlation is None or correlation not in launch:
            found.append(None)
            continue
        returned = launch[correlation][1]
        found.append(max(returned, replay_end.get(correlation, returned)))
        replay_end[correlation] = max(replay_end.get(correlation, end), end)
    return found


def _waiting(work: list[Work], ready: list[Optional[int]], busy: Intervals) -> tuple[Intervals, Intervals]:
    """Each idle gap by the work that ends it: (queued: from that work's launch to the gap's end;
    host behind: the gap before that launch returned). A gap whose next work has no launch in
    the trace, and the time after the last work, are in neither."""
    ready_at: dict[int, int] = {}  # per start: the earliest any slice begun then was launched
    for slice_, launched in zip(work, ready):
        if launched is not None:
            ready_at[slice_.start] = min(ready_at.get(slice_.start, launched), launched)
    queued: Intervals = []
    behind: Intervals = []
    for gap_start, gap_end in subtract([(-(1 << 62), busy[-1][1])], busy) if busy else []:
        first = ready_at.get(gap_end)
        if first is None:
            continue
        if first < gap_end:
            queued.append((max(gap_start, first), gap_end))
        if gap_start < first:
            behind.append((gap_start, min(first, gap_end)))
    return queued, behind


def part_key(part: str) -> str:
    """A part's key in a step's JSON figures."""
    return part.replace(" ", "_") + "_ns"


def _length(intervals: Intervals) -> int:
    return sum(end - start for start, end in intervals)
