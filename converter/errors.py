"""The one exception type the CLI turns into a one-line message and exit code 2."""

from __future__ import annotations

from typing import Optional


class CgtraceError(Exception):
    """A problem the user can fix: the message names the file, the problem and what to do next.
    `io_error`: the file system's error behind it (a full disk), for a caller whose user has
    other choices than the message's (`demo` has no -o)."""

    def __init__(self, message: str, io_error: Optional[OSError] = None):
        super().__init__(message)
        self.message = message
        self.io_error = io_error
