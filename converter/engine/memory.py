"""Memory over time: each device's allocated and reserved bytes as counters, from the
`[memory]` instants Kineto writes with `profile_memory=True`.

The instants stay where they are; the counters are derived series beside them (model/derived.py):
per device, "allocated" from each event's `Total Allocated`, "reserved" from its `Total
Reserved`. Traces from before Kineto wrote totals (2021) carry only each event's `Bytes`:
there allocated is their running sum per device from the trace's first memory event, so it
counts from what was allocated before the capture (or the window), and no reserved counter is
made. Where several events share a timestamp, the last one's total holds at that time (which is
last is told from the events' totals, as _last_at_each_time says). A GPU's
counters sit in that GPU's row group (its lanes' container once compacted, folded under its
memory lane; else its process), the CPU's (device -1) in the process whose thread recorded them.
"""

from __future__ import annotations

from itertools import repeat
from typing import Optional

import msgspec
import numpy as np

from ..kineto import CPU_DEVICE, GPU_CATEGORIES, MEMORY_EVENT, device_name
from ..model import CounterSample, CounterScale, LaneKind, Process, Trace, Track, TrackRole
from ..model.args import decode_json
from ..model.columns import first_positions


class _MemoryArgs(msgspec.Struct):
    """The args of a `[memory]` instant that the counters read; absent totals stay None."""

    device: Optional[int] = msgspec.field(default=None, name="Device Id")
    allocated: Optional[float] = msgspec.field(default=None, name="Total Allocated")
    reserved: Optional[float] = msgspec.field(default=None, name="Total Reserved")
    bytes: Optional[float] = msgspec.field(default=None, name="Bytes")


_DECODER = msgspec.json.Decoder(_MemoryArgs)


def add_memory_counters(trace: Trace) -> int:
    """Add each device's allocated (and, where totals are written, reserved) counter; returns
    how many counter tracks were made."""
    table = trace.slices
    rows = table.named(MEMORY_EVENT.__eq__)
    rows = rows[table.instant[rows]]
    if not len(rows):
        return 0
    events = [_decoded(text) for text in trace.args_texts(rows)]
    # A Device Id that is no device (absent, below -1, past int32) counts for none.
    device = np.array([args.device if args.device is not None and CPU_DEVICE <= args.device < 1 << 31 else -2
                       for args in events], np.int64)
    allocated, reserved, sizes = (np.array([np.nan if value is None else value for value in values], np.float64)
                                  for values in zip(*((a.allocated, a.reserved, a.bytes) for a in events)))
    processes = [_process_of(track) for track in table.tracks_of(rows)]
    homes = _gpu_homes(trace)
    made = 0
    # One series per device and recording process: devices in order, processes as they first come.
    process_code = first_positions(map(id, processes), len(processes))[0]
    keys = dict.fromkeys((d, code) for d, code in zip(device.tolist(), process_code.tolist()) if d >= CPU_DEVICE)
    for number, code in sorted(keys):
        mine = np.flatnonzero((device == number) & (process_code == code))
        process = processes[code]
        parent, owner = homes.get(number, (None, process)) if number != CPU_DEVICE else (None, process)
        order = np.argsort(table.ts[rows[mine]], kind="stable")
        picked, times = mine[order], table.ts[rows[mine[order]]]
        totals = allocated[picked]
        series = [(TrackRole.MEMORY_ALLOCATED,
                   totals if not np.isnan(totals).any() else np.cumsum(np.nan_to_num(sizes[picked])))]
        if not np.isnan(reserved[picked]).any():
            series.append((TrackRole.MEMORY_RESERVED, reserved[picked]))
        last = _last_at_each_time(times, totals, sizes[picked])
        # An opened GPU shows a row per lane group and no more (compaction.py): allocated folds
        # under its memory lane (memcpy, memset) where it has one, reserved under allocated.
        shown_under = _memory_lane(trace, parent)
        for role, values in series:
            track = trace.add_track(_counter_track(trace, role, number, owner, parent))
            track.folded_under = shown_under
            if shown_under is not None:
                shown_under.orders_children = True
            shown_under = track if parent is not None else None
            trace.counters.extend(map(CounterSample, times[last].tolist(), values[last].tolist(), repeat(track)))
            made += 1
    return made


