"""Kineto events -> trace model, one event at a time: a handler per Chrome phase, the
metadata events and the flows' binding once all are read.

Every event the bulk path of plain_events.py does not take comes here, so these handlers say
what each phase means and why an event is skipped.
"""

from __future__ import annotations

from typing import Any, Optional

import msgspec

from .. import kineto
from ..kineto import MAX_NS
from ..model import NO_ARGS, CounterSample, Thread, Trace, decode_json, encode_json
from ..model.builder import TraceBuilder
from ..model.canonical import source_key
from .decimal_times import FLOAT_EXACT_LIMIT_US, to_ns
from .flows import FlowEvents, bind_flows
from .kineto_events import EVENT, Event, Plain, Tagged, decode_event

_THREAD_SCOPED = frozenset(("X", "B", "E", "s", "t", "f"))
# End events take their name from the begin; flow names are not shown anywhere.
_NAME_OPTIONAL = frozenset(("E", "e", "s", "t", "f"))
# What metadata events set: (the process or thread, its attribute) -> (event, value), each one given.
_Settings = dict[tuple[Any, str], list[tuple[Event, Any]]]


class PhaseHandlers(TraceBuilder):
    """Turns decoded Kineto events into the trace model, one handler per Chrome phase."""

    def __init__(self, trace: Trace, base_ns: int):
        super().__init__(trace)
        self.base_ns = base_ns
        self.open_begins: dict[tuple[Any, Any], list[tuple[int, Event]]] = {}
        self.open_async: dict[tuple[Any, ...], list[tuple[int, Event]]] = {}
        self.flow_events = FlowEvents()
        self.metadata_events: list[Event] = []
        self.exact_times = False  # whether an event had to be decoded again for its exact times

    # -- events -------------------------------------------------------------------------
    def _add_each(self, items: list, start: int, end: int, raw_piece) -> None:
        skipped = self.trace.skipped
        handlers = {
            "X": self._complete, "B": self._begin, "E": self._end,
            "i": self._instant, "I": self._instant, "C": self._counter,
            "s": self._flow, "t": self._flow, "f": self._flow,
            "b": self._async_begin, "e": self._async_end, "n": self._async_instant,
        }
        decode, raws = EVENT.decode, None
        for index in range(start, end):
            item = items[index]
            items[index] = None
            raw = None
            if type(item) is not msgspec.Raw:
                event = item
            else:  # decode_event's usual case, inline (a call per event is measurable)
                raw = item
                try:
                    event = decode(raw)
                except msgspec.MsgspecError:
                    event = None
            beyond_float = event is not None and type(event.ts) is float and \
                not -FLOAT_EXACT_LIMIT_US < event.ts < FLOAT_EXACT_LIMIT_US
            if event is None or beyond_float or isinstance(event, Plain):
                # Not an object, a ts needing Decimal, or an event the bulk path left (msgspec
                # made its times floats): decoded again, as written.
                if raw is None:
                    assert raw_piece is not None  # items were decoded only where their raw piece is at hand
                    raws = raws or raw_piece()
                    raw = raws[index]
                if beyond_float or not isinstance(item, Tagged):
                    self.exact_times = True
                event = decode_event(raw)
            if event is None:
                skipped["event_not_an_object"] += 1
                continue
            ph = event.ph
            if ph == "M":
                self.keep_metadata((event,))
                continue
            handler = handlers.get(ph) if type(ph) is str else None
            if handler is None:
                skipped["unsupported_phase" if isinstance(ph, str) else "missing_phase"] += 1
                continue
            if type(event.pid) is int and type(event.tid) is int and type(event.name) is str \
                    and type(event.cat) is str:
                problem = handler(event)  # identities all well typed: nothing for _identity_problem to do
            else:
                problem = self._identity_problem(event) or handler(event)
            if problem is not None:
                skipped[problem] += 1

    def keep_metadata(self, events) -> None:
        """Metadata events, for the end of the read. Their args are copied out of the piece:
        a decoded Raw holds the whole piece's text, and thread names spread over the file
        (one before each of 20k replay streams' first event) would hold every piece to the end."""
        for event in events:
            event.args = msgspec.Raw(bytes(event.args))
        self.metadata_events.extend(events)

    def _identity_problem(self, event: Event) -> Optional[str]:
        kind = type(event.pid)
        if kind is not int and kind is not str:
            return "missing_pid" if event.pid is None else "bad_pid_or_tid"
        if event.ph in _THREAD_SCOPED or (event.ph in "iI" and event.s not in ("g", "p")):
            kind = type(event.tid)
            if kind is not int and kind is not str:
                return "missing_tid" if event.tid is None else "bad_pid_or_tid"
            event.tid = chrome_thread_key(event.tid)
        name = event.name
        if type(name) is not str:
            if name is None and event.ph not in _NAME_OPTIONAL:
                return "missing_name"
            event.name = "" if name is None else str(name)
        cat = event.cat
        if type(cat) is not str:
            event.cat = "" if cat is None else str(cat)
        return None

    def _times(self, event: Event, need_dur: bool):
        ts = to_ns(event.ts)
        if ts is None:
            return None, None, "missing_ts" if event.ts is None else "bad_ts"
        ts += self.base_ns
        if not 0 <= ts <= MAX_NS:
            return None, None, "ts_out_of_range"
        if not need_dur:
            return ts, None, None
        dur = to_ns(event.dur)
        if dur is None:
            return None, None, "missing_dur" if event.dur is None else "bad_dur"
        if dur < 0:
            return None, None, "negative_dur"
        if dur > MAX_NS - ts:
            return None, None, "ts_out_of_range"
        return ts, dur, None

    def _args(self, event: Event) -> int:
        """A reference to the raw JSON args text, or NO_ARGS when absent or empty ("{}")."""
        raw = event.args
        return self.args.add(raw) if len(raw) > 2 else NO_ARGS

    def _complete(self, event: Event):
        ts, dur = event.ts, event.dur
        if type(ts) is float and type(dur) is float and 0 <= dur < FLOAT_EXACT_LIMIT_US:
            ts, dur = round(ts * 1000) + self.base_ns, round(dur * 1000)  # the common case, inline
            if not 0 <= ts <= MAX_NS - dur:
                return "ts_out_of_range"
        else:
            ts, dur, problem = self._times(event, need_dur=True)
            if problem:
                return problem
        key = (event.pid, event.tid)
        track = self.thread_tracks.get(key) or self.thread_track(*key)
        args = event.args
        self.trace.slices.append(ts, dur, event.name, event.cat, self.args.add(args) if len(args) > 2 else NO_ARGS,
                                 track)  # _args, inline
        return None

    def _begin(self, event: Event):
        ts, _, problem = self._times(event, need_dur=False)
        if problem:
            return problem
        self.open_begins.setdefault((event.pid, event.tid), []).append((ts, event))
        return None

    def _end(self, event: Event):
        ts, _, problem = self._times(event, need_dur=False)
        if problem:
            return problem
        stack = self.open_begins.get((event.pid, event.tid))
        if not stack:
            return "end_without_begin"
        begin_ts, begin = stack.pop()
        if ts < begin_ts:
            return "end_before_begin"
        args = self._merged_args(begin, event)
        track = self.thread_track(begin.pid, begin.tid)
        self.trace.slices.append(begin_ts, ts - begin_ts, begin.name, begin.cat, args, track)
        return None

    def _merged_args(self, begin: Event, end: Event):
        """Chrome merges an E event's args into its B slice."""
        if len(end.args) <= 2:
            return self._args(begin)
        if len(begin.args) <= 2:
            return self._args(end)
        return self.args.add(encode_json({**decoded_args(begin), **decoded_args(end)}))

    def _instant(self, event: Event):
        ts, _, problem = self._times(event, need_dur=False)
        if problem:
            return problem
        scope = event.s
        if scope == "g":
            track = self.global_track()
        elif scope == "p":
            track = self.process_track(event.pid)
        else:
            track = self.thread_track(event.pid, event.tid)
        self.trace.slices.append(ts, 0, event.name, event.cat, self._args(event), track, instant=True)
        return None

    def _counter(self, event: Event):
        ts, _, problem = self._times(event, need_dur=False)
        if problem:
            return problem
        values = decoded_args(event)
        series_name = event.name if event.id is None else f"{event.name} {event.id}"
        added = False
        for key, value in values.items():
            if type(value) not in (int, float) or value != value or type(value) is int and abs(value) >= 1 << 1000:
                continue  # not a number, NaN, or an int beyond double range
            self.trace.counters.append(CounterSample(ts, float(value), self.counter_track(event.pid, series_name, key)))
            added = True
        return None if added else "counter_without_values"

    def _flow(self, event: Event):
        ts = event.ts
        if type(ts) is float:  # the common case, inline (as in _complete)
            ts = round(ts * 1000) + self.base_ns
            if not 0 <= ts <= MAX_NS:
                return "ts_out_of_range"
        else:
            ts, _, problem = self._times(event, need_dur=False)
            if problem:
                return problem
        flow_id = event.id if event.id is not None else event.id2
        if flow_id is None:
            return "flow_without_id"
        if type(flow_id) is not int:
            flow_id = hashable(flow_id)
        ph = event.ph
        key = (event.pid, event.tid)
        category = self.intern(event.cat)  # a str by now: the identity checks made it one
        self.flow_events.append(category, flow_id, ph, ts, self.thread_tracks.get(key) or self.thread_track(*key),
                                ph != "f" or event.bp == "e")
        return None

    def _async_key(self, event: Event):
        async_id = event.id if event.id is not None else event.id2
        if async_id is None:
            return None
        return (event.pid, event.cat, hashable(async_id))

    def _async_begin(self, event: Event):
        ts, _, problem = self._times(event, need_dur=False)
        key = self._async_key(event)
        if problem or key is None:
            return problem or "async_without_id"
        self.open_async.setdefault(key, []).append((ts, event))
        return None

    def _async_end(self, event: Event):
        ts, _, problem = self._times(event, need_dur=False)
        key = self._async_key(event)
        if problem or key is None:
            return problem or "async_without_id"
        stack = self.open_async.get(key)
        if not stack:
            return "async_end_without_begin"
        begin_ts, begin = stack.pop()
        if ts < begin_ts:
            return "end_before_begin"
        track = self.async_track(key, begin.name)
        self.trace.slices.append(begin_ts, ts - begin_ts, begin.name, begin.cat, self._merged_args(begin, event), track)
        return None

    def _async_instant(self, event: Event):
        ts, _, problem = self._times(event, need_dur=False)
        key = self._async_key(event)
        if problem or key is None:
            return problem or "async_without_id"
        track = self.async_track(key, event.name)
        self.trace.slices.append(ts, 0, event.name, event.cat, self._args(event), track, instant=True)
        return None

    # -- after all events -----------------------------------------------------------------
    def finish(self) -> None:
        skipped = self.trace.skipped
        for stack in self.open_begins.values():
            if stack:
                skipped["begin_without_end"] += len(stack)
        for stack in self.open_async.values():
            if stack:
                skipped["async_begin_without_end"] += len(stack)
        names: dict[Any, list[str]] = {}  # process or thread -> every name the input gave it
        settings: _Settings = {}
        for event, args in zip(self.metadata_events, _metadata_args(self.metadata_events)):
            problem = self._metadata(event, args, names, settings)
            if problem:
                skipped[problem] += 1
        for named, given in names.items():
            named.name = kineto.joined_names(given, named.source_tid if isinstance(named, Thread) else None)
        # A value given twice (a sort index) is the last in content order, whatever the input's
        # order: only such repeats are ordered (a trace on 20k replay streams gives each one once).
        for (target, attribute), values in settings.items():
            setattr(target, attribute, values[0][1] if len(values) == 1 else
                    max(values, key=lambda given: _metadata_key(given[0]))[1])
        for process in self.trace.processes:
            process.row_group = process.source_pid in kineto.BOOKKEEPING_PIDS
        self.flow_events.put_in_canonical_order(self.put_in_canonical_order())
        bound = bind_flows(self.flow_events, self.trace.slices)
        self.trace.flows.extend(bound.flows)
        self.trace.unbound_flows += bound.unbound
        self.trace.partnerless_flow_ends += bound.partnerless

    def _metadata(self, event: Event, args: dict, names: dict[Any, list[str]],
                  settings: _Settings) -> Optional[str]:
        """Read one metadata event: names go to `names`, for the caller to join, the values it
        sets to `settings`, for the caller to choose among repeats."""
        kind = type(event.pid)
        if kind is not int and kind is not str:
            return "missing_pid"
        if not args:
            return "metadata_without_args"
        name = event.name
        if name == "process_name":
            value = args.get("name")
            if isinstance(value, str):
                names.setdefault(self.process(event.pid), []).append(value)
                return None
        elif name == "process_labels":
            value = args.get("labels")
            if isinstance(value, str):
                settings.setdefault((self.process(event.pid), "labels"), []).append(
                    (event, [label for label in value.split(",") if label]))
                return None
        elif name == "process_sort_index":
            value = args.get("sort_index")
            if type(value) is int:
                settings.setdefault((self.process(event.pid), "sort_index"), []).append((event, value))
                return None
        elif name in ("thread_name", "thread_sort_index"):
            kind = type(event.tid)
            if kind is not int and kind is not str:
                return "missing_tid"
            event.tid = chrome_thread_key(event.tid)
            # A named thread keeps its name even with no events of its own, so give it its track.
            thread = self.thread_track(event.pid, event.tid).thread
            assert thread is not None  # a thread track has its thread
            if name == "thread_name" and isinstance(args.get("name"), str):
                names.setdefault(thread, []).append(args["name"])
                return None
            if name == "thread_sort_index" and type(args.get("sort_index")) is int:
                settings.setdefault((thread, "sort_index"), []).append((event, args["sort_index"]))
                return None
        else:
            return "unsupported_metadata"
        return "bad_metadata_value"



