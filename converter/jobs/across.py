"""`cgtrace report DIR` and `cgtrace query DIR SQL`: the single-trace report and query, run on
every trace of a directory as parallel tasks (executors.py), their answers put side by side.

Each task opens one trace in trace_processor where it runs and returns only its answer (the
report's figures with its collective kernels, or the query's rows), so nothing large travels.
The report's stragglers are judged on one clock: the traces' collectives give each its offset
as they give a merge's ranks theirs. Rows and ranks are tagged with the trace's file and its
global rank: the one a converted, compacted or merged trace records in its track roles (from
profiler output, `distributedInfo`'s), else none. A trace that cannot be read stops the answer,
named with the run's ranks that have no trace here; ranks merely absent are named beside it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import orjson

from ..analysis.collectives import COLLECTIVE_DEFINITIONS, TEXT_ROWS, collectives
from ..analysis.query import Result, format_table, open_checked, run_sql
from ..analysis.render import collectives_table
from ..analysis.findings import across_findings, as_text
from ..analysis.pipeline_anatomy import ANATOMY_DEFINITIONS, STAGE_PARTS
from ..analysis.report import DEFINITIONS, build_report
from ..analysis.stragglers import Arrival, hold_ups, late_arrivals, straggler_answer
from ..engine.clock import Collectives, collectives_of, estimate_clocks
from ..errors import CgtraceError
from ..fileio.atomic import GZIP_SUFFIX
from ..lane_rules import LaneRules, load_lane_rules
from ..model import roles_document
from ..terminal import terminal_safe
from .cycles import choose_cycle, profiling_cycles, steps_label
from .executors import Outcome, Workers, for_cluster, run_tasks
from .rank_files import MERGED_OUTPUT_NAME, RankAccount, account_for_ranks, find_rank_files, is_rank_trace_name, named
from .readable import as_perfetto
from .runner import COMPACTED_TAG, PERFETTO_NAMES, default_output_path

ACROSS_DEFINITIONS = {
    "step time": "a GPU's mean ProfilerStep length over the steps of its window (the window's length where it "
                 "has no steps); where no trace has GPU slices (CPU-only pipelines), a PP rank's mean step length "
                 "in its pipeline stage rows",
    "vs median": "its step time minus the median step time of all GPUs listed (of all PP ranks where no GPU is)",
    "bubble share": "its bubbles' total over its steps' total",
    "clock": "one for every trace, as merge finds it: Kineto's baseTimeNanoseconds plus each event's ts, each trace "
             "moved by its offset where the kernels of the NCCL collectives it shares with others (which end together "
             "on every rank) show the base times disagree beyond what they can tell; each trace's offset and its "
             "uncertainty are listed (transfers are not used: a trace sharing no collective keeps its base time)",
}


def traces_in(directory: Path, cycle: Optional[int] = None) -> list[Path]:
    """The traces of a directory to answer across: its Perfetto traces (not a merge's output,
    which holds many ranks), or where it has none, its rank traces (as `merge` finds them);
    of one profiling cycle where the rank traces there hold several (jobs.cycles)."""
    perfetto = sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(PERFETTO_NAMES)
                      and not p.name.startswith(".") and not MERGED_OUTPUT_NAME.match(p.name))
    try:
        rank_traces = find_rank_files([directory])
    except CgtraceError:
        if not perfetto:
            raise CgtraceError(f"{directory}: holds no traces (*.perfetto-trace[.gz], *.json, *.json.gz); pass a "
                               "directory of rank traces or of their outputs") from None
        rank_traces = []
    chosen = _one_cycle(directory, rank_traces, cycle)
    if perfetto:
        _refuse_ranks_without_output(directory, perfetto)
        if chosen is None:
            return perfetto
        outputs = {default_output_path(path, tag).name for path in chosen for tag in ("", COMPACTED_TAG)}
        return [path for path in perfetto if path.name.removesuffix(GZIP_SUFFIX) in outputs]
    return rank_traces if chosen is None else chosen


def _one_cycle(directory: Path, rank_traces: list[Path], cycle: Optional[int]) -> Optional[list[Path]]:
    """The rank traces of the profiling cycle --cycle names; None where there is one cycle and
    none was named. Several cycles with none named are refused: each rank would count twice."""
    if not rank_traces:
        if cycle is not None:
            raise CgtraceError(f"{directory}: --cycle {cycle} picks among profiler rank traces (*.json[.gz]), and "
                               "none is there; leave out --cycle")
        return None
    cycles = profiling_cycles(rank_traces)
    if len(cycles) > 1 and cycle is None:
        steps = ", ".join(f"{each.number}: {steps_label(each.steps)}" for each in cycles)
        raise CgtraceError(f"{directory}: holds {len(cycles)} profiling cycles of the same ranks ({steps}); pass "
                           "--cycle N to answer for one")
    return None if cycle is None else list(choose_cycle(cycles, cycle)[0].files)


def _refuse_ranks_without_output(directory: Path, outputs: list[Path]) -> None:
    """An answer from the outputs there are would pass for the whole run's: a rank trace beside
    them without an output of its own (not written yet, or its conversion failed) is named."""
    written = {path.name.removesuffix(GZIP_SUFFIX) for path in outputs}
    missing = sorted(path.name for path in directory.iterdir() if is_rank_trace_name(path.name) and
                     not any(default_output_path(path, tag).name in written for tag in ("", COMPACTED_TAG)))
    if missing:
        names = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        absent = rank_account(directory).note()
        raise CgtraceError(f"{directory}: {len(missing)} rank trace(s) there have no output yet ({names}), so an "
                           f"answer from the {len(outputs)} outputs would leave them out; "
                           + (f"{absent}; " if absent else "") + f"run `cgtrace compact {directory}` to write them "
                           "(it names a rank that fails), or move them out of the folder")


def rank_account(directory: Path) -> RankAccount:
    """The run's ranks with no trace in the directory, from its rank traces' headers (a folder
    of outputs alone records no world size: nothing can be said missing)."""
    try:
        return account_for_ranks(find_rank_files([directory]))
    except CgtraceError:
        return RankAccount(None, ())


def _answers(directory: Path, outcomes: list[Outcome]) -> list[Any]:
    """Every trace's answer, or one line naming the traces that could not be read and the run's
    ranks with no trace here: an answer over the others would pass for the whole run's."""
    failed = [outcome for outcome in outcomes if outcome.error is not None]
    # A bug, or a failure of this machine (a full disk: io_error) rather than of a trace, is its own line.
    stop = next((outcome.exception for outcome in failed if not isinstance(outcome.exception, CgtraceError)
                 or outcome.exception.io_error is not None), None)
    if stop is not None:
        raise stop
    if failed:
        absent = rank_account(directory).note()
        raise CgtraceError(f"{directory}: {len(failed)} of {len(outcomes)} traces could not be read "
                           f"({named(Path(outcome.name).name for outcome in failed)}), first {failed[0].error}; "
                           + (f"{absent}; " if absent else "") + "an answer without them would pass for the "
                           "whole run's: fix or move them and run again")
    return [outcome.value for outcome in outcomes]


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


