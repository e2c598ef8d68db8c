"""Pipeline anatomy: each PP rank's step split into parts that add up to the step exactly.

A part is a set of disjoint intervals inside the step, so the parts partition it (see
ANATOMY_DEFINITIONS). What a rank's compute is depends on the trace: a rank with GPU lanes
computes where a compute lane is busy (as the rest of the report says); a CPU-only rank
(gloo pipelining) computes where one of its CPU ops runs that is no communication op, which
is what the real torch pipelining traces show: forward and backward run as aten ops on the
CPU thread, while a receive posted early is a `gloo:recv` span that outlives its c10d op.
The schedule's actions (`PP:<stage><action><mb>`, GPipe's `Forward <mb>` / `Backward <mb>`)
bound the stage's work and name what a wait was for, where the trace has them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from ..kineto import (COMMUNICATION_OPS, COMPUTE_ACTIONS, CPU_OP_CATEGORY, RECEIVE_OPS, STAGELESS_PATTERN,
                      TRANSFER_BUFFERS, is_number)
from ..lane_rules import LaneRules
from ..model.intervals import Intervals, by_window, clip, covered, intersect, latest_open, subtract, union
from ..model.trace import rank_title
from ..tp.sql_text import sql_list

ANATOMY_DEFINITIONS = {
    "stage compute": "per PP rank: a rank with GPU lanes computes while a compute lane is busy; a CPU-only rank "
                     f"while one of its CPU ops ({CPU_OP_CATEGORY}) runs that is no communication op "
                     f"({', '.join(COMMUNICATION_OPS)}) and no transfer buffer "
                     f"({', '.join(prefix + '*' for prefix in TRANSFER_BUFFERS)}); its first "
                     "and last compute in a step are those inside the schedule's compute actions (F, B, I, W, "
                     "Forward <mb>, Backward <mb>) where it names them, else any",
    "warm-up, drain": "per PP rank and step: time without compute before the stage's first compute (warm-up) and "
                      "after its last (drain)",
    "receive wait": "per PP rank and step, between its first and last compute: time without compute inside a "
                    "receive (a PP RECV_F/RECV_B block, a c10d::recv*, gloo:recv* or nccl:recv* op or span); each "
                    "moment goes to the receive that ends first among those open, which names the stage and "
                    "microbatch waited for where the schedule does",
    "stage parts": "compute, warm-up, drain, receive wait, exposed communication (the rest of the time between "
                   "first and last compute that a communication lane, op or span covers) and other (the rest) "
                   "add up to the step exactly",
}

# The stage parts (each a `<key>` figure of a stage row) as every table and bar names them, in order.
STAGE_PARTS = (("compute_ns", "compute"), ("warmup_ns", "warm-up"), ("drain_ns", "drain"),
               ("recv_wait_ns", "recv wait"), ("exposed_comm_ns", "exposed comm"), ("other_ns", "other"))
RankKey = tuple[int, int, bool]  # (PP rank, global rank, in a pipeline), as report.py ranks tracks
Rows = Callable[[str], list[tuple[Any, ...]]]


@dataclass(frozen=True)
class Action:
    """One scheduled action as the trace names it; stage None where the schedule writes none."""

    action: str
    stage: Optional[int]
    microbatch: Optional[int]

    @property
    def computes(self) -> bool:
        return self.action in COMPUTE_ACTIONS or self.action == "OVERLAP_F_B"

    @property
    def sender_stage(self) -> Optional[int]:
        """The stage a RECV_F (RECV_B) waits for: the one before (after) it."""
        if self.stage is None or not self.action.startswith("RECV_"):
            return None
        return self.stage - 1 if self.action == "RECV_F" else self.stage + 1


def parse_action(name: str, rules: LaneRules) -> Optional[Action]:
    """The action a `PP:` or GPipe annotation names, or None."""
    if name.startswith("PP:(") and name.endswith(")OVERLAP_F_B"):
        return Action("OVERLAP_F_B", None, None)
    match = rules.pp_match(name)
    if match is not None:
        stage, microbatch = match.group("stage"), match.group("microbatch")
        if not (is_number(stage) and is_number(microbatch or "0")):
            return None  # as the engine reads it: no stage, so no action
        return Action(match.group("action"), int(stage), int(microbatch) if microbatch else None)
    gpipe = STAGELESS_PATTERN.match(name)
    if gpipe is not None:
        return Action("F" if gpipe.group("action") == "Forward" else "B", None, int(gpipe.group("microbatch")))
    return None


@dataclass
class Receive:
    """Time spent inside one receive, and what it was for where a RECV block says."""

    start: int
    end: int
    action: Optional[Action]


@dataclass
class StageInput:
    """What one PP rank's anatomy is made of, on the merged clock."""

    pp_rank: int
    global_rank: int
    in_pipeline: bool
    steps: list[tuple[str, int, int]]
    compute: Intervals
    communication: Intervals
    receives: list[Receive] = field(default_factory=list)
    actions: list[tuple[Action, int, int]] = field(default_factory=list)


