"""The trace model the engine works on: processes, tracks, slices, counters and flows.

It knows nothing about Chrome JSON or Perfetto protobuf. Times are integer nanoseconds on
one absolute clock, so no stage ever does float arithmetic on timestamps. Every track says
what it is for (`TrackRole`), so writers and analyses never guess it from a display name.
"""

from __future__ import annotations

import enum
from collections import Counter
from operator import attrgetter
from typing import Any, Optional

import msgspec
import numpy as np

from .args import ArgsStore, ExtraArgs, LabelRule
from .launch_keys import LaunchKeys
from .slices import SliceTable, renumbering


class Process(msgspec.Struct, eq=False):
    """One process row group; `pid` is the int32 id written out, `source_pid` what the input said."""

    pid: int
    source_pid: Any
    name: Optional[str] = None
    labels: list[str] = msgspec.field(default_factory=list)
    sort_index: Optional[int] = None
    # Written as a group of rows (plain tracks, under `parent` where a job gives one, ranked
    # among its siblings by `sort_index`) rather than as an OS process: profiler bookkeeping
    # under a made-up pid (Kineto's "Spans"), or a merged rank's process (jobs/merge.py says
    # why the UI needs that).
    row_group: bool = False
    parent: Optional["Track"] = None
    # A row group's own row as a counter (its rank's CPU work, engine/activity.py): the track its
    # counter samples name; the writer gives it the group's uuid, as it is that row.
    activity: Optional["Track"] = None

    @property
    def display_name(self) -> str:
        if self.name is not None:
            return self.name
        return str(self.source_pid) if self.row_group else f"Process {self.source_pid}"

    @property
    def short_name(self) -> str:
        """What users call it: Kineto names every process after the program and labels the
        GPU ones "GPU 0", so the first label wins."""
        return self.labels[0] if self.labels else self.display_name


class Thread(msgspec.Struct, eq=False):
    """A thread (or GPU stream) of a process; `tid` is unique across the whole output."""

    process: Process
    tid: int
    source_tid: Any
    name: Optional[str] = None
    sort_index: Optional[int] = None
    is_main: bool = False  # the process's main thread: its tid is the pid

    @property
    def display_name(self) -> str:
        if self.name is not None:
            return self.name
        source = self.source_tid
        return source if isinstance(source, str) else f"thread {source}"

    @property
    def row_title(self) -> str:
        """The title of its row when written as a plain track: its name and the input's tid,
        as the UI titles a thread, so the id that tells threads apart stays in sight (once:
        Kineto's own names, "thread 1237 (python)", often hold it already)."""
        if self.name is None or isinstance(self.source_tid, str) or str(self.source_tid) in self.name.split():
            return self.display_name
        return f"{self.name} {self.source_tid}"


class TrackRole(enum.Enum):
    """What a track is for: carried into the output, so queries need not read names."""

    PLAIN = "plain"              # a thread's own track, or any other track read from the input
    LANES = "lanes"              # a GPU's container of lanes and annotation rows
    LANE = "lane"                # compacted GPU slices of one lane group, never overlapping
    ANNOTATIONS = "annotations"  # GPU annotations and kernel labels above one lane
    OVERLAP = "overlap"          # slices that partially overlap on their home track
    GLOBAL = "global"            # instants of global scope (profiler bookkeeping): one row per output
    CRITICAL_PATH = "critical_path"  # a merge's critical path on one rank: copies of segments (engine/critical_path.py)
    MEMORY_ALLOCATED = "memory_allocated"  # a device's allocated bytes over time (engine/memory.py)
    MEMORY_RESERVED = "memory_reserved"    # a device's reserved bytes over time (engine/memory.py)
    IDLE_CAUSE = "idle_cause"    # why a GPU is idle, as a code per moment (engine/waits.py, model/derived.py)
    QUEUE_DEPTH = "queue_depth"  # one stream's launched, unfinished GPU work (engine/waits.py)


class LaneKind(enum.Enum):
    """What a lane group's slices do, for busy and exposed-communication figures."""

    COMPUTE = "compute"
    COMMUNICATION = "communication"
    MEMORY = "memory"
    OTHER = "other"


