"""Writing big files past the page cache (O_DIRECT), where the file system allows it.

The output and the args store are written once and read back late or never, so caching
them buys nothing, and on the virtual machines this project is measured on it costs a lot:
a page the guest touches for the first time faults on the host, so a buffered write's
system time varied many-fold with how many recently freed pages the kernel had at hand,
where O_DIRECT's stayed small and the same every time (figures: docs/performance.md).

O_DIRECT wants buffer addresses, lengths and file offsets in whole blocks. Data collects in
a page-aligned buffer (an anonymous map); whole blocks go out, and `flush` also writes the
partial last block, padded, to be written again with what follows. `close` trims the file
to the bytes written. Where the file system refuses O_DIRECT, at open or at the first write
(alignment rules differ), the same writes go through the page cache.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os

BLOCK = 4096
_BUFFER_BYTES = 1 << 22


def switch_to_direct_io(fd: int) -> bool:
    """Switch `fd` to O_DIRECT; False where the system or the file system has no such mode."""
    if not hasattr(os, "O_DIRECT"):
        return False
    try:
        _set_direct(fd, True)
    except OSError:
        return False
    return True


def _set_direct(fd: int, direct: bool) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if direct else flags & ~os.O_DIRECT)


class DirectWriter:
    """Sequential writes to `fd` from offset 0, in whole blocks. Closing it does not close `fd`."""

    def __init__(self, fd: int, try_direct: bool = True):
        """`try_direct`: write past the page cache where the file system allows; else buffered."""
        self._fd = fd
        self.direct = try_direct and switch_to_direct_io(fd)
        self._buffer = mmap.mmap(-1, _BUFFER_BYTES)
        self._view = memoryview(self._buffer)
        self._used = 0     # bytes in the buffer
        self._offset = 0   # the file offset of the buffer's first byte, a whole number of blocks

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self._offset + self._used

    def write(self, data) -> int:
        with memoryview(data) as source:  # bytes-like: bytes, bytearray, a map
            done = 0
            while done < len(source):
                take = min(len(source) - done, _BUFFER_BYTES - self._used)
                self._view[self._used:self._used + take] = source[done:done + take]
                self._used += take
                done += take
                if self._used == _BUFFER_BYTES:
                    self._write_whole_blocks()
            return done

    def flush(self) -> None:
        """Make every byte written so far readable from the file."""
        self._write_whole_blocks()
        if self._used:
            with self._view[:BLOCK] as padded:  # rewritten with what follows
                self._write_at(padded, self._offset)

    def close(self) -> None:
        """Flush and cut the file to its size (the last block was written padded)."""
        if self._buffer.closed:
            return
        self.flush()
        os.ftruncate(self._fd, self.size)
        self._view.release()
        self._buffer.close()

    def _write_whole_blocks(self) -> None:
        whole = self._used - self._used % BLOCK
        if not whole:
            return
        with self._view[:whole] as blocks:
            self._write_at(blocks, self._offset)
        self._offset += whole
        rest = self._used - whole
        with self._view[whole:self._used] as tail:
            self._view[:rest] = tail
        self._used = rest

    def _write_at(self, data: memoryview, offset: int) -> None:
        """Every view of the buffer is released as soon as it is written, not when the last
        reference goes: a sampling profiler (Dask's, in its workers) can hold a frame, and with
        it a view, past the call, and the buffer cannot close while one is alive."""
        done = 0
        while done < len(data):
            try:
                with data[done:] as rest:
                    done += os.pwrite(self._fd, rest, offset + done)
            except OSError as error:
                if not (self.direct and error.errno == errno.EINVAL):
                    raise
                _set_direct(self._fd, False)
                self.direct = False


def write_all(fd: int, buffer: bytearray) -> None:
    """Write and empty `buffer`; a nearly full disk can write short."""
    done = 0
    with memoryview(buffer) as view:
        while done < len(view):
            done += os.write(fd, view[done:])
    buffer.clear()


def write_at(fd: int, data: memoryview, offset: int) -> int:
    """pwrite all of `data` at `offset`; its size."""
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)
    return done


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
