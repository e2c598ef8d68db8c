"""`cgtrace report`'s output: the figures as JSON, text tables, or one HTML page with a
pipeline timeline drawn in SVG.

Text and HTML show the same tables (`Table`), so both say the same thing; only the figures
(report.py) decide what a number means. `cgtrace diff` (diff_render.py) builds its pages from
the same tables and page skeletons (`text_page`, `html_page`).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import orjson

from ..model.derived import IDLE_CAUSES, PATH_KINDS
from ..model.intervals import Intervals
from ..terminal import terminal_safe
from .collectives import HTML_ROWS, NUMERIC_COLUMNS, TEXT_ROWS, collective_lines
from .findings import as_text, waited_for
from .idle import part_key
from .pipeline_anatomy import STAGE_PARTS
from .query import format_table
from .report import Report, Timeline, gpu_label


def render(report: Report, fmt: str) -> str:
    if fmt == "json":
        return orjson.dumps(report.figures, option=orjson.OPT_INDENT_2).decode() + "\n"
    return render_html(report) if fmt == "html" else render_text(report.figures)


def ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def pct(share: float) -> str:
    return f"{share * 100:.1f}%"


@dataclass
class Table:
    """One section as display text, shared by text and HTML; HTML draws `bar` (a column of
    shares -1..1, a negative one in another colour) as bars beside the numbers and lets `wrap`
    (a label column) wrap."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    numeric: list[int]
    bar: Optional[tuple[int, list[float]]] = None
    wrap: int = 0
    stacked: Optional[tuple[int, list[list[float]]]] = None  # a column of parts' shares (STAGE_PARTS), as one bar


def _stages_table(figures: dict) -> Table:
    """A pipeline's stage parts per rank and step (no rows where the trace is no pipeline)."""
    stages = figures.get("pipeline", {}).get("stages", [])
    return Table(
        "Pipeline stages: each step cut into parts that add up to it",
        ["rank", "step", "step ms"] + [f"{label} ms" for _, label in STAGE_PARTS] + ["waited most for"],
        [[row["rank"], row["step"], ms(row["step_ns"])] + [ms(row[key]) for key, _ in STAGE_PARTS]
         + [_waited_for(row["recv_waits"])] for row in stages],
        list(range(2, 3 + len(STAGE_PARTS))), wrap=3 + len(STAGE_PARTS),
        stacked=(2, [[row[key] / row["step_ns"] if row["step_ns"] else 0.0 for key, _ in STAGE_PARTS] for row in stages]))


def _path_tables(figures: dict) -> list[Table]:
    """The critical path (a merge's, or a compacted trace's) per step: its length and time per
    kind; then per step and rank, where it ran and the work it spent most in; none where the
    trace has no path."""
    steps = figures.get("critical_path", [])
    kinds = [f"{kind} ms" for kind in PATH_KINDS]
    return [Table("Critical path (derived): what set each step's time",
                  ["step", "length ms"] + kinds,
                  [[str(step["step"]), ms(step["length_ns"])] + [ms(step["kinds_ns"][kind]) for kind in PATH_KINDS]
                   for step in steps], list(range(1, 2 + len(PATH_KINDS)))),
            Table("Critical path per rank: its time there, and the work it spent most in",
                  ["step", "rank", "on path ms"] + kinds + ["most time in"],
                  [[str(step["step"]), _path_rank(rank), ms(rank["on_path_ns"])]
                   + [ms(rank["kinds_ns"][kind]) for kind in PATH_KINDS]
                   + [f"{rank['most']['kind']}: {rank['most']['name']}: {ms(rank['most']['ns'])} ms"]
                   for step in steps for rank in step["ranks"]],
                  list(range(2, 3 + len(PATH_KINDS))), wrap=3 + len(PATH_KINDS))]


def _path_rank(rank: dict) -> str:
    """The rank a path ran on as the report names it; a compacted trace that names no rank is itself."""
    return "this trace" if rank["global_rank"] is None else f"rank {rank['pp_rank']} (global {rank['global_rank']})"


