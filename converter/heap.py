"""How a command's memory is given back: to the kernel by the C heap, and at exit.

The C heap (glibc only):

glibc maps every allocation above 128 KB afresh and unmaps it when freed, and trims freed
memory off the heap's top at once. The writer's numpy temporaries (a few MB per few
thousand packets) then touch fresh pages every time, and on VMs a fresh page faults on the
host, which made the write markedly slower once its heap had no freed room left to reuse.
Allocations up to 32 MB now come from the heap, and the heap is trimmed only past 128 MB
free. Only once the input is read: reading frees memory it never takes again (its columns
and lists reallocated as they grow), and a heap that kept it would raise the command's peak,
which reading sets, for no gain in speed.

At exit: freeing a converted model object by object as the last reference goes costs time
in proportion to the objects (arrows and counter samples; slices are columns), for memory
the process is about to give back anyway. The command line keeps the model of a
job that ends the command (a single convert or compact: not a batch's, whose workers go on to
the next rank, nor one a query reads afterwards) and ends the process without freeing it;
code that calls the jobs in a running process (tests, a server) never turns this on.
"""

from __future__ import annotations

import ctypes
import os
import sys
from contextlib import contextmanager
from typing import Iterator, NoReturn, Optional, Sequence

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def reuse_freed_memory() -> None:
    """Keep freed memory for the next allocations instead of handing it back at once."""
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 128 << 20)


_reusing_after_reads = False


def reuse_freed_memory_after_reads() -> None:
    """For a command-line process: once a job has read its input, keep freed memory for reuse
    (reuse_freed_memory). Code that calls the jobs in a running process leaves the heap as it is."""
    global _reusing_after_reads
    _reusing_after_reads = True


def input_read() -> None:
    """A job has read its input: from now on, freed memory is kept where the process asked for it."""
    if _reusing_after_reads:
        reuse_freed_memory()


def give_back_freed_memory() -> None:
    """Hand the heap's freed memory back to the kernel now (what reuse_freed_memory keeps):
    for a process whose next work needs far less than it held (the args helper, from
    reading to writing)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # a C library without malloc_trim
        return


# The models kept to the process's end, while a command that ends with end_process runs.
_kept: Optional[list[object]] = None


@contextmanager
def models_kept_to_the_end() -> Iterator[list[object]]:
    """For a command that ends with end_process: the models given to keep_to_the_end meanwhile
    stay, in the list yielded, which the caller hands to end_process."""
    global _kept
    kept: list[object] = []
    _kept = kept
    try:
        yield kept
    finally:
        _kept = None


def keeping() -> bool:
    """Whether keep_to_the_end keeps what it is given now (never in a running process)."""
    return _kept is not None


def keep_to_the_end(model: object) -> None:
    """A finished job's model: kept (never freed) where the process ends with end_process."""
    if _kept is not None:
        _kept.append(model)


def end_process(status: int, kept: Sequence[object] = ()) -> NoReturn:
    """Exit with `status`; where a model was kept, at once (its objects are not freed, and no
    exit handler runs: everything the jobs write is closed by the time they return)."""
    if kept:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
