"""The critical path of each step: the chain of work that set the step time, across a merge's
ranks or within one compacted trace.

A merge's ranks are joined by a pipeline's arrows or by their collectives (data-parallel
ranks); a trace on its own is one rank. A step's work is what ran inside it (from its first
rank's ProfilerStep start to its last one's end) and, in a trace on its own, the GPU work its
CPU calls launched, which runs on after the CPU's step ends where nothing synchronises (a
merge's step ends with its last rank's). The walk starts at the last node of
the step's work to end (across ranks; GPU work where the step has any) and goes backwards: at each node it
takes, of the node's predecessors (work_graph.py: same track, launch, arrival, the last rank to
start a collective), the one that was ready last, until it reaches the step's start; a rank
still in the previous step is followed there and cut at the step's start. Where the
predecessor was ready before the node began, the gap is named for what it was (untraced time
on the thread, a stream idle, a transfer queued on another thread); where data arrived while a
receive ran, the receive ran on from the arrival, and the path crosses to the send on the other
rank (a collective kernel, to its last rank's kernel, from that one's start). So the segments
tile the path with no gap or overlap, on the merge's one clock. The path is derived: inferred
from the measured slices, which name no dependency.

The path is written into the trace as extra tracks (one per rank, role critical_path, under one
group: at the top of a merge's pipeline, or at the top of a compacted trace) whose slices copy
the names and times of the segments: the measured slices themselves stay where they are,
unchanged.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Optional, Sequence

import enum

import msgspec
import numpy as np

from ..model import CounterSample, RankIdentity, Trace, Track, TrackRole, derived
from .activity import COMPUTING, OTHER_WORK, PATH_SCALE, highest_levels
from .work_graph import COMPUTE, KINDS, LAUNCH, TRANSFER, WAIT, RankWork

GROUP_NAME = "Critical path (per step)"  # short: a counter's row has less room for its title
IN_FLIGHT = "in flight"  # a transfer between its send's end and its arrival
UNTRACED_BEFORE = "untraced: before the rank's first traced work"  # a path that reaches a rank's first node
UNRANKED_ROW = "this trace"  # the path's row in a trace that names no rank
_ROWS_PER_RANK = 16  # a rank's rows in the group: its own, then overlap layers
_LEVELS = {COMPUTE: COMPUTING, TRANSFER: OTHER_WORK, LAUNCH: OTHER_WORK, WAIT: 0.0}  # the group row's counter


class Segment(NamedTuple):
    position: int  # the rank's place in the merge
    kind: str      # one of work_graph.KINDS
    name: str      # the work's slice name, or what was waited for
    start: int
    end: int
    peer: int = -1  # for work that ran on from another rank's, that rank's place in the merge
    held_by: str = ""  # how: its data came ("data from"), or its collective's last kernel began ("held up by")


class StepPath(msgspec.Struct, frozen=True):
    step: int
    start: int   # the step's start across ranks (its first ProfilerStep#N)
    end: int     # when the last work of the step ended
    segments: tuple[Segment, ...]


class _Graph:
    """Every rank's nodes in one set of columns (global node numbers), with the edges resolved."""

    def __init__(self, ranks: list[RankWork]):
        sizes = [len(work) for work in ranks]
        self._ranks, self._offsets = ranks, np.cumsum([0] + sizes).tolist()
        self.start = np.concatenate([work.start for work in ranks])
        self.end = np.concatenate([work.end for work in ranks])
        self.kind = np.concatenate([work.kind for work in ranks])
        self.gpu = np.concatenate([work.gpu for work in ranks])
        self.position = np.repeat(np.arange(len(ranks)), sizes)
        self.waited = self._global_nodes([work.waited for work in ranks])
        self.launch = self._global_nodes([work.launch for work in ranks])
        self.previous = _previous_on_track(_apart([work.track for work in ranks]), self.start, self.end)
        self.previous_on_device = _previous_on_track(_apart([work.device for work in ranks]), self.start, self.end)
        sends = {flow: node + offset for work, offset in zip(ranks, self._offsets) for flow, node in work.sends.items()}
        # node -> (when it could go on, the node on another rank it waited for, how)
        self.arrivals: dict[int, list[tuple[int, int, _Relation]]] = {}
        for work, offset in zip(ranks, self._offsets):
            for flow, node, at in work.arrivals:
                if flow in sends:
                    self.arrivals.setdefault(node + offset, []).append((at, sends[flow], _Relation.ARRIVAL))
        self._join_collectives(ranks)

    def _join_collectives(self, ranks: list[RankWork]) -> None:
        """Each collective kernel waits for the last of its partners' kernels to start."""
        partners: dict[tuple[str, str, int], list[int]] = {}
        for work, offset in zip(ranks, self._offsets):
            for node, key in work.collectives.items():
                partners.setdefault(key, []).append(node + offset)
        for nodes in partners.values():
            last = max(nodes, key=lambda node: (int(self.start[node]), node))
            for node in nodes:
                if int(self.position[node]) != int(self.position[last]):
                    self.arrivals.setdefault(node, []).append((int(self.start[last]), last, _Relation.COLLECTIVE))

    def _global_nodes(self, per_rank: list[np.ndarray]) -> np.ndarray:
        """Each rank's node numbers (-1: none) as numbers among all ranks' nodes."""
        return np.concatenate([np.where(nodes >= 0, nodes + offset, -1) for nodes, offset in zip(per_rank, self._offsets)])

    def name(self, node: int) -> str:
        position = int(self.position[node])
        work = self._ranks[position]
        return work.names[int(work.name[node - self._offsets[position]])]


