"""The track-roles document: what each track cgtrace wrote is for, kept as data in the trace.

This module is the contract's one home: the Perfetto writer encodes it here and every reader
(report, the answers across ranks, tests) finds and decodes it here, so queries never read
roles from display names. The writer stores one document per written trace (a merge writes
one per rank) as a ChromeEventBundle metadata entry named NAME; trace_processor keeps those
in its `metadata` table as "cr-cgtrace_track_roles", later ones "cr-<k>-cgtrace_track_roles",
and SQL finds them all in the order written. The value is JSON:

    {"version": 1,
     "tracks": [{"uuid", "role", "group", "label", "kind", "home", "layer", "device", "stream"}],
     "rank": {"pp_rank", "global_rank", "groups", "pipeline", "clock": {"offset_ns", "uncertainty_ns", "evidence"},
              "title"}}

A track's uuid is its `trace_id` arg in trace_processor (`track.source_arg_set_id`). Only
tracks with a role other than plain are listed; "group", "label" and "kind" are a lane's
group, "home" the lane (or track) an annotation row or overlap track belongs to and "layer"
its depth there, "device" a memory counter's device (-1: the CPU; engine/memory.py), "stream" a
queue depth counter's stream (engine/waits.py), each left out where it does not apply. A merge's pipeline root writes a document of its own with no "rank": its critical path rows
(role "critical_path", engine/critical_path.py). "rank" is there for a merged rank or
a converted or compacted trace that names its rank; "groups" are the uuids of the rows that
stand for a merged rank's processes (their children are its threads' rows); "clock" (a merge that
moved its ranks' clocks) how far the rank's times were moved, known to within how much
(null: a one-sided bound, or nothing), from which evidence (counts by kind); "title" the rank's
one name, as the UI, the report and SQL (tp/tables.py) name it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import msgspec

from ..errors import CgtraceError
from .trace import LaneGroup, LaneKind, Process, Trace, Track, TrackRole

NAME = "cgtrace_track_roles"
# trace_processor prefixes the name of a ChromeEventBundle metadata entry with "cr-" (and the
# bundle's index for every bundle after the first).
SQL = f"select str_value from metadata where name glob 'cr-*{NAME}' order by id"
VERSION = 1


class TrackEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One track's role; fields in the order written, those at their default left out."""

    uuid: int
    role: TrackRole
    group: Optional[str] = None
    label: Optional[str] = None
    kind: Optional[LaneKind] = None
    home: Optional[int] = None
    layer: int = 0
    device: Optional[int] = None  # a memory counter's device (-1: the CPU)
    stream: Optional[int] = None  # a queue depth counter's stream

    def __post_init__(self) -> None:
        """A lane group is whole or absent (checked on decoding too)."""
        if (self.group is None) != (self.label is None) or (self.group is None) != (self.kind is None):
            raise ValueError("a lane group needs its group, label and kind together")

    @property
    def lane_group(self) -> Optional[LaneGroup]:
        if self.group is None or self.label is None or self.kind is None:
            return None
        return LaneGroup(self.group, self.label, self.kind)


class ClockEntry(msgspec.Struct, frozen=True):
    """How a merge set the rank's clock (model.ClockPlacement)."""

    offset_ns: int
    uncertainty_ns: Optional[int]
    evidence: dict[str, int]


class RankEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """Which rank the document's tracks belong to, the uuids of its rows' groups, whether a PP group
    orders the ranks, and its clock."""

    pp_rank: int
    global_rank: int
    groups: tuple[int, ...]
    pipeline: bool = True  # whether a PP group orders the ranks: how the rank is named
    clock: Optional[ClockEntry] = None
    title: Optional[str] = None  # the rank's one name (RankIdentity.title), for SQL that names ranks


class RolesDocument(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="version", tag=VERSION):
    """One written trace's (or merged rank's) roles; the tag writes "version" first."""

    tracks: tuple[TrackEntry, ...]
    rank: Optional[RankEntry] = None


class _Versioned(msgspec.Struct):
    """Only the version, read before the rest so a document of another version is named as such."""

    version: int


_ENCODER = msgspec.json.Encoder()
_VERSION_DECODER = msgspec.json.Decoder(_Versioned)
_DECODER = msgspec.json.Decoder(RolesDocument)


def document_of(trace: Trace, track_uuid: Callable[[Track], int],
                process_uuid: Callable[[Process], int]) -> Optional[RolesDocument]:
    """The roles of a trace's tracks under the uuids its writer gave them; None where there is
    nothing to say (no roles, no rank)."""
    tracks = tuple(_entry(track, track_uuid) for track in trace.tracks if track.role is not TrackRole.PLAIN)
    if trace.rank is None:
        return RolesDocument(tracks) if tracks else None
    groups = tuple(process_uuid(process) for process in trace.processes if process.row_group)
    placed = trace.rank.clock
    clock = None if placed is None else ClockEntry(placed.offset_ns, placed.uncertainty_ns, dict(placed.evidence))
    return RolesDocument(tracks, RankEntry(trace.rank.pp_rank, trace.rank.global_rank, groups,
                                             trace.rank.in_pipeline, clock, trace.rank.title))


def _entry(track: Track, track_uuid: Callable[[Track], int]) -> TrackEntry:
    group = track.group
    home = None if track.home is None else track_uuid(track.home)
    if group is None:
        return TrackEntry(track_uuid(track), track.role, home=home, layer=track.layer, device=track.device,
                          stream=track.stream)
    return TrackEntry(track_uuid(track), track.role, group.id, group.label, group.kind, home, track.layer,
                      track.device, track.stream)


def encode(document: RolesDocument) -> str:
    return _ENCODER.encode(document).decode()


def decode(text: str, source: Path) -> RolesDocument:
    """A document as written, or a CgtraceError naming `source` that says what to do."""
    try:
        version = _VERSION_DECODER.decode(text).version
        if version != VERSION:
            raise CgtraceError(
                f"{source}: its track roles ({NAME}) are version {version}, but this cgtrace reads version "
                f"{VERSION}: read it with the cgtrace version that wrote it (upgrade cgtrace if that one is "
                f"newer), or write the trace again from its profiler output with this one")
        document = _DECODER.decode(text)
        if any(track.role is TrackRole.LANE and track.group is None for track in document.tracks):
            raise msgspec.ValidationError("a lane without its lane group")  # what every reader relies on
        return document
    except msgspec.DecodeError as error:  # malformed JSON, or a field missing or of the wrong type
        raise CgtraceError(f"{source}: its track roles ({NAME}) are not a version-{VERSION} document ({error}); "
                           "write the trace again from its profiler output with this cgtrace") from None
