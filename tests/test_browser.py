"""A real browser opens our output in the offline Perfetto UI that `cgtrace view --offline` serves.

Headless Chromium (Debian's `chromium` package, or $CGTRACE_CHROMIUM) driven by Playwright.
Skips, saying why, only where Playwright is not installed or Chromium cannot be found or started.

Checked: a converted, a compacted and a merged trace, with lane and rank order as shown.
Other tests reuse the `load_in_ui` fixture: `names, screenshot = load_in_ui(trace_path)`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Optional

import pytest

from converter.analysis.view import TraceServer, find_web_dist
from converter.engine.placement import PIPELINE_ROOT_NAME, RANKS_ROOT_NAME
from converter.generator import write_pp_run

from converter.model import TrackRole

from .helpers import SHARED_TRACES, compact_file, convert_file, rows, track_roles, write_json
from .helpers import merge_files as merge_ranks
from .test_titles import _input_ids as input_ids

LOAD_TIMEOUT_MS = 60_000
TRACK = ".pf-track"
TRACK_TITLE = ".pf-track__title-popup"   # the full title; .pf-track__title may be ellipsized
# Per row: its full title, its height in px with its children (a group's element holds its
# children's), its parent row's title, and whether its shown title is cut (v52 cuts the middle
# out: the left half of the title overflows its box).
ROW_FACTS = """tracks => tracks.map(t => {
    const title = e => e.querySelector(':scope .pf-track__title-popup').textContent;
    const parent = t.parentElement.closest('.pf-track');
    const left = t.querySelector('.pf-middle-ellipsis-left');  // cut: its start overflows
    return [title(t), Math.round(t.getBoundingClientRect().height), parent ? title(parent) : null,
            left.scrollWidth > left.clientWidth];
})"""
# Per row: its title and how many pixels of its timeline draw data: coloured, or a grey darker
# than the grid lines (v52 draws a collapsed OS process's summary, its threads' utilisation, in
# grey); the background is transparent, the grid lines light grey.
DRAWN_PX = """tracks => {
    const canvas = [...document.querySelectorAll('canvas')].sort((a, b) => b.height - a.height)[0];
    const area = canvas.getBoundingClientRect(), pixels = canvas.getContext('2d');
    return tracks.map(t => {
        const row = t.getBoundingClientRect(), shell = t.querySelector('.pf-track__shell').getBoundingClientRect();
        const data = pixels.getImageData(shell.right - area.left, row.top - area.top,
                                         row.right - shell.right, row.height).data;
        let coloured = 0;
        for (let i = 0; i < data.length; i += 4) {
            const high = Math.max(data[i], data[i + 1], data[i + 2]), low = Math.min(data[i], data[i + 1], data[i + 2]);
            if (data[i + 3] > 0 && (high - low > 40 || high < 200)) coloured++;
        }
        return [t.querySelector('.pf-track__title-popup').textContent, coloured];
    });
}"""
# Of the row titled `title`: how many rows it shows inside, its height in px, their titles.
GROUP_ROWS = """title => {
    const row = [...document.querySelectorAll('.pf-track')].find(
        t => t.querySelector('.pf-track__title-popup').textContent === title);
    return [row.querySelectorAll('.pf-track').length, Math.round(row.getBoundingClientRect().height),
            [...row.querySelectorAll('.pf-track')].map(t => t.querySelector('.pf-track__title-popup').textContent)];
}"""
CLICK_ROW = """title => [...document.querySelectorAll('.pf-track')]
    .find(t => t.querySelector('.pf-track__title-popup').textContent === title)
    .querySelector('.pf-track__shell').click()"""
GPU_GROUP = re.compile(r"GPU \d+$")  # a GPU's group of lanes: a compacted GPU's or a merged rank's
SCREEN_HEIGHT = 1000  # the viewport's
BLANK_PX = 100  # a row drawing fewer pixels than this reads as blank
# Rows an opened GPU group may show, so a user reads them at once: 12 lanes and annotation rows,
# and the GPU's "Why idle" row (engine/waits.py) below them.
MAX_GPU_ROWS = 13
# A merged rank's row: "PP rank N (global G) · GPU 0" (or "rank N ..." with no PP group).
RANK_ROW = re.compile(r"^(?:PP )?rank (\d+) \(global \d+\) · (.*)$")


class Row(NamedTuple):
    title: str
    height: int
    parent: Optional[str]
    cut: bool


def _chromium() -> str:
    found = os.environ.get("CGTRACE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("Chromium not found: `apt-get install -y chromium`, or set CGTRACE_CHROMIUM to a "
                    "Chrome binary")
    return found


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="Playwright is not installed: pip install -e '.[test]'")
    executable = _chromium()
    with sync_api.sync_playwright() as playwright:
        try:
            # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
            instance = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        except sync_api.Error as error:
            pytest.skip(f"Chromium at {executable} does not start: {str(error).splitlines()[0]}")
        yield instance
        instance.close()


@contextlib.contextmanager
def opened(browser, trace_path: Path) -> Iterator[Any]:
    """A page of the offline UI with the trace loaded (groups as the UI leaves them)."""
    server = TraceServer(trace_path, port=0, web_dist=find_web_dist())
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    page = browser.new_page(viewport={"width": 1600, "height": SCREEN_HEIGHT})
    try:
        page.goto(server.ui_url)
        page.wait_for_selector(TRACK_TITLE, state="attached", timeout=LOAD_TIMEOUT_MS)
        page.evaluate("window.waitForPerfettoIdle()")
        yield page
    finally:
        page.close()
        server.shutdown()
        server.server_close()


@pytest.fixture
def rows_in_ui(browser, tmp_path) -> Callable[[Path], tuple[list[Row], Path]]:
    """Opens a trace in the offline UI; returns the rows shown (every group expanded, in
    display order) and the path of a screenshot of the timeline."""

    def load(trace_path: Path) -> tuple[list[Row], Path]:
        with opened(browser, trace_path) as page:
            shown = expanded_rows(page)
            screenshot = tmp_path / f"{trace_path.name}.png"
            page.screenshot(path=str(screenshot))
            return shown, screenshot

    return load


def expanded_rows(page) -> list[Row]:
    """Every group of an open page expanded: its rows, in display order."""
    page.evaluate("app.commands.runCommand('dev.perfetto.ExpandAllGroups')")
    page.evaluate("window.waitForPerfettoIdle()")
    return [Row(*facts) for facts in page.eval_on_selector_all(TRACK, ROW_FACTS)]


@pytest.fixture
def load_in_ui(rows_in_ui) -> Callable[[Path], tuple[list[str], Path]]:
    """Like rows_in_ui, with the track names only."""

    def load(trace_path: Path) -> tuple[list[str], Path]:
        rows, screenshot = rows_in_ui(trace_path)
        return [row.title for row in rows], screenshot

    return load


TRACE = {"traceEvents": [
    {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "trainer"}},
    {"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "main"}},
    {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
    {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 21, "args": {"name": "stream 21"}},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 7, "tid": 7, "ts": 0, "dur": 100},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10, "dur": 50},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather", "pid": 0, "tid": 21, "ts": 20, "dur": 60},
]}


def test_converted_trace_shows_its_tracks(load_in_ui, tmp_path):
    converted = tmp_path / "converted.perfetto-trace"
    convert_file(write_json(tmp_path / "small.json", TRACE), converted)
    names, screenshot = load_in_ui(converted)
    # Perfetto titles processes and threads "<name> <id>".
    assert any(name.startswith("trainer") for name in names), names
    assert any(name.startswith("main") for name in names), names
    assert any(name.startswith("stream 7") for name in names) and any(n.startswith("stream 21") for n in names)
    assert names.index(next(n for n in names if n.startswith("trainer"))) < \
        names.index(next(n for n in names if n.startswith("main")))   # a thread follows its process
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 10_000


def test_compacted_trace_shows_lanes_in_order(load_in_ui, tmp_path):
    compacted = tmp_path / "compacted.perfetto-trace"
    compact_file(write_json(tmp_path / "small.json", TRACE), compacted)
    names, screenshot = load_in_ui(compacted)
    lanes = [n for n in names if n in ("GPU 0", "Compute annotations", "Compute", "NCCL all-gather")]
    assert lanes == ["GPU 0", "Compute", "NCCL all-gather"], names   # the GPU's row, then its lanes
    assert screenshot.stat().st_size > 10_000


def drawn_in_collapsed_rows(browser, trace: Path, opening: Optional[str] = None) -> dict[str, int]:
    """Coloured pixels per row as the trace loads, or once the top-level group titled `opening`
    is opened, the rest left as they load: what a user sees first, or after one click."""
    with opened(browser, trace) as page:
        if opening is not None:
            page.evaluate(CLICK_ROW, opening)
            page.evaluate("window.waitForPerfettoIdle()")
        return dict(page.eval_on_selector_all(TRACK, DRAWN_PX))


def on_screen(page) -> list[tuple[str, int]]:
    """(title, drawn px) of each row whose top is inside the window."""
    tops = page.eval_on_selector_all(TRACK, "ts => ts.map(t => t.getBoundingClientRect().top)")
    drawn = page.eval_on_selector_all(TRACK, DRAWN_PX)
    return [(title, px) for (title, px), top in zip(drawn, tops) if 0 <= top < SCREEN_HEIGHT]


def rows_in_gpu_groups(browser, trace: Path) -> dict[str, list[str]]:
    """Each GPU group opened (as a user clicks it; what it folds stays folded): its rows' titles."""
    with opened(browser, trace) as page:
        return gpu_group_rows(page)


