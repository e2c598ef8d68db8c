"""Which files a directory's ranks are, which ranks --ranks names, and where a merge is written.

merge, batch compact/convert, report and query over a directory, and view all pick the same
files by the same rule.
"""

from __future__ import annotations

import argparse
import gzip
import re
import stat
import zlib
from pathlib import Path
from typing import Any, Iterable, Optional

import msgspec

from .. import kineto
from ..errors import CgtraceError
from ..fileio.atomic import file_kind
from .runner import PROFILER_OUTPUT

_RANK_TRACE_NAME = re.compile(r"^(rank.*_trace|.*\.pt\.trace)\.json(\.gz)?$")


def default_merge_output(inputs: list[Path], group: int, groups: int) -> Path:
    """Where a merge writes pipeline `group` of `groups` without -o: beside the rank traces,
    `pp_traces_merged.perfetto-trace`, or `pp_group<k>_merged.perfetto-trace` for several."""
    first = inputs[0]
    directory = first if first.is_dir() else first.parent
    return directory / ("pp_traces_merged.perfetto-trace" if groups == 1 else f"pp_group{group}_merged.perfetto-trace")


# The names default_merge_output gives (a cycle's with jobs.cycles.in_cycle): files that hold many ranks, not one rank's trace.
MERGED_OUTPUT_NAME = re.compile(r"^(pp_traces|pp_group\d+)_merged(\.cycle\d+)?\.perfetto-trace(\.gz)?$")


def find_rank_files(inputs: list[Path]) -> list[Path]:
    """Explicit files, or the trace files of one directory: those named like rank traces
    (`rank*_trace.json`, `*.pt.trace.json`) when there are any, so a config or results JSON
    beside them is left alone; otherwise every JSON file there."""
    if len(inputs) == 1 and inputs[0].is_dir():
        directory = inputs[0]
        entries = sorted(p for p in directory.iterdir() if p.name.endswith(PROFILER_OUTPUT) and not p.name.startswith("."))
        for entry in entries:
            _refuse_special(entry)
        files = [p for p in entries if p.is_file()]
        if not files:
            raise CgtraceError(f"{directory}: is a directory with no trace files (*.json, *.json.gz); pass a trace "
                               "file or a directory of rank traces")
        named = [p for p in files if is_rank_trace_name(p.name)]
        return named or files
    for path in inputs:
        if not path.is_file():
            raise CgtraceError(f"{path}: no such file; pass rank trace files or one directory")
    return list(inputs)


def is_rank_trace_name(name: str) -> bool:
    """Named as profilers name one rank's trace (`rank*_trace.json`, `*.pt.trace.json`, gzipped or not)."""
    return bool(_RANK_TRACE_NAME.match(name)) and not name.startswith(".")


def _refuse_special(path: Path) -> None:
    """A FIFO or dangling symlink named like a trace was skipped unseen, so a merge then said it
    found too few ranks: it is named instead (a directory so named is no trace, and skipped)."""
    try:
        mode = path.stat().st_mode
    except OSError as error:
        raise CgtraceError(f"{path}: named like a trace but cannot be opened ({error.strerror}; a symbolic link "
                           "to nothing?); remove it, or make it the trace file") from None
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise CgtraceError(f"{path}: named like a trace but is a {file_kind(mode)}; remove it, or make it "
                           "the trace file")


# Kineto writes its header (distributedInfo among it) before traceEvents, within the first bytes.
_HEADER_BYTES, _HEADER_CHUNK = 1 << 20, 1 << 16
_EVENTS_KEY = b'"traceEvents"'
_NAMED = 8  # ranks a line names before it counts the rest


def header_rank(path: Path) -> Optional[kineto.RankHeader]:
    """The rank and world size a profiler trace's header records, read from the text before
    `traceEvents` alone (no events are read, so a file cut short still says who it was); None
    where that text is not there or not JSON."""
    head, at = b"", -1
    try:
        with open(path, "rb") as raw:
            packed = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if packed else raw
            while at < 0 and len(head) < _HEADER_BYTES:  # a chunk at a time: the header is short
                chunk = stream.read(_HEADER_CHUNK)
                if not chunk:
                    break
                head += chunk
                at = head.find(_EVENTS_KEY)
    except (OSError, EOFError, zlib.error):
        return None
    try:
        metadata = msgspec.json.decode(head[:at].rstrip().rstrip(b",") + b"}") if at > 0 else None
        return kineto.rank_header(metadata, str(path)) if isinstance(metadata, dict) else None
    except (msgspec.DecodeError, CgtraceError):
        return None


class RankAccount(msgspec.Struct, frozen=True):
    """Every rank of the run accounted for: the world size the traces record, and the global
    ranks of it that no readable trace header names (missing, or its file unreadable)."""

    world_size: Optional[int]
    missing: tuple[int, ...]

    def note(self) -> Optional[str]:
        """One line naming the ranks not there; None where none is missing."""
        if not self.missing:
            return None
        return (f"{len(self.missing)} of {self.world_size} ranks (world_size in distributedInfo) have no readable "
                f"trace here: global rank(s) {named(map(str, self.missing))}")

    def as_json(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "missing_ranks": list(self.missing), "note": self.note()}


def account_for_ranks(files: list[Path]) -> RankAccount:
    """Which ranks of the run the files' headers do not name, against the largest world_size
    they record (none recorded: nothing can be said missing, world_size None)."""
    headers = [header_rank(path) for path in files]
    sizes = [header.world_size for header in headers if header is not None and header.world_size is not None]
    if not sizes:
        return RankAccount(None, ())
    present = {header.rank for header in headers if header is not None and header.rank is not None}
    return RankAccount(max(sizes), tuple(rank for rank in range(max(sizes)) if rank not in present))


def named(items: Iterable[str]) -> str:
    """The first few, and how many more: a line stays a line at a thousand ranks."""
    listed = list(items)
    return ", ".join(listed[:_NAMED]) + (f" and {len(listed) - _NAMED} more" if len(listed) > _NAMED else "")


class RankList:
    """--ranks kept as ranges, so `0-99999999999` costs nothing, not a set of 10**11 ints."""

    def __init__(self, spans: list[range]):
        self.spans = spans

    def __contains__(self, rank: object) -> bool:
        return any(rank in span for span in self.spans)


def parse_rank_list(text: str) -> RankList:
    """--ranks: global ranks and upward ranges, `0,1,4-7`."""
    spans = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdecimal() or (high and not high.isdecimal()) or int(high or low) < int(low):
            raise argparse.ArgumentTypeError(f"{text!r} is not a rank list like 0,1,4-7 (ranges go upwards)")
        spans.append(range(int(low), int(high or low) + 1))
    return RankList(spans)
