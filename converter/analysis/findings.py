"""Findings: the few things worth looking at first, in plain English, each with its figure
and where to look, under a stable key CI can gate on.

A finding is data (`Finding`); the rules that pick them read a report's figures only, so any
answer that has figures (report, report DIR, a diff) can list findings in one format.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from statistics import mean
from typing import Any, Iterable, Optional

# A part of the step or window this large is worth a line.
NOTABLE_SHARE = 0.10
NOTABLE_EXPOSED_SHARE = 0.05
MOST = 8  # findings listed at most, largest first

FINDINGS_DEFINITION = (f"at most {MOST} lines, largest share first: a PP rank that waits on receives (recv_wait) or "
                       f"idles in warm-up and drain (pipeline_bubble) for {NOTABLE_SHARE:.0%} of its steps or more; "
                       f"communication exposed {NOTABLE_EXPOSED_SHARE:.0%} or more (exposed_communication: a stage's "
                       "outside its receive waits, else the most exposed GPU's); a straggler (straggler: how late it "
                       "arrives into collectives per step, as a share of the median step)")


@dataclass(frozen=True)
class Finding:
    """One line of findings: `key` says which rule, `figure` its number (a share 0..1), `unit`
    what it is a share of, `where` the rank, step or lane to look at."""

    key: str
    text: str
    figure: float
    unit: str
    where: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "text": self.text, "figure": self.figure, "unit": self.unit, "where": self.where}


def ranked(findings: Iterable[Finding]) -> list[Finding]:
    """Largest share first, at most MOST."""
    return sorted(findings, key=lambda f: (-f.figure, f.text))[:MOST]


def as_text(findings: list[dict[str, Any]]) -> str:
    """The findings' lines, as text output shows them above everything else."""
    if not findings:
        return "Findings: nothing stands out\n"
    return "Findings\n" + "".join(f"  - {finding['text']}\n" for finding in findings)


def report_findings(figures: dict[str, Any]) -> list[Finding]:
    """Findings of one trace's report figures (report.py's JSON)."""
    stages = figures.get("pipeline", {}).get("stages", [])
    found = list(_pipeline(stages))
    # A stage's exposed communication leaves out its receive waits, which are said already.
    staged = {row["global_rank"] for row in stages}
    exposed = sorted((gpu for gpu in figures.get("gpus", []) if gpu["exposed_comm_share"] >= NOTABLE_EXPOSED_SHARE
                      and gpu["global_rank"] not in staged), key=lambda gpu: -gpu["exposed_comm_share"])
    if exposed:
        found.append(_exposed(exposed[0], len(exposed) - 1))
    return ranked(found + straggler_findings(figures.get("stragglers", [])))


def across_findings(stages: list[dict[str, Any]], stragglers: list[dict[str, Any]]) -> list[Finding]:
    """Findings of `report DIR`: its traces' pipeline stage rows (each trace's report's, tagged
    with its `file`) and its stragglers."""
    return ranked(list(_pipeline(stages)) + straggler_findings(stragglers))


