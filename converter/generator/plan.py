"""Step-level timing: when each operation of a step runs on the CPU and the GPU.

The plan is coarse (one entry per pipeline action / eager op); events.py fills in
the kernels.  For a pipeline the plan of a step is simulated for *all* ranks of
the pipeline at once, because a RECV cannot finish before the matching SEND has
started on the peer.  It only depends on (seed, pipeline, step, per-rank start
times), so every rank's generator computes the same plan independently.

GPU work runs on "lanes" (compute, p2p send/recv per direction, FSDP all-gather,
FSDP reduce-scatter, default-group comm); each lane is one or more streams whose
operations never overlap.  The CPU runs ahead of the GPU and only waits at the
step-end synchronization.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Optional

from .schedules import Action, parse_action

US = 1000
LAUNCH_LATENCY = 6 * US

# Lanes.
COMPUTE = "compute"
SEND_NEXT = "send_next"
SEND_PREV = "send_prev"
RECV_PREV = "recv_prev"
RECV_NEXT = "recv_next"
ALLGATHER = "allgather"
REDUCESCATTER = "reducescatter"
COMM = "comm"

#: GPU span of one graph replay per kernel, by graph kind (ns).
KERNEL_SLOT_NS = 14 * US
GRAPH_SPAN_FACTOR = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}

_P2P_LANE = {"SEND_F": SEND_NEXT, "SEND_B": SEND_PREV, "RECV_F": RECV_PREV, "RECV_B": RECV_NEXT}


def graph_span_ns(kind: str, kernels_per_replay: int) -> int:
    return int(kernels_per_replay * KERNEL_SLOT_NS * GRAPH_SPAN_FACTOR[kind])


class Op:
    """One planned operation.  Times are absolute ns; gpu_* are None for CPU-only ops."""

    __slots__ = (
        "kind", "action", "label", "thread", "lane", "graph_kind", "n_replays",
        "cpu_gap", "cpu_cost", "gpu_cost", "xfer", "deps", "partner", "group",
        "cpu_start", "cpu_end", "gpu_start", "gpu_end", "delay",
    )

    def __init__(self, kind: str, *, action: Optional[Action] = None, label: Optional[str] = None,
                 thread: str = "main", lane: Optional[str] = None, graph_kind: Optional[str] = None,
                 n_replays: int = 0):
        self.kind = kind
        self.action = action
        self.label = label
        self.thread = thread
        self.lane = lane
        self.graph_kind = graph_kind
        self.n_replays = n_replays
        self.cpu_gap = 0
        self.cpu_cost = 0
        self.gpu_cost = 0
        self.xfer = 0
        self.deps: list[Op] = []
        self.partner: Optional[Op] = None   # p2p: the matching SEND/RECV on the peer
        self.group: Optional[list] = None     # collective: the same op on every rank
        self.cpu_start: int = 0
        self.cpu_end: int = 0
        self.gpu_start: Optional[int] = None
        self.gpu_end: Optional[int] = None
        self.delay = 0  # how long the GPU starts it after it could: a rank held up before it

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Op({self.kind}, {self.label or ''}, cpu=[{self.cpu_start},{self.cpu_end}], "
                f"gpu=[{self.gpu_start},{self.gpu_end}], lane={self.lane})")


class PlannedStep:
    """One rank's step: its ops in CPU order and the ProfilerStep window."""

    __slots__ = ("index", "start", "end", "ops")

    def __init__(self, index: int, start: int, end: int, ops: list[Op]):
        self.index = index
        self.start = start
        self.end = end
        self.ops = ops


class PlanParams:
    """What the plan needs from the config (same for every rank of a pipeline)."""

    def __init__(self, cfg, pipeline: Optional[int] = None):
        """`pipeline`: which of the job's pipelines (default: the config's rank's)."""
        self.seed = cfg.seed
        self.kernels = cfg.kernels_per_replay
        self.graphs_per_step = cfg.graphs_per_step
        self.graphs_per_action = cfg.graphs_per_action
        self.memcpy = cfg.include_memcpy
        self.nccl = cfg.include_nccl
        self.annotations = cfg.pp_annotations
        mine = cfg.my_pipeline if pipeline is None else pipeline
        group = cfg.pipeline_groups[mine] if cfg.pipelined else (cfg.rank,)
        # PP position in this plan -> how many times as long its compute takes
        self.slowdown = {group.index(cfg.slow_rank): cfg.slow_factor} if cfg.slow_rank in group else {}
        # PP position in this plan -> how late its GPU reaches the end-of-step all-reduce
        self.allreduce_delay = {group.index(rank): delay for rank, delay in (cfg.allreduce_delays_ns or {}).items()
                                if rank in group}
        self.launch_factor = cfg.launch_factor
        self.allreduce_over = cfg.allreduce_over
        self.joint = cfg.joint_pipelines