def _last_at_each_time(times: np.ndarray, totals: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per distinct time (`times` sorted), the position of its last event. The model's order
    among events at one time comes from their content, not the file (model/canonical.py), so
    the last is found from content too: each event's total is the one before it plus its
    Bytes, and the last is the one whose total no other event there started from. Where
    that names no single event (no totals, or a chain that does not add up), the last in the
    model's order; running sums of Bytes need none."""
    ends = np.append(times[1:] != times[:-1], True)
    last = np.flatnonzero(ends)
    starts = np.append(0, last[:-1] + 1)
    for at in np.flatnonzero(last > starts).tolist():  # ties are rare: a loop over them alone
        group = range(int(starts[at]), int(last[at]) + 1)
        started_from = [totals[i] - sizes[i] for i in group]
        ending = [i for i in group if not any(totals[i] == before for j, before in zip(group, started_from) if j != i)]
        if len(ending) == 1:
            last[at] = ending[0]
    return last


def _decoded(text: Optional[bytes]) -> _MemoryArgs:
    """An event's memory args; an event whose args are not such numbers counts for no device."""
    if text is None:
        return _MemoryArgs()
    try:
        return _DECODER.decode(text)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return _MemoryArgs()


def _process_of(track: Track) -> Optional[Process]:
    return track.thread.process if track.thread is not None else track.process


def _gpu_homes(trace: Trace) -> dict[int, tuple[Optional[Track], Optional[Process]]]:
    """Per GPU device (the `device` arg Kineto gives every GPU slice), the row group its
    counters join: its lanes' container where compaction made one, else its process. One
    slice per (process, container) is read, not every GPU slice."""
    table = trace.slices
    keys, homes = table.track_keys(lambda track: (track.parent if track.role is TrackRole.LANE else None,
                                                  _process_of(track)))
    on_gpu = np.flatnonzero(table.in_categories(GPU_CATEGORIES) & (keys[table.track] >= 0))
    home_of = keys[table.track[on_gpu]]
    codes, first = np.unique(home_of, return_index=True)
    found: dict[int, tuple[Optional[Track], Optional[Process]]] = {}
    for code, text in zip(codes.tolist(), trace.args_texts(on_gpu[first])):
        args = decode_json(text) if text is not None else None
        device = args.get("device") if isinstance(args, dict) else None
        if isinstance(device, int) and not isinstance(device, bool) and device not in found:
            found[device] = homes[code]
    return found


def _memory_lane(trace: Trace, container: Optional[Track]) -> Optional[Track]:
    """The first shown lane of a memory lane group (memcpy, memset) in a GPU's container."""
    return next((track for track in trace.tracks if track.parent is container and container is not None
                 and track.role is TrackRole.LANE and track.folded_under is None
                 and track.group is not None and track.group.kind is LaneKind.MEMORY), None)


def _counter_track(trace: Trace, role: TrackRole, device: int, process: Optional[Process],
                   parent: Optional[Track]) -> Track:
    """A memory counter's row, after its row group's other rows; allocated and reserved of one
    device on one y scale, so their heights compare."""
    what = "allocated" if role is TrackRole.MEMORY_ALLOCATED else "reserved"
    last = max((track.order for track in trace.tracks if parent is not None and track.parent is parent), default=0)
    return Track(name=f"{device_name(device)} memory {what}", process=process, parent=parent,
                 order=last + 1 if parent is not None else 0, is_counter=True, role=role, device=device,
                 scale=CounterScale(unit="bytes", shared_by=f"memory {device_name(device)}"))
