"""Worker processes that never outlive their job: `jobs` processes, each forked once and reused
for task after task, behind the `concurrent.futures.Executor` interface that a Dask cluster's
executor also offers.

Reused, not one fresh process per task: each fork of the main process, and the copy-on-write
faults that follow, cost more than a small rank's task, and more the larger the main process
grows. A worker leaves alone what came with its fork (gc.freeze(), so no collection walks the
main process's objects and copies their pages), and frees what a task left before the next
(gc.collect(), then glibc's malloc_trim(0) to hand freed pages back), so it needs no recycling
after N tasks (the figures: docs/performance.md, "Local workers reused across tasks").

Not multiprocessing.Pool or ProcessPoolExecutor: a Pool's workers share a task queue's lock,
and one killed while idle (a SIGTERM sent to the whole process group) takes the lock with it,
so terminating the pool hangs; both start workers from a helper thread, which defeats
PR_SET_PDEATHSIG (that follows the thread that forked) and forks a process that runs other
threads. Here each worker has its own pipe, down which a task (function and arguments,
pickled: a function by reference) goes and its outcome comes back, and is forked from the
thread that submits or asks for a result, never from a helper thread: a future makes
progress while someone waits for it (`result()`, `exception()`, `Executor.map`), which is
how cgtrace collects results. A worker that dies fails only the task it was running, and a
fresh one takes its place. A worker ends when its pipe closes (the executor shuts down).
Leaving the executor's `with` block by an exception kills every worker still running.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Optional, cast

from ..signals import STOPPING, stopping_deferred

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# How long a stopped worker may take to remove its temporary files before it is killed.
_UNWIND_S = 10.0


class WorkerDied(Exception):
    """A worker process ended without an answer (killed: the OOM killer, most often)."""

    def __init__(self, exit_code: Optional[int]):
        super().__init__(f"exit code {exit_code}")


@dataclass(eq=False)
class _Worker:
    process: BaseProcess
    connection: Connection  # the main process's end of its pipe: tasks go down, outcomes come back


class LocalProcessExecutor(Executor):
    """fn(*args) in one of `jobs` long-lived forked processes; the tasks wait in order."""

    def __init__(self, jobs: int, scratch: Optional[Path] = None):
        """`scratch`: the folder each worker keeps its temporary files in (its TMPDIR), for the
        caller to remove once the workers are gone; None: the system's."""
        self.jobs = max(1, jobs)
        self._scratch = scratch
        self._context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() \
            else multiprocessing.get_context("spawn")
        self._queued: deque[tuple[_LocalFuture, Callable[..., Any], tuple]] = deque()
        self._idle: list[_Worker] = []
        self._busy: dict[Connection, tuple[_LocalFuture, _Worker]] = {}
        # Every worker alive, whatever it does: one a stop caught between idle and busy included.
        self._workers: set[_Worker] = set()
        self._lock = threading.RLock()  # futures may be awaited from several threads
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        if kwargs:
            raise TypeError("LocalProcessExecutor.submit takes positional arguments only")
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to an executor that was shut down")
            future = _LocalFuture(self)
            self._queued.append((future, fn, args))
            self._start_queued()
            return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """wait: finish every task submitted; else (or with cancel_futures) drop the queued
        ones and kill the running ones. Either way every worker is gone on return."""
        with self._lock:
            self._closed = True
            finished = False
            try:
                while wait and not cancel_futures and (self._queued or self._busy):
                    self._step()
                finished = wait and not cancel_futures
            finally:
                self._end(stop=not finished)

    def __exit__(self, exc_type: Any, *exc_info: Any) -> None:
        self.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)

    def _end(self, stop: bool) -> None:
        """Cancel what did not run to its end and end every worker: an idle one when its pipe
        closes; when the tasks did not all finish (`stop`), each by SIGTERM, which unwinds it so its temporary
        files go (_serve), killed after `_UNWIND_S`."""
        for future, _, _ in self._queued:
            future.cancel()
        for future, _ in self._busy.values():
            future.cancel()
        for worker in self._workers:
            if stop:
                worker.process.terminate()
            else:
                worker.connection.close()
        deadline = time.monotonic() + _UNWIND_S
        for worker in self._workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.connection.close()
        self._queued.clear()
        self._busy.clear()
        self._idle.clear()
        self._workers.clear()

    def _drive(self, future: "_LocalFuture") -> None:
        """Run the workers until `future` is done: collect outcomes, hand out queued tasks."""
        with self._lock:
            while not future.done():
                self._step()

    def _start_queued(self) -> None:
        while self._queued and len(self._busy) < self.jobs:
            future, fn, args = self._queued.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                task = pickle.dumps((fn, args), pickle.HIGHEST_PROTOCOL)
            except Exception as unpicklable:  # as a Dask cluster would refuse it
                future.set_exception(unpicklable)
                continue
            try:
                worker = self._hand(task)
            except WorkerDied as died:
                future.set_exception(died)
                continue
            self._busy[worker.connection] = (future, worker)

    def _hand(self, task: bytes) -> _Worker:
        """An idle worker, else a fresh one, that has taken `task`. One killed while idle is
        found here (its pipe is broken) and replaced."""
        while True:
            fresh = not self._idle
            if fresh:
                self._fork()
            worker = self._idle.pop()
            try:
                worker.connection.send_bytes(task)
                return worker
            except OSError:
                self._reap(worker)
                if fresh:
                    raise WorkerDied(worker.process.exitcode) from None

    def _fork(self) -> None:
        """A new idle worker. It closes its copies of the main process's ends of the pipes (its
        own and the other workers'), so that each pipe has one process at either end and a
        worker sees its own close."""
        mine, theirs = self._context.Pipe()
        others = [mine, *(worker.connection for worker in self._workers)]
        process: BaseProcess = self._context.Process(
            target=_serve, args=(os.getpid(), theirs, others if self._context.get_start_method() == "fork" else [],
                                 self._scratch))
        # Ctrl-C and SIGTERM wait until the worker is on record to be killed, and never land
        # in a fork hook (logging's runs Python code after every fork), where the exception
        # that stops the run would be printed and lost.
        with stopping_deferred():
            try:
                process.start()
                worker = _Worker(process, mine)
                self._workers.add(worker)
                self._idle.append(worker)
            finally:
                theirs.close()

    def _step(self) -> None:
        """Wait for at least one busy worker to answer (or die), settle its future, refill."""
        self._start_queued()
        for ready in wait(list(self._busy)):
            connection = cast(Connection, ready)  # wait() returns what it was given
            future, worker = self._busy.pop(connection)
            outcome = _receive(connection)
            if outcome is None:
                self._reap(worker)
                future.set_exception(WorkerDied(worker.process.exitcode))
                continue
            self._idle.append(worker)
            if outcome[0]:
                future.set_result(outcome[1])
            else:
                future.set_exception(outcome[1])
        self._start_queued()

    def _reap(self, worker: _Worker) -> None:
        worker.connection.close()
        worker.process.join()
        self._workers.discard(worker)


