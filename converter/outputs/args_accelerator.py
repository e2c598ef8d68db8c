"""The args accelerator: slice args encoded for Perfetto in a helper process while the main
process reads the trace.

Encoding args is about half of writing a Kineto trace (a kernel carries a dozen typed
values), and it depends on nothing but the args text. So on a machine with a core to
spare, a forked helper follows the ArgsStore as it fills: for each megabyte spilled the
entries' bounds go to a file the two share and the helper is sent their count (a message
that small never fills the pipe, so reading never waits for the helper, which catches up
while flows are bound); it preads the text from the store's file, encodes the entries in
order and appends the bytes to a file of its own; it also applies the label rule it was given
to each entry (compaction labels CUDA-graph kernels with it). The store then answers
`labels(..., rule)` and `prepared(ARGS_FORM)` from the helper's work, and the writer takes
entry i's encoded bytes by index, with the helper's debug-annotation names interned first.

Labels come first: a run is labelled as soon as it arrives, and encoded when nothing newer
waits, and the labels are sent before the encoding still to do. Where args take the helper
longer than reading takes the main process (Kineto's "Input Dims" on every op), compaction
and layout then go on beside the helper's last encoding, instead of waiting for it.

Anything that goes wrong in the helper (a full disk, a kill) only loses the head start:
`result()` gives None and the writer encodes the args itself.
"""

from __future__ import annotations

import gc
import os
import tempfile
import weakref
from array import array
from collections import deque
from functools import partial
from multiprocessing import BufferTooShort
from multiprocessing.connection import Connection, Pipe
from typing import Any, BinaryIO, Iterable, Optional

import msgspec
import numpy as np

from ..fileio.args_file import FileArgsStore
from ..fileio.direct import read_all, write_all, write_at
from ..heap import give_back_freed_memory
from ..model import LabelRule
from ..signals import stopping_deferred
from ..tuning import DEFAULT_TUNING, Tuning, process_threads
from .packets import Spliced
from .prepared_args import ARGS_FORM, EncodedArgs, EntryEncoder, canonical_names, mapped
from .slice_packets import SliceBatch, encode_batch


def cores_to_spare(cores: int) -> bool:
    """Whether a helper process would run beside this one, on one of its `cores` (the
    tuning's), rather than take turns with it. Not from a process running other threads: a
    fork copies only the calling one, and Python 3.12 warns that the child may deadlock on a
    lock another thread held."""
    return cores > 1 and process_threads() == 1


def accelerated_args_store(label_rule: Optional[LabelRule], directory: Optional[str] = None,
                           encodes_packets: bool = False, tuning: Tuning = DEFAULT_TUNING) -> FileArgsStore:
    """A file-backed args store followed by a helper that prepares the Perfetto writer's
    encoding and applies `label_rule` (where given) to every entry; with `encodes_packets`,
    it stays to encode the first writer's packets too (slice_packets.py), for a job that
    writes here."""
    store = FileArgsStore(directory, tuning)
    store.follow(BackgroundArgsEncoder(store.fileno(), label_rule, directory, encodes_packets, tuning))
    return store


