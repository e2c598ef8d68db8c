"""`cgtrace demo`: a built-in example, end to end, with nothing to download."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import CgtraceError
from ..generator import GeneratorConfig, write_pp_run, write_trace
from .merge import merge_ranks
from .runner import JobOptions, default_output_path, run_job

DEMO_CONFIG = GeneratorConfig(seed=7, steps=2, graphs_per_step=12, kernels_per_replay=32,
                              annotation_gaps=True, world_size=4, rank=0)
DEMO_PP_SIZE = 4


def run_demo(directory: Path, overwrite: bool = False) -> dict[str, Any]:
    """Generate a CUDA-graph trace and a 4-rank pipeline run in `directory`; compact and merge them."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CgtraceError(f"{directory}: cannot create the demo directory ({error.strerror}); "
                           "pass another DIR") from None
    source = directory / "cuda_graph_example.json.gz"
    if source.exists() and not overwrite:
        raise CgtraceError(f"{source}: already exists; pass --overwrite to regenerate the demo or choose another DIR")
    write_trace(DEMO_CONFIG, source)
    compacted = default_output_path(source, "_compacted")
    compact_summary = run_job(source, compacted, JobOptions(compact=True, overwrite=overwrite, args_strategy="auto"))

    ranks_dir = directory / "pp_ranks"
    ranks_dir.mkdir(exist_ok=True)
    rank_files = write_pp_run(ranks_dir, pp_size=DEMO_PP_SIZE, schedule="1f1b", microbatches=4, steps=2,
                              seed=7, gzip=True, graphs_per_step=6, kernels_per_replay=16)
    merged = directory / "pp_traces_merged.perfetto-trace"
    merge_summary = merge_ranks(rank_files, lambda group, groups: merged,
                                JobOptions(overwrite=overwrite, args_strategy="auto"))
    gpu_lines = "; ".join(f"{gpu['gpu']}: {gpu['streams']} streams -> {gpu['lanes']} lanes"
                          for gpu in compact_summary["per_gpu"])
    return {
        "example_trace": str(source),
        "compacted": {key: compact_summary[key] for key in (
            "output", "original_streams", "compacted_lanes", "lanes_by_group", "flows",
            "pp_compute_dependency_pairs")},
        "merged": {key: merge_summary[key] for key in (
            "output", "pp_ranks", "pp_send_recv_pairs", "pp_send_recv_unmatched")},
        "how_to_open": (
            f"{gpu_lines}. Wrote {compacted} and {merged} ({DEMO_PP_SIZE} pipeline ranks): open them at "
            "https://ui.perfetto.dev (Open trace file), or query offline: "
            f"cgtrace query {merged} \"select name, count(*) from slice group by 1 order by 2 desc limit 10\""),
    }