def gpu_group_rows(page) -> dict[str, list[str]]:
    """rows_in_gpu_groups on a page already open."""
    groups = [title for title, _ in page.eval_on_selector_all(TRACK, DRAWN_PX) if GPU_GROUP.search(title)]
    for title in groups:
        page.evaluate(CLICK_ROW, title)
        page.evaluate("window.waitForPerfettoIdle()")
    return {title: page.evaluate(GROUP_ROWS, title)[2] for title in groups}


def test_merged_trace_shows_ranks_in_pipeline_order(rows_in_ui, browser, tmp_path):
    files = write_pp_run(tmp_path / "run", pp_size=4, microbatches=2, steps=1, seed=2,
                         graphs_per_step=2, kernels_per_replay=4)
    merged = tmp_path / "merged.perfetto-trace"
    merge_ranks(files, lambda group, groups: merged, jobs=1)
    shown, screenshot = rows_in_ui(merged)
    names = [row.title for row in shown]
    ranks = [n for n in names if n.startswith("PP rank ") and "· GPU" in n]
    assert [int(n.split()[2]) for n in ranks] == [0, 1, 2, 3], names
    assert_merged_rows_read_well(shown, merged, files, ranks=4)
    # The first screen: the root counts the busy GPUs, and, opened as it loads, each rank's rows draw.
    drawn = drawn_in_collapsed_rows(browser, merged)  # the only top-level row: v52 opens it
    assert drawn[PIPELINE_ROOT_NAME] > 100
    gpu_rows = {title: px for title, px in drawn.items() if title in ranks}
    assert len(gpu_rows) == 4 and min(gpu_rows.values()) > 100, drawn   # each GPU's busy lanes
    first_rank_lanes = names[names.index(ranks[0]) + 1:names.index(ranks[1])]
    groups = [n for n in first_rank_lanes if n in ("Compute", "NCCL other", "Memcpy")]
    assert groups == sorted(groups, key=["Compute", "NCCL other", "Memcpy"].index) and "Compute" in groups
    assert screenshot.stat().st_size > 10_000


