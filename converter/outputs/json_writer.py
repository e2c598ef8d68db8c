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

Tracks become threads as json_rows.py says; arrows are placed as json_flows.py says.
"""

from __future__ import annotations

from collections import defaultdict
from typing import BinaryIO, Optional

import msgspec
import numpy as np

from ..errors import CgtraceError
from ..model import Trace
from ..tuning import DEFAULT_TUNING, Tuning
from .json_flows import flow_endpoints, isolate, plan_flows
from .json_rows import OutputIds, Row, layout_rows, process_of, sort_keys

GLOBAL_PROCESS_NAME = "Global tracks"
EXACT_LIMIT_NS = 1 << 51       # trace_processor reads "<us>.<3 digits>" exactly below this
_SECOND_NS = 1_000_000_000
_HEADER_KEYS_WRITTEN = frozenset(("traceEvents", "baseTimeNanoseconds", "displayTimeUnit"))
_encode = msgspec.json.Encoder().encode


def write_chrome_json(trace: Trace, stream: BinaryIO) -> None:
    """Write `trace` to `stream` as Chrome trace-event JSON, in chunks."""
    ChromeJsonWriter(stream).write(trace)


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
        ids = OutputIds(trace)
        rows, processes, pids, position = layout_rows(trace, ids, self.tuning)
        endpoints = flow_endpoints(trace, rows)
        v1_flows, v2_fields, flow_counts, stuck = plan_flows(trace, endpoints)
        if stuck:
            # Arrows neither flow version can bind: their ends move to rows of their own,
            # where each is the last slice begun at its start, so v1 binds them all.
            rows = isolate(trace, rows, stuck, ids)
            endpoints = flow_endpoints(trace, rows)
            v1_flows, v2_fields, flow_counts, stuck = plan_flows(trace, endpoints)
            if stuck:
                raise CgtraceError(f"self-check failed: {len(stuck)} flow ends cannot be bound in Chrome JSON; "
                                   "nothing was written. Please report this with the input trace")
        flow_counts["flow_end_rows"] = sum(row.companion > 0 for row in rows)
        # Half-arrows agreed with another writer (a merge's cross-rank arrows) need that
        # writer's half in the same file; a single JSON document cannot hold them.
        flow_counts["flow_ends_not_written"] = len(trace.flow_ends)
        sort_keys(rows, position)

        self._header(trace)
        self._metadata(rows, processes, pids)
        self._slices(trace, rows, v2_fields)
        self._counters(trace, pids)
        self._flows(v1_flows)
        self.buffer += b"\n]}\n"
        self._flush()
        self.summary = {"json_base_time_ns": self.base_ns, "json_rows": len(rows), **flow_counts}
        return self.summary

    # -- events -----------------------------------------------------------------------------
    def _header(self, trace: Trace) -> None:
        self.buffer += b'{"baseTimeNanoseconds":%d' % self.base_ns
        for key, value in trace.metadata.items():
            if key not in _HEADER_KEYS_WRITTEN:
                self.buffer += b"," + _encode(key) + b":" + _encode(value)
        self.buffer += b',"traceEvents":['

    def _metadata(self, rows: list[Row], processes: list, pids: dict) -> None:
        for process in processes:
            if process is None:
                self._process_metadata(pids[id(None)], GLOBAL_PROCESS_NAME, [], None)
            else:
                self._process_metadata(pids[id(process)], process.display_name, process.labels, process.sort_index)
        by_pid: dict[int, list[Row]] = defaultdict(list)
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

    def _slices(self, trace: Trace, rows: list[Row], v2_fields: dict[int, bytes]) -> None:
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
                pid = pids[id(process_of(track))]
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