class LaneGroup(msgspec.Struct, frozen=True):
    id: str
    label: str
    kind: LaneKind


class CounterScale(msgspec.Struct, frozen=True):
    """How the UI draws a counter: the name of its unit, and a key its sibling counters share to
    be drawn on one y scale (Perfetto's y_axis_share_key), so equal heights mean equal values."""

    unit: str
    shared_by: str


class Track(msgspec.Struct, eq=False):
    """One display row.

    Exactly one of `thread` (a thread's own track), `process` (a track scoped to a process)
    or neither (a global track) describes where it lives; `parent` nests it under another
    track, and `order` ranks it among its siblings. `home` is the track an overlap track or an
    annotation row belongs to (its layer counts from 1), `group` a lane's lane group.
    `folded_under` is for display only: the row the UI shows it under, a click away (a
    GPU's further lanes and copy-only annotation rows, compaction.py); `parent` stays its
    place for every reader.
    """

    name: str
    process: Optional[Process] = None
    thread: Optional[Thread] = None
    parent: Optional["Track"] = None
    order: int = 0
    is_counter: bool = False
    orders_children: bool = False
    role: TrackRole = TrackRole.PLAIN
    group: Optional[LaneGroup] = None
    home: Optional["Track"] = None
    layer: int = 0
    folded_under: Optional["Track"] = None
    # Fixed uuid for a track shared by several writers into one file (a merge's root track).
    uuid: Optional[int] = None
    scale: Optional[CounterScale] = None  # a counter's unit and shared y scale, where it has them
    device: Optional[int] = None  # a memory counter's device, as Kineto numbers it (-1: the CPU)
    stream: Optional[int] = None  # a queue depth counter's stream (args.stream of its GPU work)

    @property
    def flat(self) -> bool:
        """A compacted lane: its slices never overlap, so they are written flat, in (ts, dur) order."""
        return self.role is TrackRole.LANE

    @property
    def display_name(self) -> str:
        return self.thread.display_name if self.thread is not None else self.name


# The per-event classes are msgspec Structs: built in C (three times faster than a Python
# __init__), 16 bytes smaller than a __slots__ class without the cycle collector's header
# (gc=False: they never form cycles), compared and hashed by identity like plain objects.
class CounterSample(msgspec.Struct, gc=False, eq=False):
    ts: int
    value: float
    track: Track


class Flow(msgspec.Struct, gc=False, eq=False):
    """An arrow from one slice to another (rows of the trace's SliceTable); the writer gives
    every arrow its own id."""

    source: int
    target: int
    category: str


class FlowEnd(msgspec.Struct, gc=False, eq=False):
    """One end of an arrow whose other end another writer emits (cross-rank arrows of a
    merge): the flow id is agreed beforehand, and the target starts after the source."""

    row: int  # the slice's, in the trace's SliceTable
    flow_id: int
    outgoing: bool


class ClockPlacement(msgspec.Struct, frozen=True):
    """How a merge set a rank's clock: `offset_ns` added to all its times, known to within
    `uncertainty_ns` (None: only a one-sided bound, or nothing, spoke for it), from `evidence`
    (counts by kind: collectives, transfer bounds)."""

    offset_ns: int
    uncertainty_ns: Optional[int]
    evidence: tuple[tuple[str, int], ...]


class RankIdentity(msgspec.Struct, frozen=True):
    """Which rank of a pipeline a trace is, once a merge has placed it (and its clock, where the
    merge estimated one)."""

    pp_rank: int
    global_rank: int
    in_pipeline: bool = True  # False where no PP group orders the ranks (pp_rank is then the global order)
    clock: Optional[ClockPlacement] = None

    @property
    def title(self) -> str:
        """How the UI, the report and the summary all name the rank: "PP rank" only in a pipeline."""
        return rank_title(self.pp_rank, self.global_rank, self.in_pipeline)


def rank_title(pp_rank: int, global_rank: int, in_pipeline: bool = True) -> str:
    """"PP rank 0 (global 3)", or "rank 3 (global 3)" where no pipeline orders the ranks."""
    return f"{'PP rank' if in_pipeline else 'rank'} {pp_rank} (global {global_rank})"


_SOURCE, _TARGET = attrgetter("source"), attrgetter("target")


