"""Cross-rank transfers of a pipeline from the point-to-point ops every schedule issues.

Every `torch.distributed.pipelining` schedule sends through `c10d::send` / `c10d::recv_`
(cpu ops), whether or not it writes `PP:` SEND/RECV annotations (Schedule1F1B and GPipe do
not), and no op names its peer. The transport matches P2P ops per directed channel in posting
order, so the k-th send from rank a to rank b is the k-th receive on b from a: pairing needs
only each op's peer. The peer comes from the best evidence the trace has: the enclosing
`PP:<s>SEND_X<mb>` (the rank holding stage s +/- 1), the chain ends (PP rank 0 and the last
talk to one neighbour), GPipe's enclosing `Forward <mb>` / `Backward <mb>`, else the compute
around the op (forward ops, or autograd's evaluate_function).

An arrow leaves the send and lands on a zero-duration arrival marker on the receive's row,
where the data could first have arrived: at the receive's start, or, for a receive posted
before the send ended, at the send's end, so the UI never draws it backwards and no measured
slice moves. Perfetto v52 has no name or category of its own for a TrackEvent flow: its Flow
Events panel lists an arrow under its end slices' categories, so the markers' category
(model/derived.py ARRIVAL) is the one that shows, or hides, exactly the transfers.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from ..kineto import STAGELESS_PATTERN, is_number
from ..lane_rules import LaneRules
from ..model import FlowEnd, SliceRow, Trace
from .clock import Bound
from .pp import CROSS_RANK_FLOW_BASE, add_arrival_marker

SEND, RECEIVE = "c10d::send", "c10d::recv_"
_BACKWARD_COMPUTE = "autograd::engine::evaluate_function"
_NOT_COMPUTE = ("c10d::", "aten::detach", "aten::empty", "detach")
_SEQUENCE_NUMBER = b'"Sequence number"'   # autograd records it on forward ops
PP_ANNOTATION, FORWARD_BACKWARD, CHAIN_END, COMPUTE_CONTEXT = (
    "PP annotation", "Forward/Backward annotation", "chain end", "compute context")


@dataclass(frozen=True)
class P2POp:
    """One c10d send or receive of a rank, with what its surroundings say of its peer."""

    row: int          # in the rank's trace: both passes of a merge hold the same rows
    send: bool
    start: int
    end: int
    done: int         # when the transport finished it: its span (gloo's) can outlive the op
    stage: Optional[int] = None       # from an enclosing PP:<stage>SEND_X / RECV_X
    forward: Optional[bool] = None    # carries activations (True) or gradients (False)
    evidence: str = ""                # where `forward` came from (empty: unknown)
    label: str = ""                   # the enclosing annotation's name, for the arrival marker


@dataclass
class RankOps:
    """What pass one learns of a rank's P2P ops: the ops, the stages its PP annotations name,
    and its capture's extent (to tell a partner outside the capture from a missing one)."""

    ops: list[P2POp] = field(default_factory=list)
    stages: frozenset[int] = frozenset()
    first: int = 0
    last: int = 0

    def shifted(self, offset: int) -> "RankOps":
        """The same ops on a clock `offset` ns later (a merge aligning ranks)."""
        ops = [replace(op, start=op.start + offset, end=op.end + offset, done=op.done + offset) for op in self.ops]
        return RankOps(ops, self.stages, self.first + offset, self.last + offset)


def find_ops(trace: Trace, rules: LaneRules, stages: frozenset[int]) -> RankOps:
    """The rank's c10d P2P ops in start order, each with its enclosing annotation's stage and
    direction, else its direction from the compute around it."""
    table = trace.slices
    rows = table.rows(table.named(lambda name: name in (SEND, RECEIVE)))
    if not rows:
        return RankOps()
    enclosing = _enclosing_annotations(trace, rules)
    enclosing_starts = [annotation.ts for annotation, _, _ in enclosing]
    found = [(slice_, _enclosing(enclosing, enclosing_starts, slice_))
             for slice_ in sorted(rows, key=lambda s: (s.ts, s.row))]
    computes = _computes(trace) if any(annotation is None for _, annotation in found) else []
    done = _transport_ends(trace, rows)
    compute_starts = [start for start, _ in computes]
    ops = []
    for slice_, annotation in found:
        send = slice_.name == SEND
        if annotation is not None:
            stage, forward, label = annotation
            ops.append(P2POp(slice_.row, send, slice_.ts, slice_.end, done[slice_.row], stage, forward,
                             PP_ANNOTATION if stage is not None else FORWARD_BACKWARD, label))
            continue
        # A send follows the compute that made its data; a receive feeds the compute after it.
        index = bisect_left(compute_starts, slice_.ts) - 1 if send else bisect_right(compute_starts, slice_.end)
        kind = computes[index][1] if 0 <= index < len(computes) else None
        ops.append(P2POp(slice_.row, send, slice_.ts, slice_.end, done[slice_.row], None, kind,
                         COMPUTE_CONTEXT if kind is not None else ""))
    return RankOps(ops, stages, int(table.ts.min()), int(table.end.max()))


