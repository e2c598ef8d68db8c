"""Profiling cycles: which of a directory's rank traces were profiled together.

`torch.profiler.schedule(..., repeat=N)` exports each rank N times, so a directory holds the
same ranks several times over. Names cannot tell the cycles apart (older handlers and torch
itself name files by step, process or time), so the traces' own ProfilerStep numbers do:
one rank's traces hold disjoint step ranges, and the k-th range of every rank is cycle k.
"""

from __future__ import annotations

import gzip
import re
from collections import defaultdict
from pathlib import Path
from typing import BinaryIO, Optional

import msgspec

from ..errors import CgtraceError
from ..kineto import PROFILER_STEP_PREFIX
from .rank_files import header_rank

# A ProfilerStep slice's name as Kineto writes it; read as bytes, a chunk at a time.
_STEP_NAME = re.compile(rb'"name"\s*:\s*"' + re.escape(PROFILER_STEP_PREFIX.encode()) + rb'(\d{1,18})"')
_CHUNK, _CARRY = 1 << 24, 64  # the carry keeps a name cut between two chunks
_MERGED_SUFFIX = ".perfetto-trace"


class Cycle(msgspec.Struct, frozen=True):
    """One profiling cycle: its number (from 1, in step order), the steps its traces hold, its files."""

    number: int
    steps: Optional[tuple[int, int]]
    files: tuple[Path, ...]


def profiler_steps(path: Path) -> Optional[tuple[int, int]]:
    """The first and last ProfilerStep number a trace (gzipped or not) holds; None if it holds none."""
    low: Optional[int] = None
    high: Optional[int] = None
    with open(path, "rb") as raw:
        packed = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream: BinaryIO = gzip.GzipFile(fileobj=raw) if packed else raw  # type: ignore[assignment]
        tail = b""
        while chunk := stream.read(_CHUNK):
            text = tail + chunk
            steps = [int(number) for number in _STEP_NAME.findall(text)]
            if steps:
                low = min(steps) if low is None else min(low, *steps)
                high = max(steps) if high is None else max(high, *steps)
            tail = text[-_CARRY:]
    return (low, high) if low is not None and high is not None else None


def steps_label(steps: Optional[tuple[int, int]]) -> str:
    """`steps2-3` (`steps4` for one step); empty where the trace holds no ProfilerStep."""
    if steps is None:
        return ""
    return f"steps{steps[0]}" if steps[0] == steps[1] else f"steps{steps[0]}-{steps[1]}"


def profiling_cycles(files: list[Path]) -> list[Cycle]:
    """The files as cycles. Where no rank's header appears twice there is one cycle, found
    without reading past the headers; otherwise each rank's traces are ordered by their
    ProfilerStep numbers, which must not overlap, and the k-th of every rank is cycle k."""
    by_rank: dict[Optional[int], list[Path]] = defaultdict(list)
    for path in files:
        header = header_rank(path)
        by_rank[header.rank if header is not None else None].append(path)
    if all(len(paths) == 1 for rank, paths in by_rank.items() if rank is not None):
        return [Cycle(1, None, tuple(files))]
    if None in by_rank:
        raise CgtraceError(f"{by_rank[None][0]}: its header names no rank, so which profiling cycle it belongs to "
                           "cannot be told; pass the files of one cycle")
    ordered: dict[int, list[tuple[tuple[int, int], Path]]] = {}
    for rank, paths in by_rank.items():
        assert rank is not None
        ordered[rank] = sorted((_steps_of(path), path) for path in paths)
        for (before, earlier), (after, later) in zip(ordered[rank], ordered[rank][1:]):
            if after[0] <= before[1]:
                raise CgtraceError(f"{later.parent}: {earlier.name} and {later.name} both hold global rank {rank}; "
                                   f"move one of them out of the folder and run again (it appears twice with "
                                   f"overlapping profiler steps, {steps_label(before)} and {steps_label(after)}: "
                                   "not two cycles of one run)")
    counts = {len(traces) for traces in ordered.values()}
    if len(counts) > 1:
        fewest = min(ordered, key=lambda rank: len(ordered[rank]))
        raise CgtraceError(f"{files[0].parent}: the ranks were profiled a different number of times (global rank "
                           f"{fewest}: {len(ordered[fewest])} of {max(counts)} cycles), so the cycles cannot be "
                           "told apart; pass the files of one cycle")
    cycles = []
    for index in range(counts.pop()):
        members = [ordered[rank][index] for rank in sorted(ordered)]
        cycles.append(Cycle(index + 1, (min(steps[0] for steps, _ in members), max(steps[1] for steps, _ in members)),
                            tuple(path for _, path in members)))
    return cycles


def _steps_of(path: Path) -> tuple[int, int]:
    steps = profiler_steps(path)
    if steps is None:
        raise CgtraceError(f"{path}: its rank appears more than once here, and it holds no ProfilerStep#N to tell "
                           "its profiling cycle by; pass the files of one cycle")
    return steps


def choose_cycle(cycles: list[Cycle], number: Optional[int]) -> list[Cycle]:
    """Every cycle, or the one --cycle names."""
    if number is None:
        return cycles
    if not 1 <= number <= len(cycles):
        raise CgtraceError(f"--cycle {number}: the traces hold {len(cycles)} profiling cycle(s), numbered from 1")
    return [cycles[number - 1]]


def in_cycle(output: Path, cycle: int) -> Path:
    """`pp_traces_merged.perfetto-trace` -> `pp_traces_merged.cycle1.perfetto-trace`: a cycle's
    own output, so merging one cycle never meets another's."""
    name = output.name
    at = name.find(_MERGED_SUFFIX)
    at = at if at > 0 else len(name) - len(output.suffix)
    return output.with_name(f"{name[:at]}.cycle{cycle}{name[at:]}")
