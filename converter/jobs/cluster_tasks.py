"""How a task runs in a Dask worker, a process that outlives the command: it must leave
nothing open behind it, neither when it fails nor when the command stops.

Dask keeps a failed task's exception, and with its traceback every frame's locals: a trace's
args store, a snapshot being written, whose files a merge's cleanup has already deleted, so
the disk stayed full for the next run. A failed task's frames are cleared here instead. And
Dask cannot stop a task it cancels (it runs in a worker thread to its end), so a stopped
command asks the workers to stop its tasks: each raises `TaskStopped` at its next progress
point (progress.py) and unwinds through its `with` blocks, which remove its temporary files,
while the command waits (executors.py).
"""

from __future__ import annotations

import gc
import threading
import traceback
from typing import Any, Callable, Optional

from .. import progress

_lock = threading.Lock()
_running: dict[str, dict[int, bool]] = {}  # command token -> {thread id: asked to stop}
# Commands that stopped: a task of theirs that a worker starts after the stop (it had not heard
# of its cancelling yet) must not run. A token each, for the worker's life.
_stopped: set[str] = set()


class TaskStopped(Exception):
    """Raised in a task's thread when its command stopped (an Exception, not a KeyboardInterrupt,
    which Dask would take as the worker's own shutdown)."""


def run_task(token: str, function: Callable[..., Any], *task: Any) -> Any:
    """function(*task) in a worker, as one of the command `token`'s tasks; cyclic GC off as the
    command line has it (cli.main): the trace model's objects are acyclic, so GC passes over
    them free nothing."""
    thread = threading.get_ident()
    with _lock:
        if token in _stopped:
            raise TaskStopped()
        _running.setdefault(token, {})[thread] = False
    enabled = gc.isenabled()
    gc.disable()
    failed = False
    try:
        return function(*task)
    except BaseException as error:
        failed = True
        _clear_frames(error)
        raise
    finally:
        with _lock:
            if _running[token].pop(thread):
                progress.forget_stop(thread)  # asked for as it ended: the thread's next task must not stop
            if not _running[token]:
                del _running[token]
        if enabled:
            gc.enable()
        if failed:  # what the cleared frames held can be in cycles (an error and its traceback's frames)
            gc.collect()


def _clear_frames(error: BaseException) -> None:
    """The locals of every frame in the error's tracebacks, and of the errors it was raised
    from or while handling (a CgtraceError's OSError), let go; the lines stay for the message."""
    seen: set[int] = set()
    link: Optional[BaseException] = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        traceback.clear_frames(link.__traceback__)  # skips the frame still running (this task's)
        link = link.__cause__ or link.__context__


def stop_tasks(token: str) -> int:
    """In a worker (Client.run): each running task of the command `token` raises TaskStopped at
    its next progress point, and any it starts later at once; how many still run."""
    with _lock:
        _stopped.add(token)
        threads = _running.get(token, {})
        for thread, asked in threads.items():
            if not asked:
                threads[thread] = True
                progress.ask_to_stop(thread, TaskStopped)
        return len(threads)
