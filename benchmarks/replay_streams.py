"""The shape cgtrace exists for, as a corpus kind: a CUDA-graph rank whose replays run on
thousands of streams, its events in the orders real exporters write them.

A CUDA graph's kernels run on streams of their own, and a long capture shows each replay's
work on streams the profiler numbers afresh: thousands of GPU threads, most short-lived.
`ReplayStreams` rewrites the generator's pipeline rank copy by copy (corpus.py tiles it):
every (replay, stream) pair of a copy, a replay being the kernels of one graph launch (one
correlation) and the GPU annotations that open on that stream before its next kernel, gets
the next of `streams` stream ids, cycling, so the tiled file has that many replay streams.
Events are time-sorted across streams (as Kineto and torch's exporter write them), and the
streams' thread_name and thread_sort_index metadata come first, last, or interleaved (each
right before its stream's first event, so nearly every event is on another stream than the
one before).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterator

FIRST_STREAM = 20  # the generator's first graph stream; lower ones are eager streams
PLACEMENTS = ("first", "last", "interleaved")


@dataclass(frozen=True)
class StreamShape:
    """How many replay streams, and where their metadata goes (PLACEMENTS)."""

    streams: int
    metadata: str


class ReplayStreams:
    """One source's timed events in time order, each graph-stream event with its replay
    serial within a copy (`serial_of[i]`, None for the rest)."""

    def __init__(self, timed: list[dict], shape: StreamShape):
        self.shape = shape
        self.events = sorted(timed, key=lambda event: event["ts"])  # stable: a kernel stays before its flow
        replay_of = [_correlation(event) for event in self.events]
        kernels: dict[tuple, list[tuple[float, int]]] = {}  # (pid, stream) -> [(ts, correlation)] in time order
        for event, replay in zip(self.events, replay_of):
            if replay is not None and _on_graph_stream(event):
                kernels.setdefault((event["pid"], event["tid"]), []).append((event["ts"], replay))
        serials: dict[tuple, int] = {}
        self.serial_of: list[int | None] = []
        for event, replay in zip(self.events, replay_of):
            if not _on_graph_stream(event):
                self.serial_of.append(None)
                continue
            stream = (event["pid"], event["tid"])
            if replay is None:  # an annotation: the replay of the stream's next kernel
                later = kernels.get(stream, [])
                at = bisect.bisect_left(later, (event["ts"], -1))
                replay = later[min(at, len(later) - 1)][1] if later else -1
            self.serial_of.append(serials.setdefault((stream, replay), len(serials)))
        self.per_copy = len(serials)
        self.devices = sorted({event["pid"] for event in self.events if _on_graph_stream(event)})
        self._seen: set[tuple[int, int]] = set()

    def stream(self, copy: int, serial: int) -> int:
        return FIRST_STREAM + (copy * self.per_copy + serial) % self.shape.streams

    def restreamed(self, events: list[dict], copy: int) -> Iterator[dict]:
        """`events` (this source's, in its time order, already shifted for `copy`) on their
        replay streams, each preceded by its stream's metadata where that is interleaved and
        the stream is new."""
        interleaved, seen = self.shape.metadata == "interleaved", self._seen
        for event, serial in zip(events, self.serial_of):
            if serial is None:
                yield event
                continue
            stream = self.stream(copy, serial)
            if interleaved and (event["pid"], stream) not in seen:
                seen.add((event["pid"], stream))
                yield from stream_metadata(event["pid"], stream)
            moved = dict(event, tid=stream)
            if isinstance(event.get("args"), dict) and "stream" in event["args"]:
                moved["args"] = dict(event["args"], stream=stream)
            yield moved

    def all_metadata(self) -> Iterator[dict]:
        """Every replay stream's metadata, on every GPU of the source."""
        for pid in self.devices:
            for stream in range(FIRST_STREAM, FIRST_STREAM + self.shape.streams):
                yield from stream_metadata(pid, stream)


def stream_metadata(pid: int, stream: int) -> tuple[dict, dict]:
    return ({"name": "thread_name", "ph": "M", "pid": pid, "tid": stream, "args": {"name": f"stream {stream}"}},
            {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": stream, "args": {"sort_index": stream}})


def kept_metadata(metadata: list[dict]) -> list[dict]:
    """The source's metadata less its graph streams' (replaced by the replay streams')."""
    return [event for event in metadata if not _on_graph_stream(event)]


def _on_graph_stream(event: dict) -> bool:
    """A GPU event (its pid a device index) on one of the generator's graph streams."""
    pid, tid = event.get("pid"), event.get("tid")
    return isinstance(tid, int) and tid >= FIRST_STREAM and isinstance(pid, int) and pid < FIRST_STREAM


def _correlation(event: dict) -> int | None:
    """The graph launch a GPU event belongs to: a kernel's args.correlation, a flow end's id."""
    if event.get("ph") == "f":
        return event.get("id")
    args = event.get("args")
    return args.get("correlation") if isinstance(args, dict) else None