def _transport_ends(trace: Trace, ops: list[SliceRow]) -> dict[int, int]:
    """Each op's row -> when its transfer finished: the end of the latest-ending slice on its
    thread that starts inside it and outlives it (gloo's span of a non-blocking receive ends
    when the data is in), else the op's own end."""
    table, threads = trace.slices, {op.track.thread for op in ops}
    on_threads = np.flatnonzero(table.track_mask(lambda track: track.thread in threads)[table.track])
    starts, ends = table.spans(on_threads)
    order = np.argsort(starts, kind="stable")
    starts, ends, rows = starts[order], ends[order], on_threads[order]
    done = {}
    for op in ops:
        begin, stop = np.searchsorted(starts, op.ts, "left"), np.searchsorted(starts, op.end, "right")
        inside = [int(end) for row, end in zip(rows[begin:stop].tolist(), ends[begin:stop].tolist())
                  if table.tracks[int(table.track[row])].thread is op.track.thread]
        done[op.row] = max([op.end, *inside])
    return done


def _enclosing_annotations(trace: Trace, rules: LaneRules) -> list[tuple[SliceRow, Optional[int], bool]]:
    """CPU annotations that tell an op inside them its direction: PP:<s>SEND_X / RECV_X (with
    the stage) and GPipe's Forward/Backward <mb>, by start."""
    def direction(name: str) -> Optional[tuple[Optional[int], bool]]:
        match = rules.pp_match(name)
        if match is not None and match.group("action") in ("SEND_F", "SEND_B", "RECV_F", "RECV_B") \
                and is_number(match.group("stage")):
            return int(match.group("stage")), match.group("action").endswith("F")
        stageless = STAGELESS_PATTERN.match(name)
        return (None, stageless.group("action") == "Forward") if stageless is not None else None

    found = []
    for slice_ in trace.slices.rows(trace.slices.named(lambda name: direction(name) is not None)):
        if slice_.cat not in rules.annotation_categories:
            stage, forward = direction(slice_.name) or (None, False)
            found.append((slice_, stage, forward))
    found.sort(key=lambda item: item[0].ts)
    return found


def _enclosing(annotations: list[tuple[SliceRow, Optional[int], bool]], starts: list[int],
               op: SliceRow) -> Optional[tuple[Optional[int], bool, str]]:
    """The innermost annotation on the op's thread that holds it: stage, direction, name."""
    index = bisect_right(starts, op.ts)
    for annotation, stage, forward in reversed(annotations[:index]):
        if annotation.end >= op.end and annotation.track.thread is op.track.thread:
            return stage, forward, annotation.name
    return None


def _computes(trace: Trace) -> list[tuple[int, bool]]:
    """(start, is forward) of the rank's compute, by start, on all its threads (backward runs
    on autograd's own thread on GPU runs): autograd's evaluate_function is backward; a cpu op
    autograd numbered (`Sequence number`) outside any evaluate_function or c10d op is forward."""
    table = trace.slices
    backward = table.rows(table.named(lambda name: name.startswith(_BACKWARD_COMPUTE)))
    named = table.named(lambda name: not name.startswith((_BACKWARD_COMPUTE, *_NOT_COMPUTE)))
    candidates = named[table.in_categories({"cpu_op"})[named]]
    numbered = [row for row, text in zip(candidates.tolist(), trace.args_texts(candidates))
                if text is not None and _SEQUENCE_NUMBER in text]
    covering = sorted([(s.ts, s.end) for s in backward] +
                      [(s.ts, s.end) for s in table.rows(table.named(lambda name: name.startswith("c10d::")))])
    covering_starts = [start for start, _ in covering]
    ends_so_far, latest = [], -1
    for _, end in covering:
        latest = max(latest, end)
        ends_so_far.append(latest)

    def covered(ts: int, end: int) -> bool:
        index = bisect_right(covering_starts, ts) - 1
        return index >= 0 and ends_so_far[index] >= end

    forward = [s.ts for s in table.rows(numbered) if not covered(s.ts, s.end)]
    return sorted([(start, True) for start in forward] + [(s.ts, False) for s in backward])


@dataclass(frozen=True)
class TransferEnd:
    """One end of a transfer's arrow, on the rank at `position`: the send's slice, or the
    arrival marker at `marker_at` on the receive's row."""

    position: int
    row: int
    flow_id: int
    outgoing: bool
    marker_at: Optional[int] = None
    marker_name: str = ""


@dataclass
class Transfers:
    """A pipeline's pairs as arrow ends for pass two, and what could not be paired, and why."""

    ends: list[TransferEnd] = field(default_factory=list)
    pairs: int = 0
    early_receives: int = 0   # posted before their send ended: their markers sit at the send's end
    peers_from: Counter[str] = field(default_factory=Counter)
    no_peer: list[str] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)
    outside_capture: list[str] = field(default_factory=list)
    causality_violations: list[str] = field(default_factory=list)
    bounds: list[Bound] = field(default_factory=list)  # every pair's, for the clock estimate