def test_view_opens_profiler_output_compacted_or_merged(load_in_ui, tmp_path):
    from converter.generator import GeneratorConfig, write_trace
    from converter.jobs.viewable import viewable

    raw = write_trace(GeneratorConfig(steps=1, graphs_per_step=2, kernels_per_replay=8), tmp_path / "r.json.gz")
    names, _ = load_in_ui(viewable(raw)[0])
    assert "GPU 0" in names and "Compute" in names, names
    write_pp_run(tmp_path / "ranks", pp_size=2, microbatches=2, steps=1, seed=2, graphs_per_step=2,
                 kernels_per_replay=4)
    names, _ = load_in_ui(viewable(tmp_path / "ranks")[0])
    ranks = [n for n in names if n.startswith("PP rank ") and "· GPU" in n]
    assert [int(n.split()[2]) for n in ranks] == [0, 1], names


def test_report_html_of_a_merged_pipeline_reads_whole(browser, tmp_path):
    """The report's HTML as a person sees it: every label whole (no cell, heading or legend
    narrower than its text), and a timeline row per rank with its blocks and its bubble."""
    from converter.analysis.render import render
    from converter.analysis.report import build_report

    files = write_pp_run(tmp_path / "run", pp_size=4, microbatches=4, steps=2, seed=2, graphs_per_step=2,
                         kernels_per_replay=8)
    merged = tmp_path / "merged.perfetto-trace"
    merge_ranks(files, lambda group, groups: merged, jobs=1)
    page_path = tmp_path / "report.html"
    page_path.write_text(render(build_report(merged), "html"))
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(page_path.as_uri())
        cut = page.eval_on_selector_all(
            "h1, h2, p, th, td, dt, dd, .key",
            "nodes => nodes.filter(n => n.scrollWidth > n.clientWidth + 1).map(n => n.textContent)")
        assert cut == []
        labels = page.eval_on_selector_all("tr.rank th", "cells => cells.map(c => c.innerText)")
        ranks = [re.fullmatch(r"GPU \d+, PP rank (\d+) \(global \d+\)", label) for label in labels]
        assert [int(match.group(1)) for match in ranks if match] == [0, 1, 2, 3], labels
        drawn = page.eval_on_selector_all("tr.rank svg", """strips => strips.map(s => Object.fromEntries(
            ['F', 'B', 'RECV', 'SEND', 'bubble'].map(k => [k, s.querySelectorAll(`rect[data-kind="${k}"]`).length])))""")
        assert len(drawn) == 4 and all(min(kinds.values()) > 0 for kinds in drawn), drawn
        assert page.eval_on_selector_all("script, link, img", "n => n.length") == 0
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    finally:
        page.close()
    assert (tmp_path / "report.png").stat().st_size > 10_000



