"""`cgtrace report DIR` and `cgtrace query DIR SQL`: the single-trace report and query, run on
every trace of a directory as parallel tasks (executors.py), their answers put side by side.

Each task opens one trace in trace_processor where it runs and returns only its answer (the
report's figures, or the query's rows), so nothing large travels. Rows and ranks are tagged
with the trace's file and its global rank: the one a converted, compacted or merged trace
records in its track roles (from profiler output, `distributedInfo`'s), else none.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Iterable, Optional

import orjson

from ..analysis.query import Result, format_table, open_checked, run_sql, terminal_safe
from ..analysis.findings import as_text, straggler_findings
from ..analysis.report import DEFINITIONS, build_report
from ..analysis.stragglers import Arrival, late_arrivals, stragglers
from ..errors import CgtraceError
from ..fileio.atomic import GZIP_SUFFIX
from ..lane_rules import LaneRules, load_lane_rules
from ..model import roles_document
from .executors import Workers, for_cluster, run_tasks
from .rank_files import MERGED_OUTPUT_NAME, find_rank_files, is_rank_trace_name
from .readable import as_perfetto
from .runner import COMPACTED_TAG, PERFETTO_NAMES, default_output_path

ACROSS_DEFINITIONS = {
    "step time": "a GPU's mean ProfilerStep length over the steps of its window (the window's length where it "
                 "has no steps)",
    "vs median": "its step time minus the median step time of all GPUs listed",
    "bubble share": "its bubbles' total over its steps' total",
    "clock": "each trace's own: Kineto's baseTimeNanoseconds plus each event's ts, so ranks on one host share it "
             "and ranks on several hosts are as far apart as their clocks (merge aligns them: report the merge)",
}


def traces_in(directory: Path) -> list[Path]:
    """The traces of a directory to answer across: its Perfetto traces (not a merge's output,
    which holds many ranks), or where it has none, its rank traces (as `merge` finds them)."""
    perfetto = sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(PERFETTO_NAMES)
                      and not p.name.startswith(".") and not MERGED_OUTPUT_NAME.match(p.name))
    if perfetto:
        _refuse_ranks_without_output(directory, perfetto)
        return perfetto
    try:
        return find_rank_files([directory])
    except CgtraceError:
        raise CgtraceError(f"{directory}: holds no traces (*.perfetto-trace[.gz], *.json, *.json.gz); pass a directory "
                           "of rank traces or of their outputs") from None


def _refuse_ranks_without_output(directory: Path, outputs: list[Path]) -> None:
    """An answer from the outputs there are would pass for the whole run's: a rank trace beside
    them without an output of its own (not written yet, or its conversion failed) is named."""
    written = {path.name.removesuffix(GZIP_SUFFIX) for path in outputs}
    missing = sorted(path.name for path in directory.iterdir() if is_rank_trace_name(path.name) and
                     not any(default_output_path(path, tag).name in written for tag in ("", COMPACTED_TAG)))
    if missing:
        names = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise CgtraceError(f"{directory}: {len(missing)} rank trace(s) there have no output yet ({names}), so an "
                           f"answer from the {len(outputs)} outputs would leave them out; run `cgtrace compact "
                           f"{directory}` to write them (it names a rank that fails), or move them out of the folder")


def _refuse_duplicate_ranks(directory: Path, ranked: Iterable[tuple[str, Optional[int]]]) -> None:
    """Two files holding one global rank (a copy, a second run's output) would count it twice."""
    first: dict[int, str] = {}
    for file, rank in ranked:
        if rank is None:  # a trace that records no rank (its profiler output named none) cannot clash
            continue
        other = first.setdefault(rank, file)
        if other != file:
            raise CgtraceError(f"{directory}: {other} and {file} both hold global rank {rank}; move one of them "
                               "out of the folder and run again")


def query_across(directory: Path, sql: str, workers: Workers, tp_bin: Optional[str] = None) -> Result:
    """One query on every trace: the rows of all, each led by its file and rank."""
    files = traces_in(directory)
    outcomes = run_tasks(workers, query_one, [(for_cluster(path, workers.remote), sql, tp_bin) for path in files],
                         list(map(str, files)), "querying", stop_at_failure=True)
    _refuse_duplicate_ranks(directory, ((path.name, outcome.value[0]) for path, outcome in zip(files, outcomes)))
    columns: Optional[list[str]] = None
    rows: list[tuple] = []
    for path, outcome in zip(files, outcomes):
        rank, result = outcome.value
        if columns is not None and result.columns != columns:
            raise CgtraceError(f"{path}: the query gives columns {result.columns}, another trace {columns}; "
                               "name the columns in the query")
        columns = result.columns
        rows.extend((path.name, rank, *row) for row in result.rows)
    return Result(["file", "rank", *(columns or [])], rows)


def query_one(path: Path, sql: str, tp_bin: Optional[str]) -> tuple[Optional[int], Result]:
    """(the trace's global rank, the query's result) for one trace, as `cgtrace query` reads it."""
    with as_perfetto(path, compact=False) as trace, open_checked(trace, tp_bin, path) as tp:
        return recorded_rank(tp, path), run_sql(tp, sql, path)


def recorded_rank(tp: Any, path: Path) -> Optional[int]:
    """The global rank a trace's track roles record (a converted or compacted rank, the first of a merge)."""
    for (text,) in run_sql(tp, roles_document.SQL, path).rows:
        rank = roles_document.decode(text, path).rank
        if rank:
            return rank.global_rank
    return None


def report_across(directory: Path, workers: Workers, tp_bin: Optional[str] = None,
                  lanes: Optional[LaneRules] = None) -> dict[str, Any]:
    """Per GPU of every trace: step time, busy, exposed communication and bubble, and the
    stragglers: the traces whose late arrival into collectives holds the others up."""
    files = traces_in(directory)
    lanes = lanes or load_lane_rules()
    outcomes = run_tasks(workers, report_one, [(for_cluster(path, workers.remote), tp_bin, lanes) for path in files],
                         list(map(str, files)), "reporting", stop_at_failure=True)
    rows = [_rank_row(path, gpu) for path, outcome in zip(files, outcomes) for gpu in outcome.value[0]["gpus"]]
    _refuse_duplicate_ranks(directory, ((row["file"], row["global_rank"]) for row in rows))
    median = statistics.median(row["step_ns"] for row in rows) if rows else 0
    for row in rows:
        row["vs_median_ns"] = row["step_ns"] - median
    first_row = {row["file"]: row for row in reversed(rows)}
    late = late_arrivals({path.name: outcome.value[1] for path, outcome in zip(files, outcomes)})
    named = [{"file": file, "global_rank": first_row[file]["global_rank"] if file in first_row else None,
              "gpu": first_row[file]["gpu"] if file in first_row else None,
              "title": _title(file, first_row.get(file)), **figures}
             for file, figures in stragglers(late, {file: max(row["steps"], 1) for file, row in first_row.items()},
                                             median)]
    definitions = {**{k: DEFINITIONS[k] for k in ("window", "busy", "exposed communication", "bubble", "stragglers")},
                   **ACROSS_DEFINITIONS}
    return {"directory": str(directory), "traces": len(files),
            "findings": [finding.as_json() for finding in straggler_findings(named)], "definitions": definitions,
            "median_step_ns": median, "ranks": rows, "stragglers": named}


def report_one(path: Path, tp_bin: Optional[str], lanes: LaneRules) -> tuple[dict[str, Any], list[Arrival]]:
    """One trace's report figures, as `cgtrace report` computes them (no kernel list), and
    its collective kernels' arrivals."""
    with as_perfetto(path, compact=True, lanes=lanes) as trace:
        report = build_report(trace, tp_bin=tp_bin, top=0, lanes=lanes, shown_as=path)
    return report.figures, [arrival for arrivals in report.arrivals.values() for arrival in arrivals]


def _title(file: str, row: Optional[dict[str, Any]]) -> str:
    return f"rank {row['global_rank']} ({file})" if row and row["global_rank"] is not None else file


def _rank_row(path: Path, gpu: dict[str, Any]) -> dict[str, Any]:
    steps = gpu["steps"]
    step_total = sum(step["step_ns"] for step in steps)
    return {"file": path.name, "global_rank": gpu["global_rank"], "pp_rank": gpu["pp_rank"], "gpu": gpu["gpu"],
            "steps": len(steps) if gpu["window"] == "steps" else 0,
            "step_ns": step_total / len(steps) if steps else gpu["window_ns"],
            "busy_share": gpu["busy_share"], "exposed_comm_share": gpu["exposed_comm_share"],
            "bubble_share": round(sum(step["bubble_ns"] for step in steps) / step_total, 6) if step_total else 0.0}


def render_across(report: dict[str, Any], fmt: str) -> str:
    """JSON, or text: a table of GPUs, the stragglers, and the definitions."""
    if fmt == "json":
        return orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n"
    table = format_table(
        ["file", "rank", "gpu", "steps", "step ms", "vs median ms", "busy", "exposed comm", "bubble"],
        [[row["file"], "" if row["global_rank"] is None else str(row["global_rank"]), row["gpu"], str(row["steps"]),
          f"{row['step_ns'] / 1e6:.3f}", f"{row['vs_median_ns'] / 1e6:+.3f}", f"{row['busy_share'] * 100:.1f}%",
          f"{row['exposed_comm_share'] * 100:.1f}%", f"{row['bubble_share'] * 100:.1f}%"] for row in report["ranks"]],
        numeric_columns=[1, 3, 4, 5, 6, 7, 8])
    return (f"cgtrace report: {terminal_safe(report['directory'])}, {report['traces']} traces\n\n"
            + "\n".join(map(terminal_safe, as_text(report["findings"]).split("\n"))) + "\n"
            f"GPUs: step time, busy, exposed communication and bubble, over each GPU's window\n{table}\n"
            f"Median step time {report['median_step_ns'] / 1e6:.3f} ms; stragglers: "
            f"{len(report['stragglers']) or 'none'} (findings above)\n"
            "\nDefinitions\n" + "".join(f"  {term}: {text}\n" for term, text in report["definitions"].items()))
