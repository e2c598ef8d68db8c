"""Pipeline-parallel blocks (`PP:<stage><action><microbatch>` annotations) and their arrows.

A block is every GPU annotation fragment of one run of one (stage, action, microbatch),
however many streams and gaps it spans. The runs come from the CPU side: record_function
writes one CPU annotation per run of an action, and GPU work never precedes its launch, so a
fragment belongs to the run whose CPU annotation is the latest to start no later than it.
ProfilerStep numbers are only labels: a block is keyed by the step its run began in and the
run's place among that action's runs in the step, which holds with one ProfilerStep per
iteration, one over several, or none. Without any CPU annotation of an action, its runs are
split where another action of the same stage began after the current run's fragments ended.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from operator import attrgetter
from typing import Any, Callable, Optional

import msgspec
import numpy as np

from ..kineto import COMPUTE_ACTIONS, STAGELESS_PATTERN, is_number, profiler_step
from ..lane_rules import LaneRules, Match
from ..model import NO_ARGS, Flow, FlowEnd, LaneKind, SliceRow, Trace, derived
from ..model.columns import first_positions, grouped_in_order, sorted_distinct

PP_FLOW_CATEGORY = "pp_dependency"
# A receive feeds, and a send follows, the compute of the same stage and microbatch.
COMPUTE_OF = {"RECV_F": ("F",), "SEND_F": ("F",), "RECV_B": ("B", "I"), "SEND_B": ("B", "I")}
CROSS_RANK_FLOW_BASE = 1 << 61
# The lane kind each action's work runs on (UNSHARD, RESHARD, REDUCE_GRAD are FSDP collectives).
_ACTION_KIND = {**{action: LaneKind.COMPUTE for action in COMPUTE_ACTIONS},
                **{action: LaneKind.COMMUNICATION for action in (*COMPUTE_OF, "UNSHARD", "RESHARD", "REDUCE_GRAD")}}


class BlockKey(msgspec.Struct, frozen=True, order=True):
    """A block's identity, read alike on every rank, so a SEND's key gives its RECV's (with_action)."""

    step: int   # the ProfilerStep number the run began in (0 without steps): a label
    run: int    # which run of this action within that step, from 0
    stage: int
    action: str
    microbatch: Optional[int]

    def annotation(self) -> str:
        """The `PP:<stage><action><microbatch>` name of the block's annotation."""
        return f"PP:{self.stage}{self.action}{'' if self.microbatch is None else self.microbatch}"

    def describe(self) -> str:
        run = f" run {self.run + 1}" if self.run else ""
        return f"step {self.step}{run} {self.annotation()}"

    def with_action(self, stage: int, action: str) -> "BlockKey":
        """The block of another action (and stage) in the same step, run and microbatch."""
        return BlockKey(self.step, self.run, stage, action, self.microbatch)


class Anchor(msgspec.Struct, frozen=True):
    """Where on a block an arrow end sits: its first-starting fragment ("first"), its last-ending
    one ("last"), or an arrival marker named `name` at `at` on the last fragment's row
    ("arrival": where a transfer's data could first have arrived)."""

    which: str
    at: int = 0
    name: str = ""


FIRST, LAST = Anchor("first"), Anchor("last")
# Cross-rank arrows land on derived slices (derived.ARRIVAL): Perfetto v52's Flow Events panel
# lists an arrow under its end slices' categories (TrackEvent flows have none of their own), so
# that category shows or hides exactly the transfers between ranks.