def _tables(figures: dict, kernel_name: Callable[[str], str], collectives_shown: int) -> list[Table]:
    gpus = figures["gpus"]
    tables = [_stages_table(figures), *_path_tables(figures), Table(
        "GPUs: busy (any lane) and exposed communication, over the window",
        ["gpu", "window", "window ms", "busy ms", "busy", "exposed comm ms", "exposed comm"],
        [[gpu_label(g), f"{len(g['steps'])} steps" if g["window"] == "steps" else g["window"], ms(g["window_ns"]), ms(g["busy_ns"]), pct(g["busy_share"]),
          ms(g["exposed_comm_ns"]), pct(g["exposed_comm_share"])] for g in gpus],
        [2, 3, 4, 5, 6], (4, [g["busy_share"] for g in gpus]))]
    lanes = [(g, lane) for g in gpus for lane in g["lane_groups"]]
    tables.append(Table(
        "Lane groups: busy, share of the window",
        ["gpu", "lane group", "kind", "busy ms", "share", "slices"],
        [[gpu_label(g), lane["group"], lane["kind"], ms(lane["busy_ns"]), pct(lane["share"]), str(lane["slices"])]
         for g, lane in lanes], [3, 4, 5], (4, [lane["share"] for _, lane in lanes])))
    steps = [(g, step) for g in gpus for step in g["steps"]]
    pp = any("recv_ns" in step for _, step in steps)
    pp_columns = ["RECV ms", "RECV with compute ms", "SEND ms", "SEND with compute ms"] if pp else []
    tables.append(Table(
        "Steps: compute busy and bubble" + (", and time in RECV and SEND blocks" if pp else ""),
        ["gpu", "step", "step ms", "compute busy ms", "bubble ms", "bubble"] + pp_columns,
        [[gpu_label(g), step["step"], ms(step["step_ns"]), ms(step["compute_busy_ns"]), ms(step["bubble_ns"]),
          pct(step["bubble_share"])]
         + [ms(step[key]) if key in step else "-" for key in
            (("recv_ns", "recv_compute_ns", "send_ns", "send_compute_ns") if pp else ())] for g, step in steps],
        list(range(2, 6 + len(pp_columns))), (5, [step["bubble_share"] for _, step in steps])))
    tables += _memory_tables(figures)
    tables.append(collectives_table(figures.get("collectives", {}).get("collectives", []), collectives_shown))
    clocks = figures.get("clocks", [])
    tables.append(Table(
        "Clocks: how the merge moved each rank's times onto one clock",
        ["rank", "moved by us", "known to within us", "evidence"],
        [[c["rank"], f"{c['offset_ns'] / 1e3:.1f}",
          "-" if c["uncertainty_ns"] is None else f"{c['uncertainty_ns'] / 1e3:.1f}",
          ", ".join(f"{kind} {count}" for kind, count in sorted(c["evidence"].items())) or "none"] for c in clocks],
        [1, 2]))
    kernels = figures["top_kernels"]
    longest = max((k["total_ns"] for k in kernels), default=0) or 1
    tables.append(Table(
        "Top kernels by total time in the window",
        ["kernel", "count", "total ms", "mean us"],
        [[kernel_name(k["name"]), str(k["count"]), ms(k["total_ns"]), f"{k['mean_ns'] / 1e3:.3f}"] for k in kernels],
        [1, 2, 3], (2, [k["total_ns"] / longest for k in kernels])))
    tables.append(_by_op_table(gpus, kernel_name))
    tables.append(_idle_table(gpus))
    tables.append(_launch_table(gpus))
    return tables


def _launch_table(gpus: list[dict]) -> Table:
    """Each GPU's launches per step (launches.py)."""
    def us(ns: Optional[float]) -> str:
        return "-" if ns is None else f"{ns / 1e3:.1f}"

    def share(value: Optional[float]) -> str:
        return "-" if value is None else pct(value)

    return Table("Launches: delay from launch to kernel start, CPU time per launch, short kernels",
                 ["gpu", "step", "kernels", "delay p50 us", "delay p90 us", "delay max us", "CPU per launch us",
                  "short kernels", "short share", "short time share", "deepest queue (stream)"],
                 [[gpu_label(g), s["step"], str(s["kernels"]), us(s["launch_delay_p50_ns"]),
                   us(s["launch_delay_p90_ns"]), us(s["launch_delay_max_ns"]), us(s["cpu_per_launch_ns"]),
                   str(s["short_kernels"]), share(s["short_kernel_share"]), share(s["short_kernel_time_share"]),
                   _deepest(s["queue_depth"])]
                  for g in gpus for s in g["launches"]], list(range(2, 10)))


