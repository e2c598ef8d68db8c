"""Worker processes that never outlive their job: one fresh process per task, at most `jobs` at once.

Not multiprocessing.Pool: its workers share a task queue's lock, and one killed while idle
(a SIGTERM sent to the whole process group) takes the lock with it, so terminating the pool
hangs; and it forks replacement workers from a helper thread, which defeats
PR_SET_PDEATHSIG (that follows the thread that forked). Here each worker has its own pipe,
is forked from the main thread, and is killed on any way out of `run_in_workers`.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Sequence, cast

from ..errors import CgtraceError

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def run_in_workers(function: Callable[..., Any], tasks: Sequence[tuple], names: Sequence[str], jobs: int) -> list:
    """function(*task) for every task, each in a fresh process; results in task order. A
    worker's exception is raised here; a worker that dies (the OOM killer) is a CgtraceError
    naming its task (`names`, one per task)."""
    context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() \
        else multiprocessing.get_context("spawn")
    results: list = [None] * len(tasks)
    queued = list(reversed(range(len(tasks))))
    running: dict[Connection, tuple[int, BaseProcess]] = {}
    try:
        while queued or running:
            while queued and len(running) < jobs:
                index = queued.pop()
                receiver, sender = context.Pipe(duplex=False)
                process: BaseProcess = context.Process(target=_work, args=(os.getpid(), sender, function, tasks[index]))
                process.start()
                sender.close()
                running[receiver] = (index, process)
            for ready in wait(list(running)):
                receiver = cast(Connection, ready)  # wait() returns what it was given
                index, process = running.pop(receiver)
                with receiver:
                    outcome = _receive(receiver)
                process.join()
                if outcome is None:
                    raise CgtraceError(f"{names[index]}: its worker process died (exit code {process.exitcode}), "
                                       "perhaps out of memory; try --jobs 1 or a machine with more memory")
                succeeded, value = outcome
                if not succeeded:
                    raise value
                results[index] = value
    finally:
        for receiver, (_, process) in running.items():
            process.kill()
            process.join()
            receiver.close()
    return results


def _receive(receiver: Connection) -> Any:
    try:
        return receiver.recv()
    except EOFError:
        return None


def _work(parent: int, sender: Connection, function: Callable[..., Any], task: tuple) -> None:
    """A worker: stopping is the main process's business. Ctrl-C reaches the whole process
    group, so a worker ignores it; SIGTERM ends it at once, without the traceback the
    inherited handler (stopping.py) would raise; and on Linux the kernel kills it should the
    main process die without a chance to (SIGKILL, the OOM killer)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)
    try:
        outcome: tuple[bool, Any] = (True, function(*task))
    except Exception as error:  # raised again in the main process
        outcome = (False, error)
    with sender:
        sender.send(outcome)
