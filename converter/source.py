"""Reading an input file into memory: plain or gzip (detected by magic bytes, not the suffix)."""

from __future__ import annotations

import zlib
from pathlib import Path

from .errors import CgtraceError

GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 22


def read_input_bytes(path: Path) -> bytes | bytearray:
    """The file's uncompressed bytes; every failure becomes a CgtraceError naming the file."""
    try:
        with open(path, "rb") as handle:
            magic = handle.read(2)
            handle.seek(0)
            if magic == GZIP_MAGIC:
                return _gunzip(handle, path)
            return handle.read()
    except FileNotFoundError:
        raise CgtraceError(f"{path}: no such file; check the path and try again") from None
    except IsADirectoryError:
        raise CgtraceError(f"{path}: is a directory; pass a trace file (.json or .json.gz)") from None
    except PermissionError:
        raise CgtraceError(f"{path}: permission denied; make the file readable and try again") from None
    except OSError as error:
        raise CgtraceError(f"{path}: cannot read ({error.strerror or error}); check the file and try again") from None


def _gunzip(handle, path: Path) -> bytearray:
    """Decompress into one growing buffer, so the text is never held twice."""
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    text = bytearray()
    try:
        while True:
            chunk = handle.read(_CHUNK)
            if not chunk:
                break
            text += decompressor.decompress(chunk)
            while decompressor.eof and decompressor.unused_data:
                # Concatenated gzip members (e.g. `cat a.gz b.gz`) are one stream to gzip(1).
                rest = decompressor.unused_data
                decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
                text += decompressor.decompress(rest)
        text += decompressor.flush()
    except zlib.error as error:
        raise CgtraceError(f"{path}: corrupt gzip data ({error}); re-copy or re-export the trace") from None
    if not decompressor.eof:
        raise CgtraceError(f"{path}: gzip stream is truncated; re-copy the file or re-export the trace")
    return text

