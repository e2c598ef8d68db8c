"""The critical path a merge (or a compact asked for it) wrote into its trace
(engine/critical_path.py), read back per step.

The trace keeps each segment as a slice on a track whose role is critical_path, its kind, step
and rank in the slice's args; the report reads them here, so its figures and the trace agree,
and sums them per step and per rank for the text and HTML summaries.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

from ..model.derived import PATH_KINDS

Rows = Callable[[str], list[tuple[Any, ...]]]


CRITICAL_PATH_DEFINITIONS = {
    "critical path": "derived, per step of a merge, or of one trace compacted with --critical-path: the chain "
                     "of work (across ranks, in a merge) that set the step time, found by walking back from the "
                     "step's last work to end, at each piece of work, to the work before it that was ready last "
                     "(on its thread or stream, its launch, a synchronisation's GPU work, the send whose data a "
                     "receive waited for, the last rank to start a collective); the step's work is what ran "
                     "inside it and, in one compacted trace, the GPU work its calls launched; its segments tile "
                     "the step from its first rank's ProfilerStep start to that last work's end",
    "path kinds": "compute: a compute lane's GPU work, or a CPU op's own time inside an op that counts as stage "
                  "compute; transfer: communication work, a receive running on from its data's arrival or a "
                  "collective from its last rank's start, data in flight, a transfer queued on another thread; "
                  "launch: a CPU call that launched GPU work; wait: a synchronisation (a call that waits for "
                  "the GPU, a copy it made that returned only once done among them), or time nothing traced "
                  "ran on the path's thread or stream, each named for what it waited for",
}


def read_critical_path(rows: Rows, track_ids: list[int]) -> list[dict[str, Any]]:
    """Per step, in step order: when the path starts and ends, its time per kind, per rank (its
    time per kind and the work it spent most in), and its segments in time order."""
    if not track_ids:
        return []
    steps: dict[int, list[dict[str, Any]]] = {}
    for step, pp_rank, global_rank, kind, name, start, end in rows(f"""
            select extract_arg(s.arg_set_id, 'debug.args.step'), extract_arg(s.arg_set_id, 'debug.args.pp_rank'),
                   extract_arg(s.arg_set_id, 'debug.args.global_rank'), extract_arg(s.arg_set_id, 'debug.args.kind'),
                   s.name, s.ts, s.ts + s.dur
            from cgtrace_derived_slice s where s.track_id in ({', '.join(map(str, track_ids))}) order by s.ts, s.id"""):
        steps.setdefault(step, []).append({"pp_rank": pp_rank, "global_rank": global_rank, "kind": kind,
                                           "name": name, "start_ns": start, "end_ns": end})
    return [{"step": step, "start_ns": segments[0]["start_ns"], "end_ns": segments[-1]["end_ns"],
             "length_ns": segments[-1]["end_ns"] - segments[0]["start_ns"], "kinds_ns": _by_kind(segments),
             "ranks": _by_rank(segments), "segments": segments}
            for step, segments in sorted(steps.items())]


def _by_kind(segments: list[dict[str, Any]]) -> dict[str, int]:
    totals = dict.fromkeys(PATH_KINDS, 0)
    for segment in segments:
        totals[segment["kind"]] += segment["end_ns"] - segment["start_ns"]
    return totals


def _by_rank(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank the path ran on, in PP order: its time there, per kind, and the work (kind and
    name) it spent most time in."""
    on_rank: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for segment in segments:
        on_rank[(segment["pp_rank"], segment["global_rank"])].append(segment)
    ranks = []
    for (pp_rank, global_rank), mine in sorted(on_rank.items()):
        named: dict[tuple[str, str], int] = defaultdict(int)
        for segment in mine:
            named[(segment["kind"], segment["name"])] += segment["end_ns"] - segment["start_ns"]
        (kind, name), most = max(named.items(), key=lambda item: (item[1], item[0]))
        ranks.append({"pp_rank": pp_rank, "global_rank": global_rank,
                      "on_path_ns": sum(s["end_ns"] - s["start_ns"] for s in mine), "kinds_ns": _by_kind(mine),
                      "most": {"kind": kind, "name": name, "ns": most}})
    return ranks
