"""A rank's work as a dependency graph in columns, for its critical path (a merge's, or one
compacted trace's).

Nodes cover every moment of work, so no time spent inside an op can fall between nodes:

- GPU work (a kernel, copy or set) is a node;
- a CPU op or runtime call is one node per piece of its own time (its span less its children's
  on its thread), named after it: a parent's time around its children is its own work, never
  a gap;
- where no op runs on a thread but a communication span is open (gloo's transport spans of a
  receive or send outlive the op that started them), that time is a node of the span: the
  thread is waiting in a transfer.

Annotations are containers, not nodes; a synchronisation is a node that waits. Each node's kind
says what its time is (compute, launch, transfer, wait): a piece inside a communication op is a
transfer, a piece inside an op the report counts as compute (kineto.is_cpu_compute) is compute.
Each rank's nodes come from pass two of a merge, on the pipeline's clock, or from a compacted
trace on its own, with these edges into a node:

- its same-track predecessor: the node of its stream or thread that ended last before it began;
- the node of its device (any stream of its GPU, any thread of its rank's CPU) that ended last
  before it began: a stream that waits for an event of another (cudaStreamWaitEvent), or a
  thread woken by another (autograd's backward thread), names no event in the trace, and the
  work that ended just before is what it most likely waited for;
- its launch: the CPU call whose arrow (`cudaLaunchKernel`, `cudaGraphLaunch` -> each kernel of
  the replay) started it;
- a synchronisation's wait: the GPU node it waited for (the last of its rank to end in it);
- an arrival: a cross-rank arrow (a transfer, or a SEND block to its RECV) whose data reached
  the node's track at a known time, from the sending node on another rank;
- a collective's partners: an NCCL collective kernel ends no earlier than the last of its
  ranks' kernels of that collective starts; a rank's k-th collective of a kind on a channel
  is the others' k-th (NCCL runs a communicator's collectives in one order on every rank, and
  traces that name no process group still agree on it).

Nothing here moves or changes a slice: the graph is read from the rank's trace.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple, Optional

import msgspec
import numpy as np

from .. import kineto
from ..model import LaneKind, Trace, Track, TrackRole, derived
from ..model.args import decode_json

# A segment of a critical path is one of the derived path kinds (wait: nothing of the path ran).
KINDS = derived.PATH_KINDS  # a node's kind is its index here
COMPUTE, TRANSFER, LAUNCH, WAIT = KINDS
_OLD_CATEGORIES = {"Operator": kineto.CPU_OP_CATEGORY, "Runtime": "cuda_runtime"}  # 2021 traces' names for them
_CPU_WORK = (*kineto.OP_CATEGORIES, *kineto.RUNTIME_CATEGORIES)
# Calls that wait for the GPU or for another stream: time spent waiting, never work.
_SYNCHRONISATIONS = frozenset({*kineto.HOST_SYNCHRONISATIONS, "cudaStreamWaitEvent"})


class RankWork(msgspec.Struct):
    """One rank's nodes as columns (index = node), their names, and its ends of cross-rank arrows.
    (A msgspec Struct, not a dataclass: a one-trace compact builds one, and loads no dataclasses.)"""

    start: np.ndarray    # int64 ns, on the pipeline's clock
    end: np.ndarray
    track: np.ndarray    # int64: which of the rank's work tracks (a lane, a thread) it runs on
    name: np.ndarray     # int64: index into `names`
    kind: np.ndarray     # int8: index into KINDS
    launch: np.ndarray   # int64: the node that launched it, -1 for none
    gpu: np.ndarray      # bool: GPU work (a kernel, copy or set)
    device: np.ndarray   # int64: where it ran: a GPU node's GPU (its lanes' container), else the rank's CPU
    waited: np.ndarray   # int64: for a synchronisation, the GPU node it waited for (the last to end in it), else -1
    names: list[str]
    sends: dict[int, int] = msgspec.field(default_factory=dict)              # flow id -> sending node
    arrivals: list[tuple[int, int, int]] = msgspec.field(default_factory=list)  # (flow id, receiving node, arrival time)
    steps: dict[int, tuple[int, int]] = msgspec.field(default_factory=dict)  # ProfilerStep number -> (start, end)
    # node -> (channel, kind, k): its k-th NCCL collective kernel of a kind on a channel, which
    # every rank in the collective runs as its own k-th (clock.find_collectives' channels)
    collectives: dict[int, tuple[str, str, int]] = msgspec.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.start)


def _work_track(track: Track) -> Track:
    """The track whose work an annotation row or overlap track stands above: its home."""
    return track.home if track.role in (TrackRole.ANNOTATIONS, TrackRole.OVERLAP) and track.home else track


def _lane_kind(track: Track) -> Optional[LaneKind]:
    group = _work_track(track).group
    return group.kind if group is not None else None


def rank_work(trace: Trace, with_partners: bool = True) -> RankWork:
    """The rank's work graph, read after its arrow ends are attached (trace.flow_ends);
    `with_partners`: key its NCCL collective kernels to match other ranks' (a merge's; a trace
    on its own has no partners to join, and its compact does not load the clock's machinery)."""
    table = trace.slices
    texts = table.texts
    gpu_category = np.fromiter((text in kineto.GPU_CATEGORIES for text in texts), np.bool_, len(texts))
    cpu_category = np.fromiter((text in _CPU_WORK for text in texts), np.bool_, len(texts))
    spanned = ~table.instant & (table.dur > 0)
    work_ids, _ = table.track_keys(lambda track: id(_work_track(track)))
    gpus, _ = table.track_keys(lambda track: id(_work_track(track).parent or _work_track(track)))
    gpu_rows = _leaves(table.track, table.ts, table.dur, np.flatnonzero(gpu_category[table.cat] & spanned))
    ops = np.flatnonzero(cpu_category[table.cat] & spanned)
    op_pieces = _self_time(work_ids[table.track[ops]], table.ts[ops], table.end[ops])
    communication_name = np.fromiter((kineto.is_communication_op(text) for text in texts), np.bool_, len(texts))
    gpu_side = np.fromiter((text in kineto.GPU_CATEGORIES or text in kineto.GPU_ANNOTATION_CATEGORIES
                            for text in texts), np.bool_, len(texts))
    spans = np.flatnonzero(communication_name[table.name] & ~cpu_category[table.cat] & ~gpu_side[table.cat] & spanned)
    receive_name = np.fromiter((text.startswith(kineto.RECEIVE_OPS) for text in texts), np.bool_, len(texts))
    span_pieces = _uncovered(work_ids[table.track[spans]], table.ts[spans], table.end[spans],
                             receive_name[table.name[spans]], work_ids[table.track[ops]], table.ts[ops], table.end[ops])
    owner = np.concatenate([gpu_rows, ops[op_pieces.owner], spans[span_pieces.owner]])
    gpu_start, gpu_end = table.spans(gpu_rows)
    start = np.concatenate([gpu_start, op_pieces.start, span_pieces.start])
    end = np.concatenate([gpu_end, op_pieces.end, span_pieces.end])
    gpu = np.zeros(len(owner), np.bool_)
    gpu[:len(gpu_rows)] = True
    node_of = np.full(len(table), -1, np.int64)
    np.maximum.at(node_of, owner, np.arange(len(owner)))  # an op's last piece stands for it (pieces are in time order)
    lanes = work_ids[table.track[owner]]
    track = _streams(trace, owner, gpu, lanes, gpus[table.track[owner]])
    launch = np.full(len(owner), -1, np.int64)
    sources, targets = trace.flow_rows()
    if len(sources):
        launches = (node_of[sources] >= 0) & (node_of[targets] >= 0) & ~gpu_category[table.cat[sources]] \
            & gpu_category[table.cat[targets]]
        launch[node_of[targets[launches]]] = node_of[sources[launches]]
    synchronising = np.fromiter((text in _SYNCHRONISATIONS for text in texts), np.bool_, len(texts))[table.name[owner]]
    kind = _kinds(trace, owner, gpu, launch, ops, op_pieces)
    kind[synchronising] = KINDS.index(WAIT)
    waited = _waited(start, end, gpu, synchronising)
    copying = np.fromiter((text in kineto.GPU_CATEGORIES and text not in kineto.KERNEL_CATEGORIES
                           for text in texts), np.bool_, len(texts))[table.cat[owner]] & gpu
    calls, copies = _blocking_copies(start, end, launch, copying)
    # Such a call synchronises: it waits, from its start, for its copy and the stream's work
    # before it; the copy then depends on that work, not on a launch still running.
    kind[calls] = KINDS.index(WAIT)
    waited[calls] = copies
    launch[copies] = -1
    names, name = np.unique(table.name[owner], return_inverse=True)
    work = RankWork(start, end, track, name.astype(np.int64), kind, launch, gpu,
                    np.where(gpu, gpus[table.track[owner]], int(gpus.max(initial=-1)) + 1),
                    waited, [texts[i] for i in names.tolist()])
    receiving = np.where(gpu, kind == KINDS.index(TRANSFER), receive_name[table.name[owner]])
    _arrow_ends(trace, work, lanes, work_ids, node_of, receiving)
    if with_partners:
        work.collectives = _collectives(trace, work)
    for slice_ in table.rows(table.named(lambda text: kineto.profiler_step(text) is not None)):
        if slice_.cat not in kineto.GPU_ANNOTATION_CATEGORIES:
            number = kineto.profiler_step(slice_.name)
            assert number is not None
            known = work.steps.get(number, (slice_.ts, slice_.end))
            work.steps[number] = (min(known[0], slice_.ts), max(known[1], slice_.end))
    return work