def _deepest(streams: list[dict]) -> str:
    deepest = max(streams, key=lambda stream: stream["max_depth"], default=None)
    return "-" if deepest is None else f"{deepest['max_depth']} ({deepest['stream']})"


def _idle_table(gpus: list[dict]) -> Table:
    """Each GPU's idle time per step, by cause (idle.py); its parts add up to the idle time."""
    keys = [part_key(part) for part in IDLE_CAUSES]
    rows = [[gpu_label(g), step["step"], ms(step["idle_ns"])] + [ms(step[key]) for key in keys]
            for g in gpus for step in g["idle_by_cause"]]
    return Table("Idle by cause: each step's idle time (no GPU slice runs), in parts that add up to it",
                 ["gpu", "step", "idle ms"] + [f"{part} ms" for part in IDLE_CAUSES], rows,
                 list(range(2, 3 + len(keys))))


def _by_op_table(gpus: list[dict], kernel_name: Callable[[str], str]) -> Table:
    """Each GPU's time by the op, annotation and module that launched it, and what no op can be told for."""
    rows: list[list[str]] = []
    for g in gpus:
        found = g["gpu_time_by_op"]
        if "could_not_tell" in found:
            rows.append([gpu_label(g), "-", found["could_not_tell"], "-", "-"])
            continue
        named = [(by, row[by], row) for by, key in (("op", "ops"), ("annotation", "annotations"), ("module", "modules"))
                 for row in found[key]]
        named += [("no op", "launched outside every op", found["no_op"])] if found["no_op"]["gpu_slices"] else []
        named += [("unattributed", row["reason"], row) for row in found["unattributed"]]
        rows += [[gpu_label(g), by, kernel_name(name), str(row["gpu_slices"]), ms(row["total_ns"])]
                 for by, name, row in named]
    return Table("GPU time by what launched it: op, annotation, module; unattributed by reason",
                 ["gpu", "by", "name", "gpu slices", "total ms"], rows, [3, 4], wrap=2)


def _memory_tables(figures: dict) -> list[Table]:
    """Each device's peak memory per step, and memcpy traffic per direction and step; no rows
    where the trace holds no [memory] events or copies."""
    peaks, copies = figures.get("memory", []), figures.get("memcpy", [])
    return [Table("Memory: peak allocated and reserved per device and step (derived counters)",
                  ["rank", "step", "device", "peak allocated MiB", "peak reserved MiB"],
                  [[row["rank"] or "this trace", row["step"], row["device"], _mib(row["peak_allocated_bytes"]),
                    _mib(row["peak_reserved_bytes"])] for row in peaks], [3, 4]),
            Table("Memcpy traffic per direction and step",
                  ["rank", "step", "direction", "copies", "MiB", "copy ms", "GB/s"],
                  [[row["rank"] or "this trace", row["step"] or "outside steps", row["direction"], str(row["copies"]),
                    _mib(row["bytes"]), ms(row["copy_ns"]),
                    "-" if row["bandwidth_gb_s"] is None else f"{row['bandwidth_gb_s']:.2f}"] for row in copies],
                  [3, 4, 5, 6])]


def collectives_table(rows: list[dict], limit: int) -> Table:
    """The `limit` worst collectives (analysis/collectives.py); every one is in the JSON."""
    columns, lines = collective_lines(rows, limit)
    shown = f"the {len(lines)} worst of {len(rows)}" if len(rows) > limit else f"all {len(rows)}"
    return Table(f"Collectives across ranks (derived): {shown}, most total wait first", columns, lines,
                 NUMERIC_COLUMNS, wrap=8)


def _mib(size: Optional[int]) -> str:
    return "-" if size is None else f"{size / 2 ** 20:.1f}"


_NO_GPU = "No GPU slices found: a CPU-only pipeline, whose stages compute in their CPU ops."
# The parts of a pipeline stage's step, in the order tables and bars show them.


def _waited_for(waits: list[dict]) -> str:
    """A step's longest receive wait, as what it was for and how long."""
    return f"{waited_for(waits[0])}: {ms(waits[0]['wait_ns'])} ms" if waits else "-"


