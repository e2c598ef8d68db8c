"""A merged pipeline's work as a dependency graph in columns, for its critical path.

Nodes are the slices that do work: GPU kernels, copies and sets, and the CPU ops and runtime
calls, the innermost only (an op's work is its innermost calls); annotations are containers,
not nodes, and a synchronisation is a node that waits. Each rank's nodes come from pass two of a
merge, on the pipeline's clock, with three kinds of edge into a node:

- its same-track predecessor: the node of its stream or thread that ended last before it began;
- the node of its device (any stream of its GPU, any thread of its rank's CPU) that ended last
  before it began: a stream that waits for an event of another (cudaStreamWaitEvent), or a
  thread woken by another (autograd's backward thread), names no event in the trace, and the
  work that ended just before is what it most likely waited for;
- its launch: the CPU call whose arrow (`cudaLaunchKernel`, `cudaGraphLaunch` -> each kernel of
  the replay) started it;
- a synchronisation's wait: the GPU node it waited for (the last of its rank to end in it);
- an arrival: a cross-rank arrow (a transfer, or a SEND block to its RECV) whose data reached
  the node's track at a known time, from the sending node on another rank.

Nothing here moves or changes a slice: the graph is read from the rank's trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .. import kineto
from ..model import LaneKind, Trace, Track, TrackRole
from ..model.args import decode_json

# A segment of a critical path is one of these kinds (wait: nothing of the path ran).
COMPUTE, TRANSFER, LAUNCH, WAIT = "compute", "transfer", "launch", "wait"
KINDS = (COMPUTE, TRANSFER, LAUNCH, WAIT)
_CPU_WORK = ("cpu_op", "cuda_runtime", "cuda_driver")
# Calls that wait for the GPU or for another stream: time spent waiting, never work.
_SYNCHRONISATIONS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                               "cudaStreamWaitEvent"})


@dataclass
class RankWork:
    """One rank's nodes as columns (index = node), their names, and its ends of cross-rank arrows."""

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
    sends: dict[int, int] = field(default_factory=dict)              # flow id -> sending node
    arrivals: list[tuple[int, int, int]] = field(default_factory=list)  # (flow id, receiving node, arrival time)
    steps: dict[int, tuple[int, int]] = field(default_factory=dict)  # ProfilerStep number -> (start, end)

    def __len__(self) -> int:
        return len(self.start)


def _work_track(track: Track) -> Track:
    """The track whose work an annotation row or overlap track stands above: its home."""
    return track.home if track.role in (TrackRole.ANNOTATIONS, TrackRole.OVERLAP) and track.home else track


def _lane_kind(track: Track) -> Optional[LaneKind]:
    group = _work_track(track).group
    return group.kind if group is not None else None


def rank_work(trace: Trace) -> RankWork:
    """The rank's work graph, read after its arrow ends are attached (trace.flow_ends)."""
    table = trace.slices
    texts = table.texts
    categories = np.fromiter((text in kineto.GPU_CATEGORIES or text in _CPU_WORK for text in texts), np.bool_,
                             len(texts))
    waits = np.fromiter((text in _SYNCHRONISATIONS for text in texts), np.bool_, len(texts))
    rows = _leaves(table.track, table.ts, table.dur,
                   np.flatnonzero(categories[table.cat] & ~table.instant & (table.dur > 0)))
    node_of = np.full(len(table), -1, np.int64)
    node_of[rows] = np.arange(len(rows))
    work_ids, _ = table.track_keys(lambda track: id(_work_track(track)))
    gpu = np.fromiter((text in kineto.GPU_CATEGORIES for text in texts), np.bool_, len(texts))[table.cat]
    gpus, _ = table.track_keys(lambda track: id(_work_track(track).parent or _work_track(track)))
    lanes = work_ids[table.track[rows]]
    track = _streams(trace, rows, gpu[rows], lanes, gpus[table.track[rows]])
    start, end = table.spans(rows)
    launch = np.full(len(rows), -1, np.int64)
    sources, targets = trace.flow_rows()
    if len(sources):
        launches = (node_of[sources] >= 0) & (node_of[targets] >= 0) & ~gpu[sources] & gpu[targets]
        launch[node_of[targets[launches]]] = node_of[sources[launches]]
    kind = _kinds(trace, rows, gpu[rows], launch)
    synchronising = waits[table.name[rows]]
    kind[synchronising] = KINDS.index(WAIT)
    names, name = np.unique(table.name[rows], return_inverse=True)
    work = RankWork(start, end, track, name.astype(np.int64), kind, launch, gpu[rows],
                    np.where(gpu[rows], gpus[table.track[rows]], int(gpus.max(initial=-1)) + 1),
                    _waited(start, end, gpu[rows], synchronising), [texts[i] for i in names.tolist()])
    _arrow_ends(trace, work, lanes, work_ids, node_of)
    for slice_ in table.rows(table.named(lambda text: kineto.profiler_step(text) is not None)):
        if slice_.cat not in kineto.GPU_ANNOTATION_CATEGORIES:
            number = kineto.profiler_step(slice_.name)
            assert number is not None
            known = work.steps.get(number, (slice_.ts, slice_.end))
            work.steps[number] = (min(known[0], slice_.ts), max(known[1], slice_.end))
    return work


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
    """The rows (of `rows`) with no other of them inside on their track, in order: an op's
    work is its innermost calls, so an op that only waits inside (aten::item around a
    synchronisation) never stands for the wait."""
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


def _kinds(trace: Trace, rows: np.ndarray, on_gpu: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Each node's kind: a GPU node on a communication lane, or a CPU P2P or collective op,
    transfers; a CPU call with a launch arrow out of it launches; the rest computes."""
    table = trace.slices
    transfer_names = np.fromiter((kineto.is_communication_op(text) for text in table.texts), np.bool_,
                                 len(table.texts))
    communication = table.track_mask(lambda track: _lane_kind(track) is LaneKind.COMMUNICATION)
    kind = np.full(len(rows), KINDS.index(COMPUTE), np.int8)
    kind[np.where(on_gpu, communication[table.track[rows]], transfer_names[table.name[rows]])] = KINDS.index(TRANSFER)
    launching = np.zeros(len(rows), np.bool_)
    launching[launch[launch >= 0]] = True
    kind[launching & ~on_gpu] = KINDS.index(LAUNCH)
    return kind


def _arrow_ends(trace: Trace, work: RankWork, lanes: np.ndarray, work_ids: np.ndarray, node_of: np.ndarray) -> None:
    """The rank's ends of cross-rank arrows, on the nodes they stand for: a send's end on the
    last node to end inside its slice's span on its lane or thread; an arrival on the node of
    the receive's lane or thread that runs at the arrival, else the next to start. A track's
    nodes do not overlap (lanes never do; a thread's innermost calls follow one another), so
    each end is a binary search."""
    table = trace.slices
    by_track: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for end in trace.flow_ends:
        slice_ = table.row(end.row)
        track = int(work_ids[table.track[end.row]])
        if track not in by_track:
            nodes = np.flatnonzero(lanes == track)
            nodes = nodes[np.argsort(work.start[nodes], kind="stable")]
            by_track[track] = (nodes, work.start[nodes], work.end[nodes])
        nodes, starts, ends = by_track[track]
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
