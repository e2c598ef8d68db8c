"""Every performance knob in one frozen object: how much is read, encoded or written at once,
the cores and memory that decide how many ranks run at once and whether args helpers fit, and
how the reader starts decoding.

None of these change what is written, only how fast and in how much memory, so they are
chosen once (from the options and the machine: `for_this_machine`) and carried with the job
(JobOptions.tuning) instead of living as constants in each module. A test that wants many
small pieces or batches passes a Tuning with small sizes.
"""

from __future__ import annotations

import enum
import os
import threading

import msgspec


class Decoding(enum.Enum):
    """Which decoders the reader tries on a piece of events, first to last (kineto_reader)."""

    TAGGED_NUMBERS = "tagged, times as numbers"  # plain events by phase, then any event
    TAGGED_TEXT = "tagged, times as written"     # the same, for times a float cannot hold to the ns
    EVENTS = "events"                            # every event alike: the tagged decoding kept failing
    EXACT_EVENTS = "exact events"                # every event alike, times exact


# More read workers than this by default would wait on the main process, which keeps about
# half of one process's reading and builds the model in order (docs/performance.md, "One
# trace on several cores"); each would add its spans' memory.
_MOST_READ_WORKERS = 3


class Tuning(msgspec.Struct, frozen=True):
    """Every knob of one command, fixed when it starts (the module docstring says why)."""

    # Reading: the events array cut into pieces about this long (event_pieces).
    piece_bytes: int = 1 << 20
    first_decoding: Decoding = Decoding.TAGGED_NUMBERS
    tagged_tries: int = 3  # pieces the tagged decoding may fail before the rest skip it
    # Processes decoding one trace's pieces (piece_workers.py; 1: this one alone), only for this
    # much JSON or more (below, forking and the first span's wait are much of what a split could
    # save: not a measured crossover, docs/performance.md), a span of this many pieces handed to
    # one at a time.
    read_workers: int = 1
    read_workers_min_json_bytes: int = 32 << 20
    pieces_per_span: int = 4
    # The args store's file: pending text written at this size; a sweep's blocks reach this far.
    spill_bytes: int = 1 << 20
    sweep_bytes: int = 1 << 20
    # Encoded args: runs of entries joined, and the encoded bytes written, this much at a time.
    encoded_write_bytes: int = 1 << 20
    annotation_piece_bytes: int = 1 << 18  # text encoded at once: numpy's passes stay in the cache
    annotation_cache_entries: int = 20_000
    # Writing: slices per batch of columns (about 100 bytes a slice), packets per encoded part
    # (about 0.5 MB), output buffered before a write, JSON rows made Python values at once.
    slices_at_once: int = 1 << 15
    packets_at_once: int = 1 << 13
    flush_bytes: int = 1 << 22
    json_rows_at_once: int = 1 << 16
    # The args helper stays on to share the write only for this many args entries or more
    # (about 500 MB of Kineto JSON): below, its memory beside the writer's peak costs more than
    # the time it saves (args_accelerator.py).
    shared_write_entries: int = 1 << 21
    # The command line's args helper ("auto") only for inputs of this much JSON or more: below,
    # starting it (a fork, its pipe, its exit) costs more than the encoding it takes over.
    helper_min_json_bytes: int = 4 << 20
    # Nesting: slices whose times are Python ints at once (a whole long track's as ints would be
    # a large transient beside the columns), and stretches short enough for first-fit's loop whole.
    nesting_chunk: int = 1 << 16
    nesting_looped_whole: int = 256
    # The machine: cores this process may run on, and (measured on the merges of docs/performance.md)
    # a rank's model and its encoded args per byte of its JSON, and a process's own interpreter.
    cores: int = 1
    rank_bytes_per_json_byte: float = 1.5
    encoded_args_per_json_byte: float = 0.25
    process_bytes: int = 24 << 20

    @classmethod
    def for_this_machine(cls) -> Tuning:
        """Today's sizes, with the cores this process may run on, and as many read workers as
        fit beside this process and its args helper, if at least two do: on 2 cores they
        measured no faster and took more memory (docs/performance.md)."""
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        return cls(cores=cores, read_workers=min(cores - 2, _MOST_READ_WORKERS) if cores >= 4 else 1)

    def reading_with(self, workers: int) -> Tuning:
        """The same, one trace's pieces read by `workers` processes (--jobs of one trace)."""
        return msgspec.structs.replace(self, read_workers=max(1, workers))

    def shared_by(self, jobs: int) -> Tuning:
        """A job's share when `jobs` traces are read at once: the read workers between them,
        so jobs times workers stays within the cores."""
        return self.reading_with(self.read_workers // max(1, jobs))

    def default_jobs(self, sizes: list[int]) -> int:
        """How many ranks to hold at once, given their JSON sizes (largest first): as many as
        there are cores, while the estimated peak stays below the inputs' total size. A rank in
        memory takes about 1.5x its JSON, so two equal ranks go one at a time (in this
        process), and eight go two at a time."""
        total, limit = sum(sizes), min(len(sizes), self.cores)
        jobs = 1
        while jobs < limit and \
                self.process_bytes * (jobs + 2) + self.rank_bytes_per_json_byte * sum(sizes[:jobs + 1]) <= total:
            jobs += 1
        return jobs

    def helper_fits(self, sizes: list[int], jobs: int) -> bool:
        """Whether `jobs` workers should each have an args helper (args_accelerator.py): only
        on idle cores, and while the peak, with the encoded args held for writing, stays below
        the inputs' total size (so not for two ranks of 75 MB, where interpreters dominate)."""
        if 2 * jobs > self.cores:
            return False
        processes = 2 * jobs + 1  # this one, the workers and their helpers
        rank_bytes = (self.rank_bytes_per_json_byte + self.encoded_args_per_json_byte) * sum(sizes[:jobs])
        return self.process_bytes * processes + rank_bytes <= sum(sizes)


def process_threads() -> int:
    """Threads this process runs, native ones too (as Python's warning about forking counts them)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux
        return threading.active_count()


# The sizes a caller outside a job (a test, a library user) gets; a job's own come with it.
DEFAULT_TUNING = Tuning()
