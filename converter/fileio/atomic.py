"""Atomic output: files are written beside their targets and replace them only once all of a
job's files are complete (and checked, where asked), so no reader ever sees a partial file
and a failed job leaves nothing behind."""

from __future__ import annotations

import contextlib
import glob
import os
import stat
import tempfile
import zlib
from pathlib import Path
from typing import Callable, Iterator, Optional, Protocol, Sequence, Union

from ..errors import CgtraceError
from ..signals import stopping_deferred
from .direct import DirectWriter

# Given the finished temporary file and the path it will become; raises CgtraceError to refuse it.
Check = Callable[[Path, Path], None]
GZIP_SUFFIX = ".gz"  # an output named so is written gzipped (trace_processor and the UI open it as is)
_GZIP_LEVEL = 6


class Sink(Protocol):
    """What an output is written through: every writer only calls write(), then close()."""

    def write(self, data: Union[bytes, bytearray, memoryview]) -> int: ...

    def close(self) -> None: ...


@contextlib.contextmanager
def scratch_folder(prefix: str, parent: Optional[Path] = None) -> Iterator[Path]:
    """A temporary folder removed on every way out, a stop signal's too: created with stop
    signals held back, so none lands between the folder's creation and its being on record."""
    with contextlib.ExitStack() as stack:
        with stopping_deferred():
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix, dir=parent))
        yield Path(folder)


def check_output_path(path: Path, overwrite: bool, inputs: Sequence[Path] = ()) -> None:
    """Fail before any work is done when the output cannot or must not be written. Only a
    regular file is ever replaced: a symlink (dangling or not), FIFO or device node at the
    path is someone else's (as root, `-o /dev/null --overwrite` would replace /dev/null), and
    never one of the command's `inputs` (files), not even with --overwrite."""
    try:
        mode: Optional[int] = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as error:
        raise CgtraceError(f"{path}: cannot check the output path ({error.strerror}); choose another path with -o") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise CgtraceError(f"{path}: is a directory; pass a file path with -o")
    if mode is not None and not stat.S_ISREG(mode):
        raise CgtraceError(f"{path}: is a {file_kind(mode)}, which cgtrace never replaces, not even with --overwrite; "
                           "choose another path with -o")
    if mode is not None and any(_same_file(path, source) for source in inputs):
        raise CgtraceError(f"{path}: is an input of this command, which cgtrace never replaces, not even with "
                           "--overwrite; choose another output path with -o")
    if mode is not None and not overwrite:
        raise CgtraceError(f"{path}: already exists; pass --overwrite to replace it or -o to choose another path")
    parent = _parent(path)
    if not parent.is_dir():
        raise CgtraceError(f"{path}: directory {parent} does not exist; create it or choose another path with -o")
    if not os.access(parent, os.W_OK):
        raise CgtraceError(f"{path}: directory {parent} is not writable; choose another path with -o")


def remove_leftovers(path: Path) -> int:
    """Remove the temporary files a writer of `path` left when it was killed outright (SIGKILL,
    a lost cluster node), which no `finally` can clean up; call only once no writer of `path`
    runs. Returns how many there were."""
    parent = _parent(path)
    # mkstemp's names: the prefix AtomicFiles.create gives, 8 random characters, the suffix.
    pattern = os.path.join(glob.escape(str(parent)), glob.escape(f".{path.name}.") + "?" * 8 + ".tmp")
    removed = 0
    for leftover in glob.glob(pattern):  # the pattern's leading dot matches hidden names
        with contextlib.suppress(OSError):
            os.unlink(leftover)
            removed += 1
    return removed


class NotWritten(CgtraceError):
    """An output, or scratch kept beside it, could not be written in `folder` (a full disk,
    most often). Its advice is -o; a command whose user named no output words its own."""

    def __init__(self, message: str, folder: Path, io_error: OSError):
        super().__init__(message, io_error)
        self.folder = folder
        self.reason = io_error.strerror or str(io_error)

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        """Whole across a worker's pipe: pickling an exception keeps only its message."""
        return NotWritten, (self.message, self.folder, self.io_error)


