"""Shared test helpers: real traces from ../shared (skipped when absent) and SQL over outputs."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Optional

import pytest

from converter import open_trace
from converter.engine.critical_path import GROUP_NAME as CRITICAL_PATH_GROUP
from converter.model import roles_document
from converter.model.roles_document import TrackEntry

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def real_pipeline_copy(name: str, tmp_path: Path) -> Path:
    """A copy of one real torch pipelining set (its rank traces), to merge beside; skips the
    test where ../shared is absent."""
    source = SHARED_TRACES / "torch_pp_cpu" / name
    if not source.is_dir():
        pytest.skip("../shared/traces is absent")
    return Path(shutil.copytree(source, tmp_path / name))


def shared_trace_paths() -> list[Path]:
    if not SHARED_TRACES.is_dir():
        return []
    # Profiler traces only: a set's notes beside its traces (layouts_torch215.json) are no trace.
    return sorted(p for p in SHARED_TRACES.rglob("*.json*") if p.is_file() and not p.name.startswith("layouts"))


def shared_trace_param(path: Path):
    return pytest.param(path, id=str(path.relative_to(SHARED_TRACES)))


def require_shared_traces() -> None:
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces is not present: real-trace tests need it")


def rows(trace_path, sql: str) -> list[dict]:
    """Run SQL on a trace through the real consumer, trace_processor; rows as dicts."""
    with open_trace(trace_path) as tp:
        return [row.__dict__.copy() for row in tp.query(sql)]


# Each GPU's lanes hang under one row of their own: a counter (its busy lanes) whose children
# hold slices (a merged pipeline's root, a counter of busy GPUs, holds rows of rows).
# A merged rank's CPU row is a counter with children too (its CPU work): not a GPU's.
# The critical path's group is a counter of rows of its own (engine/critical_path.py): not a GPU's.
LANE_CONTAINERS_SQL = f"""select p.id from track p where p.type glob '*counter*' and p.name not glob '* · CPU*'
                           and p.name != '{CRITICAL_PATH_GROUP}' and exists (
                           select 1 from track c join cgtrace_all_slice s on s.track_id = c.id where c.parent_id = p.id)"""
# Every row of a GPU's lanes, as `under_gpu (id, gpu)`: its lanes and annotation rows, shown under
# it or folded under one of its lanes (compaction.py's folded_under).
UNDER_GPU_SQL = f"""with recursive under_gpu as (
    select t.id as id, t.parent_id as gpu from track t where t.parent_id in ({LANE_CONTAINERS_SQL})
    union all select t.id as id, u.gpu as gpu from track t join under_gpu u on t.parent_id = u.id)"""


def track_roles(trace_path) -> list[TrackEntry]:
    """The roles of every track cgtrace wrote into a trace (every rank's in a merge), read as report reads them."""
    return [role for row in rows(trace_path, roles_document.SQL)
            for role in roles_document.decode(row["str_value"], Path(trace_path)).tracks]


def problem_stats(trace_path) -> list[dict]:
    return rows(trace_path, "select name, value from stats "
                            "where severity in ('error', 'data_loss') and value > 0")


def write_json(path: Path, document) -> Path:
    text = json.dumps(document).encode()
    path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)
    return path


def convert_file(source: Path, output: Path, **options) -> dict:
    """`cgtrace convert` as a library call: run_job with JobOptions built from keywords (the
    args strategy is in-process unless a test names another)."""
    from converter.jobs.runner import JobOptions, run_job

    return run_job(source, output, JobOptions(compact=False, **options))


def compact_file(source: Path, output: Path, **options) -> dict:
    """`cgtrace compact` as a library call (see convert_file)."""
    from converter.jobs.runner import JobOptions, run_job

    return run_job(source, output, JobOptions(compact=True, **options))


def merge_files(files: list[Path], output_for, jobs=None, assume_aligned=False, pp_group=None, ranks=None,
                align="auto", **options) -> dict:
    """`cgtrace merge` as a library call (see convert_file)."""
    from converter.jobs.merge import merge_ranks
    from converter.jobs.runner import JobOptions

    return merge_ranks(files, output_for, JobOptions(**options), jobs=jobs, assume_aligned=assume_aligned,
                       pp_group=pp_group, ranks=ranks, align=align)


def view_and_fetch(trace: Path, served_name: str, cache: Optional[Path] = None) -> tuple[str, bytes, int, str]:
    """`cgtrace view TRACE --offline --no-browser` on a free port, its cache folder in `cache`
    when given: (the URL it prints, the bytes it serves at /<served_name>, its exit status
    after Ctrl-C, its stderr)."""
    import http.client
    import os
    import signal
    import subprocess
    import sys

    command = [sys.executable, "-m", "converter.cli", "view", str(trace), "--port", "0", "--no-browser", "--offline"]
    env = dict(os.environ, **({"XDG_CACHE_HOME": str(cache)} if cache is not None else {}))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parents[1], env=env)
    try:
        url = process.stdout.readline().strip() if process.stdout else ""
        port = int(url.split("url=http://127.0.0.1:")[1].split("/")[0])
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/" + served_name)
        served = connection.getresponse().read()
        connection.close()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
    return url, served, process.returncode, err


def child_pids(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc), across its threads; a thread that exits
    while they are listed has none left."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found
