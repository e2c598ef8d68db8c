"""`cgtrace diff`: both traces measured as `cgtrace report` measures them, as two tasks (at once
where there are cores or a cluster), then compared by analysis/diff.py; two directories of
rank traces, rank by rank, the ranks paired by the global rank each header records.

Each task reads its trace where it runs (profiler output compacted first, as report does)
and sends back only the report's figures, every kernel and op listed, so a kernel that ran on
one side only still shows. A rank or GPU chosen for a side is checked against its profiler
output first (the header's rank; the devices its GPU events ran on), so a wrong one is refused
before either trace is measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import msgspec

from ..analysis.diff import RankPair, Side, diff_ranks, diff_reports
from ..analysis.report import build_report
from ..errors import CgtraceError
from ..inputs.source import read_input_bytes
from ..kineto import GPU_CATEGORIES
from ..lane_rules import LaneRules
from .executors import Workers, for_cluster, run_tasks
from .rank_files import find_rank_files, header_rank, named
from .readable import as_perfetto
from .runner import PROFILER_OUTPUT

_EVERY_KERNEL = (1 << 63) - 1  # SQL's LIMIT that keeps every row


def diff_traces(a: Path, b: Path, workers: Workers, tp_bin: Optional[str], lanes: LaneRules,
                top: int, sides: tuple[Side, Side] = (Side(), Side()), step_windows: str = "launched"
                ) -> dict[str, Any]:
    """The diff of trace `a` (before) and `b` (after), `top` kernels and ops listed; `sides`:
    what of each is compared; `step_windows`: how both bound their steps (report's)."""
    if a.is_dir() and b.is_dir():
        raise CgtraceError(f"{a}, {b}: are directories; `cgtrace diff` compares two directories rank by rank, "
                           "this compares two traces")
    for path in (a, b):
        if path.is_dir():
            raise CgtraceError(f"{path}: is a directory and the other side a trace; diff two traces, or two "
                               "directories of rank traces (rank by rank)")
    for path, side, name in zip((a, b), sides, ("a", "b")):
        _check_rank(path, side.rank, f"--{name}-rank")
        _check_gpu(path, side.gpu, f"--{name}-gpu")
    tasks = [(for_cluster(path, workers.remote), tp_bin, lanes, step_windows) for path in (a, b)]
    before, after = run_tasks(workers, _figures, tasks, [str(a), str(b)], "reporting", stop_at_failure=True)
    return diff_reports(before.value, after.value, top=top, sides=sides)


def diff_directories(a: Path, b: Path, workers: Workers, tp_bin: Optional[str], lanes: LaneRules, top: int,
                     sides: tuple[Side, Side] = (Side(), Side()), step_windows: str = "launched") -> dict[str, Any]:
    """Directories `a` and `b` of rank traces, rank by rank: each global rank both hold (or the
    one pair `--a-rank`/`--b-rank` name; either alone names the same rank on both sides),
    every trace measured at once, then each pair compared as two traces are."""
    ranks_a, ranks_b = _ranks(a), _ranks(b)
    given = [side.rank for side in sides if side.rank is not None]
    if not given:
        pairs = [(rank, rank) for rank in sorted(ranks_a.keys() & ranks_b.keys())]
        if not pairs:
            raise CgtraceError(f"{a} against {b}: no global rank is in both (A holds {_listed(ranks_a)}, B holds "
                               f"{_listed(ranks_b)}); pass --a-rank and --b-rank to compare one rank of each")
        alone = [{rank: str(path) for rank, path in mine.items() if rank not in other}
                 for mine, other in ((ranks_a, ranks_b), (ranks_b, ranks_a))]
    else:
        side_a, side_b = sides
        rank_a = side_a.rank if side_a.rank is not None else given[0]  # one given: that rank on both sides
        rank_b = side_b.rank if side_b.rank is not None else given[0]
        for directory, ranks, rank, option in ((a, ranks_a, rank_a, "--a-rank"), (b, ranks_b, rank_b, "--b-rank")):
            if rank not in ranks:
                raise CgtraceError(f"{directory}: holds no trace of global rank {rank} ({option}); it holds "
                                   f"{_listed(ranks)}")
        pairs, alone = [(rank_a, rank_b)], [{}, {}]
    paths = [ranks_a[rank] for rank, _ in pairs] + [ranks_b[rank] for _, rank in pairs]
    for index, path in enumerate(paths):
        side, name = (sides[0], "a") if index < len(pairs) else (sides[1], "b")
        _check_gpu(path, side.gpu, f"--{name}-gpu")
    tasks = [(for_cluster(path, workers.remote), tp_bin, lanes, step_windows) for path in paths]
    measured = [outcome.value for outcome in run_tasks(workers, _figures, tasks, list(map(str, paths)), "reporting",
                                                       stop_at_failure=True)]
    compared = []
    for index, (rank_a, rank_b) in enumerate(pairs):
        mapped = rank_a != rank_b  # compared as --a-rank/--b-rank compare two traces' ranks
        pair_sides = (Side(rank_a if mapped else None, sides[0].gpu), Side(rank_b if mapped else None, sides[1].gpu))
        compared.append(RankPair(rank_a, rank_b, diff_reports(measured[index], measured[len(pairs) + index], top,
                                                              pair_sides)))
    return {"a": {"directory": str(a)}, "b": {"directory": str(b)}, "step_windows": step_windows,
            **diff_ranks(compared, alone[0], alone[1], top)}


def _ranks(directory: Path) -> dict[int, Path]:
    """A directory's rank traces by the global rank each header records; refused, in one line,
    where one records none or two record one rank."""
    ranks: dict[int, Path] = {}
    for path in find_rank_files([directory]):
        header = header_rank(path)
        rank = header.rank if header is not None else None
        if rank is None:
            raise CgtraceError(f"{path}: records no global rank (distributedInfo.rank), which a diff of directories "
                               "pairs traces by; diff it against one trace instead")
        if rank in ranks:
            raise CgtraceError(f"{directory}: holds global rank {rank} twice ({ranks[rank].name}, {path.name}), as "
                               "several profiling cycles do; put one cycle's traces in a directory of their own")
        ranks[rank] = path
    return ranks


def _listed(ranks: dict[int, Path]) -> str:
    return "rank " + named(map(str, sorted(ranks))) if ranks else "no rank"


def _check_rank(path: Path, rank: Optional[int], option: str) -> None:
    """Refuses `rank` where the profiler header of `path` records another one; a trace with no
    such header (one cgtrace wrote, a merge) is checked against its GPUs once measured."""
    header = header_rank(path) if rank is not None else None
    if header is not None and header.rank is not None and header.rank != rank:
        world = "" if header.world_size is None else f" of {header.world_size} (ranks 0-{header.world_size - 1})"
        raise CgtraceError(f"{path}: holds rank {header.rank}{world}, not rank {rank} ({option})")


class _DeviceArg(msgspec.Struct):
    device: Any = None


class _Event(msgspec.Struct):
    """What of an event says which GPU ran it: its category and Kineto's `device` arg."""

    cat: Any = None
    args: Optional[_DeviceArg] = None


class _Events(msgspec.Struct):
    traceEvents: list[_Event] = []


_EVENTS = msgspec.json.Decoder(_Events)


def _check_gpu(path: Path, gpu: Optional[int], option: str) -> None:
    """Refuses `gpu` where profiler output `path` ran no GPU work on it; a trace cgtrace wrote,
    or one whose events do not decode plainly, is checked against its GPUs once measured."""
    if gpu is None or not path.name.endswith(PROFILER_OUTPUT):
        return
    try:
        events = _EVENTS.decode(read_input_bytes(path)).traceEvents
    except (msgspec.DecodeError, msgspec.ValidationError):
        return  # the reader names what is wrong when the trace is measured
    devices = sorted({event.args.device for event in events if event.cat in GPU_CATEGORIES and event.args
                      and isinstance(event.args.device, int)})
    if gpu not in devices:
        has = f"GPU {', '.join(map(str, devices))}" if devices else "no GPU work"
        raise CgtraceError(f"{path}: ran no GPU work on GPU {gpu} ({option}); it has {has}")


def _figures(path: Path, tp_bin: Optional[str], lanes: LaneRules, step_windows: str) -> dict[str, Any]:
    with as_perfetto(path, compact=True, lanes=lanes) as trace:
        return build_report(trace, tp_bin=tp_bin, top=_EVERY_KERNEL, lanes=lanes, shown_as=path,
                            step_windows=step_windows).figures
