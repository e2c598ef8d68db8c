"""Ctrl-C and SIGTERM held back across a few statements that must not be split by them.

Stopping raises in the main thread wherever it is (jobs/stopping.py), and clean-up removes
what is on record: a temporary file created but not yet recorded, or a worker forked but not
yet recorded, would outlive the run. Blocked, the signal waits until both are done.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

STOPPING = frozenset({signal.SIGINT, signal.SIGTERM})


@contextlib.contextmanager
def stopping_deferred() -> Iterator[None]:
    """Inside, Ctrl-C and SIGTERM wait; they are delivered (and raise) on the way out. Blocking
    them for this thread is not enough where the process has other threads (a Dask client's
    event loop): the kernel hands a signal to any thread that does not block it, and Python
    then runs the handler in the main thread, wherever it is. So the main thread also holds
    them at Python's level, and raises the first held one again on the way out."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
    held: list[int] = []
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {number: signal.getsignal(number) for number in STOPPING}
        for number in STOPPING:
            signal.signal(number, lambda caught, frame: held.append(caught))
    try:
        yield
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        for first in held[:1]:
            signal.raise_signal(first)
