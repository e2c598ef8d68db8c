"""Pipeline-parallel schedules in torch.distributed.pipelining's action notation.

An action string is ``<stage><type><microbatch>`` (``"2F0"``, ``"1SEND_B3"``) or,
for the per-stage FSDP actions, ``<stage><type>`` (``"1UNSHARD"``).  Every action
runs inside ``record_function("PP:" + action)`` in a real run, which is what the
generator writes as ``PP:<action>`` annotations.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional

COMPUTE_TYPES = ("F", "B", "I", "W")
COMM_TYPES = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
STAGE_TYPES = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
ACTION_TYPES = COMPUTE_TYPES + COMM_TYPES + STAGE_TYPES

_ACTION_RE = re.compile(
    r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD|F|B|I|W)(\d*)$"
)


class Action(NamedTuple):
    stage: int
    type: str
    microbatch: Optional[int]

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        return f"{self.stage}{self.type}{mb}"


def parse_action(text: str) -> Action:
    """``"2F0"`` -> ``Action(2, "F", 0)``; ``"1UNSHARD"`` -> ``Action(1, "UNSHARD", None)``."""
    m = _ACTION_RE.match(text)
    if m is None:
        raise ValueError(f"not a pipeline action: {text!r}")
    stage, typ, mb = m.groups()
    if typ in STAGE_TYPES:
        if mb:
            raise ValueError(f"{typ} takes no microbatch: {text!r}")
        return Action(int(stage), typ, None)
    if not mb:
        raise ValueError(f"{typ} needs a microbatch: {text!r}")
    return Action(int(stage), typ, int(mb))


def _round_size(pp_size: int, microbatches: int) -> int:
    """Microbatches per round of the interleaved schedule: one per rank (Megatron),
    fewer when there are fewer microbatches than ranks."""
    if microbatches > pp_size and microbatches % pp_size:
        raise ValueError(
            f"interleaved schedules need microbatches ({microbatches}) to be a multiple of "
            f"pp_size ({pp_size}) when there are more microbatches than ranks"
        )
    return min(pp_size, microbatches)


def _compute_order(schedule: str, pp_size: int, rank: int, microbatches: int, v: int):
    """The F/B compute order of one rank: warmup forwards, steady 1F1B, cooldown."""
    if schedule == "1f1b" or (schedule == "zero_bubble" and v == 1):
        fwd = [(rank, m) for m in range(microbatches)]
        bwd = list(fwd)
        warmup = min(pp_size - rank - 1, microbatches)
    else:
        per_round = _round_size(pp_size, microbatches)
        fwd, bwd = [], []
        for g in range(0, microbatches, per_round):
            mbs = range(g, min(g + per_round, microbatches))
            for c in range(v):
                fwd.extend((rank + c * pp_size, m) for m in mbs)
            for c in reversed(range(v)):
                bwd.extend((rank + c * pp_size, m) for m in mbs)
        warmup = min((v - 1) * per_round + 2 * (pp_size - 1 - rank), len(fwd))
    order = [("F", s, m) for s, m in fwd[:warmup]]
    for i in range(len(fwd) - warmup):
        s, m = fwd[warmup + i]
        order.append(("F", s, m))
        s, m = bwd[i]
        order.append(("B", s, m))
    order.extend(("B", s, m) for s, m in bwd[len(fwd) - warmup:])
    return order, warmup


def _split_backward(order, delay: int):
    """Zero-bubble: every B becomes I (input grad) at once and W (weight grad)
    later: deferred by `delay` backwards while forwards remain, then one W after
    each I in the cooldown, the rest at the end."""
    last_f = max((i for i, (t, _, _) in enumerate(order) if t == "F"), default=-1)
    out, pending = [], []
    for i, (t, s, m) in enumerate(order):
        if t != "B":
            out.append((t, s, m))
            continue
        out.append(("I", s, m))
        pending.append((s, m))
        limit = delay if i < last_f else len(pending) - 1
        while pending and len(pending) > limit:
            ps, pm = pending.pop(0)
            out.append(("W", ps, pm))
    out.extend(("W", ps, pm) for ps, pm in pending)
    return out


def pipeline_schedule(
    schedule: str, pp_size: int, microbatches: int, stages_per_rank: int = 1
) -> dict[int, list[str]]:
    """One training step's actions for every PP rank, as action strings.

    - ``"1f1b"``: stage = rank; warmup forwards, steady one-forward-one-backward,
      cooldown backwards.
    - ``"interleaved"``: ``stages_per_rank`` virtual stages per rank (stage ids
      ``rank + k * pp_size``), Megatron/torch interleaved 1F1B order (more
      microbatches than ranks must be a multiple of ``pp_size``).
    - ``"zero_bubble"``: like the above with every backward split into ``I``
      (input grad, sent on with SEND_B) and a later ``W`` (weight grad).

    Around every F: ``RECV_F`` before it (stages > 0) and ``SEND_F`` after it
    (stages < last); around every B/I: ``RECV_B`` before it (stages < last) and
    ``SEND_B`` after it (stages > 0) -- only between stages on different ranks.
    Each rank starts with ``<s>UNSHARD`` per local stage and ends with
    ``<s>RESHARD``, ``<s>REDUCE_GRAD`` per local stage.
    """
    if schedule not in ("1f1b", "interleaved", "zero_bubble"):
        raise ValueError(f"unknown schedule {schedule!r}")
    if pp_size < 1 or microbatches < 1 or stages_per_rank < 1:
        raise ValueError("pp_size, microbatches and stages_per_rank must be >= 1")
    if schedule == "1f1b" and stages_per_rank != 1:
        raise ValueError("1f1b has one stage per rank; use 'interleaved' for more")
    v = stages_per_rank
    n_stages = pp_size * v
    result: dict[int, list[str]] = {}
    for rank in range(pp_size):
        order, _ = _compute_order(schedule, pp_size, rank, microbatches, v)
        if schedule == "zero_bubble":
            order = _split_backward(order, pp_size - rank - 1)
        local = [rank + c * pp_size for c in range(v)]
        acts = [f"{s}UNSHARD" for s in local]
        for t, s, m in order:
            prev_remote = s > 0 and (s - 1) % pp_size != rank
            next_remote = s < n_stages - 1 and (s + 1) % pp_size != rank
            if t == "F":
                if prev_remote:
                    acts.append(f"{s}RECV_F{m}")
                acts.append(f"{s}F{m}")
                if next_remote:
                    acts.append(f"{s}SEND_F{m}")
            elif t in ("B", "I"):
                if next_remote:
                    acts.append(f"{s}RECV_B{m}")
                acts.append(f"{s}{t}{m}")
                if prev_remote:
                    acts.append(f"{s}SEND_B{m}")
            else:  # W
                acts.append(f"{s}W{m}")
        for s in local:
            acts.append(f"{s}RESHARD")
            acts.append(f"{s}REDUCE_GRAD")
        result[rank] = acts
    return result