class BackgroundArgsEncoder:
    """The main process's handle on the helper: `submit` each spilled run of entries, then,
    once reading is over, `labels` (for compaction) and `result` (for the writer)."""

    form = ARGS_FORM

    def __init__(self, store_fd: int, label_rule: Optional[LabelRule], directory: Optional[str] = None,
                 encodes_packets: bool = False, tuning: Tuning = DEFAULT_TUNING):
        """`store_fd`: the ArgsStore's file, which the helper reads with pread. The helper
        stays on to share the write only for the tuning's shared_write_entries or more."""
        self.label_rule = label_rule
        self._shared_write_entries = tuning.shared_write_entries
        self._output = tempfile.TemporaryFile(prefix="cgtrace-encoded-args-", dir=directory, buffering=0)
        self._ends = tempfile.TemporaryFile(prefix="cgtrace-args-bounds-", dir=directory, buffering=0)
        # Each batch's packets, from its start: the batch before was read by then.
        self._packets = tempfile.TemporaryFile(prefix="cgtrace-packets-", dir=directory, buffering=0) \
            if encodes_packets else None
        requests_out, self._requests = Pipe(duplex=False)
        self._results, results_in = Pipe(duplex=False)
        # A stop signal landing in a fork hook (logging's runs after every fork) is printed and
        # lost instead of raised; held back across the fork, it is raised on the way out.
        with stopping_deferred():
            pid = os.fork()
        if pid == 0:  # the helper: it must never return into the caller's code
            status = 1
            try:
                self._requests.close()
                self._results.close()
                _serve(requests_out, results_in, store_fd, self._ends.fileno(), self._output.fileno(), label_rule,
                       self._packets.fileno() if self._packets is not None else None, tuning)
                status = 0
            finally:
                os._exit(status)
        requests_out.close()
        results_in.close()
        self._labels: Optional[EntryLabels] = None
        self._result: Optional[EncodedArgs] = None
        self._failed = False
        self._entries = 0  # submitted so far
        self._finalizer = weakref.finalize(self, _stop, pid, self._requests, self._results, self._output, self._ends,
                                           *[self._packets] if self._packets is not None else [])

    def submit(self, bounds: array) -> None:
        """Encode the entries between consecutive `bounds` (offsets in the store's file)."""
        if self._failed or len(bounds) < 2:
            return
        try:
            write_all(self._ends.fileno(), bytearray(memoryview(bounds)[1:]))  # each entry's end
            self._requests.send_bytes((len(bounds) - 1).to_bytes(8, "little"))
            self._entries += len(bounds) - 1
        except OSError:  # the helper is gone: the writer will encode these args itself
            self._failed = True

    def labels(self) -> Optional[EntryLabels]:
        """Wait for the helper's labels (its encoding may go on); None if it could not."""
        if self._labels is None and not self._failed:
            try:
                self._requests.send_bytes(b"")  # every entry was submitted
                distinct = msgspec.json.decode(self._results.recv_bytes())
                self._labels = EntryLabels(distinct, self._receive(array("I", [0]) * self._entries))
            except (OSError, EOFError, BufferTooShort, msgspec.DecodeError, ValueError, IndexError):
                self._failed = True
                self._finalizer()
        return self._labels

    def result(self) -> Optional[EncodedArgs]:
        """Wait for the helper to finish; None if it could not."""
        if self._result is None and not self._failed:
            if self.labels() is not None:
                try:
                    self._result = self._read_answer()
                except (OSError, EOFError, BufferTooShort, msgspec.DecodeError, ValueError, IndexError):
                    self._failed = True
            if self._result is not None and self._packets is not None and self._entries >= self._shared_write_entries:
                self._result.offer_packet_helper(_HelperPackets(self._requests, self._results, self._packets.fileno(),
                                                                self._finalizer))
            else:
                self._finalizer()
        return self._result

    def _read_answer(self) -> EncodedArgs:
        """The encoded entries, and after them in their file, the annotation names and every
        entry's bounds (_answer)."""
        answer = self._results.recv_bytes()
        encoded_size, names_size = int.from_bytes(answer[:8], "little"), int.from_bytes(answer[8:], "little")
        fd = self._output.fileno()
        names = msgspec.json.decode(read_all(fd, names_size, encoded_size))
        bounds = array("Q", [0]) * (self._entries + 1)
        if os.preadv(fd, [bounds], encoded_size + names_size) != len(bounds) * bounds.itemsize \
                or bounds[-1] != encoded_size:
            raise ValueError("the args helper answered for other entries than were submitted")
        return EncodedArgs(names, mapped(fd, encoded_size), bounds)

    def _receive(self, items: array) -> array:
        """The helper's next message, straight into `items` (sized for every entry submitted):
        the bounds are eight bytes an entry, and a bytes object first would hold them twice."""
        if self._results.recv_bytes_into(items) != len(items) * items.itemsize:
            raise ValueError("the args helper answered for fewer entries than were submitted")
        return items


