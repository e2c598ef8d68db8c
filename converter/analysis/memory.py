"""Memory per step for the report: each device's peak allocated and reserved bytes (from the
counters engine/memory.py writes), and the bytes memcpy moved per direction, with the bandwidth
achieved. Steps are each rank's ProfilerStep spans (the `cgtrace_step` view); a rank without
steps is answered over its whole trace (step "whole trace")."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Optional

from ..kineto import MEMCPY_CATEGORIES, device_name, memcpy_direction
from ..tp.sql_text import sql_list

WHOLE_TRACE = "whole trace"

MEMORY_DEFINITIONS: dict[str, str] = {
    "peak allocated, peak reserved": "per device and step: the highest value its memory counter (derived from "
                                     "Kineto's [memory] events: their Total Allocated and Total Reserved, or in "
                                     "2021 traces the running sum of their Bytes from the trace's first memory "
                                     "event, so relative to what was allocated before it) takes in the step, the "
                                     "value it holds as the step begins included; CPU is Kineto's device -1",
    "memcpy traffic": "per rank, step and direction (HtoD, DtoH, DtoD, PtoP, ... as Kineto names each gpu_memcpy "
                      "slice): the copies that start in the step, their bytes (the `bytes` arg) and copy time (the "
                      "sum of their durations); bandwidth is bytes over copy time",
}

Rows = Callable[[str], list[tuple[Any, ...]]]

_PEAKS_SQL = """
with samples as (
  select device, meaning, rank_document, rank, ts, value,
         lead(ts) over (partition by track_id order by ts) as next_ts
  from cgtrace_counter where meaning in ('memory allocated', 'memory reserved'))
select s.rank, w.name, w.ts, s.device, s.meaning, max(s.value)
from samples s join cgtrace_step w on w.rank_document is s.rank_document
  and s.ts < w.end_ts and (s.next_ts is null or s.next_ts > w.ts)
group by w.rank_document, w.name, s.device, s.meaning
union all
select s.rank, null, null, s.device, s.meaning, max(s.value) from samples s
where not exists (select 1 from cgtrace_step w where w.rank_document is s.rank_document)
group by s.rank_document, s.device, s.meaning"""

_MEMCPY_SQL = """
select s.rank, w.name, w.ts, s.name, count(*),
       sum(coalesce(extract_arg(s.arg_set_id, 'debug.args.bytes'), extract_arg(s.arg_set_id, 'args.bytes'))),
       sum(s.dur)
from cgtrace_slice s left join cgtrace_step w on w.rank_document is s.rank_document
  and s.ts >= w.ts and s.ts < w.end_ts
where s.category in ({categories})
group by s.rank_document, w.name, s.name"""


def memory_peaks(rows: Rows) -> list[dict[str, Any]]:
    """Per rank, step and device: peak allocated and reserved bytes (None where the trace
    writes no reserved total), steps in time order."""
    peaks: dict[tuple, dict[str, Any]] = {}
    for rank, step, start, device, meaning, peak in rows(_PEAKS_SQL):
        key = (rank or "", start if start is not None else -1, step, device)
        found = peaks.setdefault(key, {"rank": rank, "step": step or WHOLE_TRACE, "device": device_name(device),
                                       "peak_allocated_bytes": None, "peak_reserved_bytes": None})
        found["peak_allocated_bytes" if meaning == "memory allocated" else "peak_reserved_bytes"] = int(peak)
    return [peaks[key] for key in sorted(peaks)]


def memcpy_traffic(rows: Rows) -> list[dict[str, Any]]:
    """Per rank, step and direction: copies, bytes, copy time and achieved bandwidth (GB/s:
    bytes per ns), steps in time order; copies outside every step under step None."""
    sql = _MEMCPY_SQL.format(categories=sql_list(MEMCPY_CATEGORIES))
    totals: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    for rank, step, start, name, count, size, dur in rows(sql):
        total = totals[(rank or "", start if start is not None else -1, step, memcpy_direction(name or ""))]
        total[0] += count
        total[1] += int(size or 0)
        total[2] += int(dur or 0)
    return [{"rank": rank or None, "step": step, "direction": direction, "copies": count, "bytes": size,
             "copy_ns": dur, "bandwidth_gb_s": _bandwidth(size, dur)}
            for (rank, _, step, direction), (count, size, dur) in sorted(totals.items())]


def _bandwidth(size: int, dur: int) -> Optional[float]:
    return size / dur if dur else None
