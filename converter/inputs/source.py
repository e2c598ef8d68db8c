"""Reading an input file into memory: plain or gzip (detected by magic bytes, not the suffix)."""

from __future__ import annotations

import errno
import mmap
import os
import tempfile
import zlib
from pathlib import Path

from .. import progress
from ..errors import CgtraceError
from ..fileio.gzip_size import GZIP_MAGIC, uncompressed_size
from ..fileio.regular import open_regular

_CHUNK = 1 << 22
# Kineto JSON compresses 10-30x; far beyond that is a decompression bomb, not a trace.
GZIP_RATIO_LIMIT = 200
GZIP_RATIO_FLOOR = 1 << 28
NO_GZIP_LIMIT_ENV = "CGTRACE_NO_GZIP_LIMIT"


def read_input_bytes(path: Path) -> bytes | bytearray | mmap.mmap:
    """The file's uncompressed bytes; every failure becomes a CgtraceError naming the file."""
    try:
        with open_regular(path, "a trace file (.json or .json.gz)") as handle:
            magic = handle.read(2)
            handle.seek(0)
            if magic == GZIP_MAGIC:
                return _gunzip(handle, path)
            return _read_plain(handle, path)
    except FileNotFoundError:
        raise CgtraceError(f"{path}: no such file; check the path and try again") from None
    except PermissionError:
        raise CgtraceError(f"{path}: permission denied; make the file readable and try again") from None
    except MemoryError:
        raise CgtraceError(f"{path}: too large to read into memory; cut it down with --window or --steps "
                           "on a machine with more memory") from None
    except OSError as error:
        raise CgtraceError(f"{path}: cannot read ({error.strerror or error}); check the file and try again") from None


def json_size(path: Path) -> int:
    """The file's uncompressed size, without reading it; 0 if unreadable or not a regular file
    (opening a FIFO would wait for a writer; the reader refuses it with its own message)."""
    if not path.is_file():
        return 0
    try:
        with open(path, "rb") as handle:
            return uncompressed_size(handle)
    except OSError:
        return 0


def _read_plain(handle, path: Path):
    size = os.fstat(handle.fileno()).st_size
    if size and hasattr(mmap.mmap, "madvise"):
        # Mapped, not copied: the pages are clean page cache the kernel can always reclaim,
        # and the reader drops the ones it has finished with (madvise), so the text never
        # pins `size` bytes of anonymous memory for the whole run.
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    text = bytearray(size)
    view = memoryview(text)
    done = 0
    while done < size:
        count = handle.readinto(view[done:done + _CHUNK])
        if not count:
            break
        done += count
        progress.report(f"reading {path.name}: {done >> 20} / {size >> 20} MB")
    view.release()
    del text[done:]
    return text


def _gunzip(handle, path: Path):
    """Decompress into an unlinked temporary file and map it: the JSON text then lives in the
    page cache like a plain input's, instead of pinning its whole size in this process.

    Output is produced in bounded pieces and checked against the compressed size read so
    far, so a gzip bomb is refused before it fills the disk.
    """
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    limit_ratio = 0 if os.environ.get(NO_GZIP_LIMIT_ENV) else GZIP_RATIO_LIMIT
    size = 0
    with tempfile.TemporaryFile(prefix="cgtrace-gunzip-") as text:
        try:
            while True:
                chunk = handle.read(_CHUNK)
                if not chunk:
                    break
                while chunk:
                    piece = decompressor.decompress(chunk, _CHUNK * 8)
                    text.write(piece)
                    size += len(piece)
                    chunk = decompressor.unconsumed_tail
                    if decompressor.eof and decompressor.unused_data:
                        # Concatenated gzip members (e.g. `cat a.gz b.gz`) are one stream to gzip(1).
                        chunk = decompressor.unused_data + chunk
                        decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
                    compressed = handle.tell()
                    if limit_ratio and size > GZIP_RATIO_FLOOR and size > limit_ratio * compressed:
                        raise CgtraceError(
                            f"{path}: decompresses more than {limit_ratio}x (a gzip bomb?); if the trace is genuine, "
                            f"set {NO_GZIP_LIMIT_ENV}=1 and run again")
                progress.report(f"reading {path.name}: {handle.tell() >> 20} MB compressed, {size >> 20} MB of JSON")
            text.write(decompressor.flush())
        except zlib.error as error:
            raise CgtraceError(f"{path}: corrupt gzip data ({error}); re-copy or re-export the trace") from None
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # full, or past a file size limit
                raise
            raise CgtraceError(f"{path}: cannot decompress into {tempfile.gettempdir()} ({error.strerror or error}); "
                               "free some space there or point TMPDIR at a disk with room for the JSON",
                               io_error=error) from None
        if not decompressor.eof:
            raise CgtraceError(f"{path}: gzip stream is truncated; re-copy the file or re-export the trace")
        text.flush()
        if not text.tell():
            return b""
        return mmap.mmap(text.fileno(), 0, access=mmap.ACCESS_READ)  # the map keeps the unlinked file