class _LocalFuture(Future):
    """A Future that runs its executor's workers while it is waited for (so a timeout given to
    result() or exception() counts only once the task is done: cgtrace never gives one)."""

    def __init__(self, executor: LocalProcessExecutor):
        super().__init__()
        self._executor = executor

    def result(self, timeout: Optional[float] = None) -> Any:
        self._executor._drive(self)
        return super().result(timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        self._executor._drive(self)
        return super().exception(timeout)


def _receive(connection: Connection) -> Any:
    try:
        return connection.recv()
    except (EOFError, ConnectionResetError):  # the worker died
        return None


class _Stopped(BaseException):
    """SIGTERM in a worker, raised where it runs, so every `with` on the way out removes what it
    made (a temporary trace, an output's temporary file) before the worker ends."""


def _stop(number: int, frame: Optional[FrameType]) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Stopped()


def _stop_again(unraisable: Any) -> None:
    """A stop raised inside a C callback (trace_processor's wasmtime calls back into Python)
    cannot unwind through C: it is asked for again a moment later, until it is raised where
    Python code runs (an alarm, as a signal sent now would be raised in this very callback)."""
    if isinstance(unraisable.exc_value, _Stopped):
        signal.signal(signal.SIGALRM, _stop)
        signal.setitimer(signal.ITIMER_REAL, 0.01)
    else:
        sys.__unraisablehook__(unraisable)


def _serve(parent: int, connection: Connection, main_ends: list[Connection], scratch: Optional[Path]) -> None:
    """A worker: runs the tasks that come down its pipe until the pipe closes. Stopping is the
    main process's business. Ctrl-C reaches the whole process group, so a worker ignores it;
    SIGTERM (from the main process, or sent to the group) unwinds it and ends it with no
    traceback; and on Linux the kernel kills it should the main process die without a chance
    to (SIGKILL, the OOM killer)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop)
    sys.unraisablehook = _stop_again
    if scratch is not None:
        tempfile.tempdir = str(scratch)
    for end in main_ends:
        end.close()
    gc.freeze()  # what came with the fork is the main process's: no collection walks (and copies) it
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)  # blocked by the fork (_fork)
        libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # it died before prctl took effect
            os._exit(1)
        while True:
            try:
                task = connection.recv_bytes()
            except EOFError:  # the executor is done with it
                return
            try:
                _answer(connection, _run(task))
            except BrokenPipeError:  # the executor has stopped listening
                return
            del task
            _release_memory(libc)
    except _Stopped:
        os._exit(128 + signal.SIGTERM)


def _run(task: bytes) -> tuple[bool, Any]:
    try:
        function, args = pickle.loads(task)
        return True, function(*args)
    except Exception as error:  # raised again in the main process
        return False, error


def _answer(connection: Connection, outcome: tuple[bool, Any]) -> None:
    try:
        connection.send(outcome)
    except (pickle.PicklingError, TypeError, ValueError, AttributeError) as unpicklable:
        # An error holding a C pointer (wasmtime's) does not pickle; its words still travel.
        unsent = outcome[1] if not outcome[0] else unpicklable
        connection.send((False, RuntimeError(f"{type(unsent).__name__}: {unsent}")))


def _release_memory(libc: Optional[ctypes.CDLL]) -> None:
    """What a task left goes before the next: its cycles, then the heap's free pages back to the
    kernel (glibc keeps them otherwise, and a worker's RSS would stay at its largest task's)."""
    gc.collect()
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)