def pair_transfers(ranks: list[RankOps], global_ranks: list[int], pp_ranks: list[int], pp_size: int) -> Transfers:
    """Each send paired with its receive, in order per directed channel, across the merged ranks
    of one pipeline of `pp_size` ranks (`ranks[position]` has PP rank `pp_ranks[position]`: a
    merge of some ranks keeps the others' places), with one arrow (an agreed flow id) per pair."""
    owner = {stage: pp_rank for pp_rank, rank in zip(pp_ranks, ranks) for stage in rank.stages}
    position_of = {pp_rank: position for position, pp_rank in enumerate(pp_ranks)}
    channels: dict[tuple[int, int], tuple[list[P2POp], list[P2POp]]] = defaultdict(lambda: ([], []))
    result = Transfers()
    for position, rank in enumerate(ranks):
        for op in rank.ops:
            peer_pp_rank, evidence = _peer(op, pp_ranks[position], pp_size, owner)
            peer = position_of.get(peer_pp_rank) if peer_pp_rank is not None else None
            if peer is None:
                why = "no known peer" if peer_pp_rank is None else f"its peer, PP rank {peer_pp_rank}, is not merged"
                result.no_peer.append(f"{op.label or (SEND if op.send else RECEIVE)} at {op.start} ns on global rank "
                                      f"{global_ranks[position]}: {why}")
                continue
            sender, receiver = (position, peer) if op.send else (peer, position)
            channels[(sender, receiver)][0 if op.send else 1].append(op)
            if op.send:
                result.peers_from[evidence] += 1
    for (sender, receiver), (sends, receives) in sorted(channels.items()):
        for send, receive in zip(sends, receives):
            result.bounds.append(Bound(sender, receiver, send.start, receive.done))
            _draw(result, sender, send, receiver, receive, global_ranks[sender])
        _leftovers(result, sends[len(receives):], ranks[receiver], f"{global_ranks[sender]} -> "
                   f"{global_ranks[receiver]}: a send")
        _leftovers(result, receives[len(sends):], ranks[sender], f"{global_ranks[sender]} -> "
                   f"{global_ranks[receiver]}: a receive")
    return result


def _peer(op: P2POp, pp_rank: int, size: int, owner: dict[int, int]) -> tuple[Optional[int], str]:
    """The PP rank of the op's peer, and the evidence it came from."""
    downstream = op.send == op.forward  # activations flow to the next stage, gradients back
    if op.stage is not None:
        return owner.get(op.stage + (1 if downstream else -1)), PP_ANNOTATION
    if size == 2 or pp_rank in (0, size - 1):
        return (1 if pp_rank == 0 else pp_rank - 1), CHAIN_END
    if op.forward is None:
        return None, ""
    return pp_rank + (1 if downstream else -1), op.evidence


def _draw(result: Transfers, sender: int, send: P2POp, receiver: int, receive: P2POp, sender_rank: int) -> None:
    """The pair's arrow, to an arrival marker on the receive's row. A receive done before its
    send began is no partner: the channel's ends are out of step."""
    if receive.done < send.start:
        result.causality_violations.append(f"rank {sender_rank}: a receive done at {receive.done} ns, before its "
                                           f"send began at {send.start} ns")
        return
    flow_id = CROSS_RANK_FLOW_BASE + 1 + result.pairs
    result.pairs += 1
    result.ends.append(TransferEnd(sender, send.row, flow_id, True))
    name = f"arrival of {send.label} from rank {sender_rank}" if send.label else f"recv from rank {sender_rank}"
    result.ends.append(TransferEnd(receiver, receive.row, flow_id, False, max(send.end, receive.start), name))
    result.early_receives += receive.start < send.end


def _leftovers(result: Transfers, ops: list[P2POp], partner: RankOps, what: str) -> None:
    """Ends with no partner: outside the partner's capture, or missing from it."""
    for op in ops:
        outside = op.start > partner.last or op.end < partner.first
        (result.outside_capture if outside else result.unpaired).append(
            f"{what} at {op.start} ns has no partner" + (" (outside its capture)" if outside else ""))


def attach_transfer_ends(trace: Trace, ends: list[TransferEnd]) -> None:
    """A rank's arrow ends, with the arrival markers they land on (pass two of a merge)."""
    for end in ends:
        row = end.row
        if end.marker_at is not None:
            row = add_arrival_marker(trace, end.marker_at, end.marker_name, end.row)
        trace.flow_ends.append(FlowEnd(row, end.flow_id, end.outgoing))


def summary(transfers: Transfers) -> dict:
    """The summary's account of the transfers: how many, whence their peers, what is left."""
    return {"pp_transfers": {"c10d ops": transfers.pairs}, "pp_transfer_peers_from": dict(transfers.peers_from),
            "pp_arrival_markers": transfers.pairs, "pp_receives_posted_early": transfers.early_receives,
            "pp_transfer_causality_violations": len(transfers.causality_violations),
            "pp_transfers_no_peer": len(transfers.no_peer), "pp_transfers_unpaired": len(transfers.unpaired),
            "pp_transfers_outside_capture": len(transfers.outside_capture),
            "pp_transfer_examples": (transfers.no_peer + transfers.unpaired + transfers.outside_capture +
                                     transfers.causality_violations)[:20]}
