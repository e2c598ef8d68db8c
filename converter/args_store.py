"""Slice args kept on disk, not in memory, between reading and writing.

Args text is about half of a Kineto trace (a kernel carries two dozen keys), and it is only
needed again when the writer encodes it. Held as millions of bytes objects it made the trace
model bigger than the input; appended to one unlinked temporary file instead, each slice
keeps a single int (offset and length) and the text sits in the page cache, which the kernel
can write back and reclaim. It is read back with pread, not a memory map: the writer reads
in track order, not file order, and every fault on a map pulls in 64 KB around it, which
made the map resident faster than madvise could drop it.
"""

from __future__ import annotations

import os
import tempfile
from typing import Optional

from .errors import CgtraceError

_LENGTH_BITS = 32
_LENGTH_MASK = (1 << _LENGTH_BITS) - 1
_WRITE_BUFFER = 1 << 20


class ArgsStore:
    """Append-only store of raw JSON args; `add` gives a reference, `text` gives the bytes back."""

    def __init__(self, directory: Optional[str] = None):
        """`directory`: where the temporary file lives (default: TMPDIR, else the system's)."""
        self._directory = directory
        self._file = None
        self._size = 0
        self._flushed = False

    def add(self, text) -> int:
        """Store bytes-like `text` (bytes, msgspec.Raw, ...); the reference is an int."""
        if self._file is None:
            self._file = self._open()
        size = len(text)
        reference = self._size << _LENGTH_BITS | size
        try:
            self._file.write(text)
        except OSError as error:
            raise self._disk_error(error) from None
        self._size += size
        self._flushed = False
        return reference

    def text(self, reference: int) -> bytes:
        if not self._flushed:
            self._flush()
        return os.pread(self._fd, reference & _LENGTH_MASK, reference >> _LENGTH_BITS)

    def _open(self):
        try:
            return tempfile.TemporaryFile(prefix="cgtrace-args-", dir=self._directory, buffering=_WRITE_BUFFER)
        except OSError as error:
            raise self._disk_error(error) from None

    def _flush(self) -> None:
        try:
            self._file.flush()
        except OSError as error:
            raise self._disk_error(error) from None
        self._fd = self._file.fileno()
        self._flushed = True

    def _disk_error(self, error: OSError) -> CgtraceError:
        where = self._directory or tempfile.gettempdir()
        return CgtraceError(f"{where}: cannot keep the trace's args in a temporary file ({error.strerror or error}); "
                            "free some space there or point TMPDIR at a disk with room for about half the "
                            "input's size")

