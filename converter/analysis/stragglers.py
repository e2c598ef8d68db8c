"""Stragglers: the ranks whose late arrival into collectives makes the others wait.

Every rank's NCCL collective kernel of one collective starts when that rank gets there and
cannot finish before the last one has. Each rank is judged by its own lateness: how much
after the collective's typical arrival (the median of its members' starts) it arrives, less
what its clock's uncertainty leaves unsure; so several late ranks of one group are each named
with their own amount, and the last one's hold-up of the others is reported beside it.
The k-th collective of a kind on a process group (its name and ranks, as Kineto records them
on the kernel) is one collective on every rank that has it; the arrivals are the kernels'
starts on the clock the traces share. Traces from before torch recorded groups name none on
any kernel: there every rank that runs a kernel name runs it in the same order, so the k-th
of a name is one collective. Where some kernels name a group and others do not (NCCL kernels
replayed inside CUDA graphs), the nameless ones could belong to any group and are left out.
Order only matches collectives where every rank has as many of a kind; where that fails, or
nothing is left to match, the answer says it could not tell, and why.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generic, Hashable, Iterable, Optional, TypeVar

import msgspec
import numpy as np

from ..kineto import KERNEL_CATEGORIES, NCCL_KERNEL_PREFIXES, NCCL_OP, POINT_TO_POINT, group_ranks
from ..model import Trace
from ..tp.tables import KERNEL_ARGS, OP_INPUT
from ..tp.sql_text import sql_list

# A rank is a straggler where it arrives this much after its collectives' typical arrival, per
# step, as a share of the median step.
STRAGGLER_SHARE = 0.10

STRAGGLER_DEFINITIONS = {
    "stragglers": "ranks that arrive late into collectives and make the others wait: per collective (the k-th "
                  "NCCL collective kernel of a kind, on every rank that has it: of a collective and size on one "
                  "process group where Kineto names them on the kernel, else of one kernel name where no kernel "
                  "of the traces names a group; matched only where each of those ranks has as many) a rank is "
                  "late by how much later its kernel starts than the median start of the collective's ranks (of an "
                  "even number, the mean of the two middle starts rounded down to the ns), "
                  "less its clock's uncertainty (lateness); the rank whose kernel starts last holds it up by how "
                  "much later it starts than the next latest, less its clock's uncertainty (held up), and the "
                  "others wait from their own starts to its start (caused wait); a straggler is late at least "
                  f"{STRAGGLER_SHARE:.0%} of the median step time per step; the latest rank is shown below that "
                  "too, and where no collective can be matched the answer is could not tell, with the reason",
}

# Each NCCL kernel with its args, and the nccl:* op its launch ran in (the innermost, on the
# launching thread; the launch is the source of the kernel's incoming flow, Kineto's ac2g
# arrow) with that op's first input's dims and type.
_ARRIVALS_SQL = """
select k.track_id, k.ts, k.dur, k.name, k.collective, k.pg, k.ranks_text, k.ranks_list, k.dtype, k.in_nelems,
       k.out_nelems, k.group_size, k.stream, op.name as op,
       (select group_concat(a.int_value, ',') from args a
        where a.arg_set_id = op.arg_set_id and a.key glob 'debug.args.Input Dims[[]0][[]*') as op_dims,
       extract_arg(op.arg_set_id, 'debug.args.Input type[0]') as op_type
from (select s.id, s.track_id, s.ts, s.dur, s.name,
             extract_arg(s.arg_set_id, 'debug.args.Collective name') as collective,
             extract_arg(s.arg_set_id, 'debug.args.Process Group Name') as pg,
             extract_arg(s.arg_set_id, 'debug.args.Process Group Ranks') as ranks_text,
             (select group_concat(a.int_value, ',') from args a
              where a.arg_set_id = s.arg_set_id and a.key glob 'debug.args.Process Group Ranks[[]*') as ranks_list,
             extract_arg(s.arg_set_id, 'debug.args.dtype') as dtype,
             extract_arg(s.arg_set_id, 'debug.args.In msg nelems') as in_nelems,
             extract_arg(s.arg_set_id, 'debug.args.Out msg nelems') as out_nelems,
             extract_arg(s.arg_set_id, 'debug.args.Group size') as group_size,
             extract_arg(s.arg_set_id, 'debug.args.stream') as stream,
             (select a.id from ancestor_slice(l.launch) a where a.name glob '{op}*'
              order by a.depth desc limit 1) as op_id
      from slice s left join (select slice_in, min(slice_out) as launch from flow group by slice_in) l
        on l.slice_in = s.id
      where s.dur > 0 and s.category in ({categories})
        and ({kernels})) k
