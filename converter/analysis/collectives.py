"""Collectives across ranks: for every collective the ranks share, when each member got there
and left, how far apart they were, how long each waited for its peers, and the bandwidth the
collective achieved where its kernels (or the nccl:* ops that launched them) record the
message.

The collectives are stragglers.py's: the same kernels, read and matched the same way (by
process group, kind and order, or by kernel name and order where no kernel names a group), on
the clock the caller put them on (one merge's, or `report DIR`'s aligned clock). What is
computed here is derived from the kernels' times; bandwidth follows NCCL-tests' formulas
(NVIDIA/nccl-tests, doc/PERFORMANCE.md), whose message size S is the whole buffer: for
all-gather the gathered output, for reduce-scatter the input, so the larger of the kernel's
in and out element counts, times its element size. A merge writes each member kernel's share
of these figures as its args (`kernel_args`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Optional

from ..kineto import DTYPE_BYTES
from ..tp.tables import OP_INPUT
from .stragglers import Arrival, Matched, Message, Who, match_collectives

# Text shows this many collectives (the worst); HTML a table of this many; JSON every one.
TEXT_ROWS = 5
HTML_ROWS = 100

COLLECTIVE_DEFINITIONS = {
    "collectives": "every collective the ranks share, matched as the stragglers' are (the k-th NCCL collective "
                   "kernel of a kind on a process group where Kineto names it on the kernel, else of a kernel name); "
                   "per member rank its kernel's start and end on the clock the report puts the ranks on, worst "
                   "first by total wait; kind, process group, size and dtype as the kernel's args record them "
                   "(Collective name, In msg nelems, Out msg nelems, dtype, Group size), else where the kernel "
                   "records no collective (traces from before torch recorded them) the collective, size and dtype as "
                   "the nccl:* op its launch ran in records its first input (the op's name, the product of Input "
                   "Dims, Input type; the launch is the kernel's incoming arrow's source), else not recorded; "
                   "message_from says which",
    "start skew, end skew": "the latest member's kernel start minus the earliest one's, and the same for their "
                            "ends (derived, on the report's clock: each rank's clock uncertainty is listed with it)",
    "wait": "per member: from its kernel's start to the latest member's start, the time its kernel spent waiting "
            "for peers (derived; the last to arrive waits 0); total wait is the members' sum, and the last to "
            "arrive held the collective up by its start minus the next latest start",
    "effective duration": "from the latest member's start to the last end of any member's kernel: the "
                          "collective's own time once every member is there (each member's kernel duration, its end "
                          "minus its start, includes its wait); where the trace holds fewer members than the Group "
                          "size recorded (a merge of one pipeline), it includes the wait for those absent",
    "algbw, busbw": "NCCL-tests' bandwidths (NVIDIA/nccl-tests doc/PERFORMANCE.md), over the effective duration: "
                    "algbw = S / effective duration in GB/s (1e9 bytes a second), S the larger of In and Out msg "
                    "nelems (from a launching op: its input's count) times the dtype's size; busbw = algbw times 2(n-1)/n for all-reduce, (n-1)/n for "
                    "all-gather, reduce-scatter and all-to-all, 1 for broadcast and reduce; n the "
                    "Group size recorded, else the members matched; none where neither the kernel nor its launching op "
                    "records size and dtype, where only the op's input is known and the collective is an all-gather "
                    "(whose S is the gathered output), or the collective is another kind",
}

# The debug annotation a merge gives each collective kernel beside its own "args": read back
# as `debug.cgtrace_collective.<figure>` (docs/sql.md).
KERNEL_ARGS_NAME = "cgtrace_collective"
# A collective's figures every member kernel carries, as its row names them ...
_SHARED_FIGURES = ("kind", "index", "process_group", "collective", "dtype", "bytes", "message_from", "group_size",
                   "members", "start_skew_ns", "end_skew_ns", "effective_ns", "total_wait_ns", "held_up_ns",
                   "algbw_gb_s", "busbw_gb_s")

def bus_factor(collective: str, members: int) -> Optional[float]:
    """NCCL-tests' busbw factor for a collective as Kineto names it (allreduce, _allgather_base,
    reduce_scatter_tensor_coalesced, all_to_all, ...) among `members` ranks; None for other kinds."""
    kind = collective.replace("_", "").lower()
    if "allreduce" in kind:
        return 2 * (members - 1) / members
    if any(name in kind for name in ("allgather", "reducescatter", "alltoall")):
        return (members - 1) / members
    if kind in ("broadcast", "reduce"):
        return 1.0
    return None


def message_bytes(message: Optional[Message]) -> Optional[int]:
    """NCCL-tests' S: the larger of the in and out element counts times the element size; None
    where the kernel records no count or a dtype of unknown size, and where only a launching
    op's input is known for an all-gather (S is its gathered output)."""
    if message is None or message.dtype not in DTYPE_BYTES:
        return None
    if message.source == OP_INPUT and "allgather" in message.collective.replace("_", "").lower():
        return None
    counts = [count for count in (message.in_nelems, message.out_nelems) if count is not None]
    return max(counts) * DTYPE_BYTES[message.dtype] if counts else None


def collectives(arrivals: dict[Who, list[Arrival]], title: Callable[[Who], str],
                describe: Callable[[Who], dict[str, Any]]) -> dict[str, Any]:
    """Every matched collective, worst (most total wait) first, with its members' figures; what
    was left out, and why nothing could be matched where nothing was. `title`: a rank as the
    answer names it; `describe`: the identity a member row carries (file, ranks)."""
    matched, pairs = _matched_rows(arrivals, title, describe)
    rows = [row for row, _ in pairs]
    rows.sort(key=lambda row: (-row["total_wait_ns"], row["first_start_ns"]))
    return {"collectives": rows, "left_out": matched.left_out, "could_not_tell": matched.could_not_tell}


