"""`cgtrace diff`: what changed from one trace (A) to another (B), figure by figure.

Both sides are measured by `cgtrace report` (report.py builds each side's figures), so every
figure here means what the report's definition says; this module only matches the two sides'
GPUs, lane groups, kernels, steps and pipeline stages by identity, puts the figures on one
footing (a mean per step, so runs profiled for different numbers of steps compare) and
compares them. What a CI gate (`--fail-above`) looks at is chosen here too; diff_render.py
shows the result.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Hashable, Iterable, NamedTuple, Optional

from ..errors import CgtraceError
from ..kineto import MAX_RANK
from ..model import LaneKind
from .report import gpu_label

UNCHANGED_PCT = 1.0  # a finding within this percentage of A's figure reads "unchanged"
# ... or within this share of A's mean step (the noise floor, in ns): a warm-up 3.2% longer by
# 4 us, a drain 62% shorter by 26 us in a 15 ms step (real torch pipelines profiled twice) is
# the jitter of a profiled step, not a change.
NOISE_SHARE = 0.005

# The diff's own terms, each defined once; the report's definitions follow them in the output.
DIFF_DEFINITIONS = {
    "matching": "GPUs are matched by identity: PP rank, global rank and device (Kineto's GPU index, or the "
                "GPU's name where the trace records none); lane groups by label on each GPU, kernels by name, "
                "pipeline stages by PP rank; traces whose GPUs or stages do not match one to one are refused",
    "chosen": "--a-rank/--b-rank (global rank) and --a-gpu/--b-gpu (Kineto's GPU index) keep only those GPUs, "
              "and their ranks' stages, on each side; where the kept GPUs' identities differ (rank 3 of one run "
              "against rank 1 of another) one GPU a side is compared with the other, as is one PP rank's stages; "
              "kernels by name still cover every GPU of each trace",
    "op match": "each GPU's kernel time per step under the op that launched it (the report's kernels by op) "
                "on both sides, matched by the op's name, so kernels that differ by name (another GPU or "
                "library) compare through the op that launched them; unmatched: ops on one side only, and "
                "each side's kernels with no launch arrow or no op around their launch",
    "per step": "every figure but a single step's is a mean per step: its total over the window divided by the "
                "GPU's steps in it (an active span counts as one); kernel and stage totals are divided by the "
                "steps of their trace (mean over its GPUs) and of their PP rank",
    "step": "a step's length (a ProfilerStep#N span bounded as the report's step windows say, both sides alike, "
            "else the active span); steps are matched by their order in each GPU's window, the first with the "
            "first, since their numbers differ between runs; steps beyond the shorter side's are not compared",
    "compute busy": "time at least one compute lane is busy",
    "kernel time": "a kernel's time in the window, summed over its slices and GPUs",
    "kind time": "the busy time of a kind's lane groups, summed over them and over GPUs",
    "delta": "B's figure minus A's; change: the delta as a percentage of A's figure (none where A's is 0); "
             f"unchanged: a change of at most {UNCHANGED_PCT:g}%, or of at most {NOISE_SHARE:.1%} of A's mean "
             "step (the noise floor, noise_floor_ns): a finding must exceed both",
    "fail-above": "--fail-above PCT exits 1 when a gated figure changes by more than PCT percent of A's (one "
                  "that is 0 in A and not in B, by any PCT) and by more than the noise floor: per GPU its step, busy, compute busy and exposed "
                  "communication, each lane group's busy time, each stage part; single steps and kernels are "
                  "not gated",
}
_SAME_GPUS = ("diff two traces of the same GPUs: the same rank's trace from each run, or merges of the same "
              "ranks, each given as profiler output or as cgtrace wrote it")


class Side(NamedTuple):
    """What of a trace is compared: the GPUs of one global rank, one GPU index; None: all."""

    rank: Optional[int] = None
    gpu: Optional[int] = None

    @classmethod
    def checked(cls, side: str, rank: object = None, gpu: object = None) -> "Side":
        """A side as the Python API gives it (`a_rank=...`), bounded as the command line bounds it."""
        def bounded(what: str, value: object) -> Optional[int]:
            if value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_RANK):
                return value
            raise CgtraceError(f"{side}_{what}={value!r}: expected a whole number from 0 to {MAX_RANK}")
        return cls(bounded("rank", rank), bounded("gpu", gpu))

    def named(self) -> str:
        return ", ".join(f"{what} {value}" for what, value in (("rank", self.rank), ("GPU index", self.gpu))
                         if value is not None)


def diff_reports(a: dict[str, Any], b: dict[str, Any], top: int = 10,
                 sides: tuple[Side, Side] = (Side(), Side())) -> dict[str, Any]:
    """The diff of two reports' figures (build_report's, every kernel listed): JSON-ready, times
    in integer ns per step; `top` kernels and ops, largest change first; `sides`: what of A and
    of B is compared."""
    names = (a["input"]["trace"], b["input"]["trace"])
    chosen = any(side != Side() for side in sides)
    kept = [_chosen_gpus(figures["gpus"], side, name) for figures, side, name in zip((a, b), sides, names)]
    gpus = _gpu_pairs(kept[0], kept[1], names, chosen)
    gpu_rows, lane_rows, step_rows, op_rows, unmatched = [], [], [], [], []
    for _, gpu_a, gpu_b in gpus:
        gpu_rows += _gpu_rows(gpu_a, gpu_b)
        lane_rows += _lane_rows(gpu_a, gpu_b)
        step_rows += _step_rows(gpu_a, gpu_b)
        matched, apart = _op_rows(gpu_a, gpu_b)
        op_rows += matched
        unmatched.append(apart)
    kernel_rows = _kernel_rows(a, b)
    stages_a, stages_b = _chosen_stages(a, kept[0], chosen), _chosen_stages(b, kept[1], chosen)
    if chosen:
        stages_b = _renumbered(stages_a, stages_b)
    stage_rows = _stage_rows(stages_a, stages_b, names)
    steps, _ = _step_figures(gpu_rows, stage_rows)
    floor = round(NOISE_SHARE * sum(row["a_ns"] for row in steps) / len(steps)) if steps else 0
    return {
        "a": {**a["input"], **sides[0]._asdict()}, "b": {**b["input"], **sides[1]._asdict()},
        "definitions": {**DIFF_DEFINITIONS, **a["definitions"]}, "noise_floor_ns": floor,
        "warnings": _schedule_warnings(stages_a, stages_b),
        "findings": _findings(gpu_rows, lane_rows, kernel_rows, stage_rows, floor),
        "gpus": gpu_rows, "lane_groups": lane_rows, "steps": step_rows,
        "kernels": kernel_rows[:max(top, 0)], "stages": stage_rows,
        "kernels_by_op": sorted(op_rows, key=lambda row: (-abs(row["delta_ns"]), row["op"], row["gpu"]))[:max(top, 0)],
        "unmatched": unmatched,
    }


def _compared(a: float, b: float) -> dict[str, Any]:
    """One figure on both sides, in whole ns: A's, B's, the delta and the change in percent."""
    a_ns, b_ns = round(a), round(b)
    return {"a_ns": a_ns, "b_ns": b_ns, "delta_ns": b_ns - a_ns,
            "change_pct": round(100 * (b_ns - a_ns) / a_ns, 2) if a_ns else None}


# -- matching ------------------------------------------------------------------------------------
def _identity(gpu: dict[str, Any]) -> tuple[Optional[int], Optional[int], Hashable]:
    """What makes a GPU the same one in two traces: its PP and global rank, and Kineto's device
    index (its name where the trace records none)."""
    return gpu["pp_rank"], gpu["global_rank"], gpu["device"] if gpu["device"] is not None else gpu["gpu"]


def _chosen_gpus(gpus: list[dict[str, Any]], side: Side, name: str) -> list[dict[str, Any]]:
    """The GPUs `side` keeps; refused, naming what the trace has, where it keeps none."""
    kept = [gpu for gpu in gpus if side.rank in (None, gpu["global_rank"]) and side.gpu in (None, gpu["device"])]
    if gpus and not kept:
        has = ", ".join(sorted({gpu_label(gpu) for gpu in gpus}))
        raise CgtraceError(f"{name}: has no GPU of {side.named()}; it has {has}")
    return kept


def _gpu_pairs(a: list[dict[str, Any]], b: list[dict[str, Any]], names: tuple[str, str],
               chosen: bool = False) -> list[tuple]:
    """(identity, A's GPU, B's GPU) for every GPU, refused where an identity is missing or twice on a side;
    where GPUs were `chosen` and their identities differ, A's one GPU against B's one."""
    for side, gpus in enumerate((a, b)):
        if len({_identity(gpu) for gpu in gpus}) < len(gpus):
            raise CgtraceError(f"{names[side]}: two of its GPUs have one identity (PP rank, global rank, device), "
                               f"so they cannot be matched; {_SAME_GPUS}")
    if chosen and {_identity(gpu) for gpu in a} != {_identity(gpu) for gpu in b}:
        if len(a) == len(b) == 1:
            return [(_identity(a[0]), a[0], b[0])]
        raise CgtraceError(f"{names[0]} against {names[1]}: the chosen GPUs ({len(a)} against {len(b)}) are not "
                           "the same ones; choose one GPU a side (--a-rank and --b-rank, --a-gpu and --b-gpu)")
    labels = {_identity(gpu): gpu_label(gpu) for gpu in a + b}
    return _pairs({_identity(gpu): gpu for gpu in a}, {_identity(gpu): gpu for gpu in b}, labels.__getitem__, names)


def _pairs(a: dict[Any, Any], b: dict[Any, Any], what: Callable[[Any], str],
           names: tuple[str, str]) -> list[tuple[Any, Any, Any]]:
    """(key, A's, B's) for every key, in A's order; refused, naming the file that lacks one, unless
    both sides hold the same keys."""
    for side, (items, others) in enumerate(((b, a), (a, b))):
        missing = next((key for key in others if key not in items), None)
        if missing is not None:
            raise CgtraceError(f"{names[1 - side]}: has no {what(missing)}, which {names[side]} has; {_SAME_GPUS}")
    return [(key, a[key], b[key]) for key in a]


def _gpu_fields(gpu: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """A's GPU as its row names it, and B's (another GPU where they were chosen)."""
    return {"gpu": gpu_label(gpu), "b_gpu": gpu_label(b), "pp_rank": gpu["pp_rank"],
            "global_rank": gpu["global_rank"], "device": gpu["device"]}


# -- figures -------------------------------------------------------------------------------------
_GPU_FIGURES: tuple[tuple[str, Callable[[dict[str, Any]], int]], ...] = (
    ("step", lambda gpu: sum(step["step_ns"] for step in gpu["steps"])),
    ("busy", lambda gpu: gpu["busy_ns"]),
    ("compute busy", lambda gpu: sum(step["compute_busy_ns"] for step in gpu["steps"])),
    ("exposed communication", lambda gpu: gpu["exposed_comm_ns"]),
)
_STEP_FIGURES = (("step", "step_ns"), ("compute busy", "compute_busy_ns"))
_POINTS_IN_TIME = {"start_ns", "end_ns"}  # a stage row's fields that are no duration


def _gpu_rows(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    counts = {"a_steps": len(a["steps"]), "b_steps": len(b["steps"])}
    return [{**_gpu_fields(a, b), "figure": figure, **counts,
             **_compared(total(a) / len(a["steps"]), total(b) / len(b["steps"]))} for figure, total in _GPU_FIGURES]


def _lane_rows(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Each lane group either side has on this GPU, A's order first; a group one side lacks is 0 there."""
    groups_a, groups_b = ({lane["group"]: lane for lane in gpu["lane_groups"]} for gpu in (a, b))
    rows = []
    for group in {**groups_a, **groups_b}:
        busy_a, busy_b = (groups[group]["busy_ns"] / len(gpu["steps"]) if group in groups else 0
                          for groups, gpu in ((groups_a, a), (groups_b, b)))
        rows.append({**_gpu_fields(a, b), "group": group, "kind": (groups_a.get(group) or groups_b[group])["kind"],
                     **_compared(busy_a, busy_b)})
    return rows


