"""`on_trace_ready=converter.trace_handler(DIR)`: torch.profiler's callback that writes the
Kineto JSON once and the compacted `.perfetto-trace` beside it, during the training run; or,
with `compact=False`, the JSON alone, which costs the loop little more than torch's export
and leaves compaction or a merge for later.

Each file is named by rank, profiling cycle (a count of this rank's traces, from 1) and the
ProfilerStep numbers it holds, read from the trace (torch's step_num is already past them),
so `schedule(..., repeat=N)` gives N files per rank that `cgtrace merge` tells apart.

It never imports torch (a profiler is already running when it is called, so torch is loaded;
its rank is read from `torch.distributed` only if that is loaded and initialised, else from
the trace's header), and never stops the run: a failure is logged, counted on the handler and
leaves the JSON in place, so nothing profiled is lost.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Protocol

from ..errors import CgtraceError

if TYPE_CHECKING:
    from ..lane_rules import LaneRules

_LOG = logging.getLogger("cgtrace")
_HEADER_BYTES = 1 << 20  # Kineto writes distributedInfo before traceEvents, within the first KiB
_TAIL_BYTES = 1 << 16    # and traceName after them, at the very end


class ChromeTraceExporter(Protocol):
    """What the handler needs of a profiler: `torch.profiler.profile` is one."""

    def export_chrome_trace(self, path: str) -> object: ...


@dataclass
class TraceHandler:
    """Called by the profiler with itself each time a trace is ready; see `trace_handler`."""

    directory: Path
    worker_name: Optional[str]
    keep_json: bool
    gzip_json: bool
    lanes: LaneRules = field(repr=False)
    split_steps: bool
    compact: bool = True
    written: list[Path] = field(default_factory=list)   # every file written and still there, in order
    failures: int = 0                                    # traces whose export or compaction failed
    last_error: Optional[str] = None
    # Profilers on several threads may share one handler: its counts stay exact.
    _counting: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _cycles: dict[str, int] = field(default_factory=dict, repr=False, compare=False)  # traces so far, per worker

    def __call__(self, profiler: ChromeTraceExporter) -> None:
        try:
            exported = self._export(profiler)
        except Exception as error:  # never the training run's end: log, count, go on
            self._failed(f"{self.directory}: exporting the profiler's trace failed ({error}); check that the "
                         "directory is writable and has room")
            return
        try:
            if self.compact:
                self._compact(exported)
        except Exception as error:
            self._failed(f"{_said(error, exported)} (the JSON is kept: run `cgtrace compact {exported}` once fixed)")
            self.written.append(exported)
            return
        try:
            kept = self._keep_or_drop(exported)
            if kept is not None:
                self.written.append(kept)
        except Exception as error:  # a full disk while gzipping, a run beside this one that took the file
            self._failed(f"{_said(error, exported)} (the JSON is kept as exported, if it is still there)")
            try:
                _name_trace(exported, exported)  # it named the .gz that was not written
            except OSError:
                pass

    def _export(self, profiler: ChromeTraceExporter) -> Path:
        """The Kineto JSON under its final name, `<worker>.cycle<C>.steps<A>-<B>.pt.trace.json`,
        its traceName naming the file as it is kept (torch's names the hidden scratch file)."""
        from ..jobs.cycles import profiler_steps, steps_label

        self.directory.mkdir(parents=True, exist_ok=True)
        scratch = self.directory / f".cgtrace-{os.getpid()}-{threading.get_ident()}-{time.time_ns()}.pt.trace.json"
        try:
            profiler.export_chrome_trace(str(scratch))
            worker = self.worker_name or _worker(scratch)
            with self._counting:
                cycle = self._cycles[worker] = self._cycles.get(worker, 0) + 1
            steps = steps_label(profiler_steps(scratch))
            exported = self.directory / f"{worker}.cycle{cycle}{'.' + steps if steps else ''}.pt.trace.json"
            _name_trace(scratch, exported.with_name(exported.name + ".gz") if self.keep_json and self.gzip_json
                        else exported)
            os.replace(scratch, exported)
        finally:
            scratch.unlink(missing_ok=True)  # an export that died half-way leaves no hidden file
        return exported

    def _compact(self, exported: Path) -> None:
        from ..jobs.runner import default_output_path, run_job
        from ..jobs.options import job_options
        from .summaries import written_files

        summary = run_job(exported, default_output_path(exported),
                          job_options(True, self.lanes, split_steps=self.split_steps, overwrite=True))
        self.written.extend(written_files(summary))

    def _keep_or_drop(self, exported: Path) -> Optional[Path]:
        """The JSON kept, gzipped (whole or not at all: a full disk leaves no partial .gz) or
        dropped (None: not listed as written)."""
        from ..fileio.atomic import atomic_output

        if not self.keep_json:
            exported.unlink(missing_ok=True)  # a run beside this one may have dropped it already
            return None
        if not self.gzip_json:
            return exported
        packed = exported.with_name(exported.name + ".gz")
        with open(exported, "rb") as source, atomic_output(packed, overwrite=True) as target:
            shutil.copyfileobj(source, target, 1 << 20)
        exported.unlink(missing_ok=True)
        return packed

    def _failed(self, message: str) -> None:
        with self._counting:
            self.failures += 1
            self.last_error = message
        _LOG.error("cgtrace: %s", message)


def _name_trace(exported: Path, name: Path) -> None:
    """traceName, at the end of a Kineto JSON, set to `name`: only the tail is rewritten."""
    with open(exported, "r+b") as stream:
        start = max(0, stream.seek(0, os.SEEK_END) - _TAIL_BYTES)
        stream.seek(start)
        tail = stream.read()
        key = tail.rfind(b'"traceName"')
        colon = tail.find(b":", key) if key >= 0 else -1
        if colon < 0:
            return  # none written (not Kineto's exporter): nothing names another file
        text = tail[colon + 1:].decode("utf-8", "surrogateescape")
        try:
            old, end = json.JSONDecoder().raw_decode(text, len(text) - len(text.lstrip()))
        except ValueError:
            return
        if isinstance(old, str):
            stream.seek(start + colon + 1)
            stream.write(f" {json.dumps(str(name))}{text[end:]}".encode("utf-8", "surrogateescape"))
            stream.truncate()


def _said(error: Exception, exported: Path) -> str:
    return error.message if isinstance(error, CgtraceError) else f"{exported}: {error!r}"


def _worker(exported: Path) -> str:
    """`rank<R>` from torch.distributed (if loaded and initialised) or the trace's header; else
    torch's own default, host and process id."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return f"rank{distributed.get_rank()}"
    rank = _header_rank(exported)
    return f"rank{rank}" if rank is not None else f"{socket.gethostname()}_{os.getpid()}"


def _header_rank(exported: Path) -> Optional[int]:
    """distributedInfo.rank, read from the head of the JSON only (it comes before the events)."""
    with open(exported, "rb") as stream:
        head = stream.read(_HEADER_BYTES).decode("utf-8", "replace")
    start = head.find('"distributedInfo"')
    brace = head.find("{", start) if start >= 0 else -1
    try:
        info, _ = json.JSONDecoder().raw_decode(head, brace) if brace >= 0 else (None, 0)
    except ValueError:
        return None
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None