def short_name(name: str, limit: int = 100) -> str:
    """Templated kernel names run to hundreds of characters; text shows the head (JSON and HTML keep all)."""
    return name if len(name) <= limit else name[:limit - 1] + "…"


def render_text(figures: dict) -> str:
    source = figures["input"]
    no_gpu = "" if figures["gpus"] else f"\n{_NO_GPU if 'pipeline' in figures else 'No GPU slices found.'}\n"
    return text_page(f"cgtrace report: {source['trace']} (lanes from {source['lanes_from']})",
                     "\n" + as_text(figures["findings"]) + no_gpu, _tables(figures, short_name, TEXT_ROWS),
                     figures["definitions"])


def text_page(header: str, lead: str, tables: list[Table], definitions: dict[str, str]) -> str:
    """A text answer as report and diff print it: a header line, `lead` (text of its own lines),
    the tables that have rows, and the definitions as a legend. What comes from the trace (a
    file or kernel name in the header, a finding) reaches the terminal escaped."""
    parts = [terminal_safe(header) + "\n", "\n".join(map(terminal_safe, lead.split("\n")))]
    parts += [f"\n{table.title}\n" + format_table(table.columns, table.rows, table.numeric)
              for table in tables if table.rows]
    parts.append("\nDefinitions\n" + "".join(f"  {term}: {text}\n" for term, text in definitions.items()))
    return "".join(parts)


# PP block kinds and the bubble as the timeline colours them.
_COLORS = (("F", "#4a7bd0"), ("B", "#3c9d5d"), ("I", "#8fcf9a"), ("W", "#2a6b3d"), ("F+B", "#7a5cc4"),
           ("other", "#9a9a9a"), ("RECV", "#e0892b"), ("SEND", "#f2c94c"), ("bubble", "#d64545"))