def _pipeline(rows: list[dict[str, Any]]) -> Iterable[Finding]:
    """Receive waits, the schedule's bubble and exposed communication outside receives, per
    stage: a rank of a pipeline (PP ranks of several pipelines, as `report DIR` lists them,
    are told apart by their global ranks)."""
    by_rank: dict[tuple[int, Optional[int]], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_rank[(row["pp_rank"], row["global_rank"])].append(row)
    for _, steps in sorted(by_rank.items(), key=lambda item: (item[0][0], -1 if item[0][1] is None else item[0][1])):
        title = steps[0]["rank"]
        where: dict[str, Any] = {key: steps[0][key] for key in ("pp_rank", "global_rank", "file") if key in steps[0]}
        share = mean(row["recv_wait_ns"] / row["step_ns"] for row in steps if row["step_ns"])
        if share >= NOTABLE_SHARE:
            most = _most_waited_for(steps)
            yield Finding("recv_wait", f"{title} waits {share:.0%} of each step on receives"
                          + (f", most for {most}" if most else ""), round(share, 4), "share of the step",
                          {**where, "look_at": "receive waits (recv_waits) of its steps"})
        warmup = mean(row["warmup_ns"] / row["step_ns"] for row in steps if row["step_ns"])
        drain = mean(row["drain_ns"] / row["step_ns"] for row in steps if row["step_ns"])
        if warmup + drain >= NOTABLE_SHARE:
            yield Finding("pipeline_bubble", f"{title} idles {warmup:.0%} of each step before its first compute "
                          f"(warm-up) and {drain:.0%} after its last (drain)", round(warmup + drain, 4), "share of the step",
                          {**where, "look_at": "the start and end of its steps"})
        exposed = mean(row["exposed_comm_ns"] / row["step_ns"] for row in steps if row["step_ns"])
        if exposed >= NOTABLE_EXPOSED_SHARE:
            yield Finding("exposed_communication", f"Communication is exposed {exposed:.0%} of each step on {title} "
                          "(between its first and last compute, outside receives)", round(exposed, 4), "share of the step",
                          {**where, "look_at": "its communication ops (c10d, gloo) outside receives"})


def _most_waited_for(steps: list[dict[str, Any]]) -> Optional[str]:
    """What a rank's receive waits were mostly for, over its steps (None where nothing names it)."""
    totals: dict[tuple, int] = defaultdict(int)
    for row in steps:
        for wait in row["recv_waits"]:
            totals[(wait["action"], wait["from_stage"], wait["from_rank"])] += wait["wait_ns"]
    if not totals:
        return None
    (action, from_stage, from_rank), _ = max(totals.items(), key=lambda item: item[1])
    return waited_for({"action": action, "microbatch": None, "from_stage": from_stage, "from_rank": from_rank}) \
        if action else None


def waited_for(wait: dict[str, Any]) -> str:
    """A receive wait (pipeline_anatomy's) as words: "RECV_F mb 0 from stage 1 on PP rank 1 (global 1)"."""
    return " ".join(part for part in (
        wait["action"] or "a receive", f"mb {wait['microbatch']}" if wait["microbatch"] is not None else "",
        f"from stage {wait['from_stage']}" if wait["from_stage"] is not None else "",
        f"on {wait['from_rank']}" if wait["from_rank"] is not None else "") if part)


def _exposed(gpu: dict[str, Any], more: int) -> Finding:
    """The GPU with the most exposed communication (and how many more are over the mark)."""
    lanes = sorted((lane for lane in gpu["lane_groups"] if lane["kind"] == "communication" and lane["busy_ns"]),
                   key=lambda lane: -lane["busy_ns"])
    label = gpu["gpu"] + (f", {gpu['rank']}" if gpu.get("rank") else "")
    share = gpu["exposed_comm_share"]
    busiest = f" (busiest: {lanes[0]['group']}, {lanes[0]['share']:.0%})" if lanes else ""
    others = f"; {more} more GPU{'s' if more > 1 else ''} over {NOTABLE_EXPOSED_SHARE:.0%}" if more else ""
    return Finding("exposed_communication",
                   f"Communication is exposed {share:.0%} of the window on {label}{busiest}{others}",
                   share, "share of the window",
                   {"gpu": gpu["gpu"], "pp_rank": gpu["pp_rank"], "global_rank": gpu["global_rank"],
                    "lanes": [lane["group"] for lane in lanes]})


def straggler_findings(stragglers: list[dict[str, Any]]) -> list[Finding]:
    """One finding per straggler a merge's report or `report DIR` names (stragglers.py's rows)."""
    return ranked(Finding("straggler", f"{s['title']} arrives late at {s['late_collectives']} collectives, "
                          f"{s['late_ns_per_step'] / 1e6:.3f} ms per step after their typical arrival ({_cost(s)})",
                          s["late_share"],
                          "share of the median step", {"file": s["file"], "global_rank": s["global_rank"], "gpu": s["gpu"],
                                          "look_at": "its work before the collectives it joins last"})
                  for s in stragglers)


def _cost(straggler: dict[str, Any]) -> str:
    """What a late rank cost the others: its hold-up where it came last, else that a later rank
    held them up (it would, were that one on time)."""
    if not straggler["held_up_ns_per_step"]:
        return "never the last to arrive: a later rank held those collectives up"
    return (f"it held them up {straggler['held_up_ns_per_step'] / 1e6:.3f} ms per step; the others waited "
            f"{straggler['caused_wait_ns'] / 1e6:.3f} ms for it in all")