left join slice op on op.id = k.op_id
order by k.ts""".format(op=NCCL_OP, kernels=" or ".join(f"s.name glob '{prefix}*'" for prefix in NCCL_KERNEL_PREFIXES),
           categories=sql_list(KERNEL_CATEGORIES))
Who = TypeVar("Who", bound=Hashable)  # how the caller names a rank: a rank of a merge, a file


@dataclass(frozen=True)
class Message:
    """What the trace records of a collective's message: the collective's name, element type
    and counts, group size; from the kernel's args (Kineto's `record_param_comms` args, copied
    onto the kernel), or where it records none, from the nccl:* op its launch ran in (its
    first input's dims and type: `source` OP_INPUT)."""

    collective: str
    dtype: Optional[str] = None
    in_nelems: Optional[int] = None
    out_nelems: Optional[int] = None
    group_size: Optional[int] = None
    source: str = KERNEL_ARGS


@dataclass(frozen=True)
class Arrival:
    """One rank's kernel of one collective: which collective (its process group where the
    kernel names one, its kind, the k-th of those on the rank), when it began and ended, its
    stream (the clock's channel where it names no group: jobs/across.py), and its message
    where the kernel records one."""

    channel: Optional[str]
    kind: str
    index: int
    start: int
    end: int
    stream: Any = None
    message: Optional[Message] = None
    row: Optional[int] = None  # the kernel's row where it was read from a model (a merge's rank), else None

    def shifted(self, offset: int) -> "Arrival":
        """The arrival on a clock `offset` ns later."""
        return replace(self, start=self.start + offset, end=self.end + offset)


def _group_ranks(value: Any, listed: Optional[str]) -> str:
    """A group's ranks as "0,1": Kineto writes them as a string ("[0, 1]"), the generator as a
    list (`listed`, as trace_processor joins its elements, or `value` itself in a model)."""
    if listed is not None:
        return listed
    ranks = group_ranks(value)
    return ",".join(map(str, ranks)) if ranks is not None else value or ""


def _count(value: Any) -> Optional[int]:
    """A count arg as an int; None where absent or not a whole number."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _kind(name: str, collective: Optional[str], dtype: Any, in_nelems: Any, out_nelems: Any) -> str:
    """The collective and its size where the kernel records them, else the kernel's name
    (which names the collective, algorithm, protocol and type, the same on every rank)."""
    if collective is None:
        return name.split("(", 1)[0]
    sizes = [f"{label} {value}" for label, value in (("dtype", dtype), ("in", in_nelems), ("out", out_nelems))
             if value is not None]
    return collective + (f" ({', '.join(sizes)})" if sizes else "")


def read_arrivals(rows: Callable[[str], list[tuple[Any, ...]]], whose: Callable[[int], Who]
                  ) -> dict[Who, list[Arrival]]:
    """Each rank's collective kernels in a trace that trace_processor reads (pairwise sends and
    receives left out), numbered per channel and kind in start order. `whose`: a kernel's track
    id -> its rank."""
    return _numbered((whose(track), None, start, duration, name, collective, pg, _group_ranks(ranks_text, ranks_list),
                      dtype, in_nelems, out_nelems, group_size, stream,
                      _op_input(op, op_dims.split(",") if op_dims else None, op_type))
                     for (track, start, duration, name, collective, pg, ranks_text, ranks_list, dtype, in_nelems,
                          out_nelems, group_size, stream, op, op_dims, op_type) in rows(_ARRIVALS_SQL))


class _KernelArgs(msgspec.Struct):
    """The args of a collective kernel that _ARRIVALS_SQL reads, as Kineto writes them."""

    collective: Any = msgspec.field(default=None, name="Collective name")
    pg: Any = msgspec.field(default=None, name="Process Group Name")
    ranks: Any = msgspec.field(default=None, name="Process Group Ranks")  # text, or a list (the generator)
    dtype: Any = None
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    stream: Any = None


_decode_kernel_args = msgspec.json.Decoder(_KernelArgs).decode


def model_arrivals(trace: Trace) -> list[Arrival]:
    """A rank's collective kernels in its model, before it is written (a merge's), as
    read_arrivals reads them from the written trace, each with its row."""
    table = trace.slices
    rows = table.named(lambda name: name.startswith(NCCL_KERNEL_PREFIXES))
    rows = rows[table.in_categories(KERNEL_CATEGORIES)[rows] & (table.dur[rows] > 0)]
    rows = rows[np.argsort(table.ts[rows], kind="stable")]
    ops = _launching_ops(trace, rows)
    op_args = dict(zip(ops.values(), trace.args_texts(np.array(list(ops.values()), np.int64))))
    kernels = []
    for row, text in zip(rows.tolist(), trace.args_texts(rows)):
        args = _decoded(_decode_kernel_args, text, _KernelArgs)
        op = ops.get(row)
        op_input = None if op is None else _decoded(_decode_op_args, op_args[op], _OpArgs)
        kernels.append((None, row, int(table.ts[row]), int(table.dur[row]), table.texts[int(table.name[row])],
                        args.collective, args.pg, _group_ranks(args.ranks, None), args.dtype, args.in_nelems,
                        args.out_nelems, args.group_size, args.stream,
                        None if op is None or op_input is None else _op_input(
                            table.texts[int(table.name[op])], op_input.first_dims(), op_input.first_type())))
    return _numbered(kernels).get(None, [])


class _OpArgs(msgspec.Struct):
    """The args of an nccl:* op that _ARRIVALS_SQL reads: its inputs' dims and types."""

    dims: Any = msgspec.field(default=None, name="Input Dims")
    types: Any = msgspec.field(default=None, name="Input type")

    def first_dims(self) -> Optional[list[Any]]:
        return self.dims[0] if isinstance(self.dims, list) and self.dims and isinstance(self.dims[0], list) else None

    def first_type(self) -> Any:
        return self.types[0] if isinstance(self.types, list) and self.types else None


