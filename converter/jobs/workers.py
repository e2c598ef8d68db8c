"""Worker processes that never outlive their job: one fresh process per task, at most `jobs` at once,
behind the `concurrent.futures.Executor` interface that a Dask cluster's executor also offers.

Not multiprocessing.Pool or ProcessPoolExecutor: a Pool's workers share a task queue's lock,
and one killed while idle (a SIGTERM sent to the whole process group) takes the lock with it,
so terminating the pool hangs; both start workers from a helper thread, which defeats
PR_SET_PDEATHSIG (that follows the thread that forked) and forks a process that runs other
threads. Here each worker has its own pipe and is forked from the thread that submits or
asks for a result, never from a helper thread: a future makes progress while someone waits
for it (`result()`, `exception()`, `Executor.map`), which is how cgtrace collects results.
Leaving the executor's `with` block by an exception kills every worker still running.
"""

from __future__ import annotations

import ctypes
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


class LocalProcessExecutor(Executor):
    """fn(*args) in a fresh forked process per task, `jobs` at once; the rest wait in order."""

    def __init__(self, jobs: int, scratch: Optional[Path] = None):
        """`scratch`: the folder each worker keeps its temporary files in (its TMPDIR), for the
        caller to remove once the workers are gone; None: the system's."""
        self.jobs = max(1, jobs)
        self._scratch = scratch
        self._context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() \
            else multiprocessing.get_context("spawn")
        self._queued: deque[tuple[_LocalFuture, Callable[..., Any], tuple]] = deque()
        self._running: dict[Connection, tuple[_LocalFuture, BaseProcess]] = {}
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
        ones and kill the running ones."""
        with self._lock:
            self._closed = True
            if wait and not cancel_futures:
                while self._queued or self._running:
                    self._step()
                return
            for future, _, _ in self._queued:
                future.cancel()
            self._queued.clear()
            for _, process in self._running.values():
                process.terminate()  # unwinds it: its temporary files go (_work)
            deadline = time.monotonic() + _UNWIND_S
            for receiver, (future, process) in self._running.items():
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    process.kill()
                    process.join()
                receiver.close()
                future.cancel()
            self._running.clear()

    def __exit__(self, exc_type: Any, *exc_info: Any) -> None:
        self.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)

    def _drive(self, future: "_LocalFuture") -> None:
        """Run the pool until `future` is done: collect finished workers, start queued tasks."""
        with self._lock:
            while not future.done():
                self._step()

    def _start_queued(self) -> None:
        while self._queued and len(self._running) < self.jobs:
            future, fn, args = self._queued.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            receiver, sender = self._context.Pipe(duplex=False)
            process: BaseProcess = self._context.Process(target=_work,
                                                         args=(os.getpid(), sender, fn, args, self._scratch))
            # Ctrl-C and SIGTERM wait until the worker is on record to be killed, and never land
            # in a fork hook (logging's runs Python code after every fork), where the exception
            # that stops the run would be printed and lost.
            with stopping_deferred():
                try:
                    process.start()
                    self._running[receiver] = (future, process)
                finally:
                    sender.close()

    def _step(self) -> None:
        """Wait for at least one running worker to answer (or die), settle its future, refill."""
        self._start_queued()
        for ready in wait(list(self._running)):
            receiver = cast(Connection, ready)  # wait() returns what it was given
            future, process = self._running.pop(receiver)
            with receiver:
                outcome = _receive(receiver)
            process.join()
            if outcome is None:
                future.set_exception(WorkerDied(process.exitcode))
            elif outcome[0]:
                future.set_result(outcome[1])
            else:
                future.set_exception(outcome[1])
        self._start_queued()


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


def _receive(receiver: Connection) -> Any:
    try:
        return receiver.recv()
    except EOFError:
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


def _work(parent: int, sender: Connection, function: Callable[..., Any], task: tuple,
          scratch: Optional[Path]) -> None:
    """A worker: stopping is the main process's business. Ctrl-C reaches the whole process
    group, so a worker ignores it; SIGTERM (from the main process, or sent to the group)
    unwinds it and ends it with no traceback; and on Linux the kernel kills it should the main
    process die without a chance to (SIGKILL, the OOM killer)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop)
    sys.unraisablehook = _stop_again
    if scratch is not None:
        tempfile.tempdir = str(scratch)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)  # blocked by the fork (_start_queued)
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # it died before prctl took effect
            os._exit(1)
        try:
            outcome: tuple[bool, Any] = (True, function(*task))
        except Exception as error:  # raised again in the main process
            outcome = (False, error)
        with sender:
            try:
                sender.send(outcome)
            except (pickle.PicklingError, TypeError, ValueError, AttributeError) as unpicklable:
                # An error holding a C pointer (wasmtime's) does not pickle; its words still travel.
                unsent = outcome[1] if not outcome[0] else unpicklable
                sender.send((False, RuntimeError(f"{type(unsent).__name__}: {unsent}")))
    except _Stopped:
        os._exit(128 + signal.SIGTERM)
