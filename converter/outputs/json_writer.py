"""Trace model -> Chrome trace-event JSON, for tools that read nothing else.

The output loads in trace_processor (v52, the oldest the project supports) with no slice
dropped, every slice's ts and dur exact to the nanosecond, and one flow per model Flow between
the right slices. What v52's JSON importer does, measured, and how the writer meets it:

Time. `ts`/`dur` are microseconds. trace_processor multiplies an integer `ts` out exactly but
overflows on a 19-digit one; a `ts` with a fraction goes through a double and comes back exact
only below 2**51 ns (about 26 days): an absolute stamp such as 1712195495519695.812 us reads as
...695872 ns. `displayTimeUnit` and `baseTimeNanoseconds` are ignored (the first only counted
in `stats`). So times are written relative to a base, as "<us>.<3 digits>" made by integer
formatting (never float arithmetic), and the base goes in the `baseTimeNanoseconds` header that
Kineto uses: absolute ns = baseTimeNanoseconds + ts * 1000, which `cgtrace` itself reads back
exactly. The base is 0 when every time fits (trace_processor then shows absolute ns), else the
start of the second the trace begins in. A trace spanning more than 2**51 ns is refused.

Tracks. Every track with slices becomes one thread (tid) of its process: a thread track keeps its
thread's tid and name, other tracks (lanes, annotation rows, overlap, process-scoped, async
tracks) get fresh int32 tids named after the track, and tracks of no process go in one synthetic
process. `thread_sort_index` orders a process's rows: its real threads first, then the other
tracks by their parent chain's `order`s (lanes and annotation rows as compaction ranked them), an
overlap track right after its home. v52 ignores sort indices (newer versions and other JSON
tools use them). trace_processor drops a complete event that partially overlaps another on its
thread, so a track whose slices do not nest gets extra "(overlap N)" tids instead.

Slices are `X` events and instants `i` with `"s":"t"`, written per tid in nesting order (v52
sorts by ts, longer first, then file order). Args pass through as raw JSON text, verbatim;
dicts are encoded with msgspec. trace_processor puts them under `args.<key>` (a "." inside a
key kept; nulls, and in arrays the index of a null, skipped); its JSON number parser is not
correctly rounded: a few in a hundred random decimals (about 1 in 1000 float args of real Kineto
traces) read one ulp off, and decimals with 20 or more digits read badly wrong. Integers,
strings and bools are exact; exact floats need the protobuf output. A slice named "" reads as
"[No name]". Counter samples are `C` events, integral values written as integers (exact);
trace_processor names the track "<name> <arg key>", so the track name is split at its first
space. The input's `displayTimeUnit` is dropped (older trace_processors scaled times by it).

Flows. v52 binds a v1 flow event (`s`, and `f` with `"bp":"e"`) to the slice on top of its
thread's stack when the event is processed: the last slice begun there, even one that has
already ended; at equal ts, slices are begun before flow events, and flow events keep their file
order. An `f` without `bp` binds to the next slice begun on its thread. v2 (`bind_id` with
`flow_out`/`flow_in` on an `X` event) binds to that event's own slice, but an event carries one
bind id, so a slice cannot start one arrow and end another; v1 and v2 ids share one space (v1
ids are numbered from 0), so v2 ids start at 2**62. trace_processor stores every arrow from the
slice that starts first, whichever way it was written (the protobuf output reads the same).
So every arrow gets its own v1 id (a reused id would chain arrows), with `s` and `f` at times
where that binding picks the right slices; where no such time exists (an end with a child
beginning at the same ts), the arrow uses v2; where neither can (rare: a slice that would need
two v2 roles), its ends move to a row of their own beside their track, "<track> (flow ends)".
One flow per model Flow, between the right slices, checked on generated and adversarial traces.
"""

from __future__ import annotations

from collections import defaultdict
from typing import BinaryIO, Optional

import msgspec
import numpy as np

from ..errors import CgtraceError
from ..model import Process, Trace, Track, TrackRole
from ..model.columns import grouped_in_order
from ..model.ids import IdSpace
from ..model.nesting import fits_nested, nested_layers
from ..tuning import DEFAULT_TUNING, Tuning

