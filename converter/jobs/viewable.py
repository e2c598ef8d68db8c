"""What `cgtrace view` opens: a Perfetto trace as given, or one made from profiler output
first (a rank trace compacted, a directory of rank traces merged). The result is kept beside
the input and reused while it is newer than every input, so the next view opens at once."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import CgtraceError
from .merge import merge_ranks
from .rank_files import default_merge_output, find_rank_files
from .runner import PROFILER_OUTPUT, JobOptions, default_output_path, run_job


def viewable(path: Path) -> tuple[Path, str]:
    """(the trace to open, what was done to get it, for the user)."""
    if path.is_dir():
        return _merged(path)
    if not path.name.endswith(PROFILER_OUTPUT):
        return path, ""
    output = default_output_path(path, "_compacted")
    if _fresh(output, [path]):
        return output, f"opening {output}, compacted earlier from {path.name}"
    run_job(path, output, JobOptions(compact=True, overwrite=True, args_strategy="auto"))
    return output, f"compacted {path} -> {output} (kept for the next view)"


def _merged(directory: Path) -> tuple[Path, str]:
    files = find_rank_files([directory])
    if not files:
        raise CgtraceError(f"{directory}: no rank traces (*.json, *.json.gz) in this directory; pass a trace "
                           "file or a directory of rank traces")
    kept = next((output for output in (default_merge_output([directory], 0, 1),
                                       default_merge_output([directory], 0, 2)) if _fresh(output, files)), None)
    if kept is not None:
        return kept, f"opening {kept}, merged earlier from {len(files)} rank traces"
    summary = merge_ranks([directory], lambda group, groups: default_merge_output([directory], group, groups),
                          JobOptions(overwrite=True, args_strategy="auto"))
    outputs = [Path(pipeline["output"]) for pipeline in summary.get("pipelines", [summary])]
    others = f"; the other pipelines are in {', '.join(map(str, outputs[1:]))}" if len(outputs) > 1 else ""
    return outputs[0], f"merged {len(files)} rank traces -> {outputs[0]} (kept for the next view){others}"


def _fresh(output: Path, inputs: list[Path]) -> bool:
    """Whether `output` is a file written after every input last changed."""
    built: Optional[float] = output.stat().st_mtime if output.is_file() else None
    return built is not None and all(source.stat().st_mtime <= built for source in inputs)
