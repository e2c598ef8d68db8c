"""cgtrace view: the loopback server hands out the one trace (and, offline, the UI's files), nothing else."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from pathlib import Path

import pytest

from converter.analysis.view import PERFETTO_UI, TraceServer, find_web_dist
from converter.errors import CgtraceError

from .helpers import view_and_fetch

TRACE_BYTES = bytes(range(256)) * 64


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("served") / "my trace.perfetto-trace"
    path.write_bytes(TRACE_BYTES)
    (path.parent / "neighbour.txt").write_text("not to be served")
    return path


def start(trace: Path, web_dist: Path | None = None) -> TraceServer:
    server = TraceServer(trace, port=0, web_dist=web_dist)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def get(server: TraceServer, path: str, method: str = "GET") -> tuple[int, dict, bytes]:
    """Sends `path` exactly as written (http.client does not normalize it)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


@pytest.fixture(scope="module")
def online(trace):
    server = start(trace)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def fake_web_dist(tmp_path_factory) -> Path:
    """A UI folder with symlinks pointing out of it, as a hostile or broken install might have."""
    tmp_path = tmp_path_factory.mktemp("ui")
    web_dist = tmp_path / "web_dist"
    (web_dist / "v52.0-abc").mkdir(parents=True)
    (web_dist / "index.html").write_text("<!doctype html>ui")
    (web_dist / "v52.0-abc" / "engine.wasm").write_bytes(b"\0asm")
    (tmp_path / "secret.txt").write_text("secret")
    (web_dist / "link_out.txt").symlink_to(tmp_path / "secret.txt")
    (web_dist / "dir_out").symlink_to(tmp_path)
    return web_dist


@pytest.fixture(scope="module")
def offline(trace, fake_web_dist):
    server = start(trace, fake_web_dist)
    yield server
    server.shutdown()
    server.server_close()


def test_serves_the_trace_for_ui_perfetto_dev(online, trace):
    assert online.server_address[0] == "127.0.0.1"
    status, headers, body = get(online, "/my%20trace.perfetto-trace")
    assert (status, body) == (200, TRACE_BYTES)
    assert headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
    assert headers["Content-Length"] == str(len(TRACE_BYTES))
    status, head_headers, body = get(online, "/my%20trace.perfetto-trace", "HEAD")
    assert (status, head_headers["Content-Length"], body) == (200, str(len(TRACE_BYTES)), b"")
    assert online.ui_url == (f"{PERFETTO_UI}/#!/?url=http://127.0.0.1:{online.port}/my%20trace.perfetto-trace")


ESCAPES = ["/", "/index.html", "/../", "/..", "/%2e%2e/", "/%2e%2e/served/neighbour.txt", "/neighbour.txt",
           "/../neighbour.txt", "/..%2fneighbour.txt", "/etc/passwd", "//etc/passwd", "/%2fetc%2fpasswd",
           "/../../../../etc/passwd", "/%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd", "/.%2e/.%2e/etc/passwd",
           "/my%20trace.perfetto-trace/", "/./my%20trace.perfetto-trace", "/%ff%fe", "/a%00b",
           "/secret.txt", "/link_out.txt", "/dir_out/secret.txt", "/v52.0-abc", "/v52.0-abc/",
           "/v52.0-abc/../index.html", "/v52.0-abc/..%2findex.html", "/v52.0-abc\\..\\index.html",
           "http://127.0.0.1/etc/passwd"]


@pytest.mark.parametrize("path", ESCAPES)
def test_nothing_else_is_served_online(online, path):
    status, _, body = get(online, path)
    assert status in (400, 403, 404)
    assert TRACE_BYTES not in body and b"root:" not in body and b"not to be served" not in body


@pytest.mark.parametrize("path", [p for p in ESCAPES if p not in ("/", "/index.html")])
def test_nothing_else_is_served_offline(offline, path):
    status, _, body = get(offline, path)
    assert status in (400, 403, 404)
    assert b"secret" not in body and b"root:" not in body and b"not to be served" not in body


def test_offline_serves_the_ui_and_the_trace(offline):
    assert get(offline, "/")[::2] == (200, b"<!doctype html>ui")
    assert get(offline, "/index.html?x=1")[::2] == (200, b"<!doctype html>ui")
    status, headers, body = get(offline, "/v52.0-abc/engine.wasm")
    assert (status, headers["Content-Type"], body) == (200, "application/wasm", b"\0asm")
    assert get(offline, "/my%20trace.perfetto-trace")[::2] == (200, TRACE_BYTES)
    assert offline.ui_url == (f"http://127.0.0.1:{offline.port}/#!/?url="
                              f"http://127.0.0.1:{offline.port}/my%20trace.perfetto-trace")


