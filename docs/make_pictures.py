#!/usr/bin/env python3
"""The README's pictures, made from generated traces so they show what cgtrace writes today.

    python docs/make_pictures.py [NAME.png ...]   # needs Playwright and Chromium (see tests/test_browser.py)

Writes docs/before.png and docs/after.png (one CUDA-graph trace converted as it is, then compacted) and
docs/pipeline.png (a merged 4-rank pipeline with its SEND -> RECV arrows), each opened in the
offline Perfetto UI that `cgtrace view --offline` serves, groups expanded (what a GPU's lanes fold
stays folded); and docs/report.png, the
top of that pipeline's HTML report (`cgtrace report --format html`). Names given: only those.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from converter.analysis.render import render_html  # noqa: E402
from converter.analysis.report import build_report  # noqa: E402
from converter.analysis.view import TraceServer, find_web_dist  # noqa: E402
from converter.generator import GeneratorConfig, write_pp_run, write_trace  # noqa: E402
from converter.jobs.merge import merge_ranks  # noqa: E402
from converter.jobs.runner import JobOptions, run_job  # noqa: E402

DOCS = REPO / "docs"
WIDTH = 1400
TRACK_TITLE = ".pf-track__title-popup"
PICTURES = ("before.png", "after.png", "pipeline.png", "report.png")
# Expanded, every GPU's lanes show what they fold (a group's further lanes, copy-only annotation
# rows) as well: fold those again, as a user sees a GPU opened.
FOLD_LANES = """() => {
    const title = t => t.querySelector('.pf-track__title-popup').textContent;
    for (const lane of [...document.querySelectorAll('.pf-track')]) {
        const parent = lane.parentElement.closest('.pf-track');
        if (parent && /GPU \\d+$/.test(title(parent)) && lane.querySelector('.pf-track'))
            lane.querySelector('.pf-track__shell').click();
    }
}"""
# A click scrolls its row into view: back to the top.
TO_TOP = "() => { for (const e of document.querySelectorAll('*')) if (e.scrollTop > 0) e.scrollTop = 0; }"


def screenshot(browser, trace: Path, picture: Path, height: int, zoom_at: float = 0.0, zoom_ms: int = 0) -> None:
    """Open `trace` in a window `height` pixels tall, expand every group, zoom in (holding W
    for `zoom_ms`) around `zoom_at` (a fraction of the timeline's width), and keep the window
    without the sidebar."""
    server = TraceServer(trace, port=0, web_dist=find_web_dist())
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    page = browser.new_page(viewport={"width": WIDTH, "height": height})
    try:
        page.goto(server.ui_url)
        page.wait_for_selector(TRACK_TITLE, state="attached", timeout=60_000)
        page.evaluate("window.waitForPerfettoIdle()")
        page.evaluate("app.commands.runCommand('dev.perfetto.ExpandAllGroups')")
        page.evaluate("window.waitForPerfettoIdle()")
        page.evaluate(FOLD_LANES)
        page.evaluate("window.waitForPerfettoIdle()")
        page.wait_for_timeout(300)
        page.evaluate(TO_TOP)
        page.evaluate("window.waitForPerfettoIdle()")
        if zoom_ms:
            timeline_left = 480  # the sidebar and the track titles
            page.mouse.move(timeline_left + zoom_at * (WIDTH - timeline_left), height // 2)
            page.keyboard.down("w")
            page.wait_for_timeout(zoom_ms)
            page.keyboard.up("w")
        page.wait_for_timeout(500)
        page.screenshot(path=str(picture), clip={"x": 200, "y": 0, "width": WIDTH - 200, "height": height})
    finally:
        page.close()
        server.shutdown()
        server.server_close()


def report_picture(browser, trace: Path, picture: Path, height: int) -> None:
    """The top of `trace`'s HTML report, as Chromium draws it in a window `height` pixels tall."""
    page_file = trace.with_suffix(".html")
    page_file.write_text(render_html(build_report(trace, shown_as=Path(trace.name))))
    page = browser.new_page(viewport={"width": 1300, "height": height})
    try:
        page.goto(page_file.as_uri())
        page.screenshot(path=str(picture))
    finally:
        page.close()


def main(names: list[str]) -> int:
    from playwright.sync_api import sync_playwright

    unknown = sorted(set(names) - set(PICTURES))
    if unknown:
        print(f"make_pictures: no picture named {', '.join(unknown)}; choose from {', '.join(PICTURES)}",
              file=sys.stderr)
        return 2
    chromium = os.environ.get("CGTRACE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("make_pictures: Chromium not found; install it or set CGTRACE_CHROMIUM", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch, sync_playwright() as playwright:
        work = Path(scratch)
        source = write_trace(GeneratorConfig(seed=7, steps=2, graphs_per_step=6, kernels_per_replay=24),
                             work / "trace.json.gz")
        run_job(source, work / "before.perfetto-trace", JobOptions())
        run_job(source, work / "after.perfetto-trace", JobOptions(compact=True))
        files = write_pp_run(work / "ranks", pp_size=4, microbatches=4, steps=1, seed=7, graphs_per_step=4,
                             kernels_per_replay=12)
        merge_ranks(files, lambda group, groups: work / "pipeline.perfetto-trace", JobOptions())
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        pictures = {
            "before.png": lambda: screenshot(browser, work / "before.perfetto-trace", DOCS / "before.png", 800),
            "after.png": lambda: screenshot(browser, work / "after.perfetto-trace", DOCS / "after.png", 800),
            "pipeline.png": lambda: screenshot(browser, work / "pipeline.perfetto-trace", DOCS / "pipeline.png", 1500,
                                               zoom_at=0.92, zoom_ms=300),
            "report.png": lambda: report_picture(browser, work / "pipeline.perfetto-trace", DOCS / "report.png", 960),
        }
        names = names or list(pictures)
        try:
            for name in names:
                pictures[name]()
        finally:
            browser.close()
    for name in names:
        print(f"{DOCS / name}: {(DOCS / name).stat().st_size // 1024} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
