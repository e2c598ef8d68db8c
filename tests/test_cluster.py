"""Jobs on a real Dask cluster (distributed.LocalCluster: a scheduler and two worker processes on
this machine, loopback only): batch compaction and merge give the local path's bytes, a worker
killed mid-task costs nothing but time, and report/query across ranks match each trace's own.

The cluster tests skip when `distributed` is not installed (pip install 'cgtrace[cluster]').
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import shutil
import signal
import socket
import socketserver
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from converter.cli import main
from converter.errors import CgtraceError
from converter.fileio.atomic import AtomicFiles
from converter.generator import write_pp_run
from converter.jobs import executors, runner

from .helpers import rows
from .test_bad_input import snapshot

needs_dask = pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                                reason="distributed is not installed: pip install 'cgtrace[cluster]'")


@pytest.fixture(scope="module")
def cluster():
    """Two single-threaded worker processes and a scheduler on 127.0.0.1; no dashboard."""
    from distributed import Client, LocalCluster

    import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import the tests
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}) as local:
        with Client(local) as client:
            yield local.scheduler_address, client
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    """Eight ranks of one pipeline, as profiler output."""
    directory = tmp_path_factory.mktemp("ranks")
    write_pp_run(directory, pp_size=8, microbatches=4, steps=2, seed=5, graphs_per_step=2)
    return directory


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def copy_inputs(ranks: Path, to: Path) -> Path:
    to.mkdir()
    for path in ranks.glob("rank*_trace.json"):
        shutil.copy(path, to / path.name)
    return to


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob(".*") if p.is_file())


@needs_dask
def test_batch_compaction_and_merge_give_the_local_bytes(cluster, ranks, tmp_path, capsys, monkeypatch):
    address, _ = cluster
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir()
    remote.mkdir()
    inputs = copy_inputs(ranks, tmp_path / "inputs")
    assert cli(capsys, "compact", str(ranks), "-o", str(local), "--jobs", "2", "-q")[0] == 0
    # Relative paths: the workers run in another directory (the one the cluster started in).
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli(capsys, "compact", inputs.name, "-o", remote.name, "--scheduler", address, "-q")
    assert code == 0
    summary = json.loads(out)
    assert (summary["written"], summary["failed"], summary["workers"]) == (8, 0, f"Dask scheduler {address}")
    written = sorted(p.name for p in remote.iterdir())
    assert written == sorted(p.name for p in local.iterdir()) and len(written) == 8
    for name in written:
        assert (remote / name).read_bytes() == (local / name).read_bytes(), name
    for how, flag in (("local", ["--jobs", "2"]), ("remote", ["--scheduler", address])):
        assert cli(capsys, "merge", inputs.name, "-o", f"{how}.perfetto-trace", "-q", *flag)[0] == 0
    assert (tmp_path / "remote.perfetto-trace").read_bytes() == (tmp_path / "local.perfetto-trace").read_bytes()
    assert rows(tmp_path / "remote.perfetto-trace", "select count(*) n from flow")[0]["n"] > 0
    assert leftovers(tmp_path) == []


# -- a worker killed mid-task ---------------------------------------------------------------------
def _die_once_when_committing(marker: str) -> None:
    """In each worker: the first commit anywhere on the cluster (the marker file says which)
    kills its own worker process outright, after the output's temporary file is written."""
    commit = AtomicFiles.commit

    def dying_commit(self, check=None):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return commit(self, check)
        os.kill(os.getpid(), signal.SIGKILL)

    AtomicFiles.commit = dying_commit  # type: ignore[method-assign]
    AtomicFiles.original_commit = commit  # type: ignore[attr-defined]


def _restore_commit() -> None:
    if hasattr(AtomicFiles, "original_commit"):
        AtomicFiles.commit = AtomicFiles.original_commit  # type: ignore[method-assign]
        del AtomicFiles.original_commit


