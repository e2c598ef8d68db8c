"""Local workers (converter/jobs/workers.py) are forked once and reused across tasks: a task's
outcome is its own (a failure, or its worker's death, fails it and no other), and what a task
left behind is freed before the next one runs."""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
import time
from pathlib import Path

import pytest

from converter.jobs.executors import open_workers, run_tasks
from converter.jobs import workers
from converter.jobs.workers import LocalProcessExecutor, WorkerDied

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers, /proc")

def _pid(index: int) -> tuple[int, int]:
    return index, os.getpid()


def _pid_or_die(index: int, dying: int, pid_file: str = "") -> tuple[int, int]:
    if index == dying:
        if pid_file:
            Path(pid_file).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would, mid-task
    return index, os.getpid()


def _fail(message: str) -> None:
    raise ValueError(message)


def _rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _leave_a_cycle(mb: int) -> float:
    """`mb` of memory reachable only through a reference cycle, which only the cycle collector
    frees; the worker's RSS with it still held."""
    gc.disable()  # so no collection the allocation itself triggers frees it before the next task
    cycle: dict[str, object] = {"buffer": b"\x01" * (mb * 2**20)}  # written, so every page is resident
    cycle["self"] = cycle
    rss = _rss_mb()
    del cycle
    return rss


def test_twenty_tasks_run_in_two_processes():
    with LocalProcessExecutor(2) as executor:
        answers = [future.result() for future in [executor.submit(_pid, index) for index in range(20)]]
    assert [index for index, _ in answers] == list(range(20))
    pids = {pid for _, pid in answers}
    assert len(pids) <= 2 and os.getpid() not in pids


def test_a_worker_killed_mid_task_fails_that_task_only(tmp_path):
    """Through run_tasks, as every job reads outcomes: the killed task's outcome names its
    worker's death; every other task is done, by the surviving worker or the replacement."""
    pid_file = tmp_path / "killed.pid"
    with open_workers(2, None) as workers:
        outcomes = run_tasks(workers, _pid_or_die, [(index, 7, str(pid_file)) for index in range(20)],
                             [f"rank{index}" for index in range(20)], "testing")
    assert [outcome.name for outcome in outcomes if outcome.error] == ["rank7"]
    assert outcomes[7].error is not None and outcomes[7].error.startswith(
        f"rank7: its worker process died (exit code {-signal.SIGKILL})")
    done = [outcome.value for outcome in outcomes if outcome.error is None]
    assert [index for index, _ in done] == [index for index in range(20) if index != 7]
    killed = int(pid_file.read_text())
    assert not Path(f"/proc/{killed}").exists()  # reaped
    # How the 19 tasks split between the workers depends on the machine's load; at most the
    # survivor and one replacement answer after the kill, and the killed one never again.
    answering = {pid for _, pid in done}
    assert len(answering - {killed}) <= 2 and os.getpid() not in answering


def test_a_failing_task_is_its_outcome_and_its_worker_goes_on():
    with LocalProcessExecutor(1) as executor:
        failing = executor.submit(_fail, "rank3 is broken")
        after = executor.submit(_pid, 1)
        error = failing.exception()
        assert isinstance(error, ValueError) and str(error) == "rank3 is broken"
        assert after.result()[0] == 1


def test_a_worker_frees_what_its_task_left():
    """A task that leaves 200 MB in a reference cycle: the next task on the same worker finds
    the worker back near where it was before."""
    with LocalProcessExecutor(1) as executor:
        # Measured after one task: its clean-up hands back the free heap the fork brought from
        # a large parent (an xdist worker late in a run: 90 MB), which would hide the buffer.
        executor.submit(_rss_mb).result()
        before = executor.submit(_rss_mb).result()
        held = executor.submit(_leave_a_cycle, 200).result()
        after = executor.submit(_rss_mb).result()
    assert held - before > 150  # the buffer was really held (the rest of the RSS moves by some MB)
    assert after - before < 20, (before, held, after)


def test_shutdown_ends_every_worker_at_once():
    """Closing its pipe ends an idle worker: shutdown does not wait for the kill deadline."""
    executor = LocalProcessExecutor(2)
    pids = {future.result()[1] for future in [executor.submit(_pid, index) for index in range(4)]}
    start = time.monotonic()
    executor.shutdown()
    assert time.monotonic() - start < workers._UNWIND_S / 2
    assert len(pids) == 2 and not any(Path(f"/proc/{pid}").exists() for pid in pids)  # ended and reaped


def test_an_unpicklable_task_fails_alone():
    with LocalProcessExecutor(1) as executor:
        unpicklable = executor.submit(_pid, lambda: None)
        fine = executor.submit(_pid, 2)
        assert isinstance(unpicklable.exception(), (pickle.PicklingError, AttributeError, TypeError))
        assert fine.result()[0] == 2
        with pytest.raises(WorkerDied):
            executor.submit(_pid_or_die, 0, 0).result()