def _annotation(action: Action, style: str) -> Optional[str]:
    """The record_function name a schedule gives an action (None: it records none)."""
    if style == "pp":
        return f"PP:{action}"
    names = {"F": "Forward", "B": "Backward"}  # ScheduleGPipe
    return f"{names[action.type]} {action.microbatch}" if action.type in names else None


def _u(rng: random.Random, lo_us: float, hi_us: float) -> int:
    return int(rng.uniform(lo_us, hi_us) * US)


def _compute_cost(op: Op, p: PlanParams, rng: random.Random, slowdown: float) -> None:
    assert op.graph_kind is not None  # a compute op
    span = graph_span_ns(op.graph_kind, p.kernels)
    total = 0
    for _ in range(op.n_replays):
        total += int(span * rng.uniform(0.97, 1.04)) + 4 * US
        if p.memcpy:
            total += 9 * US
    op.gpu_cost = int(total * slowdown)
    op.cpu_cost = int((op.n_replays * _u(rng, 35, 70) + _u(rng, 15, 30)) * p.launch_factor)


def _build_ops(step: int, actions: Optional[list[Action]], p: PlanParams, rng: random.Random,
               slowdown: float) -> list[Op]:
    """A rank's ops for one step, with costs and local dependencies."""
    ops: list[Op] = []
    if step == 0 and p.nccl:
        op = Op("broadcast", lane=COMM)
        op.cpu_cost, op.gpu_cost = _u(rng, 30, 60), _u(rng, 20, 60)
        ops.append(op)
    if p.memcpy:
        op = Op("h2d", lane=COMPUTE)
        op.cpu_cost, op.gpu_cost = _u(rng, 20, 45), _u(rng, 8, 30)
        ops.append(op)
    last_compute: Optional[Op] = None
    if actions is None:
        n_fwd = (p.graphs_per_step + 1) // 2
        n_bwd = p.graphs_per_step - n_fwd
        for label, kind, n, thread in (("forward", "F", n_fwd, "main"), ("backward", "B", n_bwd, "bwd")):
            if n == 0:
                continue
            op = Op("compute", label=label, thread=thread, lane=COMPUTE, graph_kind=kind, n_replays=n)
            _compute_cost(op, p, rng, slowdown)
            ops.append(op)
            last_compute = op
    else:
        by_key: dict[tuple, Op] = {}
        last_of_stage: dict[int, Op] = {}
        for a in actions:
            action_label = _annotation(a, p.annotations)
            t = a.type
            if t in ("F", "B", "I", "W"):
                op = Op("compute", action=a, label=action_label, thread="main" if t == "F" else "bwd",
                        lane=COMPUTE, graph_kind=t, n_replays=p.graphs_per_action)
                _compute_cost(op, p, rng, slowdown)
                if t == "F":
                    dep = by_key.get(("RECV_F", a.stage, a.microbatch))
                    unshard = by_key.get(("UNSHARD", a.stage, None))
                    op.deps = [d for d in (dep, unshard) if d is not None]
                elif t in ("B", "I"):
                    dep = by_key.get(("RECV_B", a.stage, a.microbatch))
                    op.deps = [dep] if dep is not None else []
                last_of_stage[a.stage] = op
                last_compute = op
            elif t in _P2P_LANE:
                op = Op("p2p", action=a, label=action_label, lane=_P2P_LANE[t])
                op.cpu_cost = _u(rng, 25, 60)
                op.gpu_cost = 0
                op.xfer = _u(rng, 60, 160)
                if t == "SEND_F":
                    src = by_key.get(("F", a.stage, a.microbatch))
                    op.deps = [src] if src is not None else []
                elif t == "SEND_B":
                    src = by_key.get(("I", a.stage, a.microbatch)) or by_key.get(("B", a.stage, a.microbatch))
                    op.deps = [src] if src is not None else []
            elif t == "UNSHARD":
                op = Op("allgather", action=a, label=action_label, lane=ALLGATHER)
                op.cpu_cost, op.gpu_cost = _u(rng, 60, 140), _u(rng, 250, 600)
            elif t == "REDUCE_GRAD":
                op = Op("reducescatter", action=a, label=action_label, lane=REDUCESCATTER)
                op.cpu_cost, op.gpu_cost = _u(rng, 50, 120), _u(rng, 400, 1000)
                last = last_of_stage.get(a.stage)
                op.deps = [last] if last is not None else []
            else:  # RESHARD: CPU only
                op = Op("reshard", action=a, label=action_label)
                op.cpu_cost = _u(rng, 15, 40)
            by_key[(t, a.stage, a.microbatch)] = op
            ops.append(op)
    if p.nccl:
        op = Op("allreduce", lane=COMM)
        op.cpu_cost, op.gpu_cost = _u(rng, 30, 60), _u(rng, 15, 40)
        op.deps = [last_compute] if last_compute is not None else []
        ops.append(op)
    op = Op("optimizer", label="Optimizer.step#AdamW.step", lane=COMPUTE)
    op.cpu_cost, op.gpu_cost = _u(rng, 300, 650), _u(rng, 350, 900)
    ops.append(op)
    op = Op("sync", lane=COMPUTE)
    op.cpu_cost, op.gpu_cost = _u(rng, 25, 40), _u(rng, 2, 5)
    ops.append(op)
    for op in ops:
        op.cpu_gap = _u(rng, 3, 15)
    return ops


