"""Where a job's tasks run: local worker processes (`--jobs N`), or a Dask cluster (`--scheduler
tcp://HOST:PORT`, env CGTRACE_SCHEDULER) through `distributed.Client(...).get_executor(...)`.

Both are a `concurrent.futures.Executor`, chosen here from the options and nowhere else; the
jobs submit tasks and read their outcomes the same way on either. Scheduling, retries (Dask's
`retries=1`) and moving arguments and results are the executor's; cgtrace adds none of its own.
On a cluster every input and output path must be one that every worker sees (a shared file system).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from .. import progress
from ..errors import CgtraceError
from ..fileio.atomic import scratch_folder
from .cluster_tasks import run_task

if TYPE_CHECKING:
    # Imported only where tasks run (open_workers): concurrent.futures imports logging, whose
    # fork hooks would then run Python code in this process after every fork (an args
    # helper's too), and a SIGTERM's exception raised there is lost, so a run would not stop.
    from concurrent.futures import Executor, Future

SCHEDULER_ENV = "CGTRACE_SCHEDULER"
_CONNECT_TIMEOUT_S = 10  # Client() to a scheduler that has just answered the identity call
# The identity call: a scheduler answers in milliseconds; a listener that is none (a dashboard,
# a silent port) is told from a loaded one only by this deadline, all of which it costs.
_IDENTITY_S = 5.0
_UNWIND_S = 10.0  # how long a stopped command waits for its tasks on a cluster to remove their files
_RETRIES = 1  # a task that raises runs once more; a dead worker's task the scheduler reschedules (allowed-failures)
# How long a command waits while its Dask scheduler has no worker at all (none started yet, or
# every one gone) before it gives up in one line; docs/cluster.md#errors repeats it.
NO_WORKERS_S = 60.0
_POLL_S = 1.0  # how often a command waiting on a cluster's task asks whether any worker is left


@dataclass(frozen=True)
class Workers:
    """An executor and what the jobs need to know of it."""

    executor: "Executor"
    where: str      # for messages: "2 local processes", "Dask scheduler tcp://..."
    remote: bool    # a cluster: tasks run in long-lived worker processes, not forked from this one
    token: str = ""  # on a cluster, what names this command's tasks to the workers (cluster_tasks.py)
    scheduler: Optional[str] = None  # a cluster's scheduler address
    # on a cluster, how many workers the scheduler has now (asked while a task is awaited)
    count_workers: Optional[Callable[[], int]] = None


@dataclass
class Outcome:
    """One task's result, or the one-line error that ended it."""

    name: str
    value: Any = None
    error: Optional[str] = None
    exception: Optional[BaseException] = None


def for_cluster(path: Path, on_cluster: bool) -> Path:
    """A path as tasks must get it: on a cluster absolute, for workers run in other directories."""
    return path.absolute() if on_cluster else path


def scheduler_address(option: Optional[str]) -> Optional[str]:
    """--scheduler, else CGTRACE_SCHEDULER, else None (local processes)."""
    return option or os.environ.get(SCHEDULER_ENV) or None