class EntryLabels:
    """A label rule applied to every stored entry, in store order (compaction labels CUDA-graph
    kernels with it, and would otherwise read their args again): each distinct label kept once."""

    def __init__(self, distinct: Iterable[str] = (), label_ids: Optional[array] = None):
        self.distinct = list(distinct)  # label id i (from 1) is distinct[i - 1]
        self.label_ids = label_ids if label_ids is not None else array("I")  # per entry; 0: no label
        self._ids = {label: number for number, label in enumerate(self.distinct, start=1)}

    def add(self, text: bytes, bounds: np.ndarray, rule: Optional[LabelRule]) -> None:
        """The label of each entry back to back in `text` (entry i is text[bounds[i]:bounds[i + 1]]);
        with no rule (a job that does not compact), none. The rule is asked about each entry
        only where the run holds its marker: on most traces none does, so the helper, which
        paces args-heavy traces, skips the rule for most runs."""
        ids, distinct, label_ids = self._ids, self.distinct, self.label_ids
        if rule is None or text.find(rule.marker) < 0:
            label_ids.frombytes(bytes(label_ids.itemsize * (len(bounds) - 1)))
            return
        label_of = rule.label
        for entry in map(text.__getitem__, map(slice, bounds[:-1].tolist(), bounds[1:].tolist())):
            label = label_of(entry)
            if label is None:
                label_ids.append(0)
                continue
            number = ids.get(label)
            if number is None:
                distinct.append(label)
                number = ids[label] = len(distinct)
            label_ids.append(number)

    def label_of(self, reference: int) -> Optional[str]:
        number = self.label_ids[reference]
        return self.distinct[number - 1] if number else None


_END = np.dtype(np.uint64)  # an entry's end in the ends file (the store's bounds are array("Q"))
_AGAIN_ENTRIES = 1 << 16  # entries read back at once when all are encoded again
_COPY_BYTES = 1 << 20  # the helper's packets are copied to the output this much at a time


class _HelperPackets:
    """The helper, kept on after the args to encode a writer's packets (PacketHelper): a
    batch's columns go down the requests pipe; the helper writes the packets to the start of
    a file of its own and answers with their size."""

    def __init__(self, requests: Connection, results: Connection, packets_fd: int, stop: weakref.finalize):
        self._requests, self._results, self._packets_fd, self._stop = requests, results, packets_fd, stop
        self._failed = False
        self._size = 0  # of the packets finished last

    def submit(self, batch: SliceBatch, parts: range) -> bool:
        if not self._failed:
            try:
                self._requests.send_bytes(batch.to_bytes(parts))
            except OSError:
                self._failed = True
        return not self._failed

    def finished(self) -> bool:
        if not self._failed:
            try:
                self._size = int.from_bytes(self._results.recv_bytes(), "little")
            except (OSError, EOFError):
                self._failed = True
        return not self._failed

    def copy_to(self, stream: BinaryIO) -> None:
        size = self._size
        buffer = bytearray(min(size, _COPY_BYTES))
        for offset in range(0, size, _COPY_BYTES):
            with memoryview(buffer)[:min(_COPY_BYTES, size - offset)] as chunk:
                if os.preadv(self._packets_fd, [chunk], offset) != len(chunk):
                    raise OSError(f"the args helper's packets file ends before {size} bytes")
                stream.write(chunk)

    def close(self) -> None:
        self._stop()


