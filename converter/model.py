"""The trace model the engine works on: processes, tracks, slices, counters and flows.

It knows nothing about Chrome JSON or Perfetto protobuf. Times are integer nanoseconds on
one absolute clock, so no stage ever does float arithmetic on timestamps.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Iterable, Iterator, Optional

import msgspec

from .args_store import ArgsStore


@dataclass(eq=False)
class Process:
    """One process row group; `pid` is the int32 id written out, `source_pid` what the input said."""

    pid: int
    source_pid: Any
    name: Optional[str] = None
    labels: list[str] = field(default_factory=list)
    sort_index: Optional[int] = None

    @property
    def display_name(self) -> str:
        return self.name if self.name is not None else f"Process {self.source_pid}"

    @property
    def short_name(self) -> str:
        """What users call it: Kineto names every process after the program and labels the
        GPU ones "GPU 0", so the first label wins."""
        return self.labels[0] if self.labels else self.display_name


@dataclass(eq=False)
class Thread:
    """A thread (or GPU stream) of a process; `tid` is unique across the whole output."""

    process: Process
    tid: int
    source_tid: Any
    name: Optional[str] = None
    sort_index: Optional[int] = None

    @property
    def display_name(self) -> str:
        if self.name is not None:
            return self.name
        source = self.source_tid
        return source if isinstance(source, str) else f"thread {source}"


@dataclass(eq=False)
class Track:
    """One display row.

    Exactly one of `thread` (a thread's own track), `process` (a track scoped to a process)
    or neither (a global track) describes where it lives; `parent` nests it under another
    track, and `order` ranks it among its siblings.
    """

    name: str
    process: Optional[Process] = None
    thread: Optional[Thread] = None
    parent: Optional["Track"] = None
    order: int = 0
    is_counter: bool = False
    orders_children: bool = False
    # A compacted lane: its slices never overlap, so they are written flat, in (ts, dur) order.
    flat: bool = False
    # Fixed uuid for a track shared by several writers into one file (a merge's root track).
    uuid: Optional[int] = None


# The per-event classes are msgspec Structs: built in C (three times faster than a Python
# __init__), 16 bytes smaller than a __slots__ class without the cycle collector's header
# (gc=False: they never form cycles), compared and hashed by identity like plain objects.
class Slice(msgspec.Struct, gc=False, eq=False):
    """A span (or, with `is_instant`, a point) on a track. Name, ts, dur, cat and args are measured
    data and never change; only `track` may be reassigned for display.

    `args` is None, raw JSON text (bytes), a dict, or an int: a reference into the trace's
    ArgsStore. Read it through `Trace.args_of`."""

    ts: int
    dur: int
    name: str
    cat: str
    args: Any
    track: Track
    is_instant: bool = False

    @property
    def end(self) -> int:
        return self.ts + self.dur


class CounterSample(msgspec.Struct, gc=False, eq=False):
    ts: int
    value: float
    track: Track


class Flow(msgspec.Struct, gc=False, eq=False):
    """An arrow from one slice to another; the writer gives every arrow its own id."""

    source: Slice
    target: Slice
    category: str


class FlowEnd(msgspec.Struct, gc=False, eq=False):
    """One end of an arrow whose other end another writer emits (cross-rank arrows of a
    merge): the flow id is agreed beforehand, and the target starts after the source."""

    slice: Slice
    flow_id: int
    outgoing: bool


@dataclass
class Trace:
    processes: list[Process] = field(default_factory=list)
    threads: list[Thread] = field(default_factory=list)
    tracks: list[Track] = field(default_factory=list)
    slices: list[Slice] = field(default_factory=list)
    counters: list[CounterSample] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)
    flow_ends: list[FlowEnd] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    # Why events were skipped or repaired, and how many: reported in every summary.
    skipped: Counter = field(default_factory=Counter)
    unbound_flows: int = 0
    events_read: int = 0
    # Where args referenced by an int live (see args_store.py); None when all args are inline.
    args_store: Optional[ArgsStore] = None

    def args_of(self, slice_: Slice):
        """A slice's args as raw JSON text, a dict, or None."""
        args = slice_.args
        return self.args_store.text(args) if type(args) is int else args

    def args_sweep(self, slices: Iterable[Slice]) -> Iterator[tuple[Slice, Any]]:
        """(slice, args) for many slices, the stored args read in one pass over the store
        (in file order, not in the order given)."""
        stored = []
        for slice_ in slices:
            if type(slice_.args) is int:
                stored.append(slice_)
            else:
                yield slice_, slice_.args
        if stored:
            stored.sort(key=attrgetter("args"))
            yield from zip(stored, self.args_store.sweep([s.args for s in stored]))

    def add_track(self, track: Track) -> Track:
        self.tracks.append(track)
        return track