@needs_dask
def test_a_worker_killed_mid_task_is_retried_and_a_rerun_redoes_only_what_is_missing(cluster, ranks, tmp_path,
                                                                                   capsys):
    address, client = cluster
    inputs = copy_inputs(ranks, tmp_path / "inputs")
    expected = tmp_path / "expected"
    expected.mkdir()
    assert cli(capsys, "compact", str(inputs), "-o", str(expected), "--jobs", "2", "-q")[0] == 0
    marker = tmp_path / "killed-once"
    client.run(_die_once_when_committing, str(marker))
    try:
        code, out, _ = cli(capsys, "compact", str(inputs), "--scheduler", address, "-q")
    finally:
        client.run(_restore_commit)
    assert marker.exists()  # a worker did die, with its output's temporary file written
    summary = json.loads(out)
    assert (code, summary["written"], summary["failed"]) == (0, 8, 0)
    outputs = sorted(inputs.glob("*.perfetto-trace"))
    assert len(outputs) == 8 and leftovers(inputs) == []  # no partial file anywhere
    for output in outputs:
        assert output.read_bytes() == (expected / output.name).read_bytes()
    client.wait_for_workers(2, timeout=60)

    outputs[3].unlink()
    code, out, _ = cli(capsys, "compact", str(inputs), "--scheduler", address, "-q")
    summary = json.loads(out)
    assert (code, summary["written"], summary["skipped"], summary["failed"]) == (0, 1, 7, 0)
    assert [r["output"] for r in summary["ranks"] if r["status"] == "written"] == [str(outputs[3])]
    assert outputs[3].read_bytes() == (expected / outputs[3].name).read_bytes()


def _count_attempts(log: str) -> None:
    """In each worker: every job appends its input's name to `log` first."""
    prepare = runner.prepare

    def counted(input_path, *args, **keywords):
        with open(log, "a") as stream:
            stream.write(input_path.name + "\n")
        return prepare(input_path, *args, **keywords)

    runner.prepare = counted
    runner.original_prepare = prepare  # type: ignore[attr-defined]


def _restore_prepare() -> None:
    if hasattr(runner, "original_prepare"):
        runner.prepare = runner.original_prepare
        del runner.original_prepare


@needs_dask
def test_a_failing_rank_is_retried_once_then_named_and_the_others_are_kept(cluster, ranks, tmp_path, capsys):
    address, client = cluster
    inputs = copy_inputs(ranks, tmp_path / "inputs")
    (inputs / "rank5_trace.json").write_text('{"traceEvents": [')  # cut short
    log = tmp_path / "attempts.log"
    client.run(_count_attempts, str(log))
    try:
        code, out, err = cli(capsys, "compact", str(inputs), "--scheduler", address)
    finally:
        client.run(_restore_prepare)
    assert code == 2
    summary = json.loads(out)
    assert (summary["written"], summary["failed"]) == (7, 1)
    [failed] = [r for r in summary["ranks"] if r["status"] == "failed"]
    assert failed["input"] == str(inputs / "rank5_trace.json") and "rank5_trace.json" in failed["error"]
    assert log.read_text().splitlines().count("rank5_trace.json") == 2  # Dask's retries=1
    last = err.strip().splitlines()[-1]
    assert last.startswith("cgtrace: error: 1 of 8 traces failed") and "rank5_trace.json" in last
    assert "Traceback" not in err
    assert not (inputs / "rank5_trace_compacted.perfetto-trace").exists() and leftovers(inputs) == []
    assert len(list(inputs.glob("*.perfetto-trace"))) == 7


# -- a cluster over many tasks --------------------------------------------------------------------
def _rss_after_a_result(size: int) -> tuple[int, int, bytes]:
    """A task with a result of `size` random bytes: its worker's pid and resident memory as the
    result is made (the kernel's count, /proc)."""
    result = os.urandom(size)
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return os.getpid(), resident_pages * os.sysconf("SC_PAGE_SIZE"), result


@needs_dask
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_dask_workers_stay_flat_over_hundreds_of_tasks(cluster):
    """Through the jobs' own run_tasks: 400 tasks of 200 KB results each. Each worker's growth
    from its 100th task to its last, per task, stays under 25 KB; a worker that kept every
    result the command had read (their futures held to the end, as before) grew by 200 KB a
    task. Dask's own per-task logs (1,000 entries each) still fill over these tasks, a few KB
    a task, which the bound leaves room for."""
    address, _ = cluster
    size, count = 200_000, 400
    with executors.open_workers(1, address) as workers:
        outcomes = executors.run_tasks(workers, _rss_after_a_result, [(size,)] * count,
                                       [f"task {k}" for k in range(count)], "testing")
    by_worker: dict[int, list[int]] = {}
    for outcome in outcomes:
        assert outcome.error is None and len(outcome.value[2]) == size
        by_worker.setdefault(outcome.value[0], []).append(outcome.value[1])
    assert len(by_worker) == 2 and all(len(rss) > 120 for rss in by_worker.values())
    for rss in by_worker.values():
        growth_per_task = (rss[-1] - rss[99]) / (len(rss) - 100)
        assert growth_per_task < 25_000, (growth_per_task, rss[99], rss[-1])


