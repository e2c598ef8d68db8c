"""How the report bounds a profiled step: by its ProfilerStep span on the CPU side, or (the
default) by the GPU work it launched, since where the GPU runs behind the CPU a CPU span holds
the previous step's kernels and the last step's run after every span."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def owned_step_windows(steps: Sequence[tuple[int, int]], launches: np.ndarray, gpu_ends: np.ndarray
                       ) -> list[tuple[int, int]]:
    """Each step's window (its CPU span, steps in start order) run on to the end of the last GPU
    work launched within that span (GPU slice i was launched at `launches[i]` and ends at
    `gpu_ends[i]`), starting no earlier than the previous window ends, so windows never
    overlap; a window never ends before it starts."""
    starts = np.array([start for start, _ in steps], np.int64)
    ends = np.array([end for _, end in steps], np.int64)
    step = np.searchsorted(starts, launches, side="right") - 1
    inside = step >= 0
    inside[inside] = launches[inside] < ends[step[inside]]
    np.maximum.at(ends, step[inside], gpu_ends[inside])
    windows: list[tuple[int, int]] = []
    for start, end in zip(starts.tolist(), ends.tolist()):
        start = max(start, windows[-1][1]) if windows else start
        windows.append((start, max(start, end)))
    return windows
