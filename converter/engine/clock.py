"""One clock for every rank of a merge: each rank's clock offset from the trace's own evidence.

A merge lines ranks up on their profiler base times (`baseTimeNanoseconds`, or epoch times),
right only where every host's clock agrees. The trace itself says more: the kernels of one
NCCL collective end together on every rank it spans (within a few us on one host; a gloo
collective's CPU span within tens of us), so the
k-th collective of a process group on two ranks measures their clocks' difference, and the
median over many shrugs off a straggler or a kernel cut by the capture. Point-to-point
transfers bound it (a receive is not done before its send began). The base times are the
prior: a rank with no shared evidence keeps its own. Linear in the evidence (the lag search
tries a bounded number of alignments of each process group's sequence).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Iterable, Optional

import msgspec
import numpy as np

from ..kineto import KERNEL_CATEGORIES, group_ranks, rank_header
from ..model import Trace

COLLECTIVE, BOUND = "collectives", "transfer bounds"
_KIND = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_POINT_TO_POINT = ("send", "recv")  # "Collective name" of a pairwise NCCL op (and a gloo span's): no shared end
_GLOO = "gloo:"  # gloo's spans: `gloo:<collective>` on a rank's CPU
_MAX_LAG = 8           # collectives one rank's capture may have ahead of another's
# The kernels of one collective end within 1-7 us of each other on one host (measured on a
# real capture): no clock difference is known better than this from their ends.
_FLOOR_NS = 5_000
# Fewer collectives than this cannot show that their ends agree this well: the floor grows as
# the evidence thins (one collective: 8x), so a rank is not moved on one or two noisy ends.
_WELL_SAMPLED = 8
_MAD_TO_SIGMA = 1.4826


class _CommArgs(msgspec.Struct):
    group: Optional[str] = msgspec.field(default=None, name="Process Group Name")
    ranks: object = msgspec.field(default=None, name="Process Group Ranks")  # text or a list: kineto.group_ranks
    collective: Optional[str] = msgspec.field(default=None, name="Collective name")
    stream: object = None


_decode_comm = msgspec.json.Decoder(_CommArgs).decode


@dataclass
class Collectives:
    """A rank's NCCL collective kernels per channel (process group and its ranks, else the
    stream), in issue order: their kinds and end times."""

    channels: dict[str, tuple[tuple[str, ...], np.ndarray]] = field(default_factory=dict)
    span: tuple[int, int] = (0, 0)  # the capture's first start and last end: how far a drift reaches

    def count(self) -> int:
        return sum(len(ends) for _, ends in self.channels.values())


def find_collectives(trace: Trace) -> Collectives:
    """The rank's NCCL collective kernels and gloo collectives (pairwise sends and receives left
    out), per channel."""
    table = trace.slices
    rows = table.named(lambda name: _KIND.match(name) is not None)
    rows = rows[table.in_categories(KERNEL_CATEGORIES)[rows]]
    rows = rows[np.argsort(table.ts[rows], kind="stable")]
    kernels = []
    for row, text in zip(rows.tolist(), trace.args_texts(rows)):
        try:
            comm = _decode_comm(text) if text is not None else _CommArgs()
        except msgspec.MsgspecError:
            comm = _CommArgs()
        if comm.collective in _POINT_TO_POINT:
            continue
        channel = f"group {comm.group} {group_ranks(comm.ranks)}" if comm.group is not None else f"stream {comm.stream}"
        match = _KIND.match(table.texts[int(table.name[row])])
        kernels.append((channel, match.group(1) if match else "", int(table.ts[row] + table.dur[row])))
    return collectives_of(kernels + _gloo_collectives(trace), (int(table.ts.min()), int(table.end.max()))
                          if len(table) else (0, 0))


def _gloo_collectives(trace: Trace) -> list[tuple[str, str, int]]:
    """The rank's gloo collectives (CPU runs, as DDP's all-reduce): the `gloo:<collective>` span
    ends when the last rank's data is in, on every rank within tens of us (measured on a real
    DDP x PP run), so they are evidence where no NCCL kernel is; their spread sets how sure.
    Their spans name no process group: only where every group is the whole world (a 1-D mesh,
    as plain DDP) is each one shared by every rank."""
    if not rank_header(trace.metadata, "").one_dimensional:
        return []
    table = trace.slices
    rows = table.named(lambda name: name.startswith(_GLOO) and name.removeprefix(_GLOO) not in _POINT_TO_POINT)
    rows = rows[np.argsort(table.ts[rows], kind="stable")]
    return [(_GLOO, table.texts[int(table.name[row])].removeprefix(_GLOO), int(table.ts[row] + table.dur[row]))
            for row in rows.tolist()]


def collectives_of(kernels: Iterable[tuple[str, str, int]], span: tuple[int, int]) -> Collectives:
    """Collectives from a rank's kernels in start order, each (channel, kind, end): a merge
    reads them from its model, `report DIR` from each trace's rows."""
    found: dict[str, tuple[list[str], list[int]]] = {}
    for channel, kind, end in kernels:
        kinds, ends = found.setdefault(channel, ([], []))
        kinds.append(kind)
        ends.append(end)
    return Collectives({channel: (tuple(kinds), np.array(ends, np.int64)) for channel, (kinds, ends) in found.items()},
                       span)


