"""Slice args kept on disk, not in memory, between reading and writing.

Args text is about half of a Kineto trace (a kernel carries two dozen keys), and it is only
needed again when the writer encodes it. Held as millions of bytes objects it made the trace
model bigger than the input; appended to one unlinked temporary file instead, each slice
keeps a single int (its entry's index). The file is written past the page cache where the
file system allows (direct_io.py): the text is read back by the args helper right away, or
in the rare case of no helper, once more when writing. It is read back with pread, not a
memory map: the writer reads in track order, not file order, and every fault on a map pulls
in 64 KB around it, which made the map resident faster than madvise could drop it.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from array import array
from typing import Any, Iterator, Optional, Protocol

from .direct_io import DirectWriter
from .errors import CgtraceError

_SPILL_BYTES = 1 << 20
_SWEEP_BYTES = 1 << 20


class ArgsFollower(Protocol):
    """Works on the entries as they reach the file (background_args.py encodes them)."""

    def submit(self, bounds: array) -> None:
        """Entries between consecutive `bounds` (file offsets) have just been written."""

    def result(self) -> Any:
        """What it made of every entry, once all were submitted; None if it could not."""


class ArgsStore:
    """Append-only store of raw JSON args; `add` gives a reference, `text` gives the bytes back.

    New text collects in `_pending` and goes to the file a megabyte at a time: `add` runs
    once per slice, and a buffered file's write cost several times a bytearray append."""

    def __init__(self, directory: Optional[str] = None):
        """`directory`: where the temporary file lives (default: TMPDIR, else the system's)."""
        self._directory = directory
        self._reader = -1  # the file, for pread; the writer has a descriptor of its own (O_DIRECT)
        self._writer: Optional[DirectWriter] = None
        self._pending = bytearray()  # the entries after the first `_spilled_entries`, not yet in the file
        self._bounds = array("Q", [0])  # entry i is bytes _bounds[i]:_bounds[i + 1] of file + pending
        self._spilled_entries = 0
        self._follower: Optional[ArgsFollower] = None

    def add(self, text) -> int:
        """Store bytes-like `text` (bytes, msgspec.Raw, ...); the reference is an int."""
        pending = self._pending
        pending += text
        bounds = self._bounds
        bounds.append(bounds[-1] + len(text))
        if len(pending) >= _SPILL_BYTES:
            self._spill()
        return len(bounds) - 2

    def text(self, reference: int) -> bytes:
        if self._pending:
            self._spill()
        start = self._bounds[reference]
        return os.pread(self._reader, self._bounds[reference + 1] - start, start)

    def sweep(self, references: list[int]) -> Iterator[bytes]:
        """The texts of ascending `references`, read a block at a time in file order: for
        hundreds of thousands of entries, a pread each costs several times the reading."""
        if self._pending:
            self._spill()
        bounds, fd = self._bounds, self._reader
        block, block_start, block_end = b"", 0, 0
        for reference in references:
            start, end = bounds[reference], bounds[reference + 1]
            if end > block_end:
                block = read_all(fd, max(end, min(start + _SWEEP_BYTES, bounds[-1])) - start, start)
                block_start, block_end = start, start + len(block)
            yield block[start - block_start:end - block_start]

    def fileno(self) -> int:
        """The file's descriptor, for a follower that reads what was spilled."""
        self._open()
        return self._reader

    def follow(self, follower: ArgsFollower) -> None:
        """Submit every run of entries to `follower` as it reaches the file."""
        self._follower = follower

    def followed(self):
        """The follower's result over every entry; None without one, or if it failed."""
        if self._follower is None:
            return None
        if self._pending:
            self._spill()
        return self._follower.result()

    def _spill(self) -> None:
        try:
            self._open()
            self._writer.write(self._pending)
            self._writer.flush()
            self._pending.clear()
        except OSError as error:
            raise self._disk_error(error) from None
        if self._follower is not None:
            self._follower.submit(self._bounds[self._spilled_entries:])
        self._spilled_entries = len(self._bounds) - 1

    def _open(self) -> None:
        if self._writer is None:
            descriptor, path = tempfile.mkstemp(prefix="cgtrace-args-", dir=self._directory)
            try:
                self._reader = os.open(path, os.O_RDONLY)
            except OSError:
                os.close(descriptor)
                raise
            finally:
                os.unlink(path)
            self._writer = DirectWriter(descriptor)
            weakref.finalize(self, _close, descriptor, self._reader)  # also when reading fails half-way

    def _disk_error(self, error: OSError) -> CgtraceError:
        where = self._directory or tempfile.gettempdir()
        return CgtraceError(f"{where}: cannot keep the trace's args in a temporary file ({error.strerror or error}); "
                            "free some space there or point TMPDIR at a disk with room for about half the "
                            "input's size")


def _close(*descriptors: int) -> None:
    for descriptor in descriptors:
        os.close(descriptor)


def write_all(fd: int, buffer: bytearray) -> None:
    """Write and empty `buffer`; a nearly full disk can write short."""
    done = 0
    with memoryview(buffer) as view:
        while done < len(view):
            done += os.write(fd, view[done:])
    buffer.clear()


def read_all(fd: int, size: int, offset: int = 0) -> bytes:
    """pread exactly `size` bytes: one call returns at most about 2 GB."""
    parts = []
    while size > 0:
        part = os.pread(fd, size, offset)
        if not part:
            raise EOFError(f"file ends {size} bytes early")
        parts.append(part)
        size -= len(part)
        offset += len(part)
    return b"".join(parts) if len(parts) != 1 else parts[0]
