"""cgtrace from Python: the commands as functions, for notebooks, scripts and training runs.

Each function does what its command does, with the same options and the same one-line
errors (`CgtraceError`), and returns the command's JSON summary as a typed object. Heavy
imports wait inside the functions, so `import converter` stays cheap.

The examples run as doctests (tests/test_api.py), in name order, each after this set-up,
which writes a small generated trace:

>>> import tempfile
>>> from pathlib import Path
>>> from converter.generator import GeneratorConfig, write_trace
>>> folder = Path(tempfile.mkdtemp())
>>> trace = write_trace(GeneratorConfig(seed=1, steps=2, graphs_per_step=2, kernels_per_replay=4),
...                     folder / "trace.json")
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from ..errors import CgtraceError
from ..jobs.options import (MAX_TOP, PathLike, checked_step_windows, cut, job_options, lane_rules, merge_outputs,
                            rank_list, whole_number, workers)
from .handler import ChromeTraceExporter, TraceHandler
from .summaries import (Change, CompactSummary, ConvertSummary, DiffSummary, Finding, GpuFigures, GpuLanes, Kernel,
                        MergeSummary, ReportSummary)

if TYPE_CHECKING:
    from perfetto.trace_processor.api import TraceProcessor

__all__ = ["CgtraceError", "Change", "ChromeTraceExporter", "CompactSummary", "ConvertSummary", "DiffSummary",
           "Finding", "GpuFigures", "GpuLanes", "Kernel", "MergeSummary", "ReportSummary", "TraceHandler", "compact",
           "convert", "diff", "merge", "open_trace", "report", "trace_handler"]


def convert(trace: PathLike, output: Optional[PathLike] = None, *, overwrite: bool = False,
            strict: bool = False, verify: bool = False, window: Optional[str] = None,
            steps: Optional[str] = None, split_steps: bool = False) -> ConvertSummary:
    """`cgtrace convert`: the trace as native Perfetto, every slice, flow and arg kept;
    `output` defaults to `<name>.perfetto-trace` beside it.

    >>> from converter import convert
    >>> done = convert(folder / "trace.json")
    >>> done.output.name, done.slices > 0
    ('trace.perfetto-trace', True)
    """
    from ..jobs.runner import default_output_path, run_job

    source = Path(trace)
    target = Path(output) if output is not None else default_output_path(source)
    options = job_options(False, strict=strict, window=cut(window, steps), split_steps=split_steps,
                          overwrite=overwrite, verify=verify)
    return ConvertSummary.of(run_job(_one_trace(source, "convert"), target, options))


def compact(trace: PathLike, output: Optional[PathLike] = None, *, lanes: Optional[PathLike] = None,
            relane: bool = False, json: bool = False, overwrite: bool = False, strict: bool = False,
            verify: bool = False, window: Optional[str] = None, steps: Optional[str] = None,
            split_steps: bool = False, critical_path: bool = False) -> CompactSummary:
    """`cgtrace compact`: each GPU's streams repacked into a few named lanes; `lanes` is a
    lane-rules TOML file, `json=True` writes Chrome JSON instead of Perfetto, `critical_path=True`
    adds each step's critical path.

    >>> from converter import compact
    >>> done = compact(folder / "trace.json", steps="1")
    >>> done.output.name, done.gpus
    ('trace_compacted.perfetto-trace', (GpuLanes(gpu='GPU 0', streams=4, lanes=4),))
    """
    from ..jobs.runner import COMPACTED_TAG, default_output_path, run_job

    output_format = "json" if json else "perfetto"
    source = Path(trace)
    target = Path(output) if output is not None else default_output_path(source, COMPACTED_TAG, output_format)
    options = job_options(True, lane_rules(lanes), relane=relane, strict=strict, window=cut(window, steps),
                          split_steps=split_steps, output_format=output_format, overwrite=overwrite,
                          verify=verify, critical_path=critical_path)
    return CompactSummary.of(run_job(_one_trace(source, "compact"), target, options))


def merge(traces: PathLike | Sequence[PathLike], output: Optional[PathLike] = None, *,
          lanes: Optional[PathLike] = None, overwrite: bool = False, jobs: Optional[int] = None,
          ranks: Optional[str] = None, pp_group: Optional[int] = None, assume_aligned: bool = False,
          align: str = "auto", strict: bool = False, verify: bool = False,
          cycle: Optional[int] = None) -> MergeSummary:
    """`cgtrace merge`: pipeline-parallel rank traces (a directory, or the files) as one
    timeline, ranks in pipeline order with arrows between them; `ranks` like "0,1,4-7";
    `align` as `--align` (auto, base-time, none) sets the ranks' clocks; a directory holding
    several profiling cycles gives a file per cycle, or only the `cycle` named (as `--cycle`).

    >>> from converter import merge
    >>> from converter.generator import write_pp_run
    >>> files = write_pp_run(folder / "run", pp_size=2, seed=3, graphs_per_step=2, kernels_per_replay=4)
    >>> done = merge(folder / "run")
    >>> done.output.name, done.ranks, done.send_recv_pairs > 0    # global ranks in pipeline order
    ('pp_traces_merged.perfetto-trace', ((1, 0),), True)
    """
    from ..jobs.merge import merge_ranks

    inputs = [Path(traces)] if isinstance(traces, (str, Path)) or not isinstance(traces, Sequence) \
        else [Path(t) for t in traces]
    options = job_options(True, lane_rules(lanes), strict=strict, overwrite=overwrite, verify=verify)
    target = Path(output) if output is not None else None
    return MergeSummary.of(merge_ranks(inputs, merge_outputs(target, inputs, pp_group), options, jobs=jobs,
                                       assume_aligned=assume_aligned, pp_group=pp_group, ranks=rank_list(ranks),
                                       align=align, cycle=cycle))


def report(trace: PathLike, *, top: int = 10, lanes: Optional[PathLike] = None,
           tp_bin: Optional[str] = None, step_windows: str = "launched") -> ReportSummary:
    """`cgtrace report`: per GPU its busy time and exposed communication, per step the bubble,
    the top kernels; profiler output is compacted first. `.text()` and `.html()` render it
    (a notebook shows the HTML).

    >>> from converter import report
    >>> figures = report(folder / "trace.json", top=3)
    >>> [gpu.gpu for gpu in figures.gpus], 0 < figures.gpus[0].busy_share <= 1, len(figures.top_kernels)
    (['GPU 0'], True, 3)
    """
    from ..analysis.report import build_report
    from ..jobs.readable import as_perfetto

    whole_number("top", top, 0, MAX_TOP)
    bounds = checked_step_windows(step_windows)
    source, rules = _one_trace(Path(trace), "report"), lane_rules(lanes)
    with as_perfetto(source, compact=True, lanes=rules) as readable:
        return ReportSummary.of(build_report(readable, tp_bin=tp_bin, top=top, lanes=rules, shown_as=source,
                                             step_windows=bounds))


def diff(a: PathLike, b: PathLike, *, top: int = 10, lanes: Optional[PathLike] = None,
         tp_bin: Optional[str] = None, jobs: Optional[int] = None, scheduler: Optional[str] = None,
         a_rank: Optional[int] = None, b_rank: Optional[int] = None, a_gpu: Optional[int] = None,
         b_gpu: Optional[int] = None, step_windows: str = "launched") -> DiffSummary:
    """`cgtrace diff`: what changed from trace `a` (before) to `b` (after), per step, lane
    group, kernel and launching op (the `top` that moved most) and pipeline stage part, with
    findings first; `a_rank`/`b_rank`, `a_gpu`/`b_gpu`: compare only that global rank or GPU
    index of a side (`--a-rank` ...); `.beyond(pct)` names what `--fail-above pct` would fail on.

    >>> from converter import diff
    >>> same = diff(folder / "trace.json", folder / "trace.json", jobs=1)
    >>> [found.key for found in same.findings][:2], same.beyond(0.0)
    (['step_time', 'kind.compute'], ())
    """
    from ..analysis.diff import Side
    from ..jobs.diff_pair import diff_traces

    whole_number("top", top, 0, MAX_TOP)
    sides = (Side.checked("a", a_rank, a_gpu), Side.checked("b", b_rank, b_gpu))
    bounds = checked_step_windows(step_windows)
    with workers(jobs, scheduler) as where:
        return DiffSummary.of(diff_traces(Path(a), Path(b), where, tp_bin, lane_rules(lanes), top, sides, bounds))


def open_trace(trace: PathLike | bytes, tp_bin: Optional[str] = None,
               heap_limit_bytes: Optional[int] = None) -> TraceProcessor:
    """Perfetto's own `TraceProcessor` on any trace (ours, Chrome JSON or Perfetto protobuf; a
    path or the bytes), offline, with cgtrace's SQL tables defined (docs/sql.md); close it, or
    use it in a `with` block, to free its memory. `tp_bin`: a native trace_processor_shell,
    whose run of every table is checked here: one it cannot run raises CgtraceError naming the
    table and its version, not the trace; `heap_limit_bytes`: how far the WebAssembly build's
    heap may grow (default: as far as it can).

    >>> from converter import open_trace
    >>> with open_trace(folder / "trace.perfetto-trace") as tp:
    ...     [row.n > 0 for row in tp.query("select count(*) n from slice")]
    [True]
    """
    from ..tp import open_trace as opened

    return opened(trace, tp_bin, heap_limit_bytes=heap_limit_bytes)


def trace_handler(dir_name: PathLike, *, worker_name: Optional[str] = None, keep_json: bool = True,
                  gzip_json: bool = False, lanes: Optional[PathLike] = None,
                  split_steps: bool = False, compact: bool = True) -> TraceHandler:
    """A `torch.profiler` `on_trace_ready` callback: each trace ready is exported once as
    `<worker>.cycle<C>.steps<A>-<B>.pt.trace.json` in `dir_name` (worker: `rank<R>`, else
    host_pid; C counts the worker's traces from 1; A-B are the ProfilerSteps it holds) and
    compacted to `.perfetto-trace` beside it; then the JSON is kept, gzipped or dropped.
    `compact=False` writes the JSON alone, to compact or merge after the run. `.written`
    lists every file kept. Failures are logged and counted (`.failures`, `.last_error`), never
    raised into the training run; a bad `lanes` file fails here, before the run.
    `cgtrace merge dir_name` merges a distributed run's ranks, a file per profiling cycle (it
    reads the JSON, so keep it for that).

    >>> from converter import trace_handler
    >>> class Profiler:  # stands in for torch.profiler.profile
    ...     def export_chrome_trace(self, path):
    ...         Path(path).write_bytes(trace.read_bytes())
    >>> on_trace_ready = trace_handler(folder / "profiles", worker_name="worker0", gzip_json=True)
    >>> on_trace_ready(Profiler())
    >>> [path.name for path in on_trace_ready.written], on_trace_ready.failures
    (['worker0.cycle1.steps0-1.pt.trace.perfetto-trace', 'worker0.cycle1.steps0-1.pt.trace.json.gz'], 0)
    """
    if not (compact or keep_json):
        raise CgtraceError("trace_handler(compact=False, keep_json=False) would keep nothing; keep the JSON, or compact")
    return TraceHandler(Path(dir_name), worker_name, keep_json, gzip_json, lane_rules(lanes), split_steps, compact)


def _one_trace(path: Path, command: str) -> Path:
    """The API takes one trace where the command line also takes a directory (a batch)."""
    if path.is_dir():
        raise CgtraceError(f"{path}: is a directory; pass one trace file, or run `cgtrace {command} {path}` "
                           "for every trace in it")
    return path