@dataclass(frozen=True)
class Bound:
    """A transfer between two ranks (positions in the merge): its receive was done at `done`
    (receiver's clock), which is no earlier than its send began, at `start` (sender's clock)."""

    sender: int
    receiver: int
    start: int
    done: int


@dataclass
class RankClock:
    """One rank's estimate: add `offset_ns` to its times; `uncertainty_ns` None where only a
    one-sided bound (or nothing) speaks for it."""

    offset_ns: int = 0
    uncertainty_ns: Optional[int] = None
    evidence: Counter[str] = field(default_factory=Counter)

    def significant(self) -> bool:
        """Whether the evidence moves the rank beyond what it can tell."""
        return self.offset_ns != 0 and (self.uncertainty_ns is None or abs(self.offset_ns) > self.uncertainty_ns)


@dataclass
class Clocks:
    """Every rank's estimate, in merge positions, and where the evidence disagrees."""

    ranks: list[RankClock]
    warnings: list[str] = field(default_factory=list)

    def skewed(self) -> bool:
        """Whether the base times disagree beyond what the evidence can tell."""
        return any(rank.significant() for rank in self.ranks)


@dataclass(frozen=True)
class _Edge:
    """Rank `to`'s clock minus rank `source`'s, from collectives: `difference` +/- `spread`."""

    source: int
    to: int
    difference: int
    spread: int
    count: int


def estimate_clocks(collectives: list[Collectives], bounds: list[Bound], labels: list[str]) -> Clocks:
    """Each rank's offset (rank `k` is `collectives[k]`, named `labels[k]` in warnings): from its
    collectives where it shares a channel with others (the lowest position of each connected
    set keeps its clock), else from transfer bounds to a placed neighbour, else the prior."""
    clocks = Clocks([RankClock() for _ in collectives])
    edges = _collective_edges(collectives, labels, clocks.warnings)
    placed = _place_by_collectives(clocks.ranks, edges)
    intervals = _intervals(bounds)
    for bound in bounds:
        clocks.ranks[bound.sender].evidence[BOUND] += 1
        clocks.ranks[bound.receiver].evidence[BOUND] += 1
    _place_by_bounds(clocks.ranks, placed, intervals)
    _check_bounds(clocks, bounds, labels)
    clocks.warnings += [f"{label}: no collective or transfer shared with the other ranks; keeps its base time"
                        for label, rank in zip(labels, clocks.ranks) if not rank.evidence and len(labels) > 1]
    return clocks