GLOBAL_PROCESS_NAME = "Global tracks"
EXACT_LIMIT_NS = 1 << 51       # trace_processor reads "<us>.<3 digits>" exactly below this
V2_BIND_ID_BASE = 1 << 62      # above every v1 flow id trace_processor hands out
_SECOND_NS = 1_000_000_000
_FRESH_ID_START = 1 << 24
_HEADER_KEYS_WRITTEN = frozenset(("traceEvents", "baseTimeNanoseconds", "displayTimeUnit"))
_encode = msgspec.json.Encoder().encode


def write_chrome_json(trace: Trace, stream: BinaryIO) -> None:
    """Write `trace` to `stream` as Chrome trace-event JSON, in chunks."""
    ChromeJsonWriter(stream).write(trace)


class _Row:
    """One output thread: a track, or one layer of a track whose slices do not nest."""

    __slots__ = ("track", "layer", "name", "pid", "tid", "slices", "key", "companion")

    def __init__(self, track: Track, layer: int, name: str, pid: int, slices: np.ndarray):
        self.track, self.layer, self.name, self.pid = track, layer, name, pid
        self.tid = 0
        self.companion = 0   # > 0: a row of flow ends moved off the row of (track, layer)
        self.slices = slices  # rows of the trace's SliceTable, in the order written
        self.key: tuple = ()


class _Endpoint:
    """Where a flow endpoint lands: its row, its slice's start and kind, and the start of the
    slices begun just before and just after it on that row (trace_processor's processing order)."""

    __slots__ = ("row", "ts", "is_instant", "previous_ts", "next_ts", "order")

    def __init__(self, row: _Row, ts: int, is_instant: bool, previous_ts: Optional[int], next_ts: Optional[int],
                 order: tuple):
        self.row, self.ts, self.is_instant = row, ts, is_instant
        self.previous_ts, self.next_ts = previous_ts, next_ts
        self.order = order  # where trace_processor processes it: (ts, -dur), then file order


