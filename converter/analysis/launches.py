"""How a GPU's kernels were launched, per step: how long after its launch each kernel began,
the CPU time each launch took, and how many kernels were too short to hide that cost.

A kernel's launch is found as idle.py finds it (the runtime call of its rank with its
correlation id, graph-aware for a CUDA graph's replay), so the two agree on every kernel.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Optional

from .idle import HostSide, Work

SHORT_KERNEL_NS = 10_000  # the short kernels figure's threshold (its definition quotes it)
LAUNCH_DEFINITIONS = {
    "launch delay": "per GPU and step: for each kernel that begins in the step and whose launch is in the trace, its "
                    "start less the moment it was launched (as idle by cause counts it: its runtime call's return, "
                    "for a CUDA graph replay's kernel no earlier than the end of the replay's kernels begun before "
                    "it); median (p50), p90 and largest, nearest rank; negative where a kernel began before its "
                    "call returned",
    "CPU time per launch": "per GPU and step: the mean duration of the runtime calls that launched the step's "
                           "kernels, each call once (a cudaGraphLaunch once for its whole replay)",
    "short kernels": f"per GPU and step: the kernels that begin in the step and last under {SHORT_KERNEL_NS // 1000} "
                     "us, as a share of the step's kernels and of their time",
}


def launch_stats(work: list[Work], ready: list[Optional[int]], steps: list[tuple[str, int, int]],
                 host: HostSide) -> list[dict[str, Any]]:
    """Per step of one GPU (`work` by start, `ready` its launch moments: idle.ready_times)."""
    starts = [start for start, _, _, _ in work]
    rows = []
    for name, step_start, step_end in steps:
        inside = [index for index in range(bisect_left(starts, step_start), bisect_left(starts, step_end))
                  if work[index][3]]
        delays = sorted(work[index][0] - launched for index in inside
                        if (launched := ready[index]) is not None)
        calls = {work[index][2] for index in inside if ready[index] is not None}
        cpu = [host.launch[call][1] - host.launch[call][0] for call in calls if call is not None]
        durations = [work[index][1] - work[index][0] for index in inside]
        short = [duration for duration in durations if duration < SHORT_KERNEL_NS]
        rows.append({"step": name, "kernels": len(inside), "launched_kernels": len(delays),
                     "launch_delay_p50_ns": _rank(delays, 50), "launch_delay_p90_ns": _rank(delays, 90),
                     "launch_delay_max_ns": delays[-1] if delays else None, "launches": len(cpu),
                     "cpu_per_launch_ns": sum(cpu) / len(cpu) if cpu else None, "short_kernels": len(short),
                     "short_kernel_share": len(short) / len(inside) if inside else None,
                     "short_kernel_time_share": sum(short) / sum(durations) if sum(durations) else None})
    return rows


def _rank(ordered: list[int], percent: int) -> Optional[int]:
    """The nearest-rank percentile of sorted values (None for none)."""
    return ordered[max(0, -(-percent * len(ordered) // 100) - 1)] if ordered else None