def _step_rows(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**_gpu_fields(a, b), "index": index, "a_step": step_a["step"], "b_step": step_b["step"], "figure": figure,
             **_compared(step_a[key], step_b[key])}
            for index, (step_a, step_b) in enumerate(zip(a["steps"], b["steps"]), 1) for figure, key in _STEP_FIGURES]


def _steps_per_gpu(figures: dict[str, Any]) -> float:
    gpus = figures["gpus"]
    return sum(len(gpu["steps"]) for gpu in gpus) / len(gpus) if gpus else 1.0


def _kernel_rows(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Every kernel whose time changed, largest change first (then by name)."""
    totals_a, totals_b = ({kernel["name"]: kernel["total_ns"] / _steps_per_gpu(side) for kernel in side["top_kernels"]}
                          for side in (a, b))
    rows = [{"name": name, **_compared(totals_a.get(name, 0), totals_b.get(name, 0))}
            for name in {**totals_a, **totals_b}]
    return sorted((row for row in rows if row["delta_ns"]), key=lambda row: (-abs(row["delta_ns"]), row["name"]))


def _op_rows(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One GPU pair's kernel time per step by launching op (report's `kernels_by_op`, every op
    listed): a row per op both sides have, and what could not be matched."""
    steps = {"a": len(a["steps"]) or 1, "b": len(b["steps"]) or 1}
    ops = {side: {row["op"]: row for row in gpu["kernels_by_op"]["ops"]} for side, gpu in (("a", a), ("b", b))}

    def per_step(side: str, row: dict[str, Any]) -> dict[str, Any]:
        return {"kernels": row["kernels"], "ns": round(row["total_ns"] / steps[side])}

    matched = [{"gpu": gpu_label(a), "b_gpu": gpu_label(b), "op": op, "a_kernels": ops["a"][op]["kernels"],
                "b_kernels": ops["b"][op]["kernels"],
                **_compared(ops["a"][op]["total_ns"] / steps["a"], ops["b"][op]["total_ns"] / steps["b"])}
               for op in ops["a"] if op in ops["b"]]
    apart: dict[str, Any] = {"gpu": gpu_label(a), "b_gpu": gpu_label(b)}
    for side, other, gpu in (("a", "b", a), ("b", "a", b)):
        apart[f"{side}_only_ops"] = sorted(({"op": op, **per_step(side, row)} for op, row in ops[side].items()
                                            if op not in ops[other]), key=lambda row: (-row["ns"], row["op"]))
        for reason in ("no_launch", "no_op"):
            apart[f"{side}_{reason}"] = per_step(side, gpu["kernels_by_op"][reason])
    return matched, apart


def _chosen_stages(figures: dict[str, Any], gpus: list[dict[str, Any]], chosen: bool) -> list[dict[str, Any]]:
    """A side's pipeline stage rows: all, or where GPUs were chosen, those of their ranks."""
    rows = figures.get("pipeline", {}).get("stages", [])
    ranks = {gpu["global_rank"] for gpu in gpus}
    return [row for row in rows if row["global_rank"] in ranks] if chosen and gpus else rows


def _renumbered(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """B's stage rows under A's PP rank where each side kept one PP rank and they differ."""
    ranks_a, ranks_b = {row["pp_rank"] for row in a}, {row["pp_rank"] for row in b}
    if len(ranks_a) == len(ranks_b) == 1 and ranks_a != ranks_b:
        [pp_rank] = ranks_a
        return [{**row, "pp_rank": pp_rank} for row in b]
    return b


def _schedule(stages: list[dict[str, Any]]) -> dict[str, tuple[tuple[int, ...], float]]:
    """Per rank (its title), the stages its compute actions name and how many it runs per step:
    what bounds a stage's warm-up and drain."""
    by_rank: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in stages:
        by_rank[row["rank"]].append(row)
    return {rank: (tuple(sorted({action["stage"] for row in rows for action in row.get("actions", [])
                                 if action["stage"] is not None})),
                   sum(len(row.get("actions", [])) for row in rows) / len(rows)) for rank, rows in by_rank.items()}


def _schedule_warnings(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """Where A and B run different schedules (stages per rank, compute actions per step), their
    warm-up, drain and receive waits are bounded differently: a change there is no like for like."""
    schedule_a, schedule_b = _schedule(a), _schedule(b)
    warnings = []
    for rank in schedule_a.keys() & schedule_b.keys():
        (stages_a, actions_a), (stages_b, actions_b) = schedule_a[rank], schedule_b[rank]
        if stages_a != stages_b or actions_a != actions_b:
            warnings.append(f"{rank} runs a different schedule in B: stages {list(stages_a)} with {actions_a:g} "
                            f"compute actions per step in A, {list(stages_b)} with {actions_b:g} in B; its "
                            "warm-up, drain and receive waits are bounded differently, so their changes are no "
                            "like-for-like comparison")
    return sorted(warnings)


def _stage_means(stages: list[dict[str, Any]]) -> dict[int, tuple[int, dict[str, float]]]:
    """Per PP rank, its steps and the mean per step of each duration of its `pipeline.stages`
    rows (every `<part>_ns` field but the points in time, `step_ns` included), so parts the
    report adds later compare too."""
    by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in stages:
        by_rank[row["pp_rank"]].append(row)
    means = {}
    for pp_rank, rows in by_rank.items():
        parts = [key for key, value in rows[0].items()
                 if key.endswith("_ns") and key not in _POINTS_IN_TIME and isinstance(value, int)]
        means[pp_rank] = (len(rows), {key.removesuffix("_ns"): sum(row[key] for row in rows) / len(rows)
                                      for key in parts})
    return means


def _stage_rows(a: list[dict[str, Any]], b: list[dict[str, Any]], names: tuple[str, str]) -> list[dict[str, Any]]:
    stages_a, stages_b = _stage_means(a), _stage_means(b)
    # Each rank as its report names it (A's where both have it), never a name of the diff's own.
    titles = {row["pp_rank"]: row["rank"] for side in (b, a) for row in side}
    rows = []
    for pp_rank, (steps_a, parts_a), (steps_b, parts_b) in _pairs(
            stages_a, stages_b, lambda rank: f"pipeline stage of {titles[rank]}", names):
        rows += [{"pp_rank": pp_rank, "rank": titles[pp_rank], "part": part, "a_steps": steps_a, "b_steps": steps_b,
                  **_compared(parts_a.get(part, 0), parts_b.get(part, 0))} for part in {**parts_a, **parts_b}]
    return rows


# -- directories, rank by rank -------------------------------------------------------------------
class RankPair(NamedTuple):
    """One rank's trace in each directory (the same global rank, or the ranks chosen) and their diff."""

    a_rank: int
    b_rank: int
    diff: dict[str, Any]

    def title(self) -> str:
        return f"rank {self.a_rank}" + ("" if self.a_rank == self.b_rank else f" / rank {self.b_rank}")


def diff_ranks(pairs: list[RankPair], only_a: dict[int, str], only_b: dict[int, str], top: int = 10
               ) -> dict[str, Any]:
    """Two directories' diff: each rank pair's diff, the `top` largest findings over all pairs
    (changes beyond each pair's noise floor, largest first), and the ranks (global rank -> trace)
    one side holds alone."""
    changes = [{"a_rank": pair.a_rank, "b_rank": pair.b_rank, "rank": pair.title(), **finding}
               for pair in pairs for finding in pair.diff["findings"] if not finding["unchanged"]]
    changes.sort(key=lambda row: (-abs(row["delta_ns"]), row["a_rank"], row["key"]))
    return {"pairs": [{"a_rank": pair.a_rank, "b_rank": pair.b_rank, "rank": pair.title(), "diff": pair.diff}
                      for pair in pairs],
            "largest_changes": changes[:max(top, 0)],
            "only_in_a": [{"global_rank": rank, "trace": trace} for rank, trace in sorted(only_a.items())],
            "only_in_b": [{"global_rank": rank, "trace": trace} for rank, trace in sorted(only_b.items())]}


def beyond_ranks(diff: dict[str, Any], pct: float) -> list[str]:
    """`beyond` for each rank pair of a directories' diff, each line naming its rank."""
    return [f"{pair['rank']}: {line}" for pair in diff["pairs"] for line in beyond(pair["diff"], pct)]


# -- findings and the gate -----------------------------------------------------------------------
def _summed(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    rows = list(rows)
    return _compared(sum(row["a_ns"] for row in rows), sum(row["b_ns"] for row in rows))


def _most(rows: list[dict[str, Any]], where: Callable[[dict[str, Any]], str], word: str = "in") -> str:
    """Where the largest change of `rows` is (changes of rows in one place summed), where they
    are in several places."""
    deltas: dict[str, int] = defaultdict(int)
    for row in rows:
        deltas[where(row)] += row["delta_ns"]
    most = max(deltas, key=lambda place: abs(deltas[place]))
    return f"; most {word} {most}" if len(deltas) > 1 and deltas[most] else ""


def _finding(key: str, subject: str, figures: dict[str, Any], floor: int, unit: str = " per step",
             detail: str = "") -> dict:
    unchanged = _within_noise(figures, floor)
    text = f"{subject[:1].upper()}{subject[1:]} {_movement(figures, floor, unit)}" + ("" if unchanged else detail)
    return {"key": key, "subject": subject, "text": text, "unchanged": unchanged, **figures}


def _within_noise(figures: dict[str, Any], floor: int) -> bool:
    """A change within UNCHANGED_PCT of A's figure, or within the noise floor (ns)."""
    return abs(figures["delta_ns"]) * 100 <= UNCHANGED_PCT * figures["a_ns"] or abs(figures["delta_ns"]) <= floor


def _movement(figures: dict[str, Any], floor: int, unit: str = " per step") -> str:
    """A figure's change in words: "down 48.0% (-3.100 ms per step)", "unchanged (2.000 ms)"."""
    a, delta = figures["a_ns"], figures["delta_ns"]
    if _within_noise(figures, floor):
        return f"unchanged ({a / 1e6:.3f} ms{unit})"
    if not a:
        return f"up from 0 to {figures['b_ns'] / 1e6:.3f} ms{unit}"
    return f"{'up' if delta > 0 else 'down'} {abs(100 * delta / a):.1f}% ({delta / 1e6:+.3f} ms{unit})"


def _step_figures(gpu_rows: list[dict], stage_rows: list[dict]) -> tuple[list[dict], Callable[[dict], str]]:
    """The step time rows of GPUs, or of the PP ranks of a pipeline without GPUs (CPU-only), and
    how a row names where it is."""
    steps = [row for row in gpu_rows if row["figure"] == "step"]
    return (steps, _on_gpu) if steps else ([row for row in stage_rows if row["part"] == "step"], _on_rank)


def _findings(gpu_rows: list[dict], lane_rows: list[dict], kernel_rows: list[dict],
              stage_rows: list[dict], floor: int) -> list[dict[str, Any]]:
    """The headline changes, each under a key CI can gate on: step time, time per lane kind,
    exposed communication, the kernel that moved most, each stage part; `floor`: the noise floor."""
    found = []
    steps, place = _step_figures(gpu_rows, stage_rows)
    if steps:
        total = _summed(steps)
        mean = _compared(total["a_ns"] / len(steps), total["b_ns"] / len(steps))
        found.append(_finding("step_time", "step time", mean, floor, unit="", detail=_most(steps, place, "on")))
    for kind in LaneKind:
        rows = [row for row in lane_rows if row["kind"] == kind.value]
        if rows:
            found.append(_finding(f"kind.{kind.value}", f"{kind.value} time", _summed(rows), floor,
                                  detail=_most(rows, lambda row: row["group"])))
    if gpu_rows:
        exposed = [row for row in gpu_rows if row["figure"] == "exposed communication"]
        found.append(_finding("exposed_communication", "exposed communication", _summed(exposed), floor,
                              detail=_most(exposed, _on_gpu, "on")))
    kernel = _finding("top_kernel", f"kernel {kernel_rows[0]['name']}", kernel_rows[0], floor) if kernel_rows else None
    if kernel and not kernel["unchanged"]:  # the kernel that moved most, where one moved
        found.append(kernel)
    for part in dict.fromkeys(row["part"] for row in stage_rows if row["part"] != "step"):
        rows = [row for row in stage_rows if row["part"] == part]
        found.append(_finding(f"stage.{part}", f"stage {part.replace('_', ' ')}", _summed(rows), floor,
                              detail=_most(rows, _on_rank, "on")))
    return found


def _on_gpu(row: dict[str, Any]) -> str:
    return row["gpu"]


def _on_rank(row: dict[str, Any]) -> str:
    return str(row["rank"])


# What --fail-above looks at: each section's rows, and how a row is named on its line.
_GATED: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("gpus", lambda row: f"{row['gpu']}: {row['figure']}"),
    ("lane_groups", lambda row: f"{row['gpu']}: {row['group']} busy"),
    ("stages", lambda row: f"{row['rank']}: stage {row['part'].replace('_', ' ')}"),
)


def beyond(diff: dict[str, Any], pct: float) -> list[str]:
    """The gated figures that changed by more than `pct` percent of A's and by more than the
    noise floor, one line each."""
    floor = diff["noise_floor_ns"]
    return [f"{name(row)} {_movement(row, floor)}" for section, name in _GATED for row in diff[section]
            if abs(row["delta_ns"]) * 100 > pct * row["a_ns"] and abs(row["delta_ns"]) > floor]