def query_across(directory: Path, sql: str, workers: Workers, tp_bin: Optional[str] = None,
                 cycle: Optional[int] = None) -> Result:
    """One query on every trace (of one profiling cycle): the rows of all, each led by its file and rank."""
    files = traces_in(directory, cycle)
    answers = _answers(directory, run_tasks(workers, query_one, [(for_cluster(path, workers.remote), sql, tp_bin)
                                                                 for path in files], list(map(str, files)), "querying"))
    _refuse_duplicate_ranks(directory, ((path.name, answer[0]) for path, answer in zip(files, answers)))
    columns: Optional[list[str]] = None
    rows: list[tuple] = []
    for path, (rank, result) in zip(files, answers):
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
                  lanes: Optional[LaneRules] = None, cycle: Optional[int] = None,
                  step_windows: str = "launched") -> dict[str, Any]:
    """Per GPU of every trace: step time, busy, exposed communication and bubble; per PP rank
    (a rank trace with PP annotations or c10d transfers, GPU or CPU-only): its pipeline stage
    rows; the findings they give, and the stragglers: the traces whose late arrival into
    collectives holds the others up."""
    files = traces_in(directory, cycle)
    lanes = lanes or load_lane_rules()
    tasks = [(for_cluster(path, workers.remote), tp_bin, lanes, step_windows) for path in files]
    answers = _answers(directory, run_tasks(workers, report_one, tasks, list(map(str, files)), "reporting"))
    rows = [_rank_row(path, gpu) for path, (figures, _, _) in zip(files, answers) for gpu in figures["gpus"]]
    stages = [{"file": path.name, **stage} for path, (figures, _, _) in zip(files, answers)
              for stage in figures.get("pipeline", {}).get("stages", [])]
    _refuse_duplicate_ranks(directory, ((row["file"], row["global_rank"]) for row in rows + stages))
    step_times = _step_times(rows, stages)
    median = statistics.median([row["step_ns"] for row in rows] or [step for step, _ in step_times.values()] or [0])
    for row in rows:
        row["vs_median_ns"] = row["step_ns"] - median
    identity = {row["file"]: row for row in reversed(stages + rows)}  # a file's first GPU, else its first stage

    def title(file: str) -> str:
        row = identity.get(file)
        return f"rank {row['global_rank']} ({file})" if row and row["global_rank"] is not None else file

    arrivals, clocks = _on_one_clock(files, [(mine, span) for _, mine, span in answers], title)
    found = late_arrivals(arrivals, title, {row["file"]: row["uncertainty_ns"] or 0 for row in clocks["ranks"]})
    held = [{"file": file, "global_rank": identity[file]["global_rank"] if file in identity else None,
             "gpu": identity[file].get("gpu") if file in identity else None, "title": title(file), **figures}
            for file, figures in hold_ups(found.late, {file: steps for file, (_, steps) in step_times.items()},
                                          median)]
    answer = straggler_answer(found, held, median)
    shared = collectives(arrivals, title, lambda file: {
        "file": file, "global_rank": identity[file]["global_rank"] if file in identity else None})
    definitions = {**{k: DEFINITIONS[k] for k in ("window", "step windows", "busy", "exposed communication",
                                                  "bubble")},
                   **(ANATOMY_DEFINITIONS if stages else {}), "stragglers": DEFINITIONS["stragglers"],
                   **COLLECTIVE_DEFINITIONS, "findings": DEFINITIONS["findings"], **ACROSS_DEFINITIONS}
    return {"directory": str(directory), "traces": len(files), "rank_account": rank_account(directory).as_json(),
            "findings": [finding.as_json() for finding in across_findings(stages, answer["stragglers"])],
            "definitions": definitions, "median_step_ns": median, "ranks": rows, "stages": stages,
            "clock_alignment": clocks, **answer, "collectives": shared}


