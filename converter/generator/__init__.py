"""Seeded generator of realistic PyTorch-profiler (Kineto) Chrome-JSON traces of
CUDA-graph training runs, optionally pipeline-parallel.

Public API::

    GeneratorConfig(...)                       # one rank's trace, see config.py
    iter_events(cfg) -> Iterator[dict]         # streaming, float-us ts/dur
    build_trace(cfg) -> dict                   # parsed trace (small traces)
    trace_bytes(cfg) -> bytes                  # exact file content
    write_trace(cfg, path, gzip=None) -> Path  # streaming; .gz -> gzip
    pipeline_schedule(schedule, pp_size, microbatches, stages_per_rank=1)
        -> {pp_rank: ["0UNSHARD", "0F0", "0SEND_F0", ...]}
    write_pp_run(out_dir, pp_size, dp_size=1, ...) -> [Path per global rank]
"""

from .config import DEFAULT_BASE_TIME_NS, GeneratorConfig
from .events import iter_events
from .schedules import Action, parse_action, pipeline_schedule
from .writer import build_trace, trace_bytes, write_pp_run, write_trace

__all__ = [
    "Action",
    "DEFAULT_BASE_TIME_NS",
    "GeneratorConfig",
    "build_trace",
    "iter_events",
    "parse_action",
    "pipeline_schedule",
    "trace_bytes",
    "write_pp_run",
    "write_trace",
]
