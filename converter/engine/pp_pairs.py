"""The arrows a merge draws between PP blocks on different ranks: each SEND to its RECV on the
peer stage's rank, or, for stage-less schedules (GPipe), each stage's compute to the next
stage's, with one agreed flow id per arrow and the bounds the clock estimate takes from them.

Apart from pp.py, which finds the blocks on one rank, so that a compact loads none of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .clock import Bound
from .pp import COMPUTE_OF, CROSS_RANK_FLOW_BASE, FIRST, LAST, Anchor, BlockKey, Extent


@dataclass(frozen=True)
class ArrowEnd:
    """One end of a cross-rank arrow: on which rank (position), which block's which slice."""

    position: int
    block: BlockKey
    anchor: Anchor
    flow_id: int
    outgoing: bool


@dataclass
class CrossRankArrows:
    ends: list[ArrowEnd] = field(default_factory=list)
    stage_pairs: int = 0        # F(s) -> F(s+1), B(s) -> B(s-1) of stage-less schedules
    stage_unmatched: int = 0
    pairs: int = 0
    early_receives: int = 0     # posted before their send ended: their markers sit at the send's end
    skew_pairs: int = 0
    max_skew: int = 0
    unmatched: list[str] = field(default_factory=list)
    bounds: list[Bound] = field(default_factory=list)  # every SEND -> RECV pair's, for the clock estimate

    def draw(self, source: tuple[int, BlockKey, Anchor], target: tuple[int, BlockKey, Anchor]) -> None:
        """One arrow between (rank position, block, anchor) ends, with the next agreed flow id."""
        flow_id = CROSS_RANK_FLOW_BASE + 1 + len(self.ends) // 2
        self.ends.append(ArrowEnd(*source, flow_id, True))
        self.ends.append(ArrowEnd(*target, flow_id, False))


def _owners(extents: list[dict[BlockKey, Extent]]) -> dict[BlockKey, int]:
    """Each block's rank position in the pipeline."""
    return {key: position for position, blocks in enumerate(extents) for key in blocks}


def pair_sends_and_receives(extents: list[dict[BlockKey, Extent]], global_ranks: list[int]) -> CrossRankArrows:
    """SEND_F of stage s -> RECV_F of stage s+1, SEND_B of s -> RECV_B of s-1, per step and
    microbatch, across the ranks of one pipeline (`extents[position]`: that rank's blocks);
    each arrow gets one agreed flow id.

    An arrow leaves the send's last-ending fragment, whose end is when the data was sent, and
    lands on an arrival marker on the receive's row: at the receive's start, or, for a receive
    posted before the send ended (gloo's and NCCL's are non-blocking, and an NCCL receive kernel
    waits for its peer), at the send's end, since the UI draws an arrow into a slice that
    began before its source ended backwards. A receive and consumer that both ended before
    their send began mean the ranks' clocks disagree (`skew_pairs`).
    """
    owner = _owners(extents)
    result = CrossRankArrows()
    for key in sorted(owner):
        if key.action not in ("SEND_F", "SEND_B", "RECV_F", "RECV_B"):
            continue
        # Forward data flows to the next stage, gradients to the previous one.
        downstream = 1 if key.action.endswith("_F") else -1
        peer_stage = key.stage + (downstream if key.action.startswith("SEND") else -downstream)
        peer_action = ("RECV_" if key.action.startswith("SEND") else "SEND_") + key.action[-1]
        peer = key.with_action(peer_stage, peer_action)
        if peer not in owner:
            result.unmatched.append(f"{key.describe()} on global rank {global_ranks[owner[key]]}: "
                                    f"no {peer.describe()}")
            continue
        if key.action.startswith("RECV"):
            continue  # each pair is handled once, from its send
        sender, receiver = owner[key], owner[peer]
        send_start, send_end = extents[sender][key].first_start, extents[sender][key].last_end
        received = extents[receiver][peer]
        consumer = next((k for k in (peer.with_action(peer.stage, action) for action in COMPUTE_OF[peer_action])
                         if k in extents[receiver]), None)
        consumed = extents[receiver][consumer] if consumer is not None else None
        finished = max(received.last_end, consumed.last_end if consumed else 0)
        result.bounds.append(Bound(sender, receiver, send_start, finished))
        if finished <= send_start:
            result.skew_pairs += 1
            result.max_skew = max(result.max_skew, send_start - finished)
        result.pairs += 1
        result.early_receives += received.last_start < send_end
        arrival = Anchor("arrival", max(send_end, received.last_start),
                         f"arrival of {key.annotation()} from rank {global_ranks[sender]}")
        result.draw((sender, key, LAST), (receiver, peer, arrival))
    return result


def pair_stages(extents: list[dict[BlockKey, Extent]]) -> CrossRankArrows:
    """Stage-less schedules (GPipe) annotate compute only: F(s) -> F(s+1) and B(s) -> B(s-1) per
    step, run and microbatch, from the block's last-ending fragment to the next stage's first,
    drawn where the next stage's block starts after that fragment began."""
    owner = _owners(extents)
    result = CrossRankArrows()
    for key in sorted(owner):
        if key.action not in ("F", "B"):
            continue
        downstream = key.with_action(key.stage + (1 if key.action == "F" else -1), key.action)
        if downstream not in owner:
            last_stage = key.stage == (len(extents) - 1 if key.action == "F" else 0)
            result.stage_unmatched += not last_stage
            continue
        source, target = extents[owner[key]][key], extents[owner[downstream]][downstream]
        if target.first_start <= source.last_start:
            result.stage_unmatched += 1
            continue
        result.stage_pairs += 1
        result.draw((owner[key], key, LAST), (owner[downstream], downstream, FIRST))
    return result