_decode_op_args = msgspec.json.Decoder(_OpArgs).decode
_Decoded = TypeVar("_Decoded")


def _decoded(decode: Callable[[bytes], _Decoded], text: Optional[bytes], empty: Callable[[], _Decoded]) -> _Decoded:
    """Args text decoded, or no args where there is none or it is not an object of those fields."""
    try:
        return decode(text) if text is not None else empty()
    except msgspec.MsgspecError:
        return empty()


def _launching_ops(trace: Trace, kernels: np.ndarray) -> dict[int, int]:
    """Per kernel row, the row of the nccl:* op its launch ran in, where it has one: the launch
    is the source of the kernel's incoming arrow (Kineto's ac2g), and the op the latest one
    starting by the launch on the launch's track, where it lasts past the launch's end."""
    table = trace.slices
    launch_of: dict[int, int] = {}
    for flow in trace.flows:
        launch_of.setdefault(flow.target, flow.source)
    ops = table.named(lambda name: name.startswith(NCCL_OP))
    by_track: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # its ops by start, and their starts
    for track in np.unique(table.track[ops]).tolist():
        mine = ops[table.track[ops] == track]
        mine = mine[np.argsort(table.ts[mine], kind="stable")]
        by_track[track] = mine, table.ts[mine]
    found = {}
    for kernel in kernels.tolist():
        launch = launch_of.get(kernel)
        if launch is None or int(table.track[launch]) not in by_track:
            continue
        candidates, starts = by_track[int(table.track[launch])]
        place = int(np.searchsorted(starts, table.ts[launch], "right")) - 1
        op = int(candidates[place]) if place >= 0 else None
        if op is not None and table.ts[op] + table.dur[op] >= table.ts[launch] + table.dur[launch]:
            found[kernel] = op
    return found


def _op_input(op: Optional[str], dims: Optional[list[Any]], dtype: Any) -> Optional[Message]:
    """The message as an nccl:* op records its first input: its collective (the op's name),
    element count (the product of the input's dims) and type; None without both."""
    if op is None or not op.startswith(NCCL_OP) or not dims or not isinstance(dtype, str):
        return None
    sizes = [int(size) if isinstance(size, str) and size.isdigit() else _count(size) for size in dims]
    count = 1
    for size in sizes:
        if size is None:
            return None
        count *= size
    return Message(op.removeprefix(NCCL_OP), dtype, count, source=OP_INPUT)