def _stop(pid: int, requests: Connection, results: Connection, *files: Any) -> None:
    """Close the pipes (the helper exits on end of input), reap it and drop the files."""
    requests.close()
    results.close()
    for file in files:
        file.close()
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _serve(requests: Connection, results: Connection, store_fd: int, ends_fd: int, output_fd: int,
           label_rule: Optional[LabelRule], packets_fd: Optional[int], tuning: Tuning) -> None:
    # The helper touches none of the objects it inherited; without a collector walking them,
    # their pages stay shared with the main process instead of being copied.
    gc.disable()
    labels, encoder = EntryLabels(), EntryEncoder(output_fd, tuning)
    # Runs labelled but not yet encoded, as (first entry, entries): read again when encoded,
    # so a backlog costs nothing per entry.
    unencoded: deque[tuple[int, int]] = deque()
    while True:
        if unencoded and not requests.poll():  # nothing newer waits
            encoder.add(*_run_entries(store_fd, ends_fd, *unencoded.popleft()))
            continue
        message = requests.recv_bytes()
        if not message:
            break
        run = (len(labels.label_ids), int.from_bytes(message, "little"))
        text, bounds = _run_entries(store_fd, ends_fd, *run)
        labels.add(text, bounds, label_rule)
        if unencoded or requests.poll():  # behind: newer runs are labelled first
            unencoded.append(run)
        else:
            encoder.add(text, bounds)
    results.send_bytes(msgspec.json.encode(labels.distinct))
    results.send_bytes(labels.label_ids)
    del labels
    names = _encode_the_rest(encoder, store_fd, ends_fd, unencoded)
    canonical = canonical_names(names)
    if canonical is not None:
        encoder, names = _encode_again(store_fd, ends_fd, output_fd, len(encoder.bounds) - 1, canonical, tuning)
    _answer(results, output_fd, names, encoder.bounds)
    if packets_fd is not None and len(encoder.bounds) - 1 >= tuning.shared_write_entries:
        encoded = EncodedArgs(names, mapped(output_fd, encoder.bounds[-1]), encoder.bounds)
        del encoder, names
        give_back_freed_memory()  # it stays on beside the writer's peak: only what the packets need
        _serve_packets(requests, results, encoded, packets_fd)


def _encode_the_rest(encoder: EntryEncoder, store_fd: int, ends_fd: int,
                     unencoded: deque[tuple[int, int]]) -> list[Optional[str]]:
    """The runs still to encode once the labels were sent; the annotation names."""
    while unencoded:
        encoder.add(*_run_entries(store_fd, ends_fd, *unencoded.popleft()))
    return encoder.finish()


def _encode_again(store_fd: int, ends_fd: int, output_fd: int, count: int, names: list[str], tuning: Tuning
                  ) -> tuple[EntryEncoder, list[Optional[str]]]:
    """Every entry encoded again over the first, its annotation names numbered `names` (the
    canonical numbering, where the first pass met other names out of order: prepared_args.py)."""
    os.lseek(output_fd, 0, os.SEEK_SET)
    encoder = EntryEncoder(output_fd, tuning, names)
    for first in range(0, count, _AGAIN_ENTRIES):
        encoder.add(*_run_entries(store_fd, ends_fd, first, min(_AGAIN_ENTRIES, count - first)))
    return encoder, encoder.finish()


def _answer(results: Connection, output_fd: int, names: list[Optional[str]], bounds: array) -> None:
    """The names and bounds go after the encoded entries in their file, and only where they
    are down the pipe: a message that small never waits for the main process to read it, so
    a helper that does not share the write is gone as soon as it is done, not when the writer
    asks (on smaller traces its memory beside compaction's would set the run's peak)."""
    names_text = msgspec.json.encode(names)
    write_at(output_fd, memoryview(names_text), bounds[-1])
    write_at(output_fd, memoryview(bounds).cast("B"), bounds[-1] + len(names_text))
    results.send_bytes(bounds[-1].to_bytes(8, "little") + len(names_text).to_bytes(8, "little"))


def _run_entries(store_fd: int, ends_fd: int, first: int, count: int) -> tuple[bytes, np.ndarray]:
    """Entries first .. first + count - 1, back to back: their text from the store's file, and
    their bounds in it from the ends file (each entry starts where the one before it ends)."""
    before = min(first, 1)  # the end of the entry before, where there is one
    bounds = np.zeros(count + 1, np.int64)
    bounds[1 - before:] = np.frombuffer(
        read_all(ends_fd, (count + before) * _END.itemsize, (first - before) * _END.itemsize), _END)
    start = int(bounds[0])
    bounds -= start
    return read_all(store_fd, int(bounds[-1]), start), bounds


def _serve_packets(requests: Connection, results: Connection, encoded: EncodedArgs, packets_fd: int) -> None:
    """Each batch that comes, encoded to the start of `packets_fd`; its size answered."""
    while True:
        try:
            message = requests.recv_bytes()
        except EOFError:  # the main process is done with the helper
            return
        batch, parts = SliceBatch.from_bytes(message)
        size = 0
        for part in encode_batch(batch, partial(Spliced, encoded.entries, release=encoded.release_pages), parts):
            size += write_at(packets_fd, part.data, size)
        results.send_bytes(size.to_bytes(8, "little"))
