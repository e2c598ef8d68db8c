"""A file's uncompressed size without reading it: gzip records it in its trailer."""

from __future__ import annotations

import os
from typing import BinaryIO

GZIP_MAGIC = b"\x1f\x8b"
_TRAILER_BYTES = 18  # the smallest gzip member: header, empty deflate block, CRC and size


def uncompressed_size(handle: BinaryIO) -> int:
    """The size of what `handle` holds once inflated. A gzip trailer records it modulo 4 GiB,
    so it is taken as the smallest such size not below the compressed one. Leaves the handle
    at its start."""
    size = handle.seek(0, os.SEEK_END)
    handle.seek(0)
    if size < _TRAILER_BYTES or handle.read(2) != GZIP_MAGIC:
        handle.seek(0)
        return size
    handle.seek(-4, os.SEEK_END)
    stored = int.from_bytes(handle.read(4), "little")
    handle.seek(0)
    wraps = max(0, -(-(size - stored) // (1 << 32)))
    return stored + (wraps << 32)