# One screen: a merged rank's rows, groups expanded, fit this many px.
SCREEN_PX = 1000


def lane_names(trace: Path) -> set[str]:
    """The names cgtrace gives lanes ("Compute 2"), told apart by their track roles."""
    lanes = {role.uuid for role in track_roles(trace) if role.role is TrackRole.LANE}
    named = rows(trace, """select t.name, (select a.int_value from args a where a.arg_set_id = t.source_arg_set_id
                             and a.key = 'trace_id') uuid from track t""")
    return {r["name"] for r in named if r["uuid"] in lanes}


def assert_titles_show_input_ids(shown: list[Row], trace: Path, inputs: list[Path]) -> None:
    """No title but a lane's ends in a number the input lacks (an invented pid or tid)."""
    known, lanes = input_ids(inputs), lane_names(trace)
    endings = [(row.title, re.search(r"-?\d+$", row.title)) for row in shown if row.title not in lanes]
    invented = [title for title, end in endings if end and int(end.group()) not in known]
    assert invented == []


def assert_merged_rows_read_well(shown: list[Row], trace: Path, inputs: list[Path], ranks: int) -> None:
    """Each rank's rows together, ranks in pipeline order; no title cut; a rank fits a screen."""
    placed = [(int(match.group(1)), row) for row in shown if (match := RANK_ROW.match(row.title))
              and row.parent in (PIPELINE_ROOT_NAME, RANKS_ROOT_NAME)]
    order = [rank for rank, _ in placed]
    assert order == sorted(order) and set(order) == set(range(ranks)), [row.title for _, row in placed]
    assert [row.title for row in shown if row.cut] == []
    per_rank = Counter()
    for rank, row in placed:
        per_rank[rank] += row.height
    assert max(per_rank.values()) <= SCREEN_PX, per_rank
    assert_titles_show_input_ids(shown, trace, inputs)


def real(name: str) -> Path:
    path = SHARED_TRACES / name
    if not path.exists():
        pytest.skip("../shared/traces is absent")
    return path