def _on_one_clock(files: list[Path], arrivals: list[tuple[list[Arrival], tuple[int, int]]],
                  title: Callable[[str], str]) -> tuple[dict[str, list[Arrival]], dict[str, Any]]:
    """Every trace's collective arrivals (each with its capture's span) on one clock, with the
    alignment merge uses (engine.clock on their collectives, applied only where the base times
    disagree beyond what it can tell), and how each trace was placed."""
    clocks = estimate_clocks([_clock_evidence(mine, span) for mine, span in arrivals], [],
                             [title(path.name) for path in files])
    applied = clocks.skewed()
    moved = {}
    for path, (mine, _), clock in zip(files, arrivals, clocks.ranks):
        offset = clock.offset_ns if applied else 0
        moved[path.name] = [arrival.shifted(offset) for arrival in mine]
    shared = any(clock.evidence for clock in clocks.ranks)  # else (CPU-only ranks, say) every trace would warn alike
    return moved, {"applied": applied, "warnings": clocks.warnings if shared else [],
                   "ranks": [{"file": path.name, "title": title(path.name), "estimated_offset_ns": clock.offset_ns,
                              "applied_offset_ns": clock.offset_ns if applied else 0,
                              "uncertainty_ns": clock.uncertainty_ns, "evidence": dict(clock.evidence)}
                             for path, clock in zip(files, clocks.ranks)]}


def _step_times(rows: list[dict[str, Any]], stages: list[dict[str, Any]]) -> dict[str, tuple[float, int]]:
    """Per file: (its step time, its steps), from its GPUs' rows, or where the directory has no
    GPU rows (CPU-only pipelines), from its pipeline stage rows."""
    if rows:
        return {row["file"]: (row["step_ns"], max(row["steps"], 1)) for row in reversed(rows)}
    lengths: dict[str, list[int]] = defaultdict(list)
    for stage in stages:
        lengths[stage["file"]].append(stage["step_ns"])
    return {file: (sum(steps) / len(steps), len(steps)) for file, steps in lengths.items()}


def report_one(path: Path, tp_bin: Optional[str], lanes: LaneRules, step_windows: str = "launched"
               ) -> tuple[dict[str, Any], list[Arrival], tuple[int, int]]:
    """One trace's report figures, as `cgtrace report` computes them (no kernel list), its
    collective kernels' arrivals (the stragglers' evidence and its clock's, small) and its
    capture's span (how far its clock's drift reaches)."""
    with as_perfetto(path, compact=True, lanes=lanes) as trace:
        report = build_report(trace, tp_bin=tp_bin, top=0, lanes=lanes, shown_as=path, step_windows=step_windows)
    return report.figures, [arrival for arrivals in report.arrivals.values() for arrival in arrivals], report.span


def _clock_evidence(arrivals: list[Arrival], span: tuple[int, int]) -> Collectives:
    """A rank's collectives as its clock's evidence (engine.clock), as a merge reads them from
    its model: per process group, else per stream, their kinds and ends in start order; the
    drift reaches over the whole capture (`span`), as in a merge, so both give one uncertainty."""
    return collectives_of(((arrival.channel or f"stream {arrival.stream}", arrival.kind, arrival.end)
                           for arrival in arrivals), span)