def _apart(per_rank: list[np.ndarray]) -> np.ndarray:
    """Each rank's track (or device) codes, numbered so that no two ranks share one."""
    offsets = np.cumsum([0] + [int(codes.max(initial=-1)) + 1 for codes in per_rank]).tolist()
    return np.concatenate([codes + offset for codes, offset in zip(per_rank, offsets)])


def _previous_on_track(tracks: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per node, the node of its track that ended last at or before it began (-1: none)."""
    previous = np.full(len(starts), -1, np.int64)
    order = np.lexsort((ends, tracks))
    sorted_tracks, sorted_ends = tracks[order], ends[order]
    bounds = np.flatnonzero(np.diff(sorted_tracks)) + 1
    for first, last in zip([0, *bounds.tolist()], [*bounds.tolist(), len(order)]):
        members = order[first:last]
        found = np.searchsorted(sorted_ends[first:last], starts[members], "right") - 1
        previous[members] = np.where(found >= 0, members[np.maximum(found, 0)], -1)
    return previous


def critical_paths(ranks: list[RankWork]) -> list[StepPath]:
    """Each step's critical path, for the steps every rank that names steps names alike: within
    one rank's trace, or across several ranks that arrows or collectives join."""
    named = [work.steps for work in ranks if work.steps]
    if not named:
        return []
    graph = _Graph(ranks)
    if len(ranks) > 1 and not graph.arrivals:  # no arrow or collective joins the ranks: no path runs across them
        return []
    steps = sorted(set.intersection(*(set(steps) for steps in named)))
    return [path for path in (_walk(graph, step, min(s[step][0] for s in named), max(s[step][1] for s in named),
                                    launched=len(ranks) == 1) for step in steps) if path is not None]


def _walk(graph: _Graph, step: int, first: int, last: int, launched: bool) -> Optional[StepPath]:
    """The path of the step from `first` to `last`, built backwards from its last work (with
    the GPU work its calls `launched`, where asked: _step_work). It
    follows a rank back past `first` where the rank was still in the previous step, and is cut
    there; a rank with nothing before (its first traced work) waits from `first`. A node already
    on the path ends the walk, so it ends on any graph."""
    inside = _step_work(graph, first, last, launched)
    on_gpu = inside[graph.gpu[inside]]
    if len(on_gpu):  # the GPUs' work sets the step; the CPU's last op often only waits for it
        inside = on_gpu
    if not len(inside):
        return None
    node = int(inside[np.argmax(graph.end[inside])])
    end = cursor = int(graph.end[node])
    segments: list[Segment] = []
    seen: set[int] = set()
    while cursor > first:
        seen.add(node)
        start, position = int(graph.start[node]), int(graph.position[node])
        if int(graph.end[node]) < cursor:  # a send whose data arrived after it ended
            segments.append(Segment(position, TRANSFER, IN_FLIGHT, int(graph.end[node]), cursor))
            cursor = int(graph.end[node])
        edge = _ready(graph, node, cursor)
        if edge.node is not None and edge.ready > start:  # it ran on from the arrival, or from the GPU's end
            held_by = _HELD_BY.get(edge.relation) if edge.relation is not None else None
            crossed = held_by is not None
            peer = int(graph.position[edge.node]) if crossed else -1
            name = graph.name(node)
            if edge.relation is _Relation.WAITED:
                name = f"{name}: wait for {graph.name(edge.node)}"
            segments.append(Segment(position, TRANSFER if crossed else KINDS[graph.kind[node]], name,
                                    edge.ready, cursor, peer, held_by or ""))
            cursor = edge.ready
        else:
            segments.append(Segment(position, KINDS[graph.kind[node]], graph.name(node), min(start, cursor), cursor))
            cursor = min(start, cursor)
            if edge.node is None or edge.node in seen:
                what = UNTRACED_BEFORE if edge.node is None else \
                    f"could not tell: the work before loops back to {graph.name(edge.node)}"
                segments.append(Segment(position, WAIT, what, min(first, cursor), cursor))
                break
            if edge.ready < cursor:
                segments.append(_gap(graph, node, edge, cursor))
                cursor = edge.ready
        node = edge.node
    segments.reverse()  # only the first few can begin before the step (a rank still in the previous one)
    return StepPath(step, first, end, tuple(s if s.start >= first else s._replace(start=first)
                                            for s in segments if s.end > max(s.start, first)))


def _step_work(graph: _Graph, first: int, last: int, launched: bool) -> np.ndarray:
    """The nodes of the step from `first` to `last`: those that ran inside it, and where
    `launched`, the GPU work a call inside it launched (queued by the step, it runs on past a
    CPU's step end)."""
    inside = (graph.start >= first) & (graph.end <= last)
    if launched:
        launch_start = graph.start[np.maximum(graph.launch, 0)]
        inside |= (graph.launch >= 0) & (launch_start >= first) & (launch_start < last)
    return np.flatnonzero(inside)


class _Relation(enum.Enum):
    """How a node depends on its predecessor on the path."""

    TRACK = "track"        # the work before it on its stream or thread
    LAUNCH = "launch"      # the CPU call that launched it
    WAITED = "waited"      # the GPU work a synchronisation waited for
    DEVICE = "device"      # the work before it on another stream or thread of its device
    ARRIVAL = "arrival"    # data sent by another rank
    COLLECTIVE = "collective"  # the last rank's kernel of a collective to start


_HELD_BY = {_Relation.ARRIVAL: "data from", _Relation.COLLECTIVE: "held up by"}


class _Edge(NamedTuple):
    ready: int             # when the predecessor let the node run (-1: no predecessor)
    node: Optional[int]
    relation: Optional[_Relation]


def _gap(graph: _Graph, node: int, edge: _Edge, cursor: int) -> Segment:
    """The time between a predecessor's end and the node that followed it, on the node's rank,
    saying what it was. A transfer that another stream or thread started (a collective DDP's
    reducer hands to gloo's thread) was queued in its backend: time of the transfer. Else a wait
    for the predecessor: nothing traced ran on the node's stream or thread."""
    assert edge.node is not None
    position, name, gpu = int(graph.position[node]), graph.name(edge.node), bool(graph.gpu[edge.node])
    if edge.relation is _Relation.DEVICE and KINDS[graph.kind[node]] == TRANSFER:
        return Segment(position, TRANSFER, f"{graph.name(node)} queued after {name} on another "
                                           f"{'stream' if gpu else 'thread'}", edge.ready, cursor)
    if edge.relation is _Relation.TRACK:
        what = f"stream idle after {name}" if gpu else f"untraced time on the thread after {name}"
    elif edge.relation is _Relation.DEVICE:
        what = f"wait for {name} on another {'stream' if gpu else 'thread'}"
    elif edge.relation is _Relation.LAUNCH:
        what = f"queued on the GPU after its launch by {name}"
    else:
        what = f"wait for {name}"
    return Segment(position, WAIT, what, edge.ready, cursor)


def _ready(graph: _Graph, node: int, cursor: int) -> _Edge:
    """The predecessor ready last (same track, then launch or the GPU work a synchronisation
    waited for, then the device's other streams or threads, then an arrival on a tie): when it
    was ready (no later than `cursor`), which node, and how the node depends on it. An arrival
    counts only while the node ran (at or before its start, the data was there before the
    receiver came to it)."""
    start = int(graph.start[node])
    best = _Edge(-1, None, None)
    previous = int(graph.previous[node])
    if previous >= 0:
        best = _Edge(int(graph.end[previous]), previous, _Relation.TRACK)
    launch, waited = int(graph.launch[node]), int(graph.waited[node])
    if launch >= 0 and min(int(graph.end[launch]), start) > best.ready:  # a kernel waits for no more than its launch to begin
        best = _Edge(min(int(graph.end[launch]), start), launch, _Relation.LAUNCH)
    if waited >= 0 and min(int(graph.end[waited]), cursor) > best.ready:
        best = _Edge(min(int(graph.end[waited]), cursor), waited, _Relation.WAITED)
    on_device = int(graph.previous_on_device[node])
    if on_device >= 0 and int(graph.end[on_device]) > best.ready:
        best = _Edge(int(graph.end[on_device]), on_device, _Relation.DEVICE)
    for at, sender, relation in graph.arrivals.get(node, []):
        if start < at <= cursor and at > best.ready:
            best = _Edge(at, sender, relation)
    return best


def _level_runs(paths: list[StepPath]) -> Iterator[tuple[int, int, float]]:
    """Each path's segments as (start, end, counter level), adjacent ones of one level joined:
    the same levels, in fewer spans for highest_levels to sort."""
    for path in paths:
        run: Optional[tuple[int, int, float]] = None
        for segment in path.segments:
            level = _LEVELS[segment.kind]
            if run is not None and run[2] == level and run[1] == segment.start:
                run = (run[0], segment.end, level)
                continue
            if run is not None:
                yield run
            run = (segment.start, segment.end, level)
        if run is not None:
            yield run


def add_path_tracks(root: Trace, parent: Optional[Track], paths: list[StepPath],
                    ranks: Sequence[Optional[RankIdentity]]) -> int:
    """The paths as slices on extra tracks under `parent` (None: at the top): a group, then a
    row per rank in merge order; each slice's args say its kind, step and rank (where the trace
    names one: a trace on its own may name none). A rank's steps overlap where its neighbours' do (a pipeline's ranks start a step at different times), and one row's slices
    must not, so a step that would overlap the row's last goes to a second row of the rank
    (its overlap layer). How many slices."""
    if not paths:
        return 0
    # Collapsed, the group's own row draws what the path does, a counter: a row of rows draws nothing.
    group = root.add_track(Track(name=GROUP_NAME, parent=parent, orders_children=True, is_counter=True,
                                 scale=PATH_SCALE))
    root.counters += [CounterSample(ts, level, group) for ts, level in highest_levels(_level_runs(paths))]
    layers: dict[int, list[tuple[Track, int]]] = {}  # position -> its rows and where each row's slices end
    encoder = msgspec.json.Encoder()
    placed: list[tuple[Segment, str, Track, bytes]] = []  # each slice, added at once at the end
    for path in paths:
        by_rank: dict[int, list[Segment]] = {}
        for segment in path.segments:
            by_rank.setdefault(segment.position, []).append(segment)
        for position, segments in by_rank.items():
            identity = ranks[position]
            rows = layers.setdefault(position, [])
            layer = next((k for k, (_, end) in enumerate(rows) if end <= segments[0].start), len(rows))
            if layer == len(rows):
                home = rows[0][0] if rows else None
                rows.append((root.add_track(Track(name=identity.title if identity else UNRANKED_ROW, parent=group,
                                                  order=(position + 1) * _ROWS_PER_RANK + layer,
                                                  role=TrackRole.CRITICAL_PATH, home=home, layer=layer)), 0))
            track = rows[layer][0]
            rows[layer] = (track, segments[-1].end)
            for segment in segments:
                fields: dict[str, object] = {"kind": segment.kind, "step": path.step}
                if identity is not None:
                    fields.update(pp_rank=identity.pp_rank, global_rank=identity.global_rank)
                name = segment.name
                peer = ranks[segment.peer] if segment.peer >= 0 else None
                if peer is not None:
                    fields["from_global_rank"] = peer.global_rank
                    name = f"{name}: {segment.held_by} {peer.title}"
                placed.append((segment, name, track, encoder.encode(fields)))
    starts = np.fromiter((segment.start for segment, _, _, _ in placed), np.int64, len(placed))
    ends = np.fromiter((segment.end for segment, _, _, _ in placed), np.int64, len(placed))
    first_args = root.args.add_many([fields for _, _, _, fields in placed])
    root.slices.extend(starts, ends - starts, [name for _, name, _, _ in placed], [derived.CRITICAL_PATH] * len(placed),
                       np.arange(first_args, first_args + len(placed)), [track for _, _, track, _ in placed])
    return len(placed)
