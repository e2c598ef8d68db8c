"""Stopping cleanly: SIGTERM unwinds like Ctrl-C.

Every output is written under a `with` that removes its temporary files on the way out
(fileio/atomic.py, a merge's scratch directory, workers.py's processes), so a clean stop
means raising in the main thread, not dying where the signal lands.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Iterator, Optional


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, raised in the main thread, carrying the finished outputs a stopped command keeps
    (a batch keeps every rank it wrote), so the last line says what is on disk."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[Path] = []


class Terminated(Interrupted):
    """SIGTERM: it takes Ctrl-C's path, so cleanup runs alike."""


def stopped_message(interrupt: KeyboardInterrupt) -> str:
    """The last line of a stopped command: nothing written, or which finished outputs remain."""
    kept = interrupt.kept if isinstance(interrupt, Interrupted) else []
    if not kept:
        return "interrupted; nothing was written"
    return (f"interrupted; the {len(kept)} outputs finished before the stop were kept (first {kept[0]}); "
            "run the same command again to write only the rest")


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The shell's convention for a death by signal: 128 + its number (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """While inside, SIGTERM raises Terminated and SIGINT KeyboardInterrupt, each only once: a
    second signal must not cut short the cleanup the first one started. Outside the main
    thread (where Python cannot set handlers) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    for number in previous:
        signal.signal(number, _raise_once)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _raise_once(number: int, frame: Optional[FrameType]) -> None:
    for each in (signal.SIGINT, signal.SIGTERM):
        signal.signal(each, signal.SIG_IGN)
    raise Terminated() if number == signal.SIGTERM else Interrupted()