def kernel_args(arrivals: dict[Who, list[Arrival]], title: Callable[[Who], str],
                describe: Callable[[Who], dict[str, Any]]) -> dict[Who, dict[int, dict[str, Any]]]:
    """Per rank, per row of its collective kernels (arrivals read from its model: Arrival.row),
    the collective's figures as that kernel's args: the collective's own (_SHARED_FIGURES,
    those not recorded left out), its place among the collectives in first-start order
    (`ordinal`), its members' global ranks in start order, the last to arrive, and this
    member's wait. `describe(rank)` gives the rank's global_rank."""
    found: dict[Who, dict[int, dict[str, Any]]] = defaultdict(dict)
    rows = _matched_rows(arrivals, title, describe)[1]
    rows.sort(key=lambda pair: (pair[0]["first_start_ns"], pair[0]["process_group"] or "", pair[0]["kind"],
                                pair[0]["index"]))
    for ordinal, (row, members) in enumerate(rows):
        ranks = [member["global_rank"] for member in row["ranks"]]
        shared = {"ordinal": ordinal, **{key: row[key] for key in _SHARED_FIGURES if row[key] is not None},
                  "ranks": ranks, "last_to_arrive": ranks[-1]}
        for (arrival, rank), member in zip(members, row["ranks"]):
            if arrival.row is not None:
                found[rank][arrival.row] = {**shared, "wait_ns": member["wait_ns"]}
    return dict(found)


_Row = tuple[dict[str, Any], list[tuple[Arrival, Who]]]  # a collective's row, and its members in start order


def _matched_rows(arrivals: dict[Who, list[Arrival]], title: Callable[[Who], str],
                  describe: Callable[[Who], dict[str, Any]]) -> tuple[Matched[Who], list[_Row[Who]]]:
    """The collectives matched, and each one's row beside its members (in start order)."""
    matched = match_collectives(arrivals, title)
    return matched, [(_collective(channel, kind, index, members, title, describe), members)
                     for (channel, kind, index), members in matched.collectives.items()]


def _collective(channel: Optional[str], kind: str, index: int, members: list[tuple[Arrival, Who]],
                title: Callable[[Who], str], describe: Callable[[Who], dict[str, Any]]) -> dict[str, Any]:
    """One collective's row: `members` in start order."""
    starts = [arrival.start for arrival, _ in members]
    ends = [arrival.end for arrival, _ in members]
    last_start, last_end = starts[-1], max(ends)
    effective = last_end - last_start
    message = next((arrival.message for arrival, _ in members if arrival.message is not None), None)
    size = message_bytes(message)
    group_size = message.group_size if message and message.group_size else len(members)
    factor = bus_factor(message.collective, group_size) if message else None
    algbw = size / effective if size is not None and factor is not None and effective > 0 else None
    last = members[-1][1]
    return {
        "kind": kind, "index": index, "process_group": channel,
        "collective": message.collective if message else None, "dtype": message.dtype if message else None,
        "in_nelems": message.in_nelems if message else None, "out_nelems": message.out_nelems if message else None,
        "group_size": message.group_size if message else None, "bytes": size,
        "message_from": message.source if message else None,
        "members": len(members), "first_start_ns": starts[0], "last_start_ns": last_start, "last_end_ns": last_end,
        "start_skew_ns": last_start - starts[0], "end_skew_ns": last_end - min(ends),
        "effective_ns": effective, "total_wait_ns": sum(last_start - start for start in starts),
        "last_to_arrive": title(last), "held_up_ns": last_start - starts[-2],
        "algbw_gb_s": algbw, "busbw_gb_s": None if algbw is None or factor is None else algbw * factor,
        "ranks": [{**describe(rank), "title": title(rank), "start_ns": arrival.start, "end_ns": arrival.end,
                   "duration_ns": arrival.end - arrival.start, "wait_ns": last_start - arrival.start}
                  for arrival, rank in members],
    }


def collective_lines(rows: list[dict[str, Any]], limit: int) -> tuple[list[str], list[list[str]]]:
    """The worst `limit` collectives as table columns and display rows (text and HTML show the same)."""
    columns = ["collective", "group", "ranks", "size", "start skew ms", "end skew us", "effective ms",
               "total wait ms", "last to arrive (held up ms)", "algbw GB/s", "busbw GB/s"]
    return columns, [
        [f"{row['kind']} #{row['index']}", row["process_group"] or "-", _members(row), _size(row),
         f"{row['start_skew_ns'] / 1e6:.3f}", f"{row['end_skew_ns'] / 1e3:.1f}", f"{row['effective_ns'] / 1e6:.3f}",
         f"{row['total_wait_ns'] / 1e6:.3f}", f"{row['last_to_arrive']} ({row['held_up_ns'] / 1e6:.3f})",
         _bandwidth(row["algbw_gb_s"]), _bandwidth(row["busbw_gb_s"])]
        for row in rows[:limit]]


# The columns collective_lines gives that hold numbers.
NUMERIC_COLUMNS = [2, 4, 5, 6, 7, 9, 10]


def _size(row: dict[str, Any]) -> str:
    size = row["bytes"]
    if size is None:
        return "not recorded"
    shown = next((f"{size / 2 ** shift:.1f} {unit}" for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB"))
                  if size >= 2 ** shift), f"{size} B")
    return f"{shown} {row['dtype']}"


def _members(row: dict[str, Any]) -> str:
    """The members matched, and the group's size where it records more (ranks absent from the trace)."""
    group = row["group_size"]
    return f"{row['members']} of {group}" if group and group != row["members"] else str(row["members"])


def _bandwidth(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}" if value >= 1 else f"{value:.3g}"