class ChromeJsonWriter:
    def __init__(self, stream: BinaryIO, tuning: Tuning = DEFAULT_TUNING):
        self.stream = stream
        self.tuning = tuning
        self._flush_bytes = tuning.flush_bytes
        self.buffer = bytearray()
        self.first_event = True
        self.strings: dict[str, bytes] = {}
        self.base_ns = 0
        # Filled by write(): what the output holds.
        self.summary: dict = {}

    def write(self, trace: Trace) -> dict:
        """Write the whole document; returns figures (time base, rows, flows by binding)."""
        self.base_ns = _time_base(trace)
        ids = _OutputIds(trace)
        rows, processes, pids, position = self._layout(trace, ids)
        endpoints = _endpoints(trace, rows)
        v1_flows, v2_fields, flow_counts, stuck = _plan_flows(trace, endpoints)
        if stuck:
            # Arrows neither flow version can bind: their ends move to rows of their own,
            # where each is the last slice begun at its start, so v1 binds them all.
            rows = _isolate(trace, rows, stuck, ids)
            endpoints = _endpoints(trace, rows)
            v1_flows, v2_fields, flow_counts, stuck = _plan_flows(trace, endpoints)
            if stuck:
                raise CgtraceError(f"self-check failed: {len(stuck)} flow ends cannot be bound in Chrome JSON; "
                                   "nothing was written. Please report this with the input trace")
        flow_counts["flow_end_rows"] = sum(row.companion > 0 for row in rows)
        # Half-arrows agreed with another writer (a merge's cross-rank arrows) need that
        # writer's half in the same file; a single JSON document cannot hold them.
        flow_counts["flow_ends_not_written"] = len(trace.flow_ends)
        _sort_keys(rows, position)

        self._header(trace)
        self._metadata(rows, processes, pids)
        self._slices(trace, rows, v2_fields)
        self._counters(trace, pids)
        self._flows(v1_flows)
        self.buffer += b"\n]}\n"
        self._flush()
        self.summary = {"json_base_time_ns": self.base_ns, "json_rows": len(rows), **flow_counts}
        return self.summary

    # -- layout: rows, pids, tids, order --------------------------------------------------
    def _layout(self, trace: Trace, ids: "_OutputIds"):
        """Rows (one per track with slices, more where slices do not nest) with pids, tids and
        display keys; every process that gets a row or a counter gets its pid."""
        by_track = _rows_by_track(trace)
        position = {track: index for index, track in enumerate(trace.tracks)}
        for track in by_track:  # a track missing from trace.tracks still gets its row
            position.setdefault(track, len(position))

        processes: list[Optional[Process]] = list(trace.processes)
        known = {id(p) for p in processes}
        for track in [*by_track, *(sample.track for sample in trace.counters)]:
            process = _process_of(track)
            if id(process) not in known:   # None (the synthetic process) included
                known.add(id(process))
                processes.append(process)
        pids = {id(p): ids.pid(p.pid) for p in processes if p is not None}
        if None in processes:
            pids[id(None)] = ids.pid(None)

        threads_placed: set[int] = set()
        rows: list[_Row] = []
        for track in sorted(by_track, key=position.__getitem__):
            pid = pids[id(_process_of(track))]
            name = _row_name(track)
            for layer, slices in enumerate(nested_layers(trace.slices, by_track[track], self.tuning)):
                row = _Row(track, layer, name if layer == 0 else f"{name} (overlap {layer})", pid, slices)
                thread = track.thread
                if layer == 0 and thread is not None and id(thread) not in threads_placed:
                    threads_placed.add(id(thread))
                    row.tid = ids.tid(thread.tid)
                else:
                    row.tid = ids.tid(None)
                rows.append(row)
        return rows, processes, pids, position

    # -- events -----------------------------------------------------------------------------
    def _header(self, trace: Trace) -> None:
        self.buffer += b'{"baseTimeNanoseconds":%d' % self.base_ns
        for key, value in trace.metadata.items():
            if key not in _HEADER_KEYS_WRITTEN:
                self.buffer += b"," + _encode(key) + b":" + _encode(value)
        self.buffer += b',"traceEvents":['

    def _metadata(self, rows: list[_Row], processes: list, pids: dict) -> None:
        for process in processes:
            if process is None:
                self._process_metadata(pids[id(None)], GLOBAL_PROCESS_NAME, [], None)
            else:
                self._process_metadata(pids[id(process)], process.display_name, process.labels, process.sort_index)
        by_pid: dict[int, list[_Row]] = defaultdict(list)
        for row in rows:
            by_pid[row.pid].append(row)
        for pid, members in by_pid.items():
            members.sort(key=lambda r: r.key)
            for rank, row in enumerate(members):
                self._event(b'{"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":%s}}'
                            % (pid, row.tid, _encode(row.name)))
                self._event(b'{"ph":"M","name":"thread_sort_index","pid":%d,"tid":%d,"args":{"sort_index":%d}}'
                            % (pid, row.tid, rank))

    def _process_metadata(self, pid: int, name: str, labels: list, sort_index: Optional[int]) -> None:
        self._event(b'{"ph":"M","name":"process_name","pid":%d,"tid":%d,"args":{"name":%s}}'
                    % (pid, pid, _encode(name)))
        if labels:
            self._event(b'{"ph":"M","name":"process_labels","pid":%d,"tid":%d,"args":{"labels":%s}}'
                        % (pid, pid, _encode(",".join(labels))))
        if sort_index is not None:
            self._event(b'{"ph":"M","name":"process_sort_index","pid":%d,"tid":%d,"args":{"sort_index":%d}}'
                        % (pid, pid, sort_index))

    def _slices(self, trace: Trace, rows: list[_Row], v2_fields: dict[int, bytes]) -> None:
        """Every row's slices, in its order; a row's columns are read a chunk at a time."""
        table = trace.slices
        starts, durations, names, categories, args, instants = (
            table.ts, table.dur, table.name, table.cat, table.args, table.instant)
        # Per text id: its JSON string, and the category field it makes ("" writes none).
        encoded = [_encode(text) for text in table.texts]
        category_fields = [b',"cat":' + string if text else b"" for text, string in zip(table.texts, encoded)]
        buffer, base, args_text = self.buffer, self.base_ns, trace.args.text
        flush_bytes, rows_at_once = self._flush_bytes, self.tuning.json_rows_at_once
        for row in rows:
            # Every row's thread_name event came first, so each slice follows another event.
            instant_head = b',\n{"pid":%d,"tid":%d,"ph":"i","s":"t","ts":%%d.%%03d,"name":' % (row.pid, row.tid)
            complete_head = b',\n{"pid":%d,"tid":%d,"ph":"X","ts":%%d.%%03d,"dur":%%d.%%03d,"name":' % (
                row.pid, row.tid)
            for at in range(0, len(row.slices), rows_at_once):
                chunk = row.slices[at:at + rows_at_once]
                for slice_row, start, dur, name, category, reference, instant in zip(
                        chunk.tolist(), starts[chunk].tolist(), durations[chunk].tolist(), names[chunk].tolist(),
                        categories[chunk].tolist(), args[chunk].tolist(), instants[chunk].tolist()):
                    if instant:
                        event = instant_head % divmod(start - base, 1000)
                    else:
                        event = complete_head % (divmod(start - base, 1000) + divmod(dur, 1000))
                    event += encoded[name] + category_fields[category]
                    if reference >= 0:
                        text = args_text(reference).strip()
                        if text[:1] == b"{" and len(text) > 2:
                            event += b',"args":' + text
                    extra = v2_fields.get(slice_row)
                    if extra is not None:
                        event += extra
                    buffer += event + b"}"
                    if len(buffer) >= flush_bytes:
                        self._flush()

    def _counters(self, trace: Trace, pids: dict) -> None:
        prefixes: dict[int, bytes] = {}
        for sample in trace.counters:
            track = sample.track
            prefix = prefixes.get(id(track))
            if prefix is None:
                pid = pids[id(_process_of(track))]
                series, _, key = track.name.partition(" ")
                prefix = prefixes[id(track)] = b'{"ph":"C","pid":%d,"tid":%d,"name":%s,"args":{%s:' % (
                    pid, pid, _encode(series), _encode(key or "value"))
            self._event(prefix + _number(sample.value) + b'},"ts":' + self._time(sample.ts) + b"}")

    def _flows(self, v1_flows: list[tuple]) -> None:
        """One v1 id per arrow (a reused id would chain arrows); `s` right before its `f`, as
        at equal ts trace_processor takes flow events in file order."""
        if not v1_flows:
            return
        buffer, base, string, flush_bytes = self.buffer, self.base_ns, self._string, self._flush_bytes
        template = (b',\n{"ph":"s","id":%d,"pid":%d,"tid":%d,"ts":%d.%03d,"cat":%s,"name":%s}'
                    b',\n{"ph":"f","id":%d,"pid":%d,"tid":%d,"ts":%d.%03d,"cat":%s,"name":%s%s}')
        for flow_id, (category, first, second, flow_ts, enclosing) in enumerate(v1_flows, 1):
            cat = string(category)
            source, target = first.row, second.row
            start_us, start_ns = divmod(first.ts - base, 1000)
            end_us, end_ns = divmod(flow_ts - base, 1000)
            buffer += template % (flow_id, source.pid, source.tid, start_us, start_ns, cat, cat,
                                  flow_id, target.pid, target.tid, end_us, end_ns, cat, cat,
                                  b',"bp":"e"' if enclosing else b"")
            if len(buffer) >= flush_bytes:
                self._flush()

    def _event(self, event: bytes) -> None:
        if self.first_event:
            self.buffer += b"\n" + event
            self.first_event = False
        else:
            self.buffer += b",\n" + event
        if len(self.buffer) >= self._flush_bytes:
            self._flush()

    def _string(self, text: str) -> bytes:
        encoded = self.strings.get(text)
        if encoded is None:
            encoded = self.strings[text] = _encode(text)
        return encoded

    def _time(self, ts: int) -> bytes:
        return _us(ts - self.base_ns)

    def _flush(self) -> None:
        self.stream.write(self.buffer)
        self.buffer.clear()