class Trace(msgspec.Struct):
    processes: list[Process] = msgspec.field(default_factory=list)
    threads: list[Thread] = msgspec.field(default_factory=list)
    tracks: list[Track] = msgspec.field(default_factory=list)
    slices: SliceTable = msgspec.field(default_factory=SliceTable)
    counters: list[CounterSample] = msgspec.field(default_factory=list)
    flows: list[Flow] = msgspec.field(default_factory=list)
    flow_ends: list[FlowEnd] = msgspec.field(default_factory=list)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    # Why events were skipped or repaired, and how many: reported in every summary.
    skipped: Counter[str] = msgspec.field(default_factory=Counter)
    unbound_flows: int = 0           # flow ends with a partner that bound to no slice
    partnerless_flow_ends: int = 0   # flow ends whose chain lacks a start or an end in the input
    events_read: int = 0
    args: ArgsStore = msgspec.field(default_factory=ArgsStore)
    rank: Optional[RankIdentity] = None
    # Args a stage derived about slices (their launch attribution), written beside their own;
    # on the trace, so they follow its rows wherever slices are dropped.
    derived_args: ExtraArgs = msgspec.field(default_factory=ExtraArgs.none)
    # Each slice's launch keys read so far from its args (engine/launch_keys.py), kept in step
    # with its rows likewise.
    launch_keys: LaunchKeys = msgspec.field(default_factory=LaunchKeys.none)

    def instant_count(self) -> int:
        return int(np.count_nonzero(self.slices.instant))

    def flow_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Every arrow's source row and target row, as two columns in the arrows' order."""
        count = len(self.flows)
        return (np.fromiter(map(_SOURCE, self.flows), np.int64, count),
                np.fromiter(map(_TARGET, self.flows), np.int64, count))

    def args_texts(self, rows: np.ndarray) -> list[Optional[bytes]]:
        """The args of many slices, in their order, read in one pass over the store."""
        return self.args.texts(self.slices.args[rows].tolist())

    def args_labels(self, rows: np.ndarray, rule: LabelRule) -> list[Optional[str]]:
        """rule.label(args text) for many slices, in their order (None for slices without args)."""
        return self.args.labels(self.slices.args[rows].tolist(), rule)

    def keep_slices(self, kept: np.ndarray) -> None:
        """Keep the slices where `kept` (a mask), and the arrows and arrow ends between them."""
        self.slices.keep(kept)
        new_rows = renumbering(kept)
        self.flows, self.flow_ends = self._arrows_renumbered(new_rows)
        self.derived_args = self.derived_args.renumbered(new_rows)
        self.launch_keys = self.launch_keys.kept(kept)

    def subset(self, kept: np.ndarray) -> "Trace":
        """A trace of the slices where `kept` (a mask), in order, with the arrows and arrow ends
        between them; everything else shared with this one."""
        new_rows = renumbering(kept)
        flows, flow_ends = self._arrows_renumbered(new_rows)
        return msgspec.structs.replace(self, slices=self.slices.take(np.flatnonzero(kept)), flows=flows,
                                       flow_ends=flow_ends, derived_args=self.derived_args.renumbered(new_rows),
                                       launch_keys=self.launch_keys.kept(kept))

    def _arrows_renumbered(self, new_rows: np.ndarray) -> tuple[list[Flow], list[FlowEnd]]:
        """The arrows and arrow ends whose slices have a new row (-1: none), on those rows."""
        new_row = new_rows.tolist()
        flows = [Flow(new_row[flow.source], new_row[flow.target], flow.category) for flow in self.flows
                 if new_row[flow.source] >= 0 and new_row[flow.target] >= 0]
        return flows, [FlowEnd(new_row[end.row], end.flow_id, end.outgoing) for end in self.flow_ends
                       if new_row[end.row] >= 0]

    def shift_clock(self, offset: int) -> None:
        """Every slice, instant and counter sample `offset` ns later: the rank's clock set to the
        others' (durations and order untouched)."""
        self.slices.shift(offset)
        for sample in self.counters:
            sample.ts += offset

    def add_track(self, track: Track) -> Track:
        self.tracks.append(track)
        return track