def test_compacted_real_trace_shows_lanes_and_input_ids(rows_in_ui, browser, tmp_path):
    source = real("hta_cuda_graph_rank0.json.gz")
    compacted = tmp_path / "compacted.perfetto-trace"
    compact_file(source, compacted)
    shown, _ = rows_in_ui(compacted)
    gpus = [row.title for row in shown if row.parent is None and row.title.startswith("GPU ")]
    assert len(gpus) == 1, [row.title for row in shown]
    lanes = [row for row in shown if row.parent == gpus[0]]
    assert lanes and lanes[0].title == "Compute", [row.title for row in shown]
    assert_titles_show_input_ids(shown, compacted, [source])
    # On the first screen, groups collapsed, the GPU's row draws what the GPU does (its counter).
    assert drawn_in_collapsed_rows(browser, compacted)[gpus[0]] > 100


@pytest.mark.parametrize("ranks,count,gpus", [("dlrm_8ranks", 8, True), ("torch_pp_cpu/interleaved1f1b_pp2v2", 2, False),
                                              ("torch_pp_cpu/dp2_pp2", 2, False)])
def test_merged_real_ranks_read_in_pipeline_order(rows_in_ui, browser, tmp_path, ranks, count, gpus):
    copy = tmp_path / "ranks"
    shutil.copytree(real(ranks), copy)
    outputs: list[Path] = []

    def output(group: int, groups: int) -> Path:
        outputs.append(tmp_path / f"merged{group}.perfetto-trace")
        return outputs[-1]

    merge_ranks([copy], output)
    inputs = sorted(copy.glob("rank*_trace.json.gz"))
    for merged in sorted(set(outputs))[:1]:  # one pipeline of a DP x PP set: the rest are alike
        shown, screenshot = rows_in_ui(merged)
        assert_merged_rows_read_well(shown, merged, inputs, count)
        assert screenshot.stat().st_size > 10_000
        if gpus:  # first screen: the root counts busy GPUs, each rank's GPU row its lanes
            root = next(row.title for row in shown if row.parent is None and row.title in (
                PIPELINE_ROOT_NAME, RANKS_ROOT_NAME))
            drawn = drawn_in_collapsed_rows(browser, merged)  # the only top-level row: v52 opens it
            assert drawn[root] > 100
            gpu_rows = [px for title, px in drawn.items() if RANK_ROW.match(title) and " · GPU" in title]
            assert len(gpu_rows) == count and min(gpu_rows) > 100, drawn


def _merged(tmp_path: Path, ranks: Path) -> tuple[Path, list[Path]]:
    copy = tmp_path / "ranks"
    shutil.copytree(ranks, copy)
    merged = tmp_path / "merged.perfetto-trace"
    merge_ranks([copy], lambda group, groups: merged, jobs=1)
    return merged, sorted(copy.glob("rank*_trace.json*"))