def _numbered(kernels: Iterable[tuple[Any, ...]]) -> dict[Any, list[Arrival]]:
    """Arrivals per rank from kernels in start order, each (rank, row, start, duration, name,
    collective, process group, its ranks as "0,1", dtype, in and out element counts, group
    size, stream, the message its launching op records): pairwise sends and receives left out,
    numbered per channel and kind."""
    found: dict[Any, list[Arrival]] = defaultdict(list)
    counts: dict[tuple[Any, Optional[str], str], int] = defaultdict(int)
    for (rank, row, start, duration, name, collective, pg, ranks, dtype, in_nelems, out_nelems, group_size,
         stream, launched) in kernels:
        if collective in POINT_TO_POINT:
            continue
        channel = None if pg is None else f"group {pg} [{ranks}]"
        kind = _kind(name, collective, dtype, in_nelems, out_nelems)
        index = counts[(rank, channel, kind)]
        counts[(rank, channel, kind)] += 1
        message = launched if collective is None else Message(collective, dtype, _count(in_nelems),
                                                              _count(out_nelems), _count(group_size))
        found[rank].append(Arrival(channel, kind, index, start, start + duration, stream, message, row))
    return dict(found)


_FIGURES = ("late_collectives", "late_ns", "held_up_ns", "caused_wait_ns")


@dataclass
class Lateness(Generic[Who]):
    """What matching the ranks' collectives found: per rank that arrived late somewhere, at how
    many collectives (`late_collectives`), by how much after their typical arrival in all, sure
    of beyond its clock's uncertainty (`late_ns`), by how much it held up those it reached last
    (`held_up_ns`), the waiting it caused the others there (`caused_wait_ns`); how many
    collectives and ranks were matched; why kernels were left out, and where nothing could be
    matched, why not (`could_not_tell`)."""

    late: dict[Who, dict[str, int]] = field(default_factory=dict)
    collectives: int = 0
    ranks: int = 0
    left_out: list[str] = field(default_factory=list)
    could_not_tell: Optional[str] = None


@dataclass
class Matched(Generic[Who]):
    """Every rank's collectives matched across ranks: per collective (channel, kind, the k-th of
    those), its members' arrivals in start order; why kernels were left out, and where nothing
    could be matched, why not (`could_not_tell`)."""

    collectives: dict[tuple[Optional[str], str, int], list[tuple[Arrival, Who]]] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    could_not_tell: Optional[str] = None


def match_collectives(arrivals: dict[Who, list[Arrival]], title: Callable[[Who], str]) -> Matched[Who]:
    """Match every rank's collectives by channel, kind and order. `title`: a rank as the answer names it."""
    found: Matched[Who] = Matched()
    present = sorted((rank for rank, mine in arrivals.items() if mine), key=title)
    if len(present) < 2:
        found.could_not_tell = ("no rank runs NCCL collective kernels" if not present else
                                f"only {title(present[0])} runs NCCL collective kernels: nobody to wait for it")
        return found
    named = any(arrival.channel is not None for rank in present for arrival in arrivals[rank])
    by_collective: dict[tuple[Optional[str], str, int], list[tuple[Arrival, Who]]] = defaultdict(list)
    counts: dict[tuple[Optional[str], str], dict[Who, int]] = defaultdict(dict)
    nameless = 0
    for rank in present:
        for arrival in arrivals[rank]:
            if named and arrival.channel is None:
                nameless += 1
                continue
            by_collective[(arrival.channel, arrival.kind, arrival.index)].append((arrival, rank))
            counts[(arrival.channel, arrival.kind)][rank] = arrival.index + 1
    if nameless:
        found.left_out.append(f"{nameless} collective kernels that name no process group (replayed in CUDA graphs, "
                              "say) while others name theirs: which ranks share them nothing says")
    unmatched = set()
    for (channel, kind), per_rank in sorted(counts.items(), key=lambda item: (item[0][0] or "", item[0][1])):
        fewest, most = min(per_rank.items(), key=lambda item: item[1]), max(per_rank.items(), key=lambda item: item[1])
        where = f"{kind} on {channel}" if channel else kind
        if len(per_rank) < 2:
            found.left_out.append(f"{where}: only {title(fewest[0])} runs it")
        elif fewest[1] != most[1]:
            found.left_out.append(f"{where}: {title(most[0])} runs {most[1]}, {title(fewest[0])} {fewest[1]}, "
                                  "so order cannot match them")
        else:
            continue
        unmatched.add((channel, kind))
    found.collectives = {key: sorted(members, key=lambda member: member[0].start)
                         for key, members in by_collective.items() if key[:2] not in unmatched}
    if not found.collectives:
        found.could_not_tell = "; ".join(found.left_out)
    return found