@needs_dask
def test_a_scheduler_without_workers_is_one_line_after_the_bounded_wait(ranks, tmp_path, capsys, monkeypatch):
    """No worker at all (none started, or every one gone): after NO_WORKERS_S, one line naming
    the scheduler and what to do, exit 2, nothing written."""
    from distributed import LocalCluster

    monkeypatch.setattr(executors, "NO_WORKERS_S", 2.0)
    with LocalCluster(n_workers=0, processes=True, host="127.0.0.1", dashboard_address=None,
                      scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}) as empty:
        started = time.monotonic()
        code, out, err = cli(capsys, "compact", str(ranks), "-o", str(tmp_path), "--scheduler", empty.scheduler_address)
        waited = time.monotonic() - started
    assert (code, out) == (2, "")
    [line] = err.strip().splitlines()
    assert empty.scheduler_address in line and "no worker for 2 s" in line and "(0 of 8 tasks done)" in line
    assert f"dask worker {empty.scheduler_address}" in line
    assert 2.0 <= waited < 20.0
    assert list(tmp_path.iterdir()) == []


# -- answers across ranks -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compacted(ranks, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("compacted")
    assert main(["compact", str(ranks), "-o", str(directory), "--jobs", "2", "-q"]) == 0
    return directory


@needs_dask
def test_query_across_ranks_gives_each_traces_rows_tagged_with_file_and_rank(cluster, compacted, capsys):
    address, _ = cluster
    sql = "select name, count(*) as n from slice where name glob 'PP:*' group by name order by name"
    code, out, _ = cli(capsys, "query", str(compacted), sql, "--format", "json", "--scheduler", address)
    assert code == 0
    found = json.loads(out)
    traces = sorted(compacted.glob("*.perfetto-trace"))
    assert len(traces) == 8
    expected = []
    for path in traces:
        rank = int(path.name.removeprefix("rank").split("_")[0])
        expected += [{"file": path.name, "rank": rank, **row} for row in rows(path, sql)]
    assert found == expected and len(found) > 8
    code, out, _ = cli(capsys, "query", str(compacted), "select count(*) as n from slice", "--format", "csv",
                       "--jobs", "2")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "file,rank,n" and len(lines) == 9


@needs_dask
def test_report_across_ranks_matches_each_traces_report_and_names_stragglers(cluster, compacted, capsys):
    address, _ = cluster
    code, out, _ = cli(capsys, "report", str(compacted), "--format", "json", "--scheduler", address)
    assert code == 0
    across = json.loads(out)
    assert across["traces"] == 8 and len(across["ranks"]) == 8
    for row in across["ranks"]:
        code, single, _ = cli(capsys, "report", str(compacted / row["file"]), "--format", "json")
        [gpu] = json.loads(single)["gpus"]
        steps = gpu["steps"]
        assert (row["global_rank"], row["pp_rank"], row["gpu"], row["steps"]) == \
            (gpu["global_rank"], gpu["pp_rank"], gpu["gpu"], len(steps))
        assert row["step_ns"] == sum(s["step_ns"] for s in steps) / len(steps)
        assert (row["busy_share"], row["exposed_comm_share"]) == (gpu["busy_share"], gpu["exposed_comm_share"])
        assert row["bubble_share"] == round(sum(s["bubble_ns"] for s in steps) / sum(s["step_ns"] for s in steps), 6)
    median = statistics.median(row["step_ns"] for row in across["ranks"])
    assert across["median_step_ns"] == median
    assert {r["global_rank"] for r in across["ranks"]} == set(range(8))
    # Stragglers arrive late (tests/test_stragglers.py); the latest are findings, as many as fit.
    found = [f["where"]["global_rank"] for f in across["findings"] if f["key"] == "straggler"]
    assert found == [s["global_rank"] for s in across["stragglers"]][:len(found)]
    code, text, _ = cli(capsys, "report", str(compacted), "--jobs", "2")
    assert code == 0 and "stragglers:" in text
    listed = text.split("Stragglers: each rank by its own lateness")[1].split("\n\n")[0] if across["stragglers"] else ""
    assert all(f"rank {s['global_rank']} ({s['file']})" in listed for s in across["stragglers"])


