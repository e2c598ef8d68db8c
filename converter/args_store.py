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
_SPILL_BYTES = 1 << 20


class ArgsStore:
    """Append-only store of raw JSON args; `add` gives a reference, `text` gives the bytes back.

    New text collects in `_pending` and goes to the file a megabyte at a time: `add` runs
    once per slice, and a buffered file's write cost several times a bytearray append."""

    def __init__(self, directory: Optional[str] = None):
        """`directory`: where the temporary file lives (default: TMPDIR, else the system's)."""
        self._directory = directory
        self._file = None
        self._written = 0   # bytes in the file; `_pending` follows them
        self._pending = bytearray()

    def add(self, text) -> int:
        """Store bytes-like `text` (bytes, msgspec.Raw, ...); the reference is an int."""
        pending = self._pending
        reference = (self._written + len(pending)) << _LENGTH_BITS | len(text)
        pending += text
        if len(pending) >= _SPILL_BYTES:
            self._spill()
        return reference

    def text(self, reference: int) -> bytes:
        if self._pending:
            self._spill()
        return os.pread(self._file.fileno(), reference & _LENGTH_MASK, reference >> _LENGTH_BITS)

    def _spill(self) -> None:
        try:
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="cgtrace-args-", dir=self._directory, buffering=0)
            done = 0
            with memoryview(self._pending) as view:
                while done < len(view):
                    done += self._file.write(view[done:])  # a nearly full disk can write short
        except OSError as error:
            raise self._disk_error(error) from None
        self._written += len(self._pending)
        self._pending.clear()

    def _disk_error(self, error: OSError) -> CgtraceError:
        where = self._directory or tempfile.gettempdir()
        return CgtraceError(f"{where}: cannot keep the trace's args in a temporary file ({error.strerror or error}); "
                            "free some space there or point TMPDIR at a disk with room for about half the "
                            "input's size")

