"""A time limit on every call into trace_processor (loading a trace, each query).

Some inputs send trace_processor into an endless loop (a NaN or an infinity in a JSON
counter's args does), and a command then hangs with no word. Past the limit, a watchdog
thread stops the call in flight (the WebAssembly module traps at its next epoch check; a
native shell is killed) and the call's error becomes one line saying what to do.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from typing import Callable, Iterator, Optional

from perfetto.trace_processor.api import TraceProcessor, TraceProcessorConfig

from converter.errors import CgtraceError

ENV = "CGTRACE_TP_TIMEOUT"
# Loading and checking a trace takes well under a second per MB even on a small VM: a second
# per MB of (uncompressed) trace leaves room to spare, and no trace gets less than a minute.
_SECONDS_PER_BYTE = 1e-6
_LEAST_SECONDS = 60.0
# The most $CGTRACE_TP_TIMEOUT may set: a week is no limit in practice, and a timer's wait
# overflows past about 9e9 s (threading.TIMEOUT_MAX), in every thread that would start one.
MOST_SECONDS = 7 * 24 * 3600


class TimeLimitExceeded(CgtraceError):
    """A call into trace_processor was stopped at its time limit."""


class TimeLimit:
    """How long one call into trace_processor for `trace` may take."""

    def __init__(self, trace: str, size: int):
        """`size`: the trace's uncompressed bytes; $CGTRACE_TP_TIMEOUT overrides the limit."""
        self.trace = trace
        configured = os.environ.get(ENV)
        if configured is None:
            self.seconds = max(_LEAST_SECONDS, size * _SECONDS_PER_BYTE)
            return
        try:
            self.seconds = float(configured)
        except ValueError:
            self.seconds = math.nan
        if not 0 < self.seconds <= MOST_SECONDS:
            raise CgtraceError(f"{ENV}={configured}: not a time limit; set it to a number of seconds above 0, "
                               f"at most {MOST_SECONDS} (a week)")

    @contextlib.contextmanager
    def watch(self, stop: Callable[[], None]) -> Iterator[None]:
        """Run the block; past the limit `stop()` is called from another thread to end the call
        in flight, and whatever that call then raises becomes TimeLimitExceeded."""
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            stop()

        timer = threading.Timer(self.seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            yield
        except Exception:
            if expired.is_set():
                raise TimeLimitExceeded(
                    f"{self.trace}: trace_processor ran past its time limit of {self.seconds:g} s and was stopped "
                    f"(some inputs, like a NaN in a JSON counter's args, make it loop forever); to allow longer, "
                    f"set {ENV}=SECONDS") from None
            raise
        finally:
            timer.cancel()


class LimitedTraceProcessor(TraceProcessor):
    """perfetto's TraceProcessor whose load and every query stop at `limit`; `_stop` ends
    the call in flight (here: a native trace_processor_shell is killed)."""

    def __init__(self, trace: object, limit: TimeLimit, config: Optional[TraceProcessorConfig] = None):
        self._limit = limit
        with limit.watch(self._stop):
            super().__init__(trace=trace, config=config or TraceProcessorConfig())

    def query(self, sql: str):
        with self._limit.watch(self._stop):
            return super().query(sql)

    def _stop(self) -> None:
        process = self.subprocess  # None until the shell has started
        if process is not None:
            process.kill()
