"""How a GPU's kernels were launched, per step: how long after its launch each kernel began,
the CPU time each launch took, and how many kernels were too short to hide that cost.

A kernel's launch is found as idle.py finds it (the runtime call of its rank with its
correlation id, graph-aware for a CUDA graph's replay), so the two agree on every kernel; the
queue depth is model/waits.py's, which engine/waits.py also writes as a counter per stream.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..model.waits import NO_LAUNCH, Depths, HostSide, Work, launch_of, queue_depths

SHORT_KERNEL_NS = 10_000  # the short kernels figure's threshold (its definition quotes it)
LAUNCH_DEFINITIONS = {
    "launch delay": "per GPU and step: for each kernel that begins in the step and whose launch is in the trace, its "
                    "start less the moment it was launched (as idle by cause counts it: its runtime call's return, "
                    "for a CUDA graph replay's kernel no earlier than the end of the replay's kernels begun before "
                    "it); median (p50), p90 and largest, nearest rank; negative where a kernel began before its "
                    "call returned",
    "CPU time per launch": "per GPU and step: the mean duration of the runtime calls that launched the step's "
                           "kernels, each call once (a cudaGraphLaunch once for its whole replay)",
    "queue depth": "per GPU, step and stream: how many of the stream's slices were launched and not yet ended, "
                   "largest and time-weighted mean over the step; a slice counts from its launch (graph-aware, as "
                   "launch delay: a CUDA graph replay's kernel only once the replay's kernels begun before it ended, "
                   "never all at its cudaGraphLaunch) or from its start where that is earlier or its launch is not "
                   "in the trace",
    "short kernels": f"per GPU and step: the kernels that begin in the step and last under {SHORT_KERNEL_NS // 1000} "
                     "us, as a share of the step's kernels and of their time",
}


def launch_stats(work: Work, ready: np.ndarray, steps: list[tuple[str, int, int]],
                 host: HostSide) -> list[dict[str, Any]]:
    """Per step of one GPU (`work` by start, `ready` its launch moments: waits.ready_times)."""
    depths = queue_depths(work, ready)
    call = launch_of(work, host)
    rows = []
    for name, step_start, step_end in steps:
        first, last = np.searchsorted(work.start, [step_start, step_end])
        inside = first + np.flatnonzero(work.kernel[first:last])
        launched = inside[ready[inside] != NO_LAUNCH]
        delays = np.sort(work.start[launched] - ready[launched]).tolist()
        calls = np.unique(call[launched])
        cpu = (host.call_end[calls] - host.call_start[calls]).tolist()
        durations = (work.end[inside] - work.start[inside]).tolist()
        short = [duration for duration in durations if duration < SHORT_KERNEL_NS]
        rows.append({"step": name, "kernels": len(inside), "launched_kernels": len(delays),
                     "launch_delay_p50_ns": _rank(delays, 50), "launch_delay_p90_ns": _rank(delays, 90),
                     "launch_delay_max_ns": delays[-1] if delays else None, "launches": len(cpu),
                     "cpu_per_launch_ns": sum(cpu) / len(cpu) if cpu else None, "short_kernels": len(short),
                     "short_kernel_share": len(short) / len(inside) if len(inside) else None,
                     "short_kernel_time_share": sum(short) / sum(durations) if sum(durations) else None,
                     "queue_depth": [{"stream": stream, **_depth_within(changes, step_start, step_end)}
                                     for stream, changes in depths.items()]})
    return rows


def _depth_within(changes: Depths, start: int, end: int) -> dict[str, float]:
    """The largest and the time-weighted mean depth over [start, end)."""
    first = int(np.searchsorted(changes.moments, start, side="right")) - 1
    last = int(np.searchsorted(changes.moments, end))
    before = int(changes.depths[first]) if first >= 0 else 0
    moments = np.concatenate(([start], changes.moments[first + 1:last], [end]))
    depths = np.concatenate(([before], changes.depths[first + 1:last]))
    total = int((depths * np.diff(moments)).sum())
    return {"max_depth": int(depths.max()), "mean_depth": total / (end - start) if end > start else 0.0}


def _rank(ordered: list[int], percent: int) -> Optional[int]:
    """The nearest-rank percentile of sorted values (None for none)."""
    return ordered[max(0, -(-percent * len(ordered) // 100) - 1)] if ordered else None