def write_failed(path: Path, error: OSError) -> NotWritten:
    """The one message for an output that could not be written."""
    return NotWritten(f"{path}: write failed ({error.strerror or error}); nothing was written; "
                      "free disk space or choose another path with -o", _parent(path), error)


class AtomicFiles:
    """Several outputs that appear together or not at all: `create` gives a writer to a
    temporary file beside each target; `commit` checks every file, then renames them all."""

    def __init__(self, overwrite: bool):
        self.overwrite = overwrite
        self._pending: list[tuple[Path, str]] = []  # (target, temporary file)
        self._writers: list[_OwnedDirectWriter] = []

    def create(self, path: Path) -> Sink:
        """A writer to a new temporary file for `path`; close it before `commit`. The file is
        written past the page cache where it can be (direct.py), gzipped where `path` ends in
        `.gz`."""
        check_output_path(path, self.overwrite)
        parent = _parent(path)
        with stopping_deferred():  # a file created is a file on record, to be removed on any way out
            try:
                descriptor, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
            except OSError as error:
                raise CgtraceError(f"{path}: cannot create a file in {parent} ({error.strerror}); "
                                   "choose another path with -o") from None
            self._pending.append((path, temp_name))
        writer = _OwnedDirectWriter(descriptor)
        self._writers.append(writer)
        return _Gzipped(writer) if path.name.endswith(GZIP_SUFFIX) else writer

    def commit(self, check: Optional[Check] = None) -> None:
        """Check each file (`check(temporary, target)`), then move all into place. Should a
        move fail half-way, the files already moved that were new are removed again."""
        moved: list[Path] = []
        try:
            for path, temp_name in self._pending:
                os.chmod(temp_name, 0o666 & ~_current_umask())
                if check is not None:
                    check(Path(temp_name), path)
            for path, _ in self._pending:
                check_output_path(path, self.overwrite)  # it may have appeared while converting
            for path, temp_name in self._pending:
                new = not os.path.lexists(path)
                os.replace(temp_name, path)
                if new:
                    moved.append(path)
        except OSError as error:
            for path in moved:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise write_failed(self._pending[0][0], error) from None
        finally:
            self.discard()

    def discard(self) -> None:
        """Remove every temporary file not moved into place."""
        for writer in self._writers:
            writer.release()
        self._writers.clear()
        for _, temp_name in self._pending:
            with contextlib.suppress(OSError):
                os.unlink(temp_name)
        self._pending.clear()

    def __enter__(self) -> "AtomicFiles":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.discard()


class _OwnedDirectWriter(DirectWriter):
    """A DirectWriter that owns its descriptor: `close` finishes the file and closes it,
    `release` only closes it (a file being abandoned needs no last write)."""

    def close(self) -> None:
        if self._fd >= 0:
            super().close()
            self.release()

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _Gzipped:
    """A gzip stream into a file's writer; the same bytes every run (the header has no time)."""

    def __init__(self, file: DirectWriter):
        self._file = file
        self._compressor: Optional[zlib._Compress] = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)

    def write(self, data: Union[bytes, bytearray, memoryview]) -> int:
        assert self._compressor is not None, "written after close"
        self._file.write(self._compressor.compress(data))
        return len(data)

    def close(self) -> None:
        if self._compressor is not None:
            self._file.write(self._compressor.flush())
            self._compressor = None
        self._file.close()


@contextlib.contextmanager
def atomic_output(path: Path, overwrite: bool, check: Optional[Check] = None) -> Iterator[Sink]:
    """One output: a writer to a temporary file that replaces `path` only if the block finishes
    (and `check` accepts it)."""
    with AtomicFiles(overwrite) as files:
        stream = files.create(path)
        try:
            yield stream
            stream.close()
        except OSError as error:
            raise write_failed(path, error) from None
        files.commit(check)


def _same_file(path: Path, other: Path) -> bool:
    try:
        return path.samefile(other)
    except OSError:  # gone, or never there: not the output
        return False


def file_kind(mode: int) -> str:
    """What a file that is no regular file is, in words."""
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "socket" if stat.S_ISSOCK(mode) else "special file"


def _parent(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _current_umask() -> int:
    """mkstemp creates 0600 files; give the output the permissions a plain open() would."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
