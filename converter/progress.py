"""Progress on stderr for long runs: shown only on a terminal, after the first second, and
never with --quiet, so logs and pipes stay clean and stdout carries only the summary.

The points where work says how far it is are also where a task asked to stop from another
thread stops (jobs/cluster_tasks.py): they lie in ordinary code, never inside a cleanup, so
whatever the task has open is closed on its way out. An exception raised into a thread
from outside lands anywhere, in a `finally` or a finalizer too, and left files open.
"""

from __future__ import annotations

import sys
import threading
import time

from .terminal import terminal_safe

_DELAY_S = 1.0
# Thread id -> the exception that thread raises at its next progress point.
_stops: dict[int, type[BaseException]] = {}


class Progress:
    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.started = time.monotonic()
        self.shown = False
        self.last_draw = 0.0

    def update(self, message: str, new_stage: bool = False) -> None:
        """Draws `message`; counts within a stage at most ten times a second, while a new stage
        always shows (the last one, such as --verify's reload, may run for seconds)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.started < _DELAY_S or (now - self.last_draw < 0.1 and not new_stage):
            return
        self.last_draw = now
        self.shown = True
        sys.stderr.write(f"\r\x1b[2Kcgtrace: {terminal_safe(message)}")
        sys.stderr.flush()

    def done(self) -> None:
        """Clears the progress line, so whatever is written next starts a line of its own."""
        if self.shown:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
            self.shown = False


_current = Progress(enabled=False)


def start(enabled: bool) -> None:
    global _current
    _current = Progress(enabled)


def report(message: str) -> None:
    """How far the current stage is (drawn at most ten times a second)."""
    _stop_if_asked()
    _current.update(message)


def stage(message: str) -> None:
    """A new stage begins (always drawn, once past the first second)."""
    _stop_if_asked()
    _current.update(message, new_stage=True)


def ask_to_stop(thread: int, error: type[BaseException]) -> None:
    """`thread` raises `error` at its next progress point."""
    _stops[thread] = error


def forget_stop(thread: int) -> None:
    """A stop asked of `thread` and not yet raised is dropped (its task ended first)."""
    _stops.pop(thread, None)


def _stop_if_asked() -> None:
    if _stops:
        error = _stops.pop(threading.get_ident(), None)
        if error is not None:
            raise error()


def finish() -> None:
    """Ends the progress line: call before writing anything else to stderr."""
    _current.done()
