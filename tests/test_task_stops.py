"""A task on a cluster worker stops only at a progress point (jobs/cluster_tasks.py): never
inside its cleanup, so what it opened is closed however the stop is timed. Run here in
threads, as a Dask worker runs tasks."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from converter import progress
from converter.jobs.cluster_tasks import TaskStopped, run_task, stop_tasks


def _in_thread(token: str, function, *task) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = run_task(token, function, *task)
        except BaseException as error:  # noqa: B036 (the outcome is what is checked)
            outcome["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_stop_asked_during_cleanup_waits_for_the_next_progress_point(tmp_path):
    token = uuid.uuid4().hex
    events: list[str] = []
    in_cleanup, stop_asked = threading.Event(), threading.Event()

    def task() -> str:
        stream = open(tmp_path / "scratch", "wb")
        try:
            progress.report("working")
        finally:
            in_cleanup.set()
            stop_asked.wait(10)  # the stop arrives here, inside the cleanup: no progress point
            stream.close()
            events.append("closed")
        progress.report("after the cleanup")  # where it lands
        events.append("not reached")
        return "done"

    thread, outcome = _in_thread(token, task)
    in_cleanup.wait(10)
    assert stop_tasks(token) == 1
    stop_asked.set()
    thread.join(10)
    assert events == ["closed"]
    assert isinstance(outcome.get("error"), TaskStopped)
    assert stop_tasks(token) == 0  # none of the command's tasks runs any more


def test_a_long_task_stops_at_its_next_progress_point():
    token = uuid.uuid4().hex
    reports = []

    def task() -> None:
        while True:
            reports.append(len(reports))
            progress.report(f"{len(reports)}")
            time.sleep(0.001)

    thread, outcome = _in_thread(token, task)
    _wait_for(lambda: len(reports) > 3)
    assert stop_tasks(token) == 1
    thread.join(10)
    assert not thread.is_alive() and isinstance(outcome.get("error"), TaskStopped)


def test_a_stop_asked_as_a_task_ends_does_not_reach_the_threads_next_task():
    """The worker's thread runs another command's task next: the stop it was asked for, and
    never raised, is dropped when the stopped command's task ends."""
    token, other = uuid.uuid4().hex, uuid.uuid4().hex
    ending, stop_asked = threading.Event(), threading.Event()
    results = []

    def ends_without_progress() -> str:
        ending.set()
        stop_asked.wait(10)
        return "first"

    def reports() -> str:
        progress.report("next task")
        return "second"

    def worker_thread() -> None:
        results.append(run_task(token, ends_without_progress))
        results.append(run_task(other, reports))

    thread = threading.Thread(target=worker_thread)
    thread.start()
    ending.wait(10)
    assert stop_tasks(token) == 1
    stop_asked.set()
    thread.join(10)
    assert results == ["first", "second"]


def test_a_task_of_a_stopped_command_started_later_does_not_run():
    token = uuid.uuid4().hex
    assert stop_tasks(token) == 0
    ran = []
    with pytest.raises(TaskStopped):
        run_task(token, ran.append, 1)
    assert ran == []
