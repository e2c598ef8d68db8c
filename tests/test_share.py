"""`cgtrace share` as a colleague opens it: the folder from file:// (the report shows, the page
says how to start the one-line server), then served by exactly that line, where the trace
opens in the bundled Perfetto UI. Headless Chromium, skipping like tests/test_browser.py."""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import time
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
    assert {p.name for p in bundle.iterdir()} == {"index.html", "report.html", "OPEN.txt", "ui",
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
        assert "python3 -m http.server" in page.inner_text("#from-file")
        report = page.frame_locator("iframe").locator("body")
        assert "GPU 0" in report.inner_text(timeout=LOAD_TIMEOUT_MS)
    finally:
        page.close()


def _serve(bundle: Path) -> tuple[subprocess.Popen, int]:
    """The OPEN.txt line as written, on a free port, with this Python."""
    [line] = [line.strip() for line in (bundle / "OPEN.txt").read_text().splitlines() if "http.server" in line]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    words = [sys.executable if w == "python3" else str(port) if w == "8000" else w for w in shlex.split(line)]
    server = subprocess.Popen(words, cwd=bundle, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        with socket.socket() as client:
            if client.connect_ex(("127.0.0.1", port)) == 0:
                return server, port
        time.sleep(0.05)
    server.kill()
    pytest.fail(f"`{line}` did not start listening")


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
