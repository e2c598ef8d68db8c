"""`cgtrace diff`'s output: the diff as JSON, or findings and tables as text or one HTML page;
two directories' diff as JSON, or as text: the largest changes over all ranks, then each rank's.

The pages are render.py's (its tables, text layout and HTML skeleton), so a diff reads like a
report; only diff.py decides what is compared and what counts as a change.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Callable

import orjson

from .render import Table, html_page, ms, short_name, text_page

_COMPARED = ["A ms", "B ms", "delta ms", "change"]


def render_diff(diff: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return orjson.dumps(diff, option=orjson.OPT_INDENT_2).decode() + "\n"
    if fmt == "html":
        lead = [f"<h2>Findings</h2><ul>{''.join(f'<li>{html.escape(line)}</li>' for line in _findings(diff))}</ul>",
                "<p class=note>Bars: each delta against the largest in its table; blue up, orange down.</p>"]
        return html_page(f"cgtrace diff: {' -> '.join(_told_apart(diff['a']['trace'], diff['b']['trace']))}",
                         _sides(diff), lead, _tables(diff, lambda name: name), diff["definitions"])
    findings = "\nFindings\n" + "".join(f"  - {line}\n" for line in _findings(diff))
    return text_page(f"cgtrace diff: {_sides(diff)}", findings, _tables(diff, short_name), diff["definitions"])


def render_rank_diffs(diff: dict[str, Any], fmt: str) -> str:
    """Two directories' diff (diff.diff_ranks'), as JSON or text."""
    if fmt == "json":
        return orjson.dumps(diff, option=orjson.OPT_INDENT_2).decode() + "\n"
    lines = [f"cgtrace diff, rank by rank: A: {diff['a']['directory']}; B: {diff['b']['directory']}", "",
             "Largest changes"]
    lines += [f"  - {change['rank']}: {change['text']}" for change in diff["largest_changes"]] or [
        "  - none beyond any rank's noise floor"]
    for side in ("a", "b"):
        lines += [f"Only in {side.upper()}: rank {alone['global_rank']} ({alone['trace']})"
                  for alone in diff[f"only_in_{side}"]]
    for pair in diff["pairs"]:
        lines += ["", f"=== {pair['rank']} ===", render_diff(pair["diff"], "text").rstrip("\n")]
    return "\n".join(lines) + "\n"


def _told_apart(a: str, b: str) -> tuple[str, str]:
    """A's and B's traces by their names, with as many of their folders as tell them apart
    (two runs' merges share one name: runA/pp_traces_merged... -> runB/pp_traces_merged...)."""
    parts_a, parts_b = Path(a).parts, Path(b).parts
    for depth in range(1, max(len(parts_a), len(parts_b)) + 1):
        short_a, short_b = Path(*parts_a[-depth:]), Path(*parts_b[-depth:])
        if short_a != short_b:
            return str(short_a), str(short_b)
    return a, b  # one trace against itself


def _sides(diff: dict[str, Any]) -> str:
    return "; ".join(f"{side.upper()}: {diff[side]['trace']} (lanes from {diff[side]['lanes_from']})"
                     for side in ("a", "b"))


def _findings(diff: dict[str, Any]) -> list[str]:
    """Warnings first (A and B not alike), each change on a line of its own, then what did not
    change on one line."""
    changed = [f"Warning: {warning}" for warning in diff.get("warnings", [])]
    changed += [finding["text"] for finding in diff["findings"] if not finding["unchanged"]]
    same = [finding["subject"] for finding in diff["findings"] if finding["unchanged"]]
    return changed + ([f"Unchanged: {', '.join(same)}"] if same else []) or [
        "Nothing to compare: neither trace has GPU slices or pipeline stages"]


def _compared(row: dict[str, Any]) -> list[str]:
    a, b, change = row["a_ns"], row["b_ns"], row["change_pct"]
    shown = "-" if not (a or b) else "new" if change is None else f"{change:+.1f}%"
    return [ms(a), ms(b), f"{row['delta_ns'] / 1e6:+.3f}", shown]


def _table(title: str, columns: list[str], rows: list[dict[str, Any]],
           cells: Callable[[dict[str, Any]], list[str]]) -> Table:
    """A section: `cells` label each row, the compared figures follow, with a bar by the delta
    (the section's largest fills it; a decrease in the other colour)."""
    largest = max((abs(row["delta_ns"]) for row in rows), default=0) or 1
    labels = len(columns)
    return Table(title, columns + _COMPARED, [cells(row) + _compared(row) for row in rows],
                 list(range(labels, labels + len(_COMPARED))),
                 (labels + 2, [row["delta_ns"] / largest for row in rows]))


def _tables(diff: dict[str, Any], kernel_name: Callable[[str], str]) -> list[Table]:
    return [
        _table("GPUs: mean per step", ["gpu", "figure"], diff["gpus"],
               lambda row: [_pair(row["gpu"], row["b_gpu"]), row["figure"]]),
        _table("Lane groups: busy per step", ["gpu", "lane group", "kind"], diff["lane_groups"],
               lambda row: [_pair(row["gpu"], row["b_gpu"]), row["group"], row["kind"]]),
        _table("Pipeline stages: each part per step", ["rank", "part"], diff["stages"],
               lambda row: [row["rank"], row["part"].replace("_", " ")]),
        _table("Steps, matched by order", ["gpu", "step (A / B)", "figure"], diff["steps"],
               lambda row: [_pair(row["gpu"], row["b_gpu"]), f"{row['a_step']} / {row['b_step']}", row["figure"]]),
        _table("Kernels: largest changes in time per step", ["kernel"], diff["kernels"],
               lambda row: [kernel_name(row["name"])]),
        _table("Kernels by launching op: largest changes in time per step", ["gpu (A / B)", "op", "kernels A / B"],
               diff["kernels_by_op"],
               lambda row: [_pair(row["gpu"], row["b_gpu"]), kernel_name(row["op"]),
                            f"{row['a_kernels']} / {row['b_kernels']}"]),
        _unmatched(diff, kernel_name),
    ]


def _pair(a: str, b: str) -> str:
    return a if a == b else f"{a} / {b}"


_UNLINKED = (("no_launch", "kernels with no launch arrow"), ("no_op", "kernels launched outside every op"))


def _unmatched(diff: dict[str, Any], kernel_name: Callable[[str], str]) -> Table:
    """Kernel time per step the op match could not place: ops on one side only, and kernels
    with no launch arrow or no op around their launch."""
    rows = []
    for apart in diff["unmatched"]:
        gpu = _pair(apart["gpu"], apart["b_gpu"])
        for side in ("a", "b"):
            rows += [[gpu, side.upper(), kernel_name(what), str(figures["kernels"]), ms(figures["ns"])]
                     for what, figures in [(f"op only in {side.upper()}: {row['op']}", row)
                                           for row in apart[f"{side}_only_ops"]]
                     + [(label, apart[f"{side}_{reason}"]) for reason, label in _UNLINKED
                        if apart[f"{side}_{reason}"]["kernels"]]]
    return Table("Kernels not matched by op: time per step", ["gpu (A / B)", "side", "what", "kernels", "ms"],
                 rows, [3, 4])
