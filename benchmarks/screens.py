#!/usr/bin/env python3
"""What a user sees first, measured and photographed, on the four outputs of issue 39.

    python benchmarks/screens.py OUT_DIR     # needs Playwright, Chromium and ../shared/traces

Builds the outputs tests/test_browser.py checks (a merged real CPU pipeline, a merged generated
CUDA-graph pipeline, a merged real 8-rank capture, a compacted real CUDA-graph trace), opens each
in the offline UI at 1600x1000 and writes, per output, three screenshots (as loaded; the first
GPU or rank group opened; one step zoomed) and one line of measurements to OUT_DIR/measured.json:
blank rows on the first screen, rows and height of the opened group, cut titles with all groups
expanded. Run it on two checkouts to compare them (PYTHONPATH picks the code measured).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from tests.test_browser import (BLANK_PX, GROUP_ROWS, ROW_FACTS, TRACK, _first_screens, on_screen,  # noqa: E402
                                rows_in_gpu_groups, opened)

# Opens the first row whose title names a GPU (a merged rank's, or a compacted GPU's), else the
# first rank's row (a CPU-only merge).
OPEN_FIRST_GPU = """() => {
    const rows = [...document.querySelectorAll('.pf-track')];
    const titled = re => rows.find(t => re.test(t.querySelector('.pf-track__title-popup').textContent));
    const row = titled(/GPU \\d+$/) || titled(/^(PP )?rank \\d+ /);
    row.querySelector('.pf-track__shell').click();
    return row.querySelector('.pf-track__title-popup').textContent;
}"""


def measure(browser, what: str, trace: Path, out: Path) -> dict:
    stem = what.replace(" ", "_")
    facts: dict = {"output": what, "MB": round(trace.stat().st_size / 1e6, 2)}
    with opened(browser, trace) as page:
        first = on_screen(page)
        facts["first_screen_rows"] = len(first)
        facts["blank_rows"] = [title for title, px in first if px < BLANK_PX]
        page.screenshot(path=str(out / f"{stem}_1_first.png"))
        group = page.evaluate(OPEN_FIRST_GPU)
        page.evaluate("window.waitForPerfettoIdle()")
        count, height, titles = page.evaluate(GROUP_ROWS, group)
        facts["opened"] = {"group": group, "rows": count, "px": height, "titles": titles}
        page.screenshot(path=str(out / f"{stem}_2_opened.png"))
        page.mouse.move(1000, 500)
        page.keyboard.down("Control")  # Ctrl + wheel zooms around the pointer
        for _ in range(6):
            page.mouse.wheel(0, -120)
            page.wait_for_timeout(50)
        page.keyboard.up("Control")
        page.wait_for_timeout(300)
        page.evaluate("window.waitForPerfettoIdle()")
        page.screenshot(path=str(out / f"{stem}_3_zoomed.png"))
        page.evaluate("app.commands.runCommand('dev.perfetto.ExpandAllGroups')")
        page.evaluate("window.waitForPerfettoIdle()")
        rows = page.eval_on_selector_all(TRACK, ROW_FACTS)
        facts["all_rows"] = len(rows)
        facts["cut_titles"] = [title for title, _, _, cut in rows if cut]
    facts["most_rows_in_a_gpu_group"] = max(map(len, rows_in_gpu_groups(browser, trace).values()), default=0)
    return facts


def main(args: list[str]) -> int:
    from playwright.sync_api import sync_playwright

    if len(args) != 1:
        print("screens: name one output folder", file=sys.stderr)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    chromium = os.environ.get("CGTRACE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    with tempfile.TemporaryDirectory() as scratch, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        measured = []
        for what, trace in _first_screens(Path(scratch)):
            measured.append(measure(browser, what, trace, out))
            (out / "measured.json").write_text(json.dumps(measured, indent=1))
        browser.close()
    for facts in measured:
        print(json.dumps({k: v for k, v in facts.items() if k != "opened"}),
              "opened:", {k: v for k, v in facts["opened"].items() if k != "titles"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
