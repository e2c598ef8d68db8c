"""Slice args kept on disk, not in memory, between reading and writing.

Args text is about half of a Kineto trace (a kernel carries two dozen keys), and it is only
needed again when the writer encodes it. Held as millions of bytes objects it made the trace
model bigger than the input; appended to one unlinked temporary file instead, each slice
keeps a single int (its entry's index). The file is written past the page cache where the
file system allows (direct.py): the text is read back once, in file order, by whatever
prepares it for the writer (the args helper while reading, or the in-process pass before
writing), and by compaction for the few slices it needs. It is read back with pread, not a
memory map: single entries are read in any order, and every fault on a map pulls in 64 KB
around it, which made the map resident faster than madvise could drop it.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from array import array
from bisect import bisect_right
from itertools import accumulate, islice
from typing import Any, Iterator, Optional, Protocol, Sequence

from ..errors import CgtraceError
from ..model import ArgsStore, LabelRule, PreparedArgs
from ..tuning import DEFAULT_TUNING, Tuning
from .direct import DirectWriter, read_all


class ArgsFollower(Protocol):
    """Works on the entries as they reach the file (an args accelerator encodes them)."""

    form: str          # the writer's encoding its result prepares (see ArgsStore.prepared)
    label_rule: Optional[LabelRule]  # the rule its labels were computed with, if any

    def submit(self, bounds: array) -> None:
        """Entries between consecutive `bounds` (file offsets) have just been written."""

    def labels(self) -> Optional["FollowedLabels"]:
        """Its label rule applied to every entry, once all were submitted; None if it could not.
        Ready before `result`: compaction asks for labels while the encoding may go on."""

    def result(self) -> Optional[PreparedArgs]:
        """What it made of every entry, once all were submitted; None if it could not."""


class FollowedLabels(Protocol):
    def label_of(self, reference: int) -> Optional[str]: ...


class FileArgsStore(ArgsStore):
    """Append-only store of raw JSON args in an unlinked temporary file.

    New text collects in `_pending` and goes to the file a megabyte at a time (the tuning's
    spill_bytes): `add` runs once per slice, and a buffered file's write cost several times a
    bytearray append."""

    def __init__(self, directory: Optional[str] = None, tuning: Tuning = DEFAULT_TUNING):
        """`directory`: where the temporary file lives (default: TMPDIR, else the system's)."""
        super().__init__()
        self._directory = directory
        self._spill_bytes, self._sweep_bytes = tuning.spill_bytes, tuning.sweep_bytes
        self._reader = -1  # the file, for pread; the writer has a descriptor of its own (O_DIRECT)
        self._writer: Optional[DirectWriter] = None
        self._pending = bytearray()  # the entries after the first `_spilled_entries`, not yet in the file
        self._bounds = array("Q", [0])  # entry i is bytes _bounds[i]:_bounds[i + 1] of file + pending
        self._spilled_entries = 0
        self._follower: Optional[ArgsFollower] = None

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def add_many(self, texts: list[Any]) -> int:
        first = len(self._bounds) - 1
        self._pending += b"".join(texts)
        self._bounds.extend(islice(accumulate(map(len, texts), initial=self._bounds[-1]), 1, None))
        if len(self._pending) >= self._spill_bytes:
            self._spill()
        return first

    def text(self, reference: int) -> bytes:
        if self._pending:
            self._spill()
        start = self._bounds[reference]
        return os.pread(self._reader, self._bounds[reference + 1] - start, start)

    def sweep(self, references: Sequence[int]) -> Iterator[bytes]:
        """Read a block at a time in file order: for hundreds of thousands of entries, a pread
        each costs several times the reading. A block ends with the last entry wanted within
        sweep_bytes of its start, so entries far apart (a GPU's annotations among its
        kernels) are not each read with a megabyte after them."""
        if self._pending:
            self._spill()
        bounds, fd, reach = self._bounds, self._reader, self._sweep_bytes
        ends = [bounds[reference + 1] for reference in references]
        block, block_start, block_end = b"", 0, 0
        for index, reference in enumerate(references):
            start, end = bounds[reference], ends[index]
            if end > block_end:
                last = bisect_right(ends, start + reach, index) - 1  # the last entry wanted that fits
                block = read_all(fd, max(end, ends[last] if last >= index else end) - start, start)
                block_start, block_end = start, start + len(block)
            yield block[start - block_start:end - block_start]

    def labels(self, references: list[int], rule: LabelRule) -> list[Optional[str]]:
        follower = self._follower
        followed = self._followed().labels() if follower is not None and follower.label_rule is rule else None
        if followed is None:
            return super().labels(references, rule)
        label_of = followed.label_of
        return [None if reference < 0 else label_of(reference) for reference in references]

    def prepared(self, form: str) -> Optional[PreparedArgs]:
        if self._follower is None or self._follower.form != form:
            return super().prepared(form)
        return self._followed().result() or super().prepared(form)

    def fileno(self) -> int:
        """The file's descriptor, for a follower that reads what was spilled."""
        self._open()
        return self._reader

    def follow(self, follower: ArgsFollower) -> None:
        """Submit every run of entries to `follower` as it reaches the file."""
        self._follower = follower

    def _followed(self) -> ArgsFollower:
        """The follower, with every entry submitted to it."""
        assert self._follower is not None
        if self._pending:
            self._spill()
        return self._follower

    def _spill(self) -> None:
        try:
            self._open()
            assert self._writer is not None
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
                            "input's size", io_error=error)


def _close(*descriptors: int) -> None:
    for descriptor in descriptors:
        os.close(descriptor)