def _collective_edges(collectives: list[Collectives], labels: list[str], warnings: list[str]) -> list[_Edge]:
    """Per channel, each member's clock against the channel's first member (a star: linear in ranks)."""
    members: dict[str, list[int]] = {}
    for position, rank in enumerate(collectives):
        for channel in rank.channels:
            members.setdefault(channel, []).append(position)
    edges = []
    for channel, positions in sorted(members.items()):
        reference = collectives[positions[0]].channels[channel]
        for position in positions[1:]:
            matched = _match(reference, collectives[position].channels[channel])
            if matched is None:
                warnings.append(f"{labels[position]}: its {channel} collectives match no order of "
                                f"{labels[positions[0]]}'s; not used")
                continue
            edge, drift = _edge(positions[0], position, *matched, collectives[positions[0]].span,
                                collectives[position].span)
            if drift is not None:
                warnings.append(f"{labels[position]} vs {labels[positions[0]]}: clocks drift {drift / 1000:.1f} us "
                                f"over the capture ({channel}); the offset is their middle")
            edges.append(edge)
    return edges


def _match(reference: tuple[tuple[str, ...], np.ndarray], other: tuple[tuple[str, ...], np.ndarray]
           ) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The reference's and the other rank's ends of the same collectives: the alignment of the
    two sequences (one capture may start or stop a few collectives earlier) whose kinds agree
    and whose end differences spread least."""
    (kinds_a, ends_a), (kinds_b, ends_b) = reference, other
    shortest = min(len(ends_a), len(ends_b))
    best: Optional[tuple[tuple[float, int], slice, slice]] = None
    for lag in range(-min(_MAX_LAG, len(ends_a) - 1), min(_MAX_LAG, len(ends_b) - 1) + 1):
        a = slice(max(0, -lag), min(len(ends_a), len(ends_b) - lag))
        b = slice(a.start + lag, a.stop + lag)
        overlap = a.stop - a.start
        if overlap * 2 < shortest or overlap < min(2, shortest) or kinds_a[a] != kinds_b[b]:
            continue  # one collective alone matches at any lag: it says nothing of the alignment
        # A few ends spread little by chance: no alignment is surer than its evidence's floor.
        score = (max(_spread(ends_b[b] - ends_a[a]), _floor(overlap)), -overlap)
        if best is None or score < best[0]:
            best = (score, a, b)
    return None if best is None else (ends_a[best[1]], ends_b[best[2]])


def _floor(count: int) -> float:
    """How well `count` shared collectives can tell a clock difference at best (_FLOOR_NS, more
    for fewer than _WELL_SAMPLED)."""
    return _FLOOR_NS * max(1.0, _WELL_SAMPLED / count)


def _spread(differences: np.ndarray) -> float:
    """A robust standard deviation: the median absolute deviation, scaled."""
    return float(_MAD_TO_SIGMA * np.median(np.abs(differences - np.median(differences))))


def _edge(source: int, to: int, ends_a: np.ndarray, ends_b: np.ndarray, span_a: tuple[int, int],
          span_b: tuple[int, int]) -> tuple[_Edge, Optional[int]]:
    """The clock difference of two ranks from the ends of their shared collectives (their
    median: the difference in the evidence's middle), its uncertainty (the spread, and how far
    the drift between the evidence's halves carries it by either end of the two captures), and that
    drift if it exceeds what the spread explains."""
    differences = ends_a - ends_b
    half = len(differences) // 2
    middle = float(np.median(ends_a))
    drift, rate = 0, 0.0
    if half >= 2:
        drift = int(np.median(differences[-half:]) - np.median(differences[:half]))
        apart = float(np.median(ends_a[-half:]) - np.median(ends_a[:half]))
        rate = drift / apart if apart > 0 else 0.0
    residuals = differences - rate * (ends_a - middle)  # the drift taken out: what is left is noise
    spread = _spread(residuals)
    reach = abs(rate) * max(middle - min(span_a[0], span_b[0] + middle - float(np.median(ends_b))),
                            max(span_a[1], span_b[1] + middle - float(np.median(ends_b))) - middle)
    uncertainty = int(max(spread + reach, _floor(len(differences))))
    significant = abs(drift) > 2 * spread + _FLOOR_NS
    return _Edge(source, to, int(np.median(residuals)), uncertainty, len(differences)), \
        drift if significant else None


def _place_by_collectives(ranks: list[RankClock], edges: list[_Edge]) -> list[bool]:
    """Offsets along the least uncertain paths from each connected set's lowest position
    (Dijkstra on variances); which ranks the collectives placed."""
    neighbours: dict[int, list[tuple[int, int, int]]] = {}
    for edge in edges:
        neighbours.setdefault(edge.source, []).append((edge.to, edge.difference, edge.spread))
        neighbours.setdefault(edge.to, []).append((edge.source, -edge.difference, edge.spread))
        for position in (edge.source, edge.to):  # how many of its collectives others shared
            ranks[position].evidence[COLLECTIVE] = max(ranks[position].evidence[COLLECTIVE], edge.count)
    placed = [False] * len(ranks)
    variance = [math.inf] * len(ranks)
    for root in range(len(ranks)):
        if placed[root] or root not in neighbours:
            continue
        variance[root] = 0.0
        queue = [(0.0, root, 0)]
        while queue:
            spent, position, offset = heappop(queue)
            if placed[position]:
                continue
            placed[position] = True
            ranks[position].offset_ns = offset
            ranks[position].uncertainty_ns = int(math.sqrt(spent)) if position != root else 0
            for to, difference, spread in neighbours.get(position, []):
                total = spent + float(spread) ** 2
                if not placed[to] and total < variance[to]:
                    variance[to] = total
                    heappush(queue, (total, to, offset + difference))
    return placed


def _intervals(bounds: list[Bound]) -> dict[tuple[int, int], list[float]]:
    """Per ordered pair (a, b) with a < b: [lowest, highest] clock of b minus clock of a that
    their transfers allow."""
    found: dict[tuple[int, int], list[float]] = {}
    for bound in bounds:
        # The receive was done no earlier than the send began: done + c_receiver >= start + c_sender.
        low = bound.start - bound.done  # c_receiver - c_sender >= low
        a, b = sorted((bound.sender, bound.receiver))
        interval = found.setdefault((a, b), [-math.inf, math.inf])
        if bound.receiver == b:
            interval[0] = max(interval[0], low)
        else:
            interval[1] = min(interval[1], -low)
    return found


def _place_by_bounds(ranks: list[RankClock], placed: list[bool], intervals: dict[tuple[int, int], list[float]]
                     ) -> None:
    """Ranks the collectives left alone, placed from a placed neighbour (or, in a set with none,
    its lowest position): the middle of the interval their transfers allow, else the prior
    moved just inside a one-sided bound."""
    neighbours: dict[int, list[tuple[int, float, float]]] = {}
    for (a, b), (low, high) in intervals.items():
        neighbours.setdefault(a, []).append((b, low, high))
        neighbours.setdefault(b, []).append((a, -high, -low))
    frontier = [position for position, done in enumerate(placed) if done]
    for root in [*frontier, *range(len(ranks))]:
        if not placed[root]:
            placed[root] = True  # no placed neighbour: keeps its prior, the reference of its neighbours
            ranks[root].uncertainty_ns = 0 if root in neighbours else None
            frontier.append(root)
        while frontier:
            position = frontier.pop()
            for to, low, high in neighbours.get(position, []):
                if placed[to]:
                    continue
                placed[to] = True
                frontier.append(to)
                own, prior = ranks[position], -ranks[position].offset_ns  # keeps its base: c_to = 0
                relative = (low + high) / 2 if math.isfinite(low + high) else min(max(prior, low), high)
                width = (high - low) / 2 if math.isfinite(low + high) else None
                ranks[to].offset_ns = own.offset_ns + int(relative)
                ranks[to].uncertainty_ns = None if width is None or own.uncertainty_ns is None \
                    else own.uncertainty_ns + int(width)


def _check_bounds(clocks: Clocks, bounds: list[Bound], labels: list[str]) -> None:
    """A warning where the estimate leaves a receive done before its send began."""
    worst: dict[tuple[int, int], int] = {}
    for bound in bounds:
        early = (bound.start + clocks.ranks[bound.sender].offset_ns) - (bound.done + clocks.ranks[bound.receiver].offset_ns)
        if early > 0:
            key = (bound.sender, bound.receiver)
            worst[key] = max(worst.get(key, 0), early)
    for (sender, receiver), early in sorted(worst.items()):
        clocks.warnings.append(f"{labels[receiver]}: a receive from {labels[sender]} is done up to "
                               f"{early / 1000:.1f} us before its send began, even after alignment")
