"""`cgtrace demo`: a built-in example, end to end, with nothing to download."""

from __future__ import annotations

from pathlib import Path

from .errors import CgtraceError
from .generator import GeneratorConfig, write_trace
from .pipeline import convert_file, default_output_path

DEMO_CONFIG = GeneratorConfig(seed=7, steps=2, graphs_per_step=12, kernels_per_replay=32,
                              annotation_gaps=True, world_size=4, rank=0)


def run_demo(directory: Path, overwrite: bool = False) -> dict:
    """Generate an example CUDA-graph trace in `directory` and convert it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CgtraceError(f"{directory}: cannot create the demo directory ({error.strerror}); "
                           "pass another DIR") from None
    source = directory / "cuda_graph_example.json.gz"
    if source.exists() and not overwrite:
        raise CgtraceError(f"{source}: already exists; pass --overwrite to regenerate the demo or choose another DIR")
    write_trace(DEMO_CONFIG, source)
    output = default_output_path(source)
    summary = {"example_trace": str(source), "converted": convert_file(source, output, overwrite=overwrite)}
    summary["how_to_open"] = (
        f"wrote {output}: open it at https://ui.perfetto.dev (Open trace file), "
        f"or offline with `cgtrace query {output} \"select name, count(*) from slice group by 1\"`")
    return summary