def _median_ns(values: list[int]) -> int:
    """The median of whole ns, kept whole: of an even number, the mean of the two middle
    values rounded down, since a float's mean of starts ~1.7e18 ns is off by up to 256 ns."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    low, high = ordered[middle - 1], ordered[middle]
    return low + (high - low) // 2


def late_arrivals(arrivals: dict[Who, list[Arrival]], title: Callable[[Who], str],
                  uncertainty: Optional[dict[Who, int]] = None) -> Lateness[Who]:
    """Match every rank's collectives (match_collectives), and find who arrived late.
    `title`: a rank as the answer names it; `uncertainty`: how far each rank's clock may be off
    the others' (none given: they share one clock)."""
    unsure = uncertainty or {}
    matched = match_collectives(arrivals, title)
    found: Lateness[Who] = Lateness(left_out=matched.left_out, could_not_tell=matched.could_not_tell)
    ranked: set[Who] = set()
    for members in matched.collectives.values():
        found.collectives += 1
        starts = [(arrival.start, rank) for arrival, rank in members]
        ranked.update(rank for _, rank in starts)
        typical = _median_ns([start for start, _ in starts])
        for start, rank in starts:
            lateness = start - typical - unsure.get(rank, 0)
            if lateness > 0:
                figures = found.late.setdefault(rank, dict.fromkeys(_FIGURES, 0))
                figures["late_collectives"] += 1
                figures["late_ns"] += lateness
        (second, _), (last, rank) = starts[-2], starts[-1]
        held_up = last - second - unsure.get(rank, 0)
        if held_up > 0:
            figures = found.late.setdefault(rank, dict.fromkeys(_FIGURES, 0))
            figures["held_up_ns"] += held_up
            figures["caused_wait_ns"] += sum(last - start for start, _ in starts[:-1])
    found.ranks = len(ranked)
    return found


def hold_ups(late: dict[Who, dict[str, int]], steps: dict[Who, int], median_step_ns: float
             ) -> list[tuple[Who, dict[str, Any]]]:
    """Every rank that arrived late, latest per step first (over `steps[rank]` steps, at least
    one), with its share of the median step and whether that makes it a straggler (none
    without a median step to weigh it against)."""
    rows = []
    for rank, figures in late.items():
        count = max(steps.get(rank, 1), 1)
        per_step = figures["late_ns"] / count
        if per_step > 0:
            rows.append((rank, {**figures, "late_ns_per_step": round(per_step),
                                "held_up_ns_per_step": round(figures["held_up_ns"] / count),
                                "late_share": round(per_step / median_step_ns, 4) if median_step_ns > 0 else None,
                                "straggler": median_step_ns > 0 and per_step >= STRAGGLER_SHARE * median_step_ns}))
    return sorted(rows, key=lambda row: -row[1]["late_ns_per_step"])


def straggler_answer(found: Lateness, rows: list[dict[str, Any]], median_step_ns: float) -> dict[str, Any]:
    """The stragglers and what backs the answer, as report and report DIR give them: `rows` are
    hold_ups' rows as the caller names their ranks (`title`), latest first."""
    could_not_tell = found.could_not_tell
    if could_not_tell is None and median_step_ns <= 0:
        could_not_tell = "no step time to weigh the lateness against"
    named = [row for row in rows if row["straggler"]] if could_not_tell is None else []
    largest = rows[0] if rows and could_not_tell is None else None
    if could_not_tell is not None:
        summary = f"could not tell, because {could_not_tell}"
    elif largest is None:
        summary = f"none named ({found.collectives} collectives matched on {found.ranks} ranks, none late)"
    else:
        summary = (f"{len(named) or 'none'} named ({found.collectives} collectives matched on {found.ranks} ranks); "
                   f"latest: {largest['title']}, {largest['late_ns_per_step'] / 1e6:.3f} ms late per step, "
                   f"{largest['late_share']:.1%} of the median step, "
                   + ("at or above" if largest["straggler"] else "below") + f" the {STRAGGLER_SHARE:.0%} threshold")
    return {"stragglers": named,
            "straggler_check": {"summary": summary, "could_not_tell": could_not_tell, "collectives": found.collectives,
                                "ranks": found.ranks, "threshold_share": STRAGGLER_SHARE, "largest_hold_up": largest,
                                "left_out": found.left_out}}