def read_stages(rows: Rows, rank_of: Callable[[int], Optional[RankKey]], rules: LaneRules,
                steps: dict[Optional[RankKey], list[tuple[str, int, int]]],
                gpu_lanes: dict[RankKey, tuple[Intervals, Intervals]]) -> list[StageInput]:
    """Each ranked PP stage's inputs from the trace: its actions and receives (GPU side on a rank
    with GPU lanes, else CPU side), and its compute and communication (`gpu_lanes`: rank ->
    (compute, communication) of its GPU lanes; CPU-only ranks read their CPU ops)."""
    annotation = sql_list(sorted(rules.annotation_categories))
    receives = " or ".join(f"s.name glob '{prefix}*'" for prefix in RECEIVE_OPS)
    found: dict[RankKey, StageInput] = {}
    spans: dict[RankKey, list[tuple[str, int, int]]] = {}
    for name, start, end, owner, on_gpu_side in rows(f"""
            select s.name, s.ts, s.ts + s.dur, t.owner,
                   (s.category in ({annotation}) or t.annotation) as gpu_side
            from slice s join report_track t on t.id = s.track_id
            where s.dur > 0 and (s.name glob 'PP:*' or s.name glob 'Forward *' or s.name glob 'Backward *'
                                 or {receives})"""):
        rank = rank_of(owner)
        if rank is None or bool(on_gpu_side) != (rank in gpu_lanes):
            continue
        spans.setdefault(rank, []).append((name, start, end))
    cpu_only = [rank for rank in spans if rank not in gpu_lanes]
    cpu = _cpu_ops(rows, rank_of, set(cpu_only)) if cpu_only else {}
    for rank, named in spans.items():
        compute, communication = gpu_lanes.get(rank) or cpu.get(rank, ([], []))
        stage = found[rank] = StageInput(*rank, steps.get(rank, []), compute, communication)
        blocks = sorted(((start, end, action) for name, start, end in named
                         if (action := parse_action(name, rules)) is not None), key=lambda block: block[:2])
        stage.actions = [(action, start, end) for start, end, action in blocks]
        recv_blocks = [(start, end, action) for start, end, action in blocks if action.action.startswith("RECV_")]
        ops = [(start, end) for name, start, end in named if name.startswith(RECEIVE_OPS)]
        # Each receive op is for the RECV block it starts in (the latest one open then).
        enclosing = latest_open([(start, end) for start, end, _ in recv_blocks], (start for start, _ in ops))
        stage.receives += [Receive(start, end, recv_blocks[block][2] if block >= 0 else None)
                           for (start, end), block in zip(ops, enclosing)]
        stage.receives += [Receive(start, end, action) for start, end, action in recv_blocks]
    return sorted((stage for stage in found.values() if stage.steps), key=lambda stage: stage.pp_rank)


def _cpu_ops(rows: Rows, rank_of: Callable[[int], Optional[RankKey]], ranks: set[RankKey]
             ) -> dict[RankKey, tuple[Intervals, Intervals]]:
    """CPU-only ranks' compute (CPU ops that are no communication op, less the time a
    communication op runs inside one) and communication (communication ops and the transport
    spans they leave running, such as gloo's)."""
    found: dict[RankKey, tuple[Intervals, Intervals, Intervals]] = {}
    prefixes = " or ".join(f"s.name glob '{prefix}*'" for prefix in COMMUNICATION_OPS)
    buffers = " or ".join(f"s.name glob '{prefix}*'" for prefix in TRANSFER_BUFFERS)
    for start, end, owner, communicates, is_op in rows(f"""
            select s.ts, s.ts + s.dur, t.owner, ({prefixes}), s.category = '{CPU_OP_CATEGORY}'
            from slice s join report_track t on t.id = s.track_id
            where s.dur > 0 and (s.category = '{CPU_OP_CATEGORY}' or ({prefixes}))
              and not ({buffers})"""):
        rank = rank_of(owner)
        if rank is not None and rank in ranks:
            work, blocking, comms = found.setdefault(rank, ([], [], []))
            (comms if communicates else work).append((start, end))
            if communicates and is_op:
                blocking.append((start, end))
    return {rank: (subtract(union(work), union(blocking)), union(comms))
            for rank, (work, blocking, comms) in found.items()}


@dataclass
class _StepInputs:
    """What of a stage one step holds: its receives and compute actions (those overlapping it)."""

    receives: list[Receive]
    actions: list[tuple[Action, int, int]]


