"""Building a trace model from any input: one process, thread and track per input identity.

A reader maps its input's own ids (ints or strings, repeated across GPUs) to model objects
through a TraceBuilder, which hands out unique int32 ids and creates each track once.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .args import ArgsStore
from .canonical import order_counters, order_slices, source_key
from .ids import IdSpace
from .trace import Process, Thread, Trace, Track, TrackRole

FIRST_FRESH_ID = 1 << 20


class TraceBuilder:
    """The identities of one trace being read, keyed by the input's own ids."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.args: ArgsStore = trace.args
        # One space for pids and tids, as on Linux (a pid is its main thread's tid): a stream's
        # tid 7 and GPU 7's pid 7 would otherwise be one thread to trace_processor.
        self._ids = IdSpace(FIRST_FRESH_ID)
        self._mains: set[int] = set()  # pids already given to their main thread
        self._processes: dict[Any, Process] = {}
        self._threads: dict[tuple[Any, Any], Thread] = {}
        self.thread_tracks: dict[tuple[Any, Any], Track] = {}
        self._process_tracks: dict[Any, Track] = {}
        self._async_tracks: dict[tuple[Any, ...], Track] = {}
        self._counter_tracks: dict[tuple[Any, ...], Track] = {}
        self._global_track: Optional[Track] = None
        self.strings: dict[str, str] = {}

    def process(self, source_pid: Any) -> Process:
        process = self._processes.get(source_pid)
        if process is None:
            # pid 0 (GPU 0's in Kineto) is kept: the UI titles a process "<name> <pid>", and
            # trace_processor takes it as upid 0, whose idle thread (tid 0) has no slices.
            process = Process(pid=self._ids.claim(source_pid, zero=True), source_pid=source_pid)
            self._processes[source_pid] = process
            self.trace.processes.append(process)
        return process

    def thread(self, source_pid: Any, source_tid: Any) -> Thread:
        key = (source_pid, source_tid)
        thread = self._threads.get(key)
        if thread is None:
            process = self.process(source_pid)
            # A stream id repeats on every GPU, but thread ids must be unique in the output; a
            # process's main thread (tid == pid in the input, or tid 0, which names no thread)
            # shares its pid.
            is_main = source_tid in (source_pid, 0) and process.pid != 0 and process.pid not in self._mains
            if is_main:
                self._mains.add(process.pid)
            thread = Thread(process=process, tid=process.pid if is_main else self._ids.claim(source_tid),
                            source_tid=source_tid, is_main=is_main)
            self._threads[key] = thread
            self.trace.threads.append(thread)
        return thread

    def thread_track(self, source_pid: Any, source_tid: Any) -> Track:
        key = (source_pid, source_tid)
        track = self.thread_tracks.get(key)
        if track is None:
            thread = self.thread(source_pid, source_tid)
            track = self.trace.add_track(Track(name="", process=thread.process, thread=thread))
            self.thread_tracks[key] = track
        return track

    def process_track(self, source_pid: Any) -> Track:
        """Where process-scoped instants go."""
        track = self._process_tracks.get(source_pid)
        if track is None:
            track = self.trace.add_track(Track(name="process-scoped instants", process=self.process(source_pid)))
            self._process_tracks[source_pid] = track
        return track

    def global_track(self) -> Track:
        """Where global instants go."""
        if self._global_track is None:
            self._global_track = self.trace.add_track(Track(name="Global instants", role=TrackRole.GLOBAL))
        return self._global_track

    def async_track(self, key: tuple[Any, ...], name: str) -> Track:
        """One track per async id (`key` starts with the source pid), named after its first slice."""
        track = self._async_tracks.get(key)
        if track is None:
            track = self.trace.add_track(Track(name=name, process=self.process(key[0])))
            self._async_tracks[key] = track
        return track

    def counter_track(self, source_pid: Any, series: str, key: str) -> Track:
        track_key = (source_pid, series, key)
        track = self._counter_tracks.get(track_key)
        if track is None:
            track = self.trace.add_track(Track(name=f"{series} {key}", process=self.process(source_pid),
                                               is_counter=True))
            self._counter_tracks[track_key] = track
        return track

    def put_in_canonical_order(self) -> dict[Track, int]:
        """Once every event is read: ids claimed, and processes, threads, tracks, slices and
        counter samples ordered, by content alone (canonical.py); each track's place."""
        processes = sorted(self._processes.items(), key=lambda item: source_key(item[0]))
        threads = sorted(self._threads.items(), key=lambda item: _keys(item[0]))
        self._ids, self._mains = IdSpace(FIRST_FRESH_ID), set()
        for source_pid, process in processes:
            process.pid = self._ids.claim(source_pid, zero=True)
        for (source_pid, source_tid), thread in threads:
            process = thread.process
            thread.is_main = source_tid in (source_pid, 0) and process.pid != 0 and process.pid not in self._mains
            if thread.is_main:
                self._mains.add(process.pid)
            thread.tid = process.pid if thread.is_main else self._ids.claim(source_tid)
        self.trace.processes[:] = [process for _, process in processes]
        self.trace.threads[:] = [thread for _, thread in threads]
        # Thread tracks in their threads' order, then the process-scoped, async and counter tracks
        # by their keys, then the global one.
        tracks = [self.thread_tracks[key] for key, _ in threads if key in self.thread_tracks]
        for keyed in (self._process_tracks, self._async_tracks, self._counter_tracks):
            tracks += [track for _, track in sorted(keyed.items(), key=lambda item: _keys(item[0]))]
        if self._global_track is not None:
            tracks.append(self._global_track)
        self.trace.tracks[:] = tracks
        place = {track: index for index, track in enumerate(self.trace.tracks)}
        table = self.trace.slices
        own = set(table.tracks)
        order_slices(table, [track for track in self.trace.tracks if track in own], self.args)
        self._name_async_tracks()
        order_counters(self.trace.counters, place)
        return place

    def _name_async_tracks(self) -> None:
        """An async track is named after its first slice: first in the canonical order."""
        table = self.trace.slices
        if not self._async_tracks or not len(table):
            return
        first = np.full(len(table.tracks), -1, np.int64)
        rows = np.arange(len(table))
        first[table.track[::-1]] = rows[::-1]  # the last write of each id wins: its first row
        ids = {track: index for index, track in enumerate(table.tracks)}
        names = table.name
        for track in self._async_tracks.values():
            index = ids.get(track)
            if index is not None and first[index] >= 0:
                track.name = table.texts[int(names[first[index]])]

    def intern(self, text: str) -> str:
        """One string object per distinct name or category."""
        return self.strings.get(text) or self.strings.setdefault(text, text)


def _keys(key: Any) -> tuple:
    """The sort key of a builder's key: one source id, or a tuple of them."""
    return tuple(map(source_key, key)) if type(key) is tuple else (source_key(key),)