def _us(ns: int) -> bytes:
    """Integer ns (>= 0) -> exact microsecond text, by integer formatting only."""
    return b"%d.%03d" % divmod(ns, 1000)


def _number(value: float) -> bytes:
    """A counter value as JSON; integral values as integers (read exactly), +-inf as the
    strings trace_processor converts back, NaN (not valid JSON) as null."""
    if value != value:
        return b"null"
    if value in (float("inf"), float("-inf")):
        return b'"inf"' if value > 0 else b'"-inf"'
    if float(value).is_integer() and abs(value) < 2 ** 53:
        return b"%d" % int(value)
    return _encode(float(value))


def _time_base(trace: Trace) -> int:
    firsts: list[int] = []
    lasts: list[int] = []
    table = trace.slices
    if len(table):
        starts = table.ts
        firsts.append(int(starts.min()))
        lasts.append(int(np.where(table.instant, starts, starts + table.dur).max()))
    if trace.counters:
        stamps = [sample.ts for sample in trace.counters]
        firsts.append(min(stamps))
        lasts.append(max(stamps))
    if not firsts:
        return 0
    first, last = min(firsts), max(lasts)
    base = 0 if first >= 0 and last < EXACT_LIMIT_NS else first - first % _SECOND_NS
    if last - base >= EXACT_LIMIT_NS:
        days = (last - first) / 86_400e9
        raise CgtraceError(f"the trace spans {days:.0f} days; Chrome JSON read by trace_processor holds "
                           f"nanoseconds exactly only within {EXACT_LIMIT_NS / 86_400e9:.0f} days. "
                           "Write the native Perfetto format instead")
    return base