class _RankState:
    __slots__ = ("ops", "idx", "cpu_t", "lane_last")

    def __init__(self, ops: list[Op], start: int):
        self.ops = ops
        self.idx = 0
        self.cpu_t = start
        self.lane_last: dict[str, Op] = {}


def _try_start(op: Op, st: _RankState) -> bool:
    """Place `op` if everything it waits for is known; False if blocked."""
    cpu_start = st.cpu_t + op.cpu_gap
    if op.lane is None:
        op.cpu_start, op.cpu_end = cpu_start, cpu_start + op.cpu_cost
        st.cpu_t = op.cpu_end
        return True
    if op.kind in ("optimizer", "sync"):
        waits = list(st.lane_last.values())
        ready = cpu_start + (20 * US if op.kind == "sync" else op.cpu_cost) + LAUNCH_LATENCY
    else:
        waits = list(op.deps)
        prev = st.lane_last.get(op.lane)
        if prev is not None:
            waits.append(prev)
        ready = cpu_start + op.cpu_cost + LAUNCH_LATENCY
    for w in waits:
        if w.gpu_end is None:
            return False
        ready = max(ready, w.gpu_end + 2 * US)
    op.gpu_start = ready + op.delay
    if op.partner is None and op.group is None:
        op.gpu_end = ready + op.gpu_cost
    op.cpu_start = cpu_start
    op.cpu_end = cpu_start + op.cpu_cost
    if op.kind == "sync":  # the CPU blocks until the GPU is done
        assert op.gpu_end is not None  # set above: a sync has no partner or group
        op.cpu_end = max(op.cpu_end, op.gpu_end + 6 * US)
    st.cpu_t = op.cpu_end
    st.lane_last[op.lane] = op
    return True


def _simulate(states: list[_RankState]) -> None:
    pending: list[Op] = []
    while True:
        progress = False
        done = True
        for st in states:
            while st.idx < len(st.ops):
                op = st.ops[st.idx]
                if not _try_start(op, st):
                    break
                if op.partner is not None or op.group is not None:
                    pending.append(op)
                st.idx += 1
                progress = True
            if st.idx < len(st.ops):
                done = False
        still = []
        for op in pending:
            if op.group is not None:  # a collective ends after the last member joins
                if any(m.gpu_start is None for m in op.group):
                    still.append(op)
                    continue
                op.gpu_end = max(m.gpu_start for m in op.group) + op.gpu_cost
                progress = True
                continue
            peer = op.partner
            assert peer is not None and op.gpu_start is not None and op.action is not None  # a started p2p op
            if peer.gpu_start is None:
                still.append(op)
                continue
            meet = max(op.gpu_start, peer.gpu_start)
            send = op if op.action.type.startswith("SEND") else peer
            extra = 0 if op is send else 2 * US  # the receiver finishes just after
            op.gpu_end = meet + send.xfer + extra
            progress = True
        pending = still
        if done and not pending:
            return
        if not progress:
            stuck = [st.ops[st.idx] for st in states if st.idx < len(st.ops)]
            raise RuntimeError(f"pipeline schedule deadlocks in the timing simulation at {stuck}")


def step_rng(seed: int, pipeline: int | str, step: int) -> random.Random:
    return random.Random(f"cgtrace-plan:{seed}:{pipeline}:{step}")


