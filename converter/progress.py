"""Progress on stderr for long runs: shown only on a terminal, after the first second, and
never with --quiet, so logs and pipes stay clean and stdout carries only the summary."""

from __future__ import annotations

import sys
import time

_DELAY_S = 1.0


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
        sys.stderr.write(f"\r\x1b[2Kcgtrace: {message}")
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
    _current.update(message)


def stage(message: str) -> None:
    """A new stage begins (always drawn, once past the first second)."""
    _current.update(message, new_stage=True)


def finish() -> None:
    """Ends the progress line: call before writing anything else to stderr."""
    _current.done()