def _metadata_key(event: Event) -> tuple:
    return (source_key(event.name), source_key(event.pid), source_key(chrome_thread_key(event.tid)),
            bytes(event.args))


def chrome_thread_key(tid: Any) -> Any:
    """Chrome's trace viewer keys threads by the tid's text, so `"5555"` and `5555` are one
    thread (2021 Kineto traces write the first on slices, the second on flow events); a
    decimal string is read as the int it spells. Other text ("stream 7", "05555") stays."""
    if type(tid) is str and tid.isascii() and len(tid) <= 18:
        digits = tid[1:] if tid[:1] == "-" else tid
        if digits.isdigit() and str(int(tid)) == tid:
            return int(tid)
    return tid


def _metadata_args(events: list[Event]) -> list[dict]:
    """Each event's args as decoded_args gives them, decoded in one call (a trace on 20k
    replay streams has two metadata events per stream)."""
    values = decode_json(b"[" + b",".join([event.args if len(event.args) > 2 else b"null" for event in events]) + b"]")
    return [value if isinstance(value, dict) else {} for value in values]


def decoded_args(event: Event) -> dict:
    raw = event.args
    value = decode_json(raw) if len(raw) > 2 else None
    return value if isinstance(value, dict) else {}


def hashable(value):
    return value if isinstance(value, (int, str, float)) else repr(value)