def _process_of(track: Track) -> Optional[Process]:
    node: Optional[Track] = track
    while node is not None:
        if node.thread is not None:
            return node.thread.process
        if node.process is not None:
            return node.process
        node = node.parent
    return None


def _row_name(track: Track) -> str:
    return track.thread.display_name if track.thread is not None else track.name


def _rows_by_track(trace: Trace) -> dict[Track, np.ndarray]:
    """Each track's slices (rows, in row order), the tracks in the order of their first slice."""
    table = trace.slices
    return {table.tracks[track_id]: rows for track_id, rows in grouped_in_order(table.track)}


def _endpoints(trace: Trace, rows: list[_Row]) -> dict[int, _Endpoint]:
    """The endpoint of every slice (by row) that an arrow starts or ends at."""
    endpoints: dict[int, _Endpoint] = {}
    if not trace.flows:
        return endpoints
    table = trace.slices
    starts, durations, instants = table.ts, table.dur, table.instant
    wanted = np.zeros(len(table), np.bool_)
    wanted[[flow.source for flow in trace.flows]] = True
    wanted[[flow.target for flow in trace.flows]] = True
    for row_index, row in enumerate(rows):
        slices = row.slices
        positions = np.flatnonzero(wanted[slices])
        if not len(positions):
            continue
        last = len(slices) - 1
        picked = slices[positions]
        # The starts of the slices just before and after each endpoint's on its row.
        before = starts[slices[np.maximum(positions - 1, 0)]].tolist()
        after = starts[slices[np.minimum(positions + 1, last)]].tolist()
        for index, slice_row, start, dur, instant, previous, following in zip(
                positions.tolist(), picked.tolist(), starts[picked].tolist(), durations[picked].tolist(),
                instants[picked].tolist(), before, after):
            endpoints[slice_row] = _Endpoint(row, start, instant, previous if index else None,
                                             following if index < last else None, (start, -dur, row_index, index))
    return endpoints


def _plan_flows(trace: Trace, endpoints: dict[int, _Endpoint]):
    """How each arrow is written: (v1 arrows as (category, first, second, `f` ts, `f` binds
    the enclosing slice), v2 fields per row, counts by binding, rows of the slices to isolate
    for arrows that neither version can bind as they lie).

    trace_processor reports every arrow from the slice that starts first (at equal starts, from
    the one bound first), so each arrow is planned from that slice, `first`, to the other,
    `second`: the result is the same, and `second` never begins before `first`.
    """
    v1: list[tuple] = []
    v2_slot: dict[int, tuple] = {}  # row -> ("out", bind id) or ("in", bind id)
    v2_out_ids: dict[int, int] = {}
    counts = {"flows_v1": 0, "flows_v1_next_slice": 0, "flows_v2": 0}
    stuck: set[int] = set()
    for flow in trace.flows:
        first, second = flow.source, flow.target
        if endpoints[second].ts < endpoints[first].ts:
            first, second = second, first
        at_first, at_second = endpoints[first], endpoints[second]
        start, end = at_first.ts, at_second.ts
        # An `s` at `first`'s start binds to it unless another slice begins with it later on
        # its row (a child starting at the same ts).
        first_bindable = at_first.next_ts is None or at_first.next_ts > start
        if at_second.next_ts is None or at_second.next_ts > end:
            enclosing, flow_ts = True, end   # likewise an `f` with "bp":"e" at `second`'s start
        else:
            # An `f` without "bp" binds to the next slice begun on its row: `second`, if the
            # `f` comes after the slice begun before `second`, and before `second`. (Strictly
            # after: Chrome's rule, which cgtrace's reader follows, also takes a slice
            # beginning at the `f`'s ts.)
            enclosing = False
            previous = at_second.previous_ts
            flow_ts = start if previous is None else max(start, previous + 1)
        second_bindable = enclosing or flow_ts < end
        if first_bindable and second_bindable:
            counts["flows_v1" if enclosing else "flows_v1_next_slice"] += 1
            v1.append((flow.category, at_first, at_second, flow_ts, enclosing))
            continue
        # v2: bound to the X events' own slices (not instants'); `first` must be processed
        # first, and an event carries one bind id: out to any number of arrows, or in.
        first_slot, second_slot = v2_slot.get(first), v2_slot.get(second)
        if at_first.order < at_second.order and second_slot is None and \
                (first_slot is None or first_slot[0] == "out") and \
                not at_first.is_instant and not at_second.is_instant:
            bind_id = v2_out_ids.get(first)
            if bind_id is None:
                bind_id = v2_out_ids[first] = V2_BIND_ID_BASE + len(v2_out_ids)
                v2_slot[first] = ("out", bind_id)
            v2_slot[second] = ("in", bind_id)
            counts["flows_v2"] += 1
            continue
        if not first_bindable:
            stuck.add(first)
        if not second_bindable:
            stuck.add(second)
    v2_fields = {key: b',"bind_id":%d,"flow_%s":true' % (bind_id, direction.encode())
                 for key, (direction, bind_id) in v2_slot.items()}
    return v1, v2_fields, counts, stuck