class _Stage:
    """A stage's whole-trace lists made once, and what each of its steps holds, so a step's
    parts cost what the step holds (a per-step pass over whole-trace lists was quadratic in
    steps: 800 steps of a merged pipeline took minutes)."""

    def __init__(self, stage: StageInput):
        self.stage = stage
        computing = [(action, start, end) for action, start, end in stage.actions if action.computes]
        self.computing = union((start, end) for _, start, end in computing)
        self.receiving = union((receive.start, receive.end) for receive in stage.receives)
        steps = [(start, end) for _, start, end in stage.steps]
        self.steps = [_StepInputs(receives, actions) for receives, actions in zip(
            by_window(stage.receives, lambda r: (r.start, r.end), steps),
            by_window(computing, lambda block: (block[1], block[2]), steps))]


def stage_parts(stage: _Stage, start: int, end: int, holds: _StepInputs) -> dict[str, Any]:
    """One step's parts (they add up to `end - start`) and what each receive wait was for."""
    compute = clip(stage.stage.compute, start, end)
    bounds = intersect(compute, clip(stage.computing, start, end)) or compute
    idle = subtract([(start, end)], compute)
    first, last = (bounds[0][0], bounds[-1][1]) if bounds else (end, end)
    warmup, drain = intersect(idle, [(start, first)]), intersect(idle, [(last, end)])
    middle = subtract(subtract(idle, warmup), drain)
    receiving = intersect(middle, clip(stage.receiving, start, end))
    exposed = intersect(subtract(middle, receiving), clip(stage.stage.communication, start, end))
    other = subtract(subtract(middle, receiving), exposed)
    return {"compute_ns": _length(compute), "warmup_ns": _length(warmup), "drain_ns": _length(drain),
            "recv_wait_ns": _length(receiving), "exposed_comm_ns": _length(exposed), "other_ns": _length(other),
            "recv_waits": _attributed(receiving, holds.receives)}


def _length(intervals: Intervals) -> int:
    return sum(end - start for start, end in intervals)


def _attributed(waiting: Intervals, receives: Sequence[Receive]) -> list[dict[str, Any]]:
    """Receive waits by what they waited for: each moment goes to the receive that finishes
    first among those open then (the one the rank is blocked on)."""
    by_action: dict[Optional[Action], int] = {}
    left = waiting
    for receive in sorted(receives, key=lambda r: (r.end, r.action is None)):
        [inside] = covered(left, [(receive.start, receive.end)])
        if inside:
            by_action[receive.action] = by_action.get(receive.action, 0) + inside
            left = subtract(left, [(receive.start, receive.end)])
    return [{"action": action.action if action else None, "stage": action.stage if action else None,
             "microbatch": action.microbatch if action else None,
             "from_stage": action.sender_stage if action else None, "wait_ns": ns}
            for action, ns in sorted(by_action.items(), key=lambda item: -item[1])]


def anatomy(stages: list[StageInput]) -> Optional[dict[str, Any]]:
    """`pipeline` of the report: a row per PP rank and step; None where no rank is a stage."""
    if not stages:
        return None
    holder = {action.stage: stage for stage in stages for action, _, _ in stage.actions
              if action.stage is not None and action.computes}
    rows = []
    for stage in stages:
        made = _Stage(stage)
        for (name, start, end), holds in zip(stage.steps, made.steps):
            parts = stage_parts(made, start, end, holds)
            for wait in parts["recv_waits"]:
                sender = holder.get(wait["from_stage"])
                wait["from_pp_rank"] = sender.pp_rank if sender else None
                wait["from_rank"] = rank_title(sender.pp_rank, sender.global_rank, sender.in_pipeline) if sender else None
            rows.append({"pp_rank": stage.pp_rank, "global_rank": stage.global_rank,
                         "rank": rank_title(stage.pp_rank, stage.global_rank, stage.in_pipeline), "step": name,
                         "start_ns": start, "step_ns": end - start, **parts,
                         "actions": _compute_actions(stage, start, end, holds.actions)})
    return {"stages": rows}


def _compute_actions(stage: StageInput, start: int, end: int, actions: list[tuple[Action, int, int]]
                     ) -> list[dict[str, Any]]:
    """The step's compute actions (per action, stage and microbatch, in the order they began)
    and how long the stage computed inside each (its blocks may be cut by gaps)."""
    blocks: dict[Action, list[tuple[int, int]]] = {}
    for action, s, e in actions:
        blocks.setdefault(action, []).append((max(s, start), min(e, end)))
    return [{"action": action.action, "stage": action.stage, "microbatch": action.microbatch,
             "start_ns": spans[0][0], "compute_ns": sum(covered(stage.compute, union(spans)))}
            for action, spans in sorted(blocks.items(), key=lambda item: item[1][0][0])]