class Block(msgspec.Struct):
    """A block's slices are snapshots of their rows (a few, read in Python): no stage moves
    them between finding the blocks and drawing their arrows."""

    key: BlockKey
    fragments: list[SliceRow] = msgspec.field(default_factory=list)

    @property
    def start(self) -> int:
        return min(f.ts for f in self.fragments)

    def first_fragment(self) -> SliceRow:
        """The fragment an arrow into the block ends on: the first to start (the longest on a tie)."""
        return min(self._on_real_work(), key=lambda f: (f.ts, -f.dur))

    def last_fragment(self) -> SliceRow:
        """The fragment a cross-rank arrow leaves from when the block is its source: the last to end."""
        return max(self._on_real_work(), key=lambda f: (f.ts + f.dur, f.ts))

    def _on_real_work(self) -> list[SliceRow]:
        """The fragments above lanes of the block's own kind (a receive's above communication,
        a compute's above compute), so arrows meet the work and not, say, a memcpy it covers;
        all fragments where none is (CPU blocks, or no such lane)."""
        kind = _ACTION_KIND.get(self.key.action)
        own = [f for f in self.fragments
               if f.track.home is not None and f.track.home.group is not None and f.track.home.group.kind is kind]
        return own or self.fragments

    def attach(self, trace: Trace, anchor: Anchor, flow_id: int, outgoing: bool) -> None:
        """An arrow end where `anchor` says (both passes of a merge resolve it alike)."""
        if anchor.which == "arrival":
            row = add_arrival_marker(trace, anchor.at, anchor.name, self.last_fragment().row)
        else:
            row = (self.first_fragment() if anchor.which == "first" else self.last_fragment()).row
        trace.flow_ends.append(FlowEnd(row, flow_id, outgoing))

    def shifted(self, offset: int) -> "Block":
        """The block on a clock `offset` ns later, as its rank's shifted slices are."""
        return Block(self.key, [f._replace(ts=f.ts + offset) for f in self.fragments])

    def extent(self) -> "Extent":
        first, last = self.first_fragment(), self.last_fragment()
        return Extent(first.ts, first.ts + first.dur, last.ts, last.ts + last.dur)


def add_arrival_marker(trace: Trace, at: int, name: str, beside: int) -> int:
    """A zero-duration, derived slice at `at` on the row of slice `beside`; its row."""
    return trace.slices.append(at, 0, name, derived.ARRIVAL, NO_ARGS, trace.slices.row(beside).track, instant=True)


class Extent(msgspec.Struct, frozen=True):
    """Where a block's first fragment starts and ends, and where its last-ending one does."""

    first_start: int
    first_end: int
    last_start: int
    last_end: int

    def shifted(self, offset: int) -> "Extent":
        """The extent on a clock `offset` ns later."""
        return Extent(self.first_start + offset, self.first_end + offset, self.last_start + offset,
                      self.last_end + offset)


# Which annotations a trace's PP blocks came from (the summary's `pp_annotations`).
GPU_PP, CPU_PP, STAGELESS, NO_PP = "GPU PP annotations", "CPU PP annotations only", "stage-less", "none"
_STAGELESS_ACTION = {"Forward": "F", "Backward": "B"}
_BLOCK_START = attrgetter("start")


_STEP, _PP, _STAGELESS = 1, 2, 3   # what a name is: a ProfilerStep, a PP annotation, GPipe's stage-less one


def find_blocks(trace: Trace, rules: LaneRules, pp_rank: int = 0) -> tuple[dict[BlockKey, Block], str]:
    """PP blocks, keyed by step, run, stage, action and microbatch, and where they came from:
    the GPU annotation fragments, or, in a trace with none (a CPU-only pipeline), the CPU
    annotations themselves, each run its own block. A trace with no `PP:` annotation at all
    is read for GPipe's stage-less `Forward <mb>` / `Backward <mb>`, on stage `pp_rank`.
    A pipeline rank repeats a few names thousands of times: each distinct name is read once
    in Python, the rows are labelled on columns."""
    table = trace.slices
    kinds: dict[str, tuple[int, Any]] = {}  # name -> (_STEP, its number) or (_PP or _STAGELESS, its match)

    def kind_of(name: str) -> bool:
        step = profiler_step(name)
        if step is not None:
            kinds[name] = (_STEP, step)
        elif (match := rules.pp_match(name)) is not None:
            kinds[name] = (_PP, match)
        elif (match := STAGELESS_PATTERN.match(name)) is not None:
            kinds[name] = (_STAGELESS, match)
        return name in kinds

    rows = table.named(kind_of)
    names, starts = table.name[rows], table.ts[rows]
    kind_by_id, step_by_id = np.zeros(len(table.texts), np.int8), np.zeros(len(table.texts), np.int64)
    matches: dict[int, Match] = {}  # name id -> its match, for annotations whose stage and microbatch are numbers
    for name_id in sorted_distinct(names).tolist():
        kind, value = kinds[table.texts[name_id]]
        if kind == _STEP:
            kind_by_id[name_id], step_by_id[name_id] = kind, value
        elif is_number(_stage(value, None if kind == _PP else pp_rank)) and \
                is_number(value.group("microbatch") or "0"):
            kind_by_id[name_id], matches[name_id] = kind, value
    row_kinds = kind_by_id[names]
    steps = _Steps(starts[row_kinds == _STEP], step_by_id[names[row_kinds == _STEP]])
    on_gpu = table.in_categories(rules.annotation_categories)[rows]
    chosen, stage_of_all = row_kinds == _PP, None
    if not chosen.any():
        chosen, stage_of_all = row_kinds == _STAGELESS, pp_rank
        if not chosen.any():
            return {}, NO_PP
    gpu, cpu = chosen & on_gpu, chosen & ~on_gpu
    scheme = STAGELESS if stage_of_all is not None else GPU_PP if gpu.any() else CPU_PP
    at = np.flatnonzero(gpu if gpu.any() else cpu)
    fragments = table.rows(rows[at])  # without GPU fragments, each CPU annotation is its run
    step_of, run_of, unlabelled = _cpu_run_labels(names[at], starts[at], _CpuRuns(names[cpu], starts[cpu], steps))
    if unlabelled:  # names with no CPU annotation
        pairs = [(fragments[index], matches[int(names[at[index]])]) for index in unlabelled]
        found = _runs_between_other_actions(pairs, steps.at_one, stage_of_all)
        for index in unlabelled:
            step_of[index], run_of[index] = found[fragments[index]]
    parts = {name_id: _key_part(matches[name_id], stage_of_all) for name_id in sorted_distinct(names[at]).tolist()}
    keys = list(zip(step_of, run_of, map(parts.__getitem__, names[at].tolist())))
    blocks: dict[BlockKey, Block] = {}
    for _, positions in grouped_in_order(first_positions(keys, len(keys))[0]):
        step, run, (stage, action, microbatch) = keys[positions[0]]
        key = BlockKey(step, run, stage, action, microbatch)
        blocks[key] = Block(key, [fragments[index] for index in positions.tolist()])
    return blocks, scheme