def test_real_offline_ui_files(trace):
    web_dist = find_web_dist()
    server = start(trace, web_dist)
    try:
        status, headers, body = get(server, "/")
        assert (status, body) == (200, (web_dist / "index.html").read_bytes())
        build = next(web_dist.glob("v*/frontend_bundle.js"))
        status, headers, _ = get(server, f"/{build.parent.name}/frontend_bundle.js", "HEAD")
        assert (status, headers["Content-Length"]) == (200, str(build.stat().st_size))
    finally:
        server.shutdown()
        server.server_close()


def test_only_loopback_is_bound(online):
    """Bound to 127.0.0.1, not to every address: 127.0.0.2 (also this machine) is refused."""
    assert online.socket.getsockname()[0] == "127.0.0.1"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", online.port), timeout=2).close()


def test_errors(trace, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("errors")
    with pytest.raises(CgtraceError, match="no such file"):
        TraceServer(tmp_path / "missing.perfetto-trace", port=0)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(CgtraceError, match=r"cannot listen .*pass --port N"):
            TraceServer(trace, port=busy.getsockname()[1])


def test_cli_prints_the_url_and_stops_cleanly_on_ctrl_c(trace):
    """Stopped as any command is: its exit status says Ctrl-C (130), as a shell script expects."""
    url, served, status, err = view_and_fetch(trace, "my%20trace.perfetto-trace")
    port = int(url.split("url=http://127.0.0.1:")[1].split("/")[0])
    assert url == f"http://127.0.0.1:{port}/#!/?url=http://127.0.0.1:{port}/my%20trace.perfetto-trace"
    assert served == TRACE_BYTES and status == 130
    assert "Traceback" not in err and err.strip().splitlines()[-1] == f"cgtrace: stopped serving {trace}"


def test_sigterm_stops_view_with_143(trace):
    """A service manager's stop is SIGTERM: the exit status says so (it was 0, as if served out)."""
    import signal
    import subprocess
    import sys

    with subprocess.Popen([sys.executable, "-m", "converter.cli", "view", str(trace), "--port", "0", "--no-browser",
                           "--offline"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        assert "url=http://127.0.0.1:" in (process.stdout.readline() if process.stdout else "")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=10)
    assert process.returncode == 143
    assert "Traceback" not in err and err.strip().splitlines()[-1] == f"cgtrace: stopped serving {trace}"


def get_as(server: TraceServer, host: str | None, path: str = "/my%20trace.perfetto-trace") -> tuple[int, dict]:
    """A request with this Host header (None: without one), as a rebound DNS name would send."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.putrequest("GET", path, skip_host=True)
        if host is not None:
            connection.putheader("Host", host)
        connection.endheaders()
        response = connection.getresponse()
        response.read()
        return response.status, dict(response.getheaders())
    finally:
        connection.close()


@pytest.mark.parametrize("server_name", ["online", "offline"])
def test_only_requests_addressed_to_the_server_are_answered(request, server_name):
    """DNS rebinding: a page on evil.example, resolved to 127.0.0.1, sends Host: evil.example:PORT."""
    server = request.getfixturevalue(server_name)
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}"):
        assert get_as(server, host)[0] == 200
    for host in (f"evil.example:{server.port}", "evil.example", f"127.0.0.1:{server.port + 1}", "127.0.0.1",
                 f"localhost.evil.example:{server.port}", "", None):
        assert get_as(server, host)[0] == 403, host
    if server_name == "offline":
        assert get_as(server, f"evil.example:{server.port}", "/")[0] == 403


def test_cors_only_for_the_hosted_ui(online, offline):
    assert get(online, "/my%20trace.perfetto-trace")[1]["Access-Control-Allow-Origin"] == PERFETTO_UI
    for path in ("/my%20trace.perfetto-trace", "/", "/v52.0-abc/engine.wasm"):
        status, headers, _ = get(offline, path)
        assert status == 200 and "Access-Control-Allow-Origin" not in headers


def test_an_idle_connection_is_closed(trace):
    server = TraceServer(trace, port=0, idle_timeout=0.5)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        quiet = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        half = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        half.sendall(b"GET /my%20trace.perfetto-trace HTTP/1.1\r\n")  # and never the rest
        started = time.monotonic()
        assert quiet.recv(1) == b"" and half.recv(1) == b""  # closed by the server
        assert time.monotonic() - started < 5
        quiet.close()
        half.close()
    finally:
        server.shutdown()
        server.server_close()


def test_a_trickling_client_is_closed_at_the_idle_timeout(trace):
    """A byte every 0.3 s never lets a read wait 0.5 s, yet the request gets 0.5 s in all."""
    server = TraceServer(trace, port=0, idle_timeout=0.5)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        slow = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        started = time.monotonic()
        closed = False
        for byte in b"GET /my%20trace.perfetto-trace HTTP/1.1\r\nHost: x\r\n":
            try:
                slow.sendall(bytes([byte]))
            except OSError:  # the server closed the connection
                closed = True
                break
            time.sleep(0.3)
            if time.monotonic() - started > 3:
                break
        closed = closed or slow.recv(1) == b""
        assert closed and time.monotonic() - started < 3
        slow.close()
    finally:
        server.shutdown()
        server.server_close()
