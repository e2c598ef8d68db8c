"""Stragglers: the ranks whose late arrival into collectives makes the others wait.

Every rank's NCCL collective kernel of one collective starts when that rank gets there and
cannot finish before the last one has; so the last to arrive holds the whole collective up.
The k-th collective of a kind on a process group (its name and ranks, as Kineto records them
on the kernel) is one collective on every rank that has it; the arrivals are the kernels'
starts on the clock the traces share. Kernels that name no process group (those replayed
inside CUDA graphs, older traces) are left out: nothing says which ranks share them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, TypeVar

from ..kineto import KERNEL_CATEGORIES

# A rank is a straggler where the collectives it reached last were held up this much, per
# step, as a share of the median step.
STRAGGLER_SHARE = 0.10

STRAGGLER_DEFINITIONS = {
    "stragglers": "ranks whose late arrival into collectives makes the others wait: per collective (the k-th "
                  "NCCL collective kernel of a kind on one process group, named with its ranks on the kernel, on "
                  "every rank that has it) the rank whose kernel starts last holds it up by how much later it starts than the next "
                  "latest (held up), and the others wait from their own starts to its start (caused wait); a "
                  f"straggler holds collectives up at least {STRAGGLER_SHARE:.0%} of the median step time per step",
}

_ARRIVALS_SQL = """
select s.track_id, s.ts, s.name,
       extract_arg(s.arg_set_id, 'debug.args.Collective name') as collective,
       extract_arg(s.arg_set_id, 'debug.args.Process Group Name') as pg,
       (select group_concat(a.int_value, ',') from args a
        where a.arg_set_id = s.arg_set_id and a.key glob 'debug.args.Process Group Ranks*') as ranks
from slice s where s.dur > 0 and s.category in ({categories})
  and (s.name glob 'ncclKernel_*' or s.name glob 'ncclDevKernel_*')
order by s.ts""".format(categories=", ".join(f"'{c}'" for c in KERNEL_CATEGORIES))
_POINT_TO_POINT = ("send", "recv")
Who = TypeVar("Who", bound=Hashable)  # how the caller names a rank: a rank of a merge, a file


@dataclass(frozen=True)
class Arrival:
    """One rank's kernel of one collective: which collective (channel, kind, k-th), when it began."""

    channel: str
    kind: str
    index: int
    start: int


def read_arrivals(rows: Callable[[str], list[tuple[Any, ...]]], whose: Callable[[int], Who]
                  ) -> dict[Who, list[Arrival]]:
    """Each rank's collective kernels (pairwise sends and receives left out), numbered per
    channel and kind in start order. `whose`: a kernel's track id -> its rank."""
    found: dict[Who, list[Arrival]] = defaultdict(list)
    counts: dict[tuple[Who, str, str], int] = defaultdict(int)
    for track, start, name, collective, pg, ranks in rows(_ARRIVALS_SQL):
        if pg is None or collective is None or collective in _POINT_TO_POINT:
            continue
        rank = whose(track)
        channel = f"group {pg} [{ranks}]"
        kind = collective
        index = counts[(rank, channel, kind)]
        counts[(rank, channel, kind)] += 1
        found[rank].append(Arrival(channel, kind, index, start))
    return dict(found)


def late_arrivals(arrivals: dict[Who, list[Arrival]]) -> dict[Who, dict[str, int]]:
    """Per rank that arrived last anywhere: how many collectives it reached last
    (`late_collectives`), by how much later than the next latest in all (`held_up_ns`), and the
    waiting it caused the others in all (`caused_wait_ns`)."""
    by_collective: dict[tuple[str, str, int], list[tuple[int, Who]]] = defaultdict(list)
    for rank, mine in arrivals.items():
        for arrival in mine:
            by_collective[(arrival.channel, arrival.kind, arrival.index)].append((arrival.start, rank))
    late: dict[Who, dict[str, int]] = {}
    for starts in by_collective.values():
        if len(starts) < 2:
            continue
        starts.sort(key=lambda item: item[0])
        (second, _), (last, rank) = starts[-2], starts[-1]
        figures = late.setdefault(rank, {"late_collectives": 0, "held_up_ns": 0, "caused_wait_ns": 0})
        figures["late_collectives"] += 1
        figures["held_up_ns"] += last - second
        figures["caused_wait_ns"] += sum(last - start for start, _ in starts[:-1])
    return late


def stragglers(late: dict[Who, dict[str, int]], steps: dict[Who, int], median_step_ns: float
               ) -> list[tuple[Who, dict[str, Any]]]:
    """The ranks whose holding up per step (over `steps[rank]` steps, at least one) reaches
    STRAGGLER_SHARE of the median step, most first."""
    rows = []
    for rank, figures in late.items():
        per_step = figures["held_up_ns"] / max(steps.get(rank, 1), 1)
        if per_step >= STRAGGLER_SHARE * median_step_ns and per_step > 0:
            rows.append((rank, {**figures, "held_up_ns_per_step": round(per_step),
                                "held_up_share": round(per_step / median_step_ns, 4)}))
    return sorted(rows, key=lambda row: -row[1]["held_up_ns_per_step"])