def plan_job_step(step: int, starts: list[list[int]], schedule: Optional[dict[int, list[str]]],
                  params: list[PlanParams], pipelines: list[int | str]) -> list[list[PlannedStep]]:
    """Plan one step of several pipelines simulated on one clock, their end-of-step
    all-reduce one collective over all of their ranks.  Each pipeline draws from its own
    random stream in the same order as alone, so one pipeline plans as plan_step does."""
    rngs = [step_rng(p.seed, pipeline, step) for p, pipeline in zip(params, pipelines)]
    job_ops = [_pipeline_ops(step, len(begins), schedule, p, rng) for begins, p, rng in zip(starts, params, rngs)]
    _group_collectives(job_ops, params[0])
    states = [[_RankState(ops, begins[r] + _u(rng, 10, 40)) for r, ops in enumerate(all_ops)]
              for all_ops, begins, rng in zip(job_ops, starts, rngs)]
    _simulate([state for pipeline_states in states for state in pipeline_states])
    out = []
    for all_ops, begins, rng in zip(job_ops, starts, rngs):
        out.append([PlannedStep(step, begins[r], ops[-1].cpu_end + _u(rng, 5, 20), ops)
                    for r, ops in enumerate(all_ops)])
    return out


def _group_collectives(job_ops: list[list[list[Op]]], params: PlanParams) -> None:
    """Make each collective one op group, which ends when its last member arrives.  Alone, a
    pipeline's only collective is its end-of-step all-reduce; a joint job's are every one, the
    step-0 broadcast over all ranks, FSDP's all-gathers and reduce-scatters over each DP group
    (a PP position across pipelines) and the all-reduce over either, every member's work after
    the last arrival as long, so their kernels end together as NCCL's do."""
    kinds = ("broadcast", "allreduce", "allgather", "reducescatter") if params.joint else ("allreduce",)
    per_dp_group = {"allgather", "reducescatter"} | ({"allreduce"} if params.allreduce_over == "dp" else set())
    groups: dict[tuple, list[Op]] = defaultdict(list)
    for all_ops in job_ops:
        for position, ops in enumerate(all_ops):
            seen: dict[str, int] = defaultdict(int)
            for op in ops:
                if op.kind in kinds:
                    groups[(op.kind, position if op.kind in per_dp_group else None, seen[op.kind])].append(op)
                    seen[op.kind] += 1
    for members in groups.values():
        if len(members) > 1:
            for op in members:
                op.group = members
                if params.joint:
                    op.gpu_cost = members[0].gpu_cost


def _pipeline_ops(step: int, n: int, schedule: Optional[dict[int, list[str]]], params: PlanParams,
                  rng: random.Random) -> list[list[Op]]:
    """Every PP rank's ops of one step, each SEND paired with its RECV, late ranks' all-reduce delayed."""
    all_ops: list[list[Op]] = []
    for r in range(n):
        actions = None if schedule is None else [parse_action(a) for a in schedule[r]]
        all_ops.append(_build_ops(step, actions, params, rng, params.slowdown.get(r, 1.0)))
        for op in all_ops[-1]:
            if op.kind == "allreduce":
                op.delay = params.allreduce_delay.get(r, 0)
    # Pair every SEND with its RECV on the neighbouring stage.
    if schedule is not None:
        sends: dict[tuple, Op] = {}
        recvs: dict[tuple, Op] = {}
        for ops in all_ops:
            for op in ops:
                if op.kind != "p2p":
                    continue
                a = op.action
                assert a is not None  # p2p ops come from actions
                if a.type == "SEND_F":
                    sends[("F", a.stage + 1, a.microbatch)] = op
                elif a.type == "SEND_B":
                    sends[("B", a.stage - 1, a.microbatch)] = op
                elif a.type == "RECV_F":
                    recvs[("F", a.stage, a.microbatch)] = op
                else:
                    recvs[("B", a.stage, a.microbatch)] = op
        if sends.keys() != recvs.keys():
            raise RuntimeError("pipeline schedule has unmatched SEND/RECV actions")
        for k, s in sends.items():
            recv = recvs[k]
            s.partner, recv.partner = recv, s
    return all_ops


def next_start(prev: PlannedStep, seed: int, pipeline: int, pp_rank: int) -> int:
    """When the following step begins (profiler.step() bookkeeping in between)."""
    r = random.Random(f"cgtrace-gap:{seed}:{pipeline}:{pp_rank}:{prev.index}")
    return prev.end + r.randint(1 * US, 6 * US)
