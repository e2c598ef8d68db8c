"""Opening files the user names without waiting on them: a FIFO would block the open until a
writer came, a device like /dev/zero would never end, so only regular files are read."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from ..errors import CgtraceError


def open_regular(path: Path, wanted: str) -> BinaryIO:
    """`path` opened for reading if it is a regular file; else CgtraceError saying to pass
    `wanted` (e.g. "a trace file"). OSError (missing, unreadable) is the caller's to word."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, for fstat to see
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, device or socket)"
            raise CgtraceError(f"{path}: is {kind}; pass {wanted}")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def read_small_text(path: Path, limit: int, wanted: str) -> str:
    """A small UTF-8 file (rules, a query), read whole; at most `limit` bytes are accepted, so a
    huge or endless file is refused after reading `limit` + 1."""
    try:
        with open_regular(path, wanted) as handle:
            data = handle.read(limit + 1)
    except OSError as error:
        raise CgtraceError(f"{path}: cannot read ({error.strerror or error}); check the path, "
                           f"which should name {wanted}") from None
    if len(data) > limit:
        raise CgtraceError(f"{path}: larger than {limit >> 10} KiB, too large for {wanted}; pass a smaller file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CgtraceError(f"{path}: not UTF-8 text (byte {error.start}); save it as UTF-8, "
                           f"it should be {wanted}") from None