# The stage parts as the stacked bars colour them, in STAGE_PARTS order.
# The critical path's band under each rank's strip, a colour per segment kind (engine/work_graph.KINDS).
_PATH_COLORS = tuple(zip(PATH_KINDS, ("#111111", "#6a1b9a", "#00a0a0", "#b0b0b0")))
_PATH_BAND = (38, 9)
_PART_COLORS = ("#4a7bd0", "#b7c7e6", "#d9b3e6", "#e0892b", "#d64545", "#bbbbbb")
_CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:90em}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}th,td{padding:2px 10px;border-bottom:1px solid #ddd;text-align:left;
vertical-align:top}.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}th.n{white-space:normal}
.wrap{overflow-wrap:anywhere;min-width:10em;max-width:40em}svg{vertical-align:middle}
.rest{fill:#e8e8e8}.bar{fill:#4a7bd0}.less{fill:#e0892b}.step{stroke:#555;stroke-width:1}.note{color:#555}
dl{max-width:60em}dt{font-weight:600}dd{margin:0 0 .5em 1.5em}.key{display:inline-block;margin-right:1.2em}
.findings li{margin:.2em 0}
""" + "".join(f'[data-kind="{kind}"]{{fill:{color}}}' for kind, color in _COLORS) \
    + "".join(f'[data-part="{key}"]{{fill:{color}}}' for (key, _), color in zip(STAGE_PARTS, _PART_COLORS)) \
    + "".join(f'[data-path="{kind}"]{{fill:{color}}}' for kind, color in _PATH_COLORS)
_TIMELINE_WIDTH = 900
# Bands of one rank's strip: (y, height, what it shows).
_BANDS = ((2, 12, ("F", "B", "I", "W", "F+B", "other")), (16, 8, ("RECV", "SEND")), (26, 8, ("bubble",)))
_STRIP_HEIGHT = 36


def _bar(share: float, width: int = 120) -> str:
    filled = min(1.0, abs(share)) * width
    return (f'<svg width="{width}" height="10" aria-hidden="true"><rect class="rest" width="{width}" height="10"/>'
            f'<rect class="bar{" less" if share < 0 else ""}" width="{filled:.1f}" height="10"/></svg>')


def _stacked(shares: list[float], width: int = 160) -> str:
    """Parts of a whole (shares adding up to 1) as one bar, coloured by part."""
    x, rects = 0.0, []
    for (key, label), share in zip(STAGE_PARTS, shares):
        rects.append(f'<rect data-part="{key}" x="{x:.1f}" width="{share * width:.1f}" height="10">'
                     f'<title>{label} {share:.1%}</title></rect>')
        x += share * width
    return f'<svg width="{width}" height="10" aria-hidden="true">{"".join(rects)}</svg>'


def _parts_key() -> str:
    return "<p>" + "".join(f'<span class="key"><svg width="12" height="12"><rect data-part="{key}" width="12" '
                           f'height="12"/></svg> {html.escape(label)}</span>' for key, label in STAGE_PARTS) + "</p>"


def html_table(table: Table) -> str:
    bar_column, shares = table.bar or (-1, [])
    stacked_column, parts = table.stacked or (-1, [])
    head = "".join(f"<th{' class=n' if i in table.numeric else ''}>{html.escape(c)}</th>"
                   for i, c in enumerate(table.columns))
    rows = []
    for r, row in enumerate(table.rows):
        cells = []
        for i, value in enumerate(row):
            css = " class=n" if i in table.numeric else " class=wrap" if i == table.wrap else ""
            bar = " " + _bar(shares[r]) if i == bar_column else " " + _stacked(parts[r]) if i == stacked_column else ""
            cells.append(f"<td{css}>{html.escape(value)}{bar}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    key = _parts_key() if table.stacked else ""
    return f"<h2>{html.escape(table.title)}</h2>{key}<table><tr>{head}</tr>{''.join(rows)}</table>"


def _runs(intervals: Intervals, origin: int, scale: float) -> list[tuple[float, float]]:
    """Intervals as x ranges, those less than half a pixel apart joined, so the SVG's size
    follows its width, not the trace's size."""
    runs: list[tuple[float, float]] = []
    for start, end in intervals:
        x0, x1 = (start - origin) * scale, (end - origin) * scale
        if runs and x0 - runs[-1][1] < 0.5:
            runs[-1] = (runs[-1][0], max(runs[-1][1], x1))
        else:
            runs.append((x0, x1))
    return runs


def _strip(timeline: Timeline, origin: int, scale: float, path: list[dict]) -> str:
    """One rank's strip; under it, where `path` (critical path segments) has any, their band."""
    full = _STRIP_HEIGHT + (sum(_PATH_BAND) - _STRIP_HEIGHT + 1 if path else 0)
    shapes = [f'<rect class="rest" width="{_TIMELINE_WIDTH}" height="{_STRIP_HEIGHT}" fill-opacity=".35"/>']
    y, band = _PATH_BAND
    for kind, _ in _PATH_COLORS:
        intervals = [(s["start_ns"], s["end_ns"]) for s in path if s["kind"] == kind]
        shapes += [f'<rect data-path="{kind}" x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 0.5):.2f}" height="{band}"/>'
                   for x0, x1 in _runs(intervals, origin, scale)]
    for y, height, kinds in _BANDS:
        for kind in kinds:
            intervals = timeline.bubbles if kind == "bubble" else timeline.blocks.get(kind, [])
            shapes += [f'<rect data-kind="{kind}" x="{x0:.1f}" y="{y}" width="{x1 - x0:.2f}" height="{height}"/>'
                       for x0, x1 in _runs(intervals, origin, scale)]
    shapes += [f'<line class="step" x1="{(start - origin) * scale:.1f}" x2="{(start - origin) * scale:.1f}" '
               f'y1="0" y2="{full}"/>' for _, start, _ in timeline.steps]
    return f'<svg class="strip" width="{_TIMELINE_WIDTH}" height="{full}">{"".join(shapes)}</svg>'


def _timeline(timelines: list[Timeline], critical_path: list[dict]) -> str:
    """Per rank, one strip over the steps: PP blocks by kind, RECV and SEND, and the bubble; and
    where the trace holds a critical path, its segments on that rank in a band below. Without PP
    blocks (a CPU-only pipeline, data-parallel ranks) the strips hold the steps and the path alone."""
    on_rank: dict[Optional[int], list[dict]] = {}  # None: a compacted trace that names no rank
    for step in critical_path:
        for segment in step["segments"]:
            on_rank.setdefault(segment["pp_rank"], []).append(segment)
    origin = min(start for t in timelines for _, start, _ in t.steps)
    end = max(stop for t in timelines for _, _, stop in t.steps)
    scale = _TIMELINE_WIDTH / max(end - origin, 1)
    blocks = any(t.blocks or t.bubbles for t in timelines)
    key = "".join(f'<span class="key"><svg width="12" height="12"><rect data-kind="{kind}" width="12" '
                  f'height="12"/></svg> {html.escape(kind)}</span>' for kind, _ in _COLORS) if blocks else ""
    if critical_path:
        key += ("<br>" if key else "") + "critical path: " + "".join(
            f'<span class="key"><svg width="12" height="12"><rect data-path="{kind}" width="12" height="12"/></svg> '
            f'{kind}</span>' for kind, _ in _PATH_COLORS)
    rows = "".join(f'<tr class="rank"><th class="wrap">{html.escape(t.label)}</th>'
                   f'<td>{_strip(t, origin, scale, on_rank.get(t.pp_rank, []))}</td></tr>'
                   for t in timelines)
    path_note = (" Below each rank, the step's critical path where it ran on that rank: the chain of compute, "
                 "launches, transfers and waits (across ranks, in a merge) that set the step time.") if critical_path else ""
    what = ("PP blocks by kind (top band), RECV and SEND blocks (middle), the bubble (bottom: no compute lane "
            "busy)." if blocks else "the steps, from the first rank's start (no GPU draws PP blocks here).")
    return (f"<h2>{'Pipeline timeline' if blocks else 'Timeline'}: {ms(end - origin)} ms, steps marked by lines</h2>"
            f"<p class=note>Each rank: {what}{path_note}</p><p>{key}</p><table class=timeline>{rows}</table>")


def _rank_timelines(figures: dict) -> list[Timeline]:
    """Where no GPU draws PP blocks (a CPU-only pipeline, data-parallel ranks), a strip per rank:
    every pipeline stage with its own steps marked, and any other rank the critical path ran on,
    the path's steps marked, for the path to be drawn under."""
    ranks: dict[int, Timeline] = {}
    for row in figures.get("pipeline", {}).get("stages", []):
        ranks.setdefault(row["pp_rank"], Timeline(row["rank"], [], {}, [], row["pp_rank"])).steps.append(
            (row["step"], row["start_ns"], row["start_ns"] + row["step_ns"]))
    path = figures.get("critical_path", [])
    for step in path:
        for rank in step["ranks"]:
            if rank["pp_rank"] not in ranks:
                ranks[rank["pp_rank"]] = Timeline(_path_rank(rank), [(str(s["step"]), s["start_ns"], s["end_ns"])
                                                                       for s in path], {}, [], rank["pp_rank"])
    return sorted(ranks.values(), key=lambda timeline: timeline.pp_rank or 0)


def render_html(report: Report) -> str:
    figures = report.figures
    source = figures["input"]
    findings = figures["findings"]
    lead = ["<h2>Findings</h2>" + ("<ul class=findings>" + "".join(f"<li>{html.escape(f['text'])}</li>"
                                                                 for f in findings) + "</ul>"
                                   if findings else "<p>Nothing stands out.</p>")]
    if not figures["gpus"]:
        lead.append(f"<p>{_NO_GPU if 'pipeline' in figures else 'No GPU slices found.'}</p>")
    timelines = report.timelines or (_rank_timelines(figures) if figures.get("critical_path") else [])
    if timelines:
        lead.append(_timeline(timelines, figures.get("critical_path", [])))
    return html_page(f"cgtrace report: {Path(source['trace']).name}",
                     f"{source['trace']}; lanes from {source['lanes_from']}", lead,
                     _tables(figures, lambda name: name, HTML_ROWS), figures["definitions"])


def html_page(title: str, note: str, lead: list[str], tables: list[Table], definitions: dict[str, str]) -> str:
    """One self-contained page (inline CSS and SVG, no scripts, no external URLs): the title, a
    note under it, `lead` (HTML blocks), the tables that have rows, and the definitions."""
    body = [f"<h1>{html.escape(title)}</h1>", f"<p class=note>{html.escape(note)}</p>", *lead]
    body += [html_table(table) for table in tables if table.rows]
    body.append("<h2>Definitions</h2><dl>" + "".join(f"<dt>{html.escape(term)}</dt><dd>{html.escape(text)}</dd>"
                                                    for term, text in definitions.items()) + "</dl>")
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")