# -- bad options ----------------------------------------------------------------------------------
def test_scheduler_without_distributed_says_what_to_install(ranks, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    code, out, err = cli(capsys, "compact", str(ranks), "-o", str(tmp_path), "--scheduler", "tcp://127.0.0.1:8786")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "pip install 'cgtrace[cluster]'" in err and "--scheduler" in err
    assert list(tmp_path.iterdir()) == []


@needs_dask
def test_an_unreachable_scheduler_is_one_line_naming_it(monkeypatch):
    """CGTRACE_SCHEDULER names the cluster where no --scheduler does (the commands' workers
    come from scheduler_address); one that does not answer is a one-line error naming it."""
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv(executors.SCHEDULER_ENV, address)
    assert executors.scheduler_address(None) == address
    with pytest.raises(CgtraceError) as raised:
        with executors.open_workers(1, executors.scheduler_address(None), identity_s=1):
            pass
    message = raised.value.message
    assert "\n" not in message and address in message and "cannot reach the Dask scheduler" in message


# -- listeners that are no Dask scheduler -----------------------------------------------------------
class Silent(socketserver.StreamRequestHandler):
    """Accepts, reads until the client goes, and never says a word."""

    def handle(self) -> None:
        self.rfile.read()


class Dashboard(http.server.BaseHTTPRequestHandler):
    """Answers HTTP, as the dashboard's port does (a Dask handshake gets its 400)."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


class AnswersHttp(socketserver.BaseRequestHandler):
    """Answers whatever comes with an HTTP error at once, as many web servers do."""

    def handle(self) -> None:
        self.request.recv(4096)
        self.request.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


@contextmanager
def listening(handler: type[socketserver.BaseRequestHandler]) -> Iterator[str]:
    """`handler` served on 127.0.0.1, for a minute at most, and its address."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads, server.timeout = True, 0.1
    stop, deadline = threading.Event(), time.monotonic() + 60

    def serve() -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            server.handle_request()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        thread.join()
        server.server_close()


@needs_dask
@pytest.mark.parametrize("handler", [Silent, Dashboard, AnswersHttp])
@pytest.mark.parametrize("command", ["compact", "merge", "report", "query"])
def test_a_listener_that_is_no_scheduler_is_refused_in_one_line_within_15_s(ranks, tmp_path, handler, command):
    """Dask's connect bounds the TCP connect but not the handshake after it, so the first two
    hung Client(); an HTTP answer, read as a frame's length, was "out of memory"."""
    output = tmp_path / ("out" if command == "compact" else "merged.perfetto-trace")
    if command == "compact":
        output.mkdir()
    rest = {"compact": ["-o", str(output)], "merge": ["-o", str(output)], "report": [],
            "query": ["select count(*) from slice"]}[command]
    before = snapshot(tmp_path), snapshot(ranks)
    with listening(handler) as address:
        started = time.monotonic()
        with subprocess.Popen([sys.executable, "-m", "converter.cli", command, str(ranks), *rest,
                               "--scheduler", address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) as run:
            out, err = run.communicate(timeout=60)
        took = time.monotonic() - started
    assert (run.returncode, out) == (2, ""), err[-1500:]
    assert took < 15
    lines = err.splitlines()
    assert len(lines) == 1 and address in lines[0] and "check the address" in lines[0], err[-1500:]
    if handler is AnswersHttp:
        assert "(its reply is in another protocol, HTTP perhaps)" in lines[0], lines[0]
    assert (snapshot(tmp_path), snapshot(ranks)) == before
    with pytest.raises(ProcessLookupError):  # nothing it started is left running
        os.killpg(run.pid, 0)


@needs_dask
def test_a_workers_address_is_refused_as_no_scheduler(cluster):
    _, client = cluster
    worker = next(iter(client.scheduler_info()["workers"]))
    with pytest.raises(CgtraceError) as raised:
        with executors.open_workers(1, worker, identity_s=5):
            pass
    assert worker in raised.value.message and "no Dask scheduler (it calls itself Worker)" in raised.value.message


@needs_dask
@pytest.mark.parametrize("address", ["tls://127.0.0.1:8786", "ucx://127.0.0.1:8786", "tcp://127.0.0.1:port"])
def test_a_scheduler_address_cgtrace_cannot_use_is_refused_at_once(ranks, tmp_path, capsys, address):
    started = time.monotonic()
    code, out, err = cli(capsys, "compact", str(ranks), "-o", str(tmp_path), "--scheduler", address)
    assert (code, out) == (2, "") and time.monotonic() - started < 2
    assert err.count("\n") == 1 and address in err and "give tcp://HOST:PORT" in err
    assert list(tmp_path.iterdir()) == []


def test_local_batch_reports_a_failing_rank_and_keeps_the_others(ranks, tmp_path, capsys):
    inputs = copy_inputs(ranks, tmp_path / "inputs")
    (inputs / "rank2_trace.json").write_text('{"traceEvents": [')
    code, out, err = cli(capsys, "convert", str(inputs), "--jobs", "2", "-q")
    summary = json.loads(out)
    assert (code, summary["written"], summary["failed"], summary["workers"]) == (2, 7, 1, "2 local processes")
    assert err.count("\n") == 1 and "rank2_trace.json" in err and "run the same command again" in err
    assert sorted(p.name for p in inputs.glob("*.perfetto-trace")) == \
        sorted(f"rank{k}_trace.perfetto-trace" for k in range(8) if k != 2)
    assert leftovers(inputs) == []


@pytest.mark.parametrize("argv, problem", [
    (["compact", "{ranks}", "-o", "{file}"], "-o names a directory"),
    (["compact", "{ranks}", "--split-steps"], "--split-steps works on one trace"),
    (["report", "{ranks}", "--format", "html"], "--format html is for one trace"),
    (["query", "{empty}", "select 1"], "holds no traces"),
])
def test_bad_directory_options_are_one_line(ranks, tmp_path, capsys, argv, problem):
    (tmp_path / "file").write_text("")
    (tmp_path / "empty").mkdir()
    places = {"ranks": str(ranks), "file": str(tmp_path / "file"), "empty": str(tmp_path / "empty")}
    before = sorted(p.name for p in ranks.iterdir())
    code, out, err = cli(capsys, *(arg.format(**places) for arg in argv))
    assert (code, out) == (2, "") and err.count("\n") == 1 and problem in err
    assert sorted(p.name for p in ranks.iterdir()) == before


def test_a_local_worker_killed_mid_task_fails_its_rank_and_a_rerun_redoes_it(ranks, tmp_path, capsys):
    """Locally a dead worker (the OOM killer, say) is not retried: its rank is named as failed."""
    inputs = copy_inputs(ranks, tmp_path / "inputs")
    _die_once_when_committing(str(tmp_path / "killed-once"))  # forked workers inherit it
    try:
        code, out, err = cli(capsys, "compact", str(inputs), "--jobs", "2", "-q")
    finally:
        _restore_commit()
    summary = json.loads(out)
    assert (code, summary["written"], summary["failed"]) == (2, 7, 1)
    [failed] = [r for r in summary["ranks"] if r["status"] == "failed"]
    assert "its worker process died (exit code -9)" in failed["error"] and failed["input"] in failed["error"]
    assert "its worker process died" in err and err.count("\n") == 1
    assert leftovers(inputs) == [] and not Path(failed["output"]).exists()
    code, out, _ = cli(capsys, "compact", str(inputs), "--jobs", "2", "-q")
    summary = json.loads(out)
    assert (code, summary["written"], summary["skipped"]) == (0, 1, 7) and Path(failed["output"]).exists()


def test_answers_across_ranks_read_each_ranks_output_not_a_merge(tmp_path):
    from converter.jobs.across import traces_in

    for name in ("rank0_trace.json", "rank1_trace.json", "rank0_trace_compacted.perfetto-trace",
                 "rank1_trace_compacted.perfetto-trace", "pp_traces_merged.perfetto-trace",
                 "pp_group1_merged.perfetto-trace", ".rank2_trace_compacted.perfetto-trace.abcdefgh.tmp"):
        (tmp_path / name).write_text("")
    assert [p.name for p in traces_in(tmp_path)] == ["rank0_trace_compacted.perfetto-trace",
                                                     "rank1_trace_compacted.perfetto-trace"]
    for path in tmp_path.glob("*.perfetto-trace"):
        path.unlink()
    assert [p.name for p in traces_in(tmp_path)] == ["rank0_trace.json", "rank1_trace.json"]


# -- a merge on Dask that fails or is stopped leaves nothing open in the workers --------------------
def _deleted_files_held(pids: dict) -> dict[str, list[str]]:
    """Per worker, the deleted files its process holds open (/proc/PID/fd): each keeps its disk
    space taken while the worker lives, long after the command."""
    held = {}
    for worker, pid in pids.items():
        held[worker] = []
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:  # closed while listed
                continue
            if target.endswith(" (deleted)"):
                held[worker].append(target)
    return held


def _file_size_soft_limit(limit: int) -> int:
    """In each worker: writes past `limit` bytes fail (EFBIG), as on a full disk; the hard
    limit is kept, so the test can lift it again."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return os.getpid()


@needs_dask
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("limit_kb, failing", [(20, "args"), (250, "part of the merge")])
def test_a_merge_on_dask_that_fills_the_disk_leaves_no_file_open_in_the_workers(cluster, tmp_path, limit_kb,
                                                                                 failing):
    from .test_hardening import _with_file_size_limit

    address, client = cluster
    ranks = tmp_path / "ranks"
    write_pp_run(ranks, 4, events_per_rank=3_000)
    pids = client.run(os.getpid)
    before = _deleted_files_held(pids)  # the cluster's own (Dask's), from where it started
    (tmp_path / "out").mkdir()
    client.run(_file_size_soft_limit, limit_kb << 10)
    try:
        run = _with_file_size_limit(tmp_path, ["merge", ranks, "-o", "out/m.perfetto-trace", "--scheduler", address],
                                    limit_kb << 10)
    finally:
        client.run(_file_size_soft_limit, -1)  # RLIM_INFINITY
    assert "Traceback" not in run.stderr and run.returncode == 2, run.stderr[-1500:]
    lines = [line for line in run.stderr.splitlines() if line.startswith("cgtrace")]
    assert len(lines) == 1 and failing in lines[0], run.stderr[-1500:]
    assert list((tmp_path / "out").iterdir()) == [] and list((tmp_path / "tmp").iterdir()) == []
    assert _deleted_files_held(pids) == before


@needs_dask
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("phase", ["pass one", "pass two", "writing"])
def test_sigterm_to_a_merge_on_dask_leaves_no_scratch_no_open_file_no_process(cluster, tmp_path, phase):
    """Dask cannot stop a task it cancels: the command asks the workers to stop its tasks and
    waits for them to remove their files."""
    from .test_signals import _scratch, merge_pass_two, stop_in_phase, writing

    address, client = cluster
    ranks = tmp_path / "inputs" / "ranks"
    write_pp_run(ranks, 4, events_per_rank=40_000)
    pids = client.run(os.getpid)
    before = _deleted_files_held(pids)  # the cluster's own (Dask's), from where it started
    args = ["merge", "in/ranks", "-o", "out/m.perfetto-trace", "--scheduler", address]
    phases = {"pass one": lambda pid, out: any(p.is_file() for folder in _scratch(out) for p in folder.iterdir())
              and not merge_pass_two(pid, out),  # a rank kept, others still read
              "pass two": merge_pass_two, "writing": writing}
    (tmp_path / "run").mkdir()
    run = stop_in_phase(tmp_path / "run", ranks.parent, args, phases[phase], signal.SIGTERM)
    stderr = run.stderr.read()
    assert run.returncode == 143, stderr
    assert stderr.splitlines() == ["cgtrace: interrupted; nothing was written"]
    assert run.leftovers == []  # no scratch folder, no temporary output (TMPDIR is there too)
    assert _deleted_files_held(pids) == before
    client.wait_for_workers(2, timeout=60)
