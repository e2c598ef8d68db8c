"""The critical path a merge wrote into its trace (engine/critical_path.py), read back per step.

The merge keeps each segment as a slice on a track whose role is critical_path, its kind, step
and rank in the slice's args; the report reads them here, so its figures and the trace agree.
"""

from __future__ import annotations

from typing import Any, Callable

Rows = Callable[[str], list[tuple[Any, ...]]]


def read_critical_path(rows: Rows, track_ids: list[int]) -> list[dict[str, Any]]:
    """Per step, in step order: when the path starts and ends, and its segments in time order."""
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
             "length_ns": segments[-1]["end_ns"] - segments[0]["start_ns"], "segments": segments}
            for step, segments in sorted(steps.items())]
