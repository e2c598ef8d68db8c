"""`cgtrace share` as a colleague opens it: the folder from file:// (the report shows, the page
says how to start the one-line server), then served by exactly that line (the bundle's own
open.py), where the trace opens in the bundled Perfetto UI. Headless Chromium, skipping like tests/test_browser.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from converter.cli import main
from converter.generator import GeneratorConfig, write_trace

from .test_browser import LOAD_TIMEOUT_MS, TRACK_TITLE, browser  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("share")
    write_trace(GeneratorConfig(seed=1, steps=2, graphs_per_step=2, kernels_per_replay=4), work / "trace.json")
    assert main(["share", str(work / "trace.json"), "-o", str(work / "bundle"), "-q"]) == 0
    return work / "bundle"


def test_the_bundle_holds_trace_report_ui_and_index(bundle, tmp_path):
    assert {p.name for p in bundle.iterdir()} == {"index.html", "report.html", "OPEN.txt", "open.py", "ui",
                                                  "trace_compacted.perfetto-trace"}
    assert (bundle / "ui" / "index.html").is_file()
    assert main(["share", str(bundle / "trace_compacted.perfetto-trace"), "-o", str(tmp_path / "b.zip"), "-q"]) == 0
    names = zipfile.ZipFile(tmp_path / "b.zip").namelist()
    assert {"b/index.html", "b/report.html", "b/ui/index.html", "b/trace_compacted.perfetto-trace"} <= set(names)
    assert main(["share", str(bundle / "trace_compacted.perfetto-trace"), "-o", str(tmp_path), "--overwrite"]) == 2


def test_from_a_file_the_report_shows_and_the_page_says_how_to_serve(browser, bundle):  # noqa: F811
    page = browser.new_page()
    try:
        page.goto((bundle / "index.html").as_uri())
        assert "python3 open.py" in page.inner_text("#from-file")
        report = page.frame_locator("iframe").locator("body")
        assert "GPU 0" in report.inner_text(timeout=LOAD_TIMEOUT_MS)
    finally:
        page.close()


def _serve(bundle: Path) -> tuple[subprocess.Popen, int]:
    """The OPEN.txt line as written, with this Python, on any free port and no browser; the
    port is the one its first line names."""
    [line] = [line.strip() for line in (bundle / "OPEN.txt").read_text().splitlines() if line.startswith("    ")]
    words = [sys.executable if w == "python3" else w for w in shlex.split(line)] + ["--port", "0", "--no-browser"]
    server = subprocess.Popen(words, cwd=bundle, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    said = server.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:(\d+)/", said)
    if not found:
        server.kill()
        pytest.fail(f"`{line}` did not say where it serves: {said!r}")
    return server, int(found.group(1))


def test_served_the_trace_opens_in_the_bundled_ui(browser, bundle):  # noqa: F811
    server, port = _serve(bundle)
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    try:
        page.goto(f"http://127.0.0.1:{port}/")
        assert page.is_hidden("#from-file")
        assert "GPU 0" in page.frame_locator("iframe").locator("body").inner_text(timeout=LOAD_TIMEOUT_MS)
        page.click("#open-trace")
        page.wait_for_selector(TRACK_TITLE, state="attached", timeout=LOAD_TIMEOUT_MS)
        page.evaluate("window.waitForPerfettoIdle()")
        titles = page.eval_on_selector_all(TRACK_TITLE, "ts => ts.map(t => t.textContent)")
        assert "GPU 0" in titles and "/ui/index.html" in page.url, titles
    finally:
        page.close()
        server.kill()
        server.wait()
