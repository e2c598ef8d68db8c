"""Atomic output: write beside the target, then rename, so no reader ever sees a partial file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

from .direct_io import DirectWriter
from .errors import CgtraceError


def check_output_path(path: Path, overwrite: bool) -> None:
    """Fail before any work is done when the output cannot or must not be written."""
    if path.exists() and not overwrite:
        raise CgtraceError(f"{path}: already exists; pass --overwrite to replace it or -o to choose another path")
    if path.is_dir():
        raise CgtraceError(f"{path}: is a directory; pass a file path with -o")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise CgtraceError(f"{path}: directory {parent} does not exist; create it or choose another path with -o")
    if not os.access(parent, os.W_OK):
        raise CgtraceError(f"{path}: directory {parent} is not writable; choose another path with -o")


@contextlib.contextmanager
def atomic_output(path: Path, overwrite: bool) -> Iterator[DirectWriter]:
    """Yield a writer to a temp file beside `path`; it replaces `path` only if the block
    finishes. The file is written past the page cache where it can be (direct_io.py)."""
    check_output_path(path, overwrite)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        descriptor, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as error:
        raise CgtraceError(f"{path}: cannot create a file in {parent} ({error.strerror}); choose another path with -o") from None
    try:
        with os.fdopen(descriptor, "wb") as file:
            stream = DirectWriter(file.fileno())
            yield stream
            stream.close()
        os.chmod(temp_name, 0o666 & ~_current_umask())
        if not overwrite and path.exists():
            raise CgtraceError(f"{path}: appeared while converting; pass --overwrite to replace it")
        os.replace(temp_name, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        if isinstance(error, OSError):
            raise CgtraceError(f"{path}: write failed ({error.strerror or error}); free disk space or choose another path with -o") from None
        raise


def _current_umask() -> int:
    """mkstemp creates 0600 files; give the output the permissions a plain open() would."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
