"""`cgtrace compact DIR` and `convert DIR`: every rank trace of a directory, one output each,
as parallel tasks on local processes or a Dask cluster (executors.py).

An output that exists is skipped unless --overwrite, so after a failure the same command
redoes only what is missing. Each output is written atomically by its task; a task whose
worker was killed outright leaves a temporary file no `finally` removed, so once every task
has ended the leftovers beside the outputs are removed here. A failed rank is reported with
its error, and the other ranks' outputs are kept.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import msgspec

from ..errors import CgtraceError
from ..fileio.atomic import check_output_path, remove_leftovers
from ..inputs.source import json_size
from .executors import for_cluster, open_workers, run_tasks
from .rank_files import account_for_ranks, find_rank_files
from .runner import COMPACTED_TAG, JobOptions, default_output_path, run_job
from .stopping import Interrupted


def batch_output(input_path: Path, output_dir: Optional[Path], options: JobOptions) -> Path:
    """Where one rank's output goes: as for a single trace, in `output_dir` when given."""
    beside = default_output_path(input_path, COMPACTED_TAG if options.compact else "", options.output_format)
    return beside if output_dir is None else output_dir / beside.name


def run_batch(directory: Path, output_dir: Optional[Path], options: JobOptions, jobs: Optional[int] = None,
              scheduler: Optional[str] = None) -> dict[str, Any]:
    """Convert (or compact) every rank trace in `directory`; the summary lists every rank
    (written, skipped or failed), counts them, and names the run's ranks with no trace here."""
    if options.split_steps:
        raise CgtraceError(f"{directory}: --split-steps works on one trace at a time; pass a trace file")
    if output_dir is not None and not output_dir.is_dir():
        raise CgtraceError(f"{output_dir}: with a directory of traces, -o names a directory for the outputs, and "
                           "this is not one; create it or choose another")
    files = find_rank_files([directory])
    targets = [batch_output(path, output_dir, options) for path in files]
    _refuse_shared_outputs(files, targets)
    todo = [k for k, target in enumerate(targets) if options.overwrite or not target.exists()]
    for k in todo:
        check_output_path(targets[k], options.overwrite)  # every output can be written, before any work
    sizes = sorted((json_size(files[k]) for k in todo), reverse=True)
    jobs = max(1, jobs or options.tuning.default_jobs(sizes or [0]))
    remote = scheduler is not None
    # A worker gets an args helper only where cores and memory allow (a Dask worker never forks one).
    helpers = not remote and options.args_strategy == "auto" and options.tuning.helper_fits(sizes, jobs)
    task_options = msgspec.structs.replace(options, args_strategy="helper" if helpers else "in-process",
                                           tuning=options.tuning.shared_by(jobs))
    tasks = [(for_cluster(files[k], remote), for_cluster(targets[k], remote), task_options) for k in todo]
    entries: list[dict[str, Any]] = [{"input": str(path), "output": str(target), "status": "skipped",
                                      "reason": "the output exists; pass --overwrite to replace it"}
                                     for path, target in zip(files, targets)]
    started_ns = time.time_ns()
    try:
        with open_workers(jobs, scheduler) as workers:
            outcomes = run_tasks(workers, run_job, tasks, [str(files[k]) for k in todo],
                                 "compacting" if options.compact else "converting")
    except Interrupted as stop:
        stop.kept = [targets[k] for k in todo if _written_since(targets[k], started_ns)]
        raise
    finally:
        for k in todo:
            remove_leftovers(targets[k])
    for k, outcome in zip(todo, outcomes):
        entries[k] = ({"input": str(files[k]), "output": str(targets[k]), "status": "written", "summary": outcome.value}
                      if outcome.error is None else
                      {"input": str(files[k]), "output": str(targets[k]), "status": "failed", "error": outcome.error})
    counts = {status: sum(1 for entry in entries if entry["status"] == status)
              for status in ("written", "skipped", "failed")}
    return {"directory": str(directory), "workers": workers.where, "traces": len(entries), **counts,
            "rank_account": account_for_ranks(files).as_json(), "ranks": entries}


def _written_since(path: Path, started_ns: int) -> bool:
    try:
        return path.stat().st_mtime_ns >= started_ns
    except OSError:
        return False


def _refuse_shared_outputs(files: list[Path], targets: list[Path]) -> None:
    """Two inputs for one output (`rank0_trace.json` and `rank0_trace.json.gz`) would race for
    it, the winner left to chance: refused before any work, naming both."""
    first_for: dict[Path, Path] = {}
    for path, target in zip(files, targets):
        other = first_for.setdefault(target, path)
        if other != path:
            raise CgtraceError(f"{other} and {path}: both would be written to {target}; "
                               "move or remove one of them (or pass each as its own trace)")
