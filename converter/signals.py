"""Ctrl-C and SIGTERM held back across a few statements that must not be split by them.

Stopping raises in the main thread wherever it is (jobs/stopping.py), and clean-up removes
what is on record: a temporary file created but not yet recorded, or a worker forked but not
yet recorded, would outlive the run. Blocked, the signal waits until both are done.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

STOPPING = frozenset({signal.SIGINT, signal.SIGTERM})


@contextlib.contextmanager
def stopping_deferred() -> Iterator[None]:
    """Inside, Ctrl-C and SIGTERM wait; they are delivered (and raise) on the way out."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
