"""Every stored args entry encoded for the Perfetto writer, in store order, ahead of writing.

Both args strategies run this same pass: the args accelerator in a helper process while the
trace is read, the in-process strategy just before the first write. The annotation names'
iids must not depend on the order of the store (the input's order, model/canonical.py):
"args" and the keys Kineto writes are numbered first, in a fixed order, and other names after
them in text order. Names are numbered as met, so where other names were met out of text order
every entry is encoded again with the canonical numbering (`canonical_names`): never on
Kineto's own keys, and the same bytes from both strategies.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from array import array
from typing import Any, BinaryIO, Iterable, Iterator, Optional

import numpy as np

from ..fileio.direct import write_all
from ..kineto import ARGS_KEYS
from ..model import ArgsStore
from ..tuning import DEFAULT_TUNING, Tuning
from .annotations import ARGS_ANNOTATION_NAME, ArgsEncoder
from .interning import annotation_name_interner
from .slice_packets import PacketHelper

# The name ArgsStore.prepared knows this encoding by.
ARGS_FORM = "perfetto-debug-annotations"
# The annotation names numbered first, whatever the store holds.
KNOWN_NAMES = (ARGS_ANNOTATION_NAME, *ARGS_KEYS)


def canonical_names(names: list[Optional[str]]) -> Optional[list[str]]:
    """The canonical numbering of `names` (an encoder's, in iid order), or None where they are in it."""
    others = [name for name in names[len(KNOWN_NAMES):] if name is not None]
    return None if others == sorted(others) else [*KNOWN_NAMES, *sorted(others)]


class EncodedArgs:
    """Every stored entry's TrackEvent.debug_annotations bytes, and the annotation names they
    reference, in iid order (iid = position + 1; None: a known name no entry references)."""

    def __init__(self, names: list[Optional[str]], blob: Any, bounds: array):
        self.interned = names
        self._blob = blob
        self._bounds = bounds  # entry i is blob[bounds[i]:bounds[i + 1]]
        self._packet_helper: Optional[PacketHelper] = None

    def offer_packet_helper(self, helper: PacketHelper) -> None:
        """The process that encoded these args, kept to encode one writer's packets too."""
        self._packet_helper = helper

    def take_packet_helper(self) -> Optional[PacketHelper]:
        """The helper offered, to the first writer that asks (it stops it when done)."""
        helper, self._packet_helper = self._packet_helper, None
        return helper

    def runs(self, references: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        bounds = np.frombuffer(self._bounds, np.uint64)  # a view: a batch reads only its own entries
        present = references >= 0
        starts = bounds[np.where(present, references, 0)].astype(np.int64)
        lengths = bounds[np.where(present, references + 1, 0)].astype(np.int64) - np.where(present, starts, 0)
        return self.entries, starts, lengths

    @property
    def entries(self) -> np.ndarray:
        """Every entry's bytes, back to back (a view)."""
        return np.frombuffer(self._blob, np.uint8)

    def release_pages(self) -> None:
        """A fault on a mapped file maps the 64 KB around it too, so the sparse args of a thread
        seen now and then across a large trace would keep many times their own size resident
        for one part of a batch."""
        if isinstance(self._blob, mmap.mmap):
            self._blob.madvise(mmap.MADV_DONTNEED)

    @property
    def bounds(self) -> array:
        return self._bounds

    def write_blob(self, stream: BinaryIO, write_bytes: int = DEFAULT_TUNING.encoded_write_bytes) -> None:
        """Every entry's bytes, in order, to `stream` (a merge keeps them for its second pass)."""
        for start in range(0, self._bounds[-1], write_bytes):
            stream.write(self._blob[start:min(start + write_bytes, self._bounds[-1])])


class EntryEncoder:
    """Encodes runs of entries one after another into `output_fd`, numbering annotation names
    `names` first and the others as met, a tuning's encoded_write_bytes at a time."""

    def __init__(self, output_fd: int, tuning: Tuning = DEFAULT_TUNING, names: Iterable[str] = KNOWN_NAMES):
        self._output_fd = output_fd
        self._write_bytes = tuning.encoded_write_bytes
        self._interner = annotation_name_interner([])
        for name in names:
            self._interner.field(name)
        self._referenced: set[str] = set()  # the names an entry refers to: only those are written
        self._encode_run = ArgsEncoder(self._reference, tuning).encode_run
        self.bounds = array("Q", [0])  # in the output, entry i is bytes bounds[i]:bounds[i + 1]
        self._buffer = bytearray()
        self._written = 0

    def add(self, text: bytes, bounds: np.ndarray) -> None:
        """Entries back to back in `text`: entry i is text[bounds[i]:bounds[i + 1]]."""
        before = self._written + len(self._buffer)  # where this run's bytes start in the output
        ends = before + np.cumsum(self._encode_run(text, bounds, self._buffer))
        self.bounds.frombytes(ends.astype(np.uint64).tobytes())
        if len(self._buffer) >= self._write_bytes:
            self._written += len(self._buffer)
            write_all(self._output_fd, self._buffer)

    def _reference(self, name: str) -> bytes:
        self._referenced.add(name)
        return self._interner.field(name)

    def finish(self) -> list[Optional[str]]:
        """Write what is buffered; the annotation names in iid order (None for those no entry
        refers to)."""
        write_all(self._output_fd, self._buffer)
        referenced = self._referenced
        return [name if name in referenced else None for name in self._interner.references]


def prepare_in_process(store: ArgsStore, directory: Optional[str] = None, tuning: Tuning = DEFAULT_TUNING
                       ) -> EncodedArgs:
    """The accelerator's work, done here: every entry, in one sweep over the store, read back
    through the page cache as the accelerator's is."""
    names: Optional[list[str]] = list(KNOWN_NAMES)
    while names is not None:
        output = tempfile.TemporaryFile(prefix="cgtrace-encoded-args-", dir=directory, buffering=0)
        encoder = EntryEncoder(output.fileno(), tuning, names)
        for text, bounds in entry_runs(store.sweep(range(len(store))), tuning.encoded_write_bytes):
            encoder.add(text, bounds)
        encoded = encoder.finish()
        names = canonical_names(encoded)
    return EncodedArgs(encoded, mapped(output.fileno(), encoder.bounds[-1]), encoder.bounds)


def entry_runs(entries: Iterable[bytes], run_bytes: int = DEFAULT_TUNING.encoded_write_bytes
               ) -> Iterator[tuple[bytes, np.ndarray]]:
    """Entries joined into runs of about `run_bytes`, each with the entries' bounds in it."""
    run: list[bytes] = []
    size = 0
    for entry in entries:
        run.append(entry)
        size += len(entry)
        if size >= run_bytes:
            yield _joined(run)
            run, size = [], 0
    if run:
        yield _joined(run)


def _joined(run: list[bytes]) -> tuple[bytes, np.ndarray]:
    """The entries back to back, and each one's bounds in them."""
    bounds = np.zeros(len(run) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, run), np.int64, len(run)), out=bounds[1:])
    return b"".join(run), bounds


def mapped(fd: int, size: int) -> Any:
    """An encoded-args file, read through the page cache it already sits in: reading it into
    memory would take as many fresh pages, which on a virtual machine cost more than the copy.
    The map keeps the (unlinked) file alive after it is closed."""
    if not size:
        return b""
    if os.fstat(fd).st_size < size:
        raise EOFError("the encoded args file is short")
    return mmap.mmap(fd, size, access=mmap.ACCESS_READ)