def _isolate(trace: Trace, rows: list[_Row], stuck: set[int], ids: "_OutputIds") -> list[_Row]:
    """Move the given slices (rows) off their rows onto companion rows beside them, layered so
    that each nests properly and begins alone: each is then the last slice begun at its start."""
    table = trace.slices
    starts, durations, instants = table.ts, table.dur, table.instant
    is_stuck = np.zeros(len(table), np.bool_)
    is_stuck[list(stuck)] = True
    result: list[_Row] = []
    for row in rows:
        result.append(row)
        moving = is_stuck[row.slices]
        if not moving.any():
            continue
        moved = row.slices[moving]   # already in nesting order
        row.slices = row.slices[~moving]
        members: list[list[int]] = []     # per companion row, its slices
        open_ends: list[list[int]] = []   # per companion row, the ends of its open slices
        last_starts: list[int] = []       # per companion row, its last slice's start
        for slice_row, start, dur, instant in zip(moved.tolist(), starts[moved].tolist(), durations[moved].tolist(),
                                                  instants[moved].tolist()):
            for layer, ends in enumerate(open_ends):
                if last_starts[layer] != start and fits_nested(ends, start, start + dur):
                    last_starts[layer] = start
                    break
            else:
                layer = len(members)
                members.append([])
                open_ends.append([])
                last_starts.append(start)
            if not instant:
                open_ends[layer].append(start + dur)
            members[layer].append(slice_row)
        for layer, slices in enumerate(members):
            suffix = "" if layer == 0 else f" {layer + 1}"
            companion = _Row(row.track, row.layer, f"{row.name} (flow ends{suffix})", row.pid,
                             np.array(slices, np.int64))
            companion.companion = layer + 1
            companion.tid = ids.tid(None)
            result.append(companion)
    return result


def _sort_keys(rows: list[_Row], position: dict[Track, int]) -> None:
    """Display order within a process: real threads (by sort_index, then model order), then
    other tracks by their parent chain's orders; overlap tracks (layout's, by name, and this
    writer's) and rows of isolated flow ends right after their home."""
    def base_key(track: Track) -> tuple:
        thread = track.thread
        if thread is not None:
            return (0, (thread.sort_index is None, thread.sort_index or 0), position.get(track, 0))
        chain = []
        node: Optional[Track] = track
        while node is not None:
            chain.append(node.order)
            node = node.parent
        return (1, tuple(reversed(chain)), position.get(track, 0))

    for row in rows:
        track = row.track
        home = track.home if track.role is TrackRole.OVERLAP else None
        if home is not None:
            row.key = base_key(home) + (track.layer, row.layer, row.companion, position.get(track, 0))
        else:
            row.key = base_key(track) + (0, row.layer, row.companion, 0)


class _OutputIds:
    """pids and tids for the output: a model id is kept where valid (an int32; 0 only for a
    pid, as Kineto's GPU 0 has) and not yet taken, a fresh one is used otherwise;
    fresh ids never equal a pid or tid of the model."""

    def __init__(self, trace: Trace):
        avoid = {p.pid for p in trace.processes} | {t.tid for t in trace.threads}
        pids, tids = IdSpace(_FRESH_ID_START, avoid), IdSpace(_FRESH_ID_START, avoid)
        self.pid = lambda preferred: pids.claim(preferred, zero=True)
        self.tid = tids.claim
