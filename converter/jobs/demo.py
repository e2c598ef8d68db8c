"""`cgtrace demo`: a built-in example, end to end, with nothing to download."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ..errors import CgtraceError
from ..generator import GeneratorConfig, write_pp_run, write_trace
from .merge import merge_ranks
from .runner import COMPACTED_TAG, JobOptions, default_output_path, run_job

DEMO_CONFIG = GeneratorConfig(seed=7, steps=2, graphs_per_step=12, kernels_per_replay=32,
                              annotation_gaps=True, world_size=4, rank=0)
DEMO_PP_SIZE = 4
DEMO_MARKER = ".cgtrace-demo"


EXAMPLE_NAME = "cuda_graph_example.json.gz"
RANKS_NAME = "pp_ranks"
MERGED_NAME = "pp_traces_merged.perfetto-trace"


def run_demo(directory: Path, overwrite: bool = False) -> dict[str, Any]:
    """Generate a CUDA-graph trace and a 4-rank pipeline run in `directory`; compact and merge them.
    A directory an earlier demo wrote (its marker file says so) is written again, so the README's
    first command can be rerun; one holding anything else only with `overwrite`. A demo that
    fails (a full disk) or is stopped takes back what it wrote."""
    created = not directory.exists()
    marker = directory / DEMO_MARKER
    try:
        directory.mkdir(parents=True, exist_ok=True)
        foreign = not marker.is_file() and any(directory.iterdir())
        if foreign and not overwrite:
            raise CgtraceError(f"{directory}: holds files an earlier demo did not write; pass another DIR, "
                               "or --overwrite to write the demo among them")
        marker.write_text("Written by `cgtrace demo`, which replaces its own files here when run again.\n")
    except OSError as error:
        raise CgtraceError(f"{directory}: cannot write the demo there ({error.strerror}); pass another DIR") from None
    try:
        return _write_demo(directory)
    except BaseException as failure:
        _take_back(directory, created)
        io_error = failure if isinstance(failure, OSError) else \
            failure.io_error if isinstance(failure, CgtraceError) else None
        if io_error is not None:
            raise CgtraceError(f"{directory}: cannot write the demo there ({io_error.strerror or io_error}); "
                               "free disk space or pass another DIR") from None
        raise


def _write_demo(directory: Path) -> dict[str, Any]:
    source = directory / EXAMPLE_NAME
    write_trace(DEMO_CONFIG, source)  # every output from here on is the demo's own: replaced
    compacted = default_output_path(source, COMPACTED_TAG)
    compact_summary = run_job(source, compacted, JobOptions(compact=True, overwrite=True, args_strategy="auto"))

    ranks_dir = directory / RANKS_NAME
    ranks_dir.mkdir(exist_ok=True)
    rank_files = write_pp_run(ranks_dir, pp_size=DEMO_PP_SIZE, schedule="1f1b", microbatches=4, steps=2,
                              seed=7, gzip=True, graphs_per_step=6, kernels_per_replay=16)
    merged = directory / MERGED_NAME
    merge_summary = merge_ranks(rank_files, lambda group, groups: merged,
                                JobOptions(overwrite=True, args_strategy="auto"))
    gpu_lines = "; ".join(f"{gpu['gpu']}: {gpu['streams']} streams -> {gpu['lanes']} lanes"
                          for gpu in compact_summary["per_gpu"])
    return {
        "example_trace": str(source),
        "compacted": {key: compact_summary[key] for key in (
            "output", "original_streams", "compacted_lanes", "lanes_by_group", "flows")},
        "merged": {key: merge_summary[key] for key in (
            "output", "pp_ranks", "pp_send_recv_pairs", "pp_send_recv_unmatched")},
        "how_to_open": (
            f"{gpu_lines}. Wrote {compacted} and {merged} ({DEMO_PP_SIZE} pipeline ranks). Look at them with "
            f"`cgtrace view {compacted}` and `cgtrace view {merged}` (add --offline without internet), or query: "
            f"cgtrace query {merged} \"select name, count(*) from slice group by 1 order by 2 desc limit 10\""),
    }


def _take_back(directory: Path, created: bool) -> None:
    """Remove the demo's files: the whole directory if this run made it, else only its own."""
    if created:
        shutil.rmtree(directory, ignore_errors=True)
        return
    shutil.rmtree(directory / RANKS_NAME, ignore_errors=True)
    source = directory / EXAMPLE_NAME
    for own in (source, default_output_path(source, COMPACTED_TAG), directory / MERGED_NAME, directory / DEMO_MARKER):
        own.unlink(missing_ok=True)
