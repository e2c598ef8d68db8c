"""What `cgtrace view` opens: a Perfetto trace as given, or one made from profiler output
first (a rank trace compacted, a directory of rank traces merged).

What view makes is kept in the cache folder (fileio/cache.py), never beside the input: a
file there of the same name may be the user's own (compacted with other lanes, or cut to a
few steps) and is neither replaced nor mistaken for the whole trace, and a read-only folder
of traces opens too. Each result sits in a folder named by a digest of its inputs (paths,
sizes, times changed) and of cgtrace's own code, so a changed input or a new cgtrace makes a
new one; only the newest few are kept.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Optional

from ..errors import CgtraceError
from ..fileio.atomic import NotWritten
from ..fileio.cache import cache_dir
from .merge import merge_ranks
from .rank_files import default_merge_output, find_rank_files
from .runner import COMPACTED_TAG, PROFILER_OUTPUT, JobOptions, default_output_path, run_job

KEPT = 4  # results view keeps: traces can be gigabytes


def viewable(path: Path, kept_in: Optional[Path] = None) -> tuple[Path, str]:
    """(the trace to open, what was done to get it, for the user). `kept_in`: where results
    are kept (default: the cache folder's `view/`)."""
    if not path.exists():
        dangling = " (a symbolic link to nothing)" if path.is_symlink() else ""
        raise CgtraceError(f"{path}: no such file{dangling}; check the path and try again")
    if path.is_dir():
        files = find_rank_files([path])
        if not files:
            raise CgtraceError(f"{path}: no rank traces (*.json, *.json.gz) in this directory; pass a trace "
                               "file or a directory of rank traces")
    elif not path.name.endswith(PROFILER_OUTPUT):
        return path, ""
    else:
        files = [path]
    folder = (kept_in or cache_dir() / "view") / _digest(files)
    if path.is_dir():
        return _merged(path, files, folder)
    output = folder / default_output_path(path, COMPACTED_TAG).name
    if output.is_file():
        return output, f"opening {output}, compacted earlier from {path}"
    _make_room(folder)
    try:
        run_job(path, output, JobOptions(compact=True, overwrite=True, args_strategy="auto"))
    except NotWritten as error:
        raise _not_kept(error) from None
    return output, f"compacted {path} -> {output} (kept for the next view)"


def _merged(directory: Path, files: list[Path], folder: Path) -> tuple[Path, str]:
    kept = sorted(folder.glob("*.perfetto-trace")) if folder.is_dir() else []
    if kept:
        return kept[0], f"opening {kept[0]}, merged earlier from {len(files)} rank traces in {directory}"
    _make_room(folder)
    try:
        summary = merge_ranks([directory], lambda group, groups: folder / default_merge_output([directory], group,
                                                                                          groups).name,
                              JobOptions(overwrite=True, args_strategy="auto"))
    except NotWritten as error:
        raise _not_kept(error) from None
    outputs = [Path(pipeline["output"]) for pipeline in summary.get("pipelines", [summary])]
    others = f"; the other pipelines are in {', '.join(map(str, outputs[1:]))}" if len(outputs) > 1 else ""
    return outputs[0], f"merged {len(files)} rank traces -> {outputs[0]} (kept for the next view){others}"


def _not_kept(error: NotWritten) -> CgtraceError:
    """A write into the cache folder that failed, worded for it: the user named no output, so
    the advice is the folder's, not -o."""
    return CgtraceError(f"{error.folder}: cannot keep the trace view makes here ({error.reason}); free some space there "
                        "or set XDG_CACHE_HOME to a folder with room", io_error=error.io_error)


def _digest(files: list[Path]) -> str:
    """Names one set of inputs as they are now, for this cgtrace: its own code files count
    as inputs, since a changed cgtrace may write another trace under the same version."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent.parent
    for file in [*sorted(package.rglob("*.py")), *files]:
        stat = file.stat()
        digest.update(f"\0{file.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


def _make_room(folder: Path) -> None:
    """Create `folder`, dropping all but the newest KEPT - 1 other results beside it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CgtraceError(f"{folder.parent}: cannot keep the trace view makes here ({error.strerror or error}); "
                           "set XDG_CACHE_HOME to a writable folder") from None
    others = sorted((entry for entry in folder.parent.iterdir() if entry.is_dir() and entry != folder),
                    key=lambda entry: entry.stat().st_mtime, reverse=True)
    for old in others[KEPT - 1:]:
        shutil.rmtree(old, ignore_errors=True)