@contextmanager
def open_workers(jobs: int, scheduler: Optional[str], identity_s: float = _IDENTITY_S) -> Iterator[Workers]:
    """Local processes, `jobs` at once, or the Dask cluster at `scheduler` (refused unless it
    answers an identity call within `identity_s`). Leaving by an exception kills (local) or
    cancels (Dask) every task still running."""
    if scheduler is None:
        from .workers import LocalProcessExecutor  # see the TYPE_CHECKING import above

        # The workers' temporary files and folders go in one folder of the command's, removed
        # once every worker is gone: a worker killed outright, or stopped inside its own
        # cleanup, leaves nothing behind in TMPDIR.
        with scratch_folder("cgtrace-workers-") as scratch, LocalProcessExecutor(jobs, scratch) as local:
            yield Workers(local, f"{local.jobs} local process{'es' if local.jobs > 1 else ''}", remote=False)
        return
    try:
        from distributed import Client
    except ImportError:
        raise CgtraceError(f"--scheduler {scheduler}: running on a Dask cluster needs the cluster extra; "
                           "pip install 'cgtrace[cluster]'") from None
    _check_scheduler(scheduler, identity_s)
    try:
        client = Client(scheduler, timeout=_CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as error:
        raise _unreachable(scheduler, error) from None
    with client:
        executor = client.get_executor(retries=_RETRIES, pure=False)
        token = uuid.uuid4().hex
        try:
            yield Workers(executor, f"Dask scheduler {scheduler}", remote=True, token=token,
                          scheduler=scheduler, count_workers=lambda: len(client.nthreads()))
        except BaseException:
            executor.shutdown(wait=False)  # cancels what has not started
            _stop_running(client, token)
            raise
        executor.shutdown(wait=True)


def _stop_running(client: Any, token: str) -> None:
    """Stop this command's tasks still running on the workers and wait, `_UNWIND_S` at most, for
    them to unwind, so none holds a file open that the command's cleanup is about to delete.
    Asked again until none runs: a worker may start a task before it hears of its cancelling."""
    from .cluster_tasks import stop_tasks

    deadline = time.monotonic() + _UNWIND_S
    while time.monotonic() < deadline:
        try:
            still = client.run(stop_tasks, token)
        except (OSError, TimeoutError):  # a worker or the scheduler gone: nothing more to ask
            return
        if not any(still.values()):
            return
        time.sleep(0.05)


def _check_scheduler(scheduler: str, timeout_s: float) -> None:
    """Refuse, in one line and within about `timeout_s`, a scheduler address that Client() would
    hang on or fail late for. Dask's `connect(timeout=...)` bounds only the TCP connect and its
    retries, not the handshake read after it (distributed/comm/core.py), so Client(timeout=...)
    waits for ever on a listener that accepts and never answers (an HTTP server, the dashboard's
    port, waits as long for a request line Dask never sends), and reads an HTTP reply as a frame
    count, a MemoryError. Hence an identity call of our own first, under a deadline that a
    thread's join enforces even where cancelling would not reach (a slow name lookup). Schemes
    other than tcp:// need settings cgtrace cannot pass (TLS certificates, UCX), so they are
    refused before any connecting."""
    import asyncio

    from distributed.comm import parse_address, parse_host_port

    scheme, location = parse_address(scheduler)
    if scheme != "tcp":
        raise CgtraceError(f"--scheduler {scheduler}: cgtrace reaches Dask schedulers over tcp:// only, not "
                           f"{scheme}://; give tcp://HOST:PORT or leave out --scheduler")
    try:
        parse_host_port(location)
    except ValueError as error:
        raise CgtraceError(f"--scheduler {scheduler}: not a scheduler address ({_first_line(error)}); "
                           "give tcp://HOST:PORT or leave out --scheduler") from None
    answer: list[Any] = []  # the identity reply, or the exception that ended the call
    thread = threading.Thread(target=_ask_identity, args=(scheduler, timeout_s, answer),
                              name="cgtrace-scheduler-check", daemon=True)
    thread.start()
    thread.join(timeout_s + 0.5)  # the call's own deadline ends it first; this one, whatever blocks it
    reply = answer[0] if answer else TimeoutError()
    if isinstance(reply, dict) and reply.get("type") == "Scheduler":
        return
    if isinstance(reply, (TimeoutError, asyncio.TimeoutError)):
        raise CgtraceError(f"--scheduler {scheduler}: no Dask scheduler answered within {timeout_s:g} s; "
                           "check the address (the scheduler's port, not its dashboard) or leave out --scheduler")
    if isinstance(reply, OSError):  # refused, unreachable, or closed by what answered
        raise _unreachable(scheduler, reply)
    if isinstance(reply, MemoryError):  # the length of a Dask frame read from the bytes of another protocol
        what = "its reply is in another protocol, HTTP perhaps"
    elif isinstance(reply, BaseException):
        what = _first_line(reply)
    else:
        what = f"it calls itself {reply.get('type') if isinstance(reply, dict) else type(reply).__name__}"
    raise CgtraceError(f"--scheduler {scheduler}: what answered there is no Dask scheduler ({what}); check the "
                       "address (the scheduler's port, not its dashboard or a worker's) or leave out --scheduler")


def _ask_identity(scheduler: str, timeout_s: float, answer: list[Any]) -> None:
    """In its own thread and event loop (the caller may be in one already): the scheduler's
    identity reply, or the exception, appended to `answer`."""
    import asyncio

    from distributed.comm import connect

    async def identity() -> Any:
        # connect retries a refused port until its timeout: stop before the deadline, to name it so
        comm = await connect(scheduler, timeout=0.8 * timeout_s)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()  # close() would flush first, and may wait on a peer that never reads

    try:
        answer.append(asyncio.run(asyncio.wait_for(identity(), timeout_s)))
    except BaseException as error:  # MemoryError included: an HTTP reply read as a frame count
        answer.append(error)


def _unreachable(scheduler: str, error: BaseException) -> CgtraceError:
    """One message for a connection that failed, whether in the check or in Client() after it."""
    return CgtraceError(f"--scheduler {scheduler}: cannot reach the Dask scheduler ({_first_line(error)}); "
                        "check the address and that `dask scheduler` runs there, or leave out --scheduler")


def run_tasks(workers: Workers, function: Callable[..., Any], tasks: Sequence[tuple], names: Sequence[str],
              label: str, stop_at_failure: bool = False) -> list[Outcome]:
    """function(*task) for every task (`names`: the file each is about); outcomes in task
    order, progress as they come. A failed task is its outcome's error, so the others'
    results are kept; with `stop_at_failure` the first failure is raised instead, and leaving
    `open_workers` then stops the rest. Each future is let go once its outcome is read: a Dask
    worker keeps a task's result for as long as the command holds its future, so over thousands
    of tasks the workers grew by every result they had returned."""
    submit = workers.executor.submit
    futures: list[Optional["Future"]] = [submit(run_task, workers.token, function, *task) if workers.remote
                                         else submit(function, *task) for task in tasks]
    outcomes = []
    for done, name in enumerate(names, 1):
        future, futures[done - 1] = futures[done - 1], None
        assert future is not None
        if workers.count_workers is not None:
            _await_with_workers(future, workers, done - 1, len(tasks))
        outcome = _outcome(future, name)
        del future
        if stop_at_failure and outcome.exception is not None:
            raise outcome.exception
        outcomes.append(outcome)
        progress.stage(f"{label}: {done} of {len(tasks)} done ({workers.where})")
    return outcomes


def _await_with_workers(future: "Future", workers: Workers, done: int, total: int) -> None:
    """Wait for a cluster's task while the scheduler has a worker to run it; after
    `NO_WORKERS_S` with none (none started, or every one gone), a one-line error naming the
    scheduler: Dask itself would wait for ever."""
    assert workers.count_workers is not None
    alone_since: Optional[float] = None
    while not future.done():
        try:
            future.exception(timeout=_POLL_S)
            return
        except TimeoutError:
            pass
        if workers.count_workers():
            alone_since = None
            continue
        now = time.monotonic()
        alone_since = now if alone_since is None else alone_since
        if now - alone_since >= NO_WORKERS_S:
            raise CgtraceError(f"--scheduler {workers.scheduler}: the Dask scheduler has had no worker for "
                               f"{NO_WORKERS_S:g} s ({done} of {total} tasks done); start workers "
                               f"(dask worker {workers.scheduler}) and run the command again")


def _outcome(future: Future, name: str) -> Outcome:
    """A worker's CgtraceError keeps its message (it names the file); a dead worker becomes
    one; any other exception (a bug) is kept as it is, to be raised with its traceback."""
    from .workers import WorkerDied

    error = future.exception()
    if error is None:
        return Outcome(name, value=future.result())
    if isinstance(error, CgtraceError):
        return Outcome(name, error=error.message, exception=error)
    if isinstance(error, WorkerDied) or type(error).__name__ == "KilledWorker":  # Dask's, after its retries
        died = CgtraceError(f"{name}: its worker process died ({_first_line(error)}), perhaps out of memory; "
                            "try fewer ranks at once (--jobs) or workers with more memory")
        return Outcome(name, error=died.message, exception=died)
    return Outcome(name, error=f"{name}: {type(error).__name__}: {_first_line(error)}", exception=error)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