def _rank_row(path: Path, gpu: dict[str, Any]) -> dict[str, Any]:
    steps = gpu["steps"]
    step_total = sum(step["step_ns"] for step in steps)
    return {"file": path.name, "global_rank": gpu["global_rank"], "pp_rank": gpu["pp_rank"], "gpu": gpu["gpu"],
            "steps": len(steps) if gpu["window"] == "steps" else 0,
            "step_ns": step_total / len(steps) if steps else gpu["window_ns"],
            "busy_share": gpu["busy_share"], "exposed_comm_share": gpu["exposed_comm_share"],
            "bubble_share": round(sum(step["bubble_ns"] for step in steps) / step_total, 6) if step_total else 0.0}


def render_across(report: dict[str, Any], fmt: str) -> str:
    """JSON, or text: the findings, a table of GPUs, one of pipeline stages, the stragglers,
    and the definitions."""
    if fmt == "json":
        return orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n"
    gpus = format_table(
        ["file", "rank", "gpu", "steps", "step ms", "vs median ms", "busy", "exposed comm", "bubble"],
        [[row["file"], _rank(row), row["gpu"], str(row["steps"]), f"{row['step_ns'] / 1e6:.3f}",
          f"{row['vs_median_ns'] / 1e6:+.3f}", f"{row['busy_share'] * 100:.1f}%",
          f"{row['exposed_comm_share'] * 100:.1f}%", f"{row['bubble_share'] * 100:.1f}%"] for row in report["ranks"]],
        numeric_columns=[1, 3, 4, 5, 6, 7, 8])
    stages = format_table(
        ["file", "rank", "pp rank", "step", "step ms", *(f"{label} ms" for _, label in STAGE_PARTS)],
        [[row["file"], _rank(row), str(row["pp_rank"]), row["step"], f"{row['step_ns'] / 1e6:.3f}",
          *(f"{row[key] / 1e6:.3f}" for key, _ in STAGE_PARTS)] for row in report["stages"]],
        numeric_columns=[1, 2, *range(4, 5 + len(STAGE_PARTS))])
    alignment = report["clock_alignment"]
    clocks = format_table(
        ["trace", "offset ms", "+- ms", "evidence"],
        [[row["title"], f"{row['applied_offset_ns'] / 1e6:+.3f}",
          "?" if row["uncertainty_ns"] is None else f"{row['uncertainty_ns'] / 1e6:.3f}",
          ", ".join(f"{kind} {count}" for kind, count in sorted(row["evidence"].items())) or "none"]
         for row in alignment["ranks"]], numeric_columns=[1, 2])
    stragglers = format_table(
        ["rank", "late at", "late ms/step", "of median step", "held up ms/step", "caused wait ms"],
        [[row["title"], str(row["late_collectives"]), f"{row['late_ns_per_step'] / 1e6:.3f}",
          f"{row['late_share']:.1%}", f"{row['held_up_ns_per_step'] / 1e6:.3f}", f"{row['caused_wait_ns'] / 1e6:.3f}"]
         for row in report["stragglers"]], numeric_columns=[1, 2, 3, 4, 5])
    shared = collectives_table(report["collectives"]["collectives"], TEXT_ROWS)
    moved = "moved where" if alignment["applied"] else "kept: the base times agree within what"
    sections = [(title, table) for title, table, rows in (
        ("GPUs: step time, busy, exposed communication and bubble, over each GPU's window", gpus, report["ranks"]),
        ("Pipeline stages: each PP rank's steps cut into parts that add up to the step", stages, report["stages"]),
        ("Stragglers: each rank by its own lateness into collectives, latest first", stragglers, report["stragglers"]),
        (shared.title, format_table(shared.columns, shared.rows, shared.numeric), shared.rows),
        (f"Clocks: each trace's offset ({moved} their collectives can tell) and its uncertainty", clocks,
         alignment["ranks"] if any(row["evidence"] for row in alignment["ranks"]) else []))
        if rows]
    check = report["straggler_check"]
    left_out = "" if check["could_not_tell"] else "".join(f"  left out: {why}\n" for why in check["left_out"])
    absent = report["rank_account"]["note"]
    page = (f"cgtrace report: {report['directory']}, {report['traces']} traces\n\n"
            + (f"Not every rank is here: {absent}\n\n" if absent else "") + as_text(report["findings"])
            + "".join(f"\n{title}\n{table.rstrip()}\n" for title, table in sections)
            + f"\nMedian step time {report['median_step_ns'] / 1e6:.3f} ms; stragglers: {check['summary']}\n"
            + left_out + "".join(f"  clock: {warning}\n" for warning in alignment["warnings"]) + "\nDefinitions\n"
            + "".join(f"  {term}: {meaning}\n" for term, meaning in report["definitions"].items()))
    return "\n".join(map(terminal_safe, page.split("\n")))  # names from the traces reach the terminal escaped


def _rank(row: dict[str, Any]) -> str:
    return "" if row["global_rank"] is None else str(row["global_rank"])