class _Steps:
    """The ProfilerStep a time falls in: the latest to start no later than it (0 before any)."""

    def __init__(self, starts: np.ndarray, numbers: np.ndarray):
        order = np.lexsort((numbers, starts))
        self.starts, self.numbers = starts[order], numbers[order]

    def at(self, times: np.ndarray) -> np.ndarray:
        index = np.searchsorted(self.starts, times, side="right") - 1
        return np.where(index >= 0, self.numbers[np.maximum(index, 0)], 0) if len(self.numbers) else \
            np.zeros(len(times), np.int64)

    def at_one(self, time: int) -> int:
        return int(self.at(np.array([time], np.int64))[0])


class _CpuRuns:
    """Each CPU annotation's run, per name in start order: its step, and its place among the
    name's earlier CPU annotations in that step (a step number can come back: a trace tiled
    in time, or a profiler restarted)."""

    def __init__(self, names: np.ndarray, starts: np.ndarray, steps: _Steps):
        order = np.lexsort((starts, names))
        self.names, self.starts = names[order], starts[order]
        self.steps = steps.at(self.starts)
        positions = np.arange(len(order))
        by_step = np.lexsort((positions, self.steps, self.names))
        names_by_step, steps_by_step = self.names[by_step], self.steps[by_step]
        first_in_step = np.ones(len(order), bool)
        first_in_step[1:] = (names_by_step[1:] != names_by_step[:-1]) | (steps_by_step[1:] != steps_by_step[:-1])
        self.runs = np.empty(len(order), np.int64)
        self.runs[by_step] = positions - np.maximum.accumulate(np.where(first_in_step, positions, 0))

    def of_name(self, name_id: int) -> slice:
        return slice(int(np.searchsorted(self.names, name_id)), int(np.searchsorted(self.names, name_id, "right")))


def _cpu_run_labels(names: np.ndarray, starts: np.ndarray, cpu_runs: _CpuRuns
                    ) -> tuple[list[int], list[int], list[int]]:
    """(steps, runs, unlabelled): the (step, run) of each fragment, that of the CPU annotation
    of its name that is the latest to start no later than it (or its name's first), and
    where a name has no CPU annotation, the fragment's position in `unlabelled` instead."""
    steps, runs = np.zeros(len(names), np.int64), np.zeros(len(names), np.int64)
    unlabelled: list[int] = []
    for name_id, positions in grouped_in_order(names):
        own = cpu_runs.of_name(name_id)
        if own.start == own.stop:
            unlabelled += positions.tolist()
            continue
        index = own.start + np.maximum(np.searchsorted(cpu_runs.starts[own], starts[positions], "right") - 1, 0)
        steps[positions], runs[positions] = cpu_runs.steps[index], cpu_runs.runs[index]
    return steps.tolist(), runs.tolist(), sorted(unlabelled)