class _Pieces(NamedTuple):
    """Pieces of time, each owned by one of the slices they were cut from (`owner`: its index
    among them), in time order per track; `parent` (per slice: its enclosing slice, -1 for
    none) where the slices nest."""

    owner: np.ndarray
    start: np.ndarray
    end: np.ndarray
    parent: np.ndarray


def _self_time(tracks: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> _Pieces:
    """Nested slices (a thread's calls) cut into their own time: the moments where each is the
    innermost open on its track. A sweep over the starts and ends in order: the count of open
    slices after each event is the innermost's depth, and the innermost is the last slice to
    start at that depth, so each piece's owner (and each slice's parent) is a binary search among
    the starts of one depth; n log n."""
    count = len(starts)
    index = np.arange(count)
    times = np.concatenate([starts, ends])
    opening = np.concatenate([np.ones(count, np.int8), np.zeros(count, np.int8)])
    # At one time ends come first; of starts the outer (longer, then earlier row) first; of ends the inner.
    order = np.lexsort((np.concatenate([index, -index]), np.concatenate([-ends, -starts]), opening, times,
                        np.concatenate([tracks, tracks])))
    slice_of = np.concatenate([index, index])[order]
    is_start = opening[order].astype(np.bool_)
    depth = np.cumsum(np.where(is_start, 1, -1))  # each track's events balance, so the count restarts at 0
    starts_by_depth: dict[int, np.ndarray] = {}
    start_events = np.flatnonzero(is_start)
    for level in np.unique(depth[start_events]).tolist():
        starts_by_depth[level] = start_events[depth[start_events] == level]

    def last_start(events: np.ndarray, levels: np.ndarray) -> np.ndarray:
        """Per event, the slice that started last at or before it at the given depth."""
        found = np.full(len(events), -1, np.int64)
        for level, at_level in starts_by_depth.items():
            wanted = np.flatnonzero(levels == level)
            position = np.searchsorted(at_level, events[wanted], "right") - 1
            found[wanted] = np.where(position >= 0, slice_of[at_level[np.maximum(position, 0)]], -1)
        return found

    event_times, event_tracks = times[order], np.concatenate([tracks, tracks])[order]
    piece = np.flatnonzero((depth[:-1] > 0) & (event_times[1:] > event_times[:-1])
                           & (event_tracks[1:] == event_tracks[:-1]))
    parent = np.full(count, -1, np.int64)
    parent[slice_of[start_events]] = last_start(start_events, depth[start_events] - 1)
    return _Pieces(last_start(piece, depth[piece]), event_times[piece], event_times[piece + 1], parent)


def _uncovered(tracks: np.ndarray, starts: np.ndarray, ends: np.ndarray, preferred: np.ndarray,
               op_tracks: np.ndarray, op_starts: np.ndarray, op_ends: np.ndarray) -> _Pieces:
    """The time of spans (gloo's transport spans, which need not nest with the ops) where no op
    runs on their track, each moment owned by the span that began last of those open then, a
    `preferred` one (a receive: a thread with a send in flight and a receive open waits for the
    receive) before any other. A sweep over the spans' and ops' bounds with a heap of the open
    spans; n log n."""
    owners: list[int] = []
    piece_starts: list[int] = []
    piece_ends: list[int] = []
    for track in np.unique(tracks).tolist():
        mine = np.flatnonzero(tracks == track)
        on_track = op_tracks == track
        busy_starts, busy_ends = _union(op_starts[on_track], op_ends[on_track])
        bounds = np.unique(np.concatenate([starts[mine], ends[mine], busy_starts, busy_ends]))
        bounds = bounds[(bounds >= starts[mine].min()) & (bounds <= ends[mine].max())]
        opened = mine[np.lexsort((mine, starts[mine]))]
        position = np.searchsorted(busy_starts, bounds[:-1], "right") - 1
        covered = (position >= 0) & (busy_ends[np.maximum(position, 0)] >= bounds[1:]) if len(busy_starts) \
            else np.zeros(len(bounds) - 1, np.bool_)
        open_spans: list[tuple[bool, int, int, int]] = []  # (not preferred, -start, -index, span)
        next_span = 0
        for left, right, busy in zip(bounds[:-1].tolist(), bounds[1:].tolist(), covered.tolist()):
            while next_span < len(opened) and starts[opened[next_span]] <= left:
                span = int(opened[next_span])
                heapq.heappush(open_spans, (not preferred[span], -int(starts[span]), -span, span))
                next_span += 1
            while open_spans and ends[open_spans[0][3]] <= left:
                heapq.heappop(open_spans)
            if open_spans and not busy:
                if owners and owners[-1] == open_spans[0][3] and piece_ends[-1] == left:
                    piece_ends[-1] = right
                else:
                    owners.append(open_spans[0][3])
                    piece_starts.append(left)
                    piece_ends.append(right)
    return _Pieces(np.array(owners, np.int64), np.array(piece_starts, np.int64), np.array(piece_ends, np.int64),
                   np.full(len(starts), -1, np.int64))


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals merged into sorted, disjoint ones (touching ones join)."""
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], np.maximum.accumulate(ends[order])
    new = np.concatenate([[True], starts[1:] > ends[:-1]])
    last = np.concatenate([np.flatnonzero(new)[1:] - 1, [len(starts) - 1]])
    return starts[new], ends[last]


class _StreamRule:
    """A GPU slice's stream from its args (Kineto's `stream`, else an exporter's `original_stream`)."""

    marker = b'"stream"'

    @staticmethod
    def label(text: bytes) -> Optional[str]:
        args = decode_json(text)
        stream = args.get("original_stream", args.get("stream")) if isinstance(args, dict) else None
        return None if stream is None else str(stream)


def _streams(trace: Trace, rows: np.ndarray, on_gpu: np.ndarray, tracks: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """The work track of each node: a GPU node's stream on its GPU (a lane gathers several
    streams' work, and only a stream runs its work in order), else its own track."""
    gpu_rows = rows[on_gpu]
    streams = trace.args_labels(gpu_rows, _StreamRule())
    keys: dict[tuple[int, object], int] = {}
    first = int(tracks.max(initial=-1)) + 1
    result = tracks.copy()
    result[on_gpu] = [keys.setdefault((gpu, stream) if stream is not None else (-1, lane), first + len(keys))
                      for lane, gpu, stream in zip(tracks[on_gpu].tolist(), gpus[on_gpu].tolist(), streams)]
    return result


def _leaves(tracks: np.ndarray, starts: np.ndarray, durations: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The rows (of `rows`) with no other of them inside on their track, in order: GPU work
    is flat on a stream, and where a lane holds a slice inside another, the inner one ran."""
    order = rows[np.lexsort((-durations[rows], starts[rows], tracks[rows]))]
    ends = starts[order] + durations[order]
    parent = np.zeros(len(order), np.bool_)
    parent[:-1] = (tracks[order][1:] == tracks[order][:-1]) & (starts[order][1:] < ends[:-1])
    return np.sort(order[~parent])


def _waited(starts: np.ndarray, ends: np.ndarray, gpu: np.ndarray, synchronising: np.ndarray) -> np.ndarray:
    """Per node, for a synchronisation the GPU node that ended last while it waited, else -1."""
    waited = np.full(len(starts), -1, np.int64)
    on_gpu = np.flatnonzero(gpu)
    by_end = on_gpu[np.argsort(ends[on_gpu], kind="stable")]
    syncs = np.flatnonzero(synchronising)
    found = np.searchsorted(ends[by_end], ends[syncs], "right") - 1
    hit = (found >= 0) & (ends[by_end[np.maximum(found, 0)]] >= starts[syncs]) if len(by_end) else found < -1
    waited[syncs[hit]] = by_end[found[hit]]
    return waited


def _blocking_copies(starts: np.ndarray, ends: np.ndarray, launch: np.ndarray,
                     copying: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CPU calls that waited for a copy or set they launched (cudaMemcpy, or an async one
    to pageable memory: the call returns once the copy is done, which waits for the work before
    it on its stream), each with that copy: a call whose copy began after it did and ended
    before it returned; the last copy to end where it launched several."""
    copies = np.flatnonzero(copying & (launch >= 0))
    calls = launch[copies]
    inside = (starts[calls] < starts[copies]) & (ends[copies] <= ends[calls])
    copies, calls = copies[inside], calls[inside]
    order = np.lexsort((ends[copies], calls))
    last = np.concatenate([calls[order][1:] != calls[order][:-1], [True]]) if len(order) else np.zeros(0, np.bool_)
    return calls[order][last], copies[order][last]


def _kinds(trace: Trace, owner: np.ndarray, on_gpu: np.ndarray, launch: np.ndarray, ops: np.ndarray,
           pieces: _Pieces) -> np.ndarray:
    """Each node's kind. GPU work on a communication lane transfers, other GPU work computes.
    A piece of a CPU call that launched GPU work launches; one inside a communication op (the
    op's own or a call it made) transfers, as does the time of a communication span; one
    inside an op the report counts as compute (kineto.is_cpu_compute) computes; a transfer's
    buffer outside any compute op transfers; the rest (runtime calls) computes."""
    table = trace.slices
    texts = table.texts
    transfer_names = np.fromiter((kineto.is_communication_op(text) for text in texts), np.bool_, len(texts))
    communication = table.track_mask(lambda track: _lane_kind(track) is LaneKind.COMMUNICATION)
    kind = np.full(len(owner), KINDS.index(TRANSFER), np.int8)  # a communication span's time, unless below
    gpu = np.flatnonzero(on_gpu)
    kind[gpu] = np.where(communication[table.track[owner[gpu]]], KINDS.index(TRANSFER), KINDS.index(COMPUTE))
    names, categories = table.name[ops], table.cat[ops]
    in_communication = transfer_names[names]
    buffer = np.fromiter((text.startswith(kineto.TRANSFER_BUFFERS) for text in texts), np.bool_, len(texts))[names]
    pairs, pair = np.unique(names.astype(np.int64) * len(texts) + categories, return_inverse=True)
    computing = np.fromiter((kineto.is_cpu_compute(texts[code // len(texts)],
                                                   _OLD_CATEGORIES.get(texts[code % len(texts)], texts[code % len(texts)]))
                             for code in pairs.tolist()), np.bool_, len(pairs))[pair]
    in_compute = computing.copy()
    nested = np.flatnonzero(pieces.parent >= 0)
    for _ in range(len(ops)):  # each round carries the flags one level down: as many rounds as levels
        carried = (in_communication | _inherited(in_communication, pieces.parent, nested),
                   in_compute | _inherited(in_compute, pieces.parent, nested))
        if np.array_equal(carried[0], in_communication) and np.array_equal(carried[1], in_compute):
            break
        in_communication, in_compute = carried
    op_kind = np.where(in_communication, KINDS.index(TRANSFER),
                       np.where(in_compute | ~buffer, KINDS.index(COMPUTE), KINDS.index(TRANSFER))).astype(np.int8)
    first_op = len(gpu)
    kind[first_op:first_op + len(pieces.owner)] = op_kind[pieces.owner]
    launching = np.zeros(len(owner), np.bool_)
    launching[launch[launch >= 0]] = True
    launching_rows = np.zeros(len(table), np.bool_)
    launching_rows[owner[launching]] = True
    kind[first_op:first_op + len(pieces.owner)][launching_rows[ops[pieces.owner]]] = KINDS.index(LAUNCH)
    return kind


def _inherited(flags: np.ndarray, parent: np.ndarray, nested: np.ndarray) -> np.ndarray:
    """Per slice, its parent's flag (False for a slice with no parent)."""
    result = np.zeros(len(flags), np.bool_)
    result[nested] = flags[parent[nested]]
    return result


def _collectives(trace: Trace, work: RankWork) -> dict[int, tuple[str, str, int]]:
    """The rank's NCCL collective kernels as clock.find_collectives finds them (per channel, in
    issue order), on their nodes: a kernel is the GPU node that ends when it does."""
    from .clock import find_collectives  # a merge's machinery: a one-trace compact never loads it

    on_gpu = np.flatnonzero(work.gpu)
    on_gpu = on_gpu[np.argsort(work.end[on_gpu], kind="stable")]
    found: dict[int, tuple[str, str, int]] = {}
    for channel, (kinds, ends) in find_collectives(trace).channels.items():
        at = np.searchsorted(work.end[on_gpu], ends, "left")
        hit = at < len(on_gpu)
        hit[hit] = work.end[on_gpu[at[hit]]] == ends[hit]
        seen: dict[str, int] = {}
        for kind, index, matched in zip(kinds, at.tolist(), hit.tolist()):
            k = seen[kind] = seen.get(kind, -1) + 1
            if matched:
                found[int(on_gpu[index])] = (channel, kind, k)
    return found


def _arrow_ends(trace: Trace, work: RankWork, lanes: np.ndarray, work_ids: np.ndarray, node_of: np.ndarray,
                receiving: np.ndarray) -> None:
    """The rank's ends of cross-rank arrows, on the nodes they stand for: a send's end on the
    last node to end inside its slice's span on its lane or thread; an arrival on the receiving
    node (a transfer on the GPU, a piece of a receive op or span on the CPU) of the receive's
    lane or thread that runs at the arrival, else the next to start: what waits for data is a
    receive, not the work that happens to run when it comes. A track's nodes do not overlap
    (lanes never do; a thread's pieces follow one another), so each end is a binary search."""
    table = trace.slices
    by_track: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for end in trace.flow_ends:
        slice_ = table.row(end.row)
        key = (int(work_ids[table.track[end.row]]), end.outgoing)
        if key not in by_track:
            nodes = np.flatnonzero((lanes == key[0]) & (receiving | end.outgoing))
            nodes = nodes[np.argsort(work.start[nodes], kind="stable")]
            by_track[key] = (nodes, work.start[nodes], work.end[nodes])
        nodes, starts, ends = by_track[key]
        if end.outgoing:
            node = int(node_of[end.row])
            last = int(np.searchsorted(ends, slice_.end, "right")) - 1
            if node < 0 and last >= 0 and starts[last] >= slice_.ts:
                node = int(nodes[last])
            if node >= 0:
                work.sends[end.flow_id] = node
            continue
        at = slice_.ts
        index = int(np.searchsorted(starts, at, "right")) - 1
        if index < 0 or ends[index] < at:
            index += 1  # nothing runs at the arrival: the next to start
        if index < len(nodes):
            work.arrivals.append((end.flow_id, int(nodes[index]), at))