def _first_screens(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The issue's four inputs as a user opens them: a merged real CPU pipeline, a merged generated
    CUDA-graph pipeline, a merged real capture, a compacted real trace."""
    yield "cpu pipeline", _merged(tmp_path / "cpu", real("torch_pp_cpu/torch215_zb_pp2v2"))[0]
    files = write_pp_run(tmp_path / "run", pp_size=4, microbatches=4, steps=2, seed=2, graphs_per_step=2,
                         kernels_per_replay=8)
    generated = tmp_path / "generated.perfetto-trace"
    merge_ranks(files, lambda group, groups: generated, jobs=1)
    yield "generated pipeline", generated
    yield "dlrm_8ranks", _merged(tmp_path / "dlrm", real("dlrm_8ranks"))[0]
    compacted = tmp_path / "compacted.perfetto-trace"
    compact_file(real("hta_cuda_graph_rank0.json.gz"), compacted)
    yield "compacted", compacted


def test_every_first_screen_row_draws_and_no_title_is_cut(browser, tmp_path):
    """On each of the four outputs: as loaded, every row on the first screen draws something (no
    blank bookkeeping, CPU or OS process row); an opened GPU group shows at most MAX_GPU_ROWS
    rows (a group's further lanes and copy-only annotation rows fold under its lanes); with
    every group expanded, no title is cut and none shows an id twice. One page per output,
    as one user would go: first screen, then each GPU opened, then everything."""
    for what, trace in _first_screens(tmp_path):
        with opened(browser, trace) as page:
            first = on_screen(page)
            groups = gpu_group_rows(page)
            shown = expanded_rows(page)
        assert first and [title for title, px in first if px < BLANK_PX] == [], (what, first)
        assert all(0 < len(titles) <= MAX_GPU_ROWS for titles in groups.values()), (what, groups)
        assert groups or what == "cpu pipeline", what
        assert [row.title for row in shown if row.cut] == [], what
        twice = [row.title for row in shown if re.search(r"(-?\d{3,})\D+\1$", row.title)]  # a tid, twice
        assert twice == [], what


@pytest.mark.parametrize("source", ["generated pipeline", "dlrm_8ranks"])
def test_ui_report_and_summary_name_each_rank_alike(rows_in_ui, tmp_path, source):
    """One name per rank everywhere: the UI's rank rows, `report`'s GPUs and the merge summary;
    "PP rank" only where a pipeline orders the ranks (the generated one), "rank" elsewhere."""
    import json

    from converter.analysis.render import render
    from converter.analysis.report import build_report

    merged = tmp_path / "merged.perfetto-trace"
    if source == "generated pipeline":
        files = write_pp_run(tmp_path / "run", pp_size=2, microbatches=2, steps=1, seed=2, graphs_per_step=2,
                             kernels_per_replay=4)
    else:
        shutil.copytree(real(source), tmp_path / "ranks")
        files = [tmp_path / "ranks"]
    summary = merge_ranks(files, lambda group, groups: merged, jobs=1)
    in_summary = sorted(rank["rank"] for rank in summary["per_rank_compaction"])
    in_report = sorted(gpu["rank"] for gpu in json.loads(render(build_report(merged), "json"))["gpus"])
    shown, _ = rows_in_ui(merged)
    in_ui = sorted(row.title.split(" · ")[0] for row in shown if RANK_ROW.match(row.title) and " · GPU" in row.title)
    assert in_ui == in_report == in_summary and in_ui
    assert all(title.startswith("PP rank ") == (source == "generated pipeline") for title in in_ui), in_ui


# The query page's result grid: every cell's text, row by row, the column names first.
RESULT_CELLS = """() => [...document.querySelectorAll('.pf-query-page__results .pf-grid-cell__content')]
    .map(cell => cell.textContent.trim())"""


def test_cgtrace_sql_pasted_into_the_query_page_gives_what_cgtrace_query_gives(browser, tmp_path):
    """`cgtrace sql`, pasted into the offline UI's query page with a question after it, runs
    there and returns the rows `cgtrace query` returns (docs/sql.md)."""
    from converter.tp.tables import printed

    files = write_pp_run(tmp_path / "ranks", pp_size=2, microbatches=2, steps=2, seed=4, graphs_per_step=2,
                         kernels_per_replay=6)
    merged = tmp_path / "merged.perfetto-trace"
    merge_ranks(files, lambda group, groups: merged)
    question = "select rank, step, dur from cgtrace_step order by global_rank, step"
    expected = [[str(row["rank"]), str(row["step"]), str(row["dur"])] for row in rows(merged, question)]
    assert len(expected) == 4 and all(row[0].startswith("PP rank ") for row in expected)
    with opened(browser, merged) as page:
        page.get_by_text("Query (SQL)").click()
        page.click(".cm-content")
        page.keyboard.insert_text(printed() + question + ";\n")
        page.keyboard.press("Control+Enter")
        page.wait_for_function(f"() => document.querySelectorAll('.pf-query-page__results .pf-grid-cell__content')"
                               f".length >= {3 * (len(expected) + 1)}", timeout=LOAD_TIMEOUT_MS)
        cells = page.evaluate(RESULT_CELLS)
        page.screenshot(path=str(tmp_path / "query_page.png"))
    assert [cells[i:i + 3] for i in range(0, len(cells), 3)] == [["rank", "step", "dur"], *expected]