def _key_part(match: Match, stage_of_all: Optional[int]) -> tuple[int, str, Optional[int]]:
    """A block key's (stage, action, microbatch) from its annotation's name."""
    action, microbatch = match.group("action"), match.group("microbatch")
    return int(_stage(match, stage_of_all)), _STAGELESS_ACTION.get(action, action), \
        int(microbatch) if microbatch else None


def _stage(match: Match, stage_of_all: Optional[int]) -> str:
    return match.group("stage") if stage_of_all is None else str(stage_of_all)


def _runs_between_other_actions(fragments: list[tuple[SliceRow, Match]], step_at: Callable[[int], int],
                                stage_of_all: Optional[int]) -> dict[SliceRow, tuple[int, int]]:
    """(step, run) per fragment of actions with no CPU annotation: a new run of an action
    begins when another action of its stage started at or after its current run ended."""
    labels: dict[SliceRow, tuple[int, int]] = {}
    run_of: dict[tuple[str, int], int] = {}
    run_end: dict[tuple[str, int], int] = {}
    latest: dict[str, tuple[str, int]] = {}     # stage -> (name, start) of its latest fragment
    other_start: dict[str, int] = {}            # stage -> latest start of a name other than latest's
    for fragment, match in sorted(fragments, key=lambda item: (item[0].ts, -item[0].dur)):
        stage, name, step = _stage(match, stage_of_all), fragment.name, step_at(fragment.ts)
        previous = latest.get(stage)
        if previous is not None and previous[0] != name:
            other_start[stage] = previous[1]
        intervened = other_start.get(stage)
        key, end = (name, step), fragment.ts + fragment.dur
        if key not in run_of:
            run_of[key], run_end[key] = 0, end
        elif intervened is not None and intervened >= run_end[key]:
            run_of[key], run_end[key] = run_of[key] + 1, end
        else:
            run_end[key] = max(run_end[key], end)
        latest[stage] = (name, fragment.ts)
        labels[fragment] = (step, run_of[key])
    return labels


def arrow(source: Block, target: Block, trace: Trace) -> bool:
    """An arrow from the source fragment that ends last (among those starting no later than the
    target) to the target's first fragment: between real slices, forward in time."""
    first = target.first_fragment()
    candidates = [f for f in source.fragments if f.ts <= first.ts]
    if not candidates:
        return False
    trace.flows.append(Flow(max(candidates, key=lambda f: f.ts + f.dur).row, first.row, PP_FLOW_CATEGORY))
    return True


def link_rank_local(trace: Trace, blocks: dict[BlockKey, Block]) -> dict:
    """RECV_x -> compute x -> SEND_x per stage and microbatch, and UNSHARD -> next compute."""
    pairs = unmatched = unshard_pairs = unshard_unmatched = 0
    unmatched_names: list[str] = []
    compute_by_stage: dict[tuple[int, int], list[Block]] = defaultdict(list)
    for key, block in blocks.items():
        if key.action in COMPUTE_ACTIONS:
            compute_by_stage[(key.step, key.stage)].append(block)
    for stage_blocks in compute_by_stage.values():
        stage_blocks.sort(key=_BLOCK_START)
    for key in sorted(blocks):
        block = blocks[key]
        if key.action in COMPUTE_OF:
            compute = next((blocks[k] for k in (key.with_action(key.stage, action)
                                                 for action in COMPUTE_OF[key.action]) if k in blocks), None)
            linked = compute is not None and (
                arrow(block, compute, trace) if key.action.startswith("RECV") else arrow(compute, block, trace))
            pairs += linked
            if not linked:
                unmatched += 1
                unmatched_names.append(key.describe())
        elif key.action == "UNSHARD":  # the first compute block of its stage starting with it or later
            stage_blocks = compute_by_stage.get((key.step, key.stage), [])
            index = bisect_left(stage_blocks, block.start, key=_BLOCK_START)
            later = stage_blocks[index] if index < len(stage_blocks) else None
            linked = later is not None and arrow(block, later, trace)
            unshard_pairs += linked
            unshard_unmatched += not linked
    return {"pp_compute_dependency_pairs": pairs, "pp_compute_dependency_unmatched": unmatched,
            "pp_unshard_compute_pairs": unshard_pairs, "pp_unshard_compute_unmatched": unshard_unmatched,
            "pp_unmatched_examples": unmatched_names[:20]}
