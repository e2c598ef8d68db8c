"""An independent, deliberately plain reading of Chrome/Kineto JSON: what a converted trace must hold.

It shares no code with `converter`: the standard json module with Decimal for exact
timestamps, straightforward loops, and Chrome's documented binding rules for flows.
"""

from __future__ import annotations

import gzip
import json
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal


@dataclass
class Expected:
    slices: Counter = field(default_factory=Counter)          # (name, ts_ns, dur_ns)
    slice_args: Counter = field(default_factory=Counter)      # (name, ts_ns, dur_ns, frozenset(flat args))
    flows: Counter = field(default_factory=Counter)           # (src name, src ts, dst name, dst ts)
    counter_values: Counter = field(default_factory=Counter)  # (ts_ns, value)
    process_names: dict = field(default_factory=dict)  # pid -> name (every name given, joined)
    thread_names: dict = field(default_factory=dict)   # (pid, tid) -> name


def load_events(path) -> tuple[dict, list]:
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    document = json.loads(raw, parse_float=Decimal)
    if isinstance(document, list):
        return {}, document
    return document, document["traceEvents"]


def to_ns(value) -> int:
    return int((Decimal(value) * 1000).to_integral_value())


def flatten(value, prefix: str, out: dict) -> dict:
    """trace_processor's arg key convention: a.b for dicts, a[0] for arrays, a '.' inside a
    key becomes '_'; a null or empty container has no value (in an array it keeps its place
    as JSON text)."""
    if isinstance(value, dict):
        for key, item in value.items():
            key = key.replace(".", "_")
            flatten(item, f"{prefix}.{key}" if prefix else key, out)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if item is None or item == [] or item == {}:
                item = json.dumps(item)  # kept in place as text, so later indices do not shift
            flatten(item, f"{prefix}[{index}]", out)
    elif value is not None:
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, Decimal):
            value = float(value)
        out[prefix] = value
    return out


def _is_number(value) -> bool:
    return isinstance(value, (int, Decimal)) and not isinstance(value, bool)


def expected_from(path, skip_categories=()) -> Expected:
    """What a lossless output holds; slices of `skip_categories` (annotations that compaction
    re-shapes on purpose) are left out."""
    header, events = load_events(path)
    base = header.get("baseTimeNanoseconds", 0) if isinstance(header, dict) else 0
    expected = Expected()
    # (pid, tid text) -> [(ts, dur, name)], for flow binding: Chrome's viewer keys threads by the
    # tid's text, so "5555" and 5555 are one thread.
    spans_by_thread = defaultdict(list)
    open_begins = defaultdict(list)
    flow_events = []
    process_names, thread_names = defaultdict(set), defaultdict(set)

    def add_slice(name, ts, dur, args, pid, tid, bindable=True):
        expected.slices[(name, ts, dur)] += 1
        flat = frozenset(flatten(args, "", {}).items()) if isinstance(args, dict) else frozenset()
        expected.slice_args[(name, ts, dur, flat)] += 1
        if bindable:
            spans_by_thread[(pid, str(tid))].append((ts, dur, name))

    for event in events:
        if not isinstance(event, dict):
            continue
        ph, name, pid, tid = event.get("ph"), event.get("name"), event.get("pid"), event.get("tid")
        ts = event.get("ts")
        if ph == "M":
            args = event.get("args") or {}
            # Named twice (real traces name a thread twice), every distinct name shows, in text
            # order: the converter keeps no input order (model/canonical.py).
            if name == "process_name" and isinstance(args.get("name"), str):
                process_names[pid].add(args["name"])
            if name == "thread_name" and isinstance(args.get("name"), str):
                thread_names[(pid, tid)].add(args["name"])
            continue
        if pid is None or not _is_number(ts) or event.get("cat") in skip_categories:
            continue
        ts_ns = base + to_ns(ts)
        if ph == "X" and isinstance(name, str) and tid is not None:
            dur = event.get("dur")
            if _is_number(dur) and dur >= 0:
                add_slice(name, ts_ns, to_ns(dur), event.get("args"), pid, tid)
        elif ph == "B" and isinstance(name, str) and tid is not None:
            open_begins[(pid, tid)].append((ts_ns, event))
        elif ph == "E" and tid is not None and open_begins[(pid, tid)]:
            begin_ts, begin = open_begins[(pid, tid)].pop()
            args = dict(begin.get("args") or {}, **(event.get("args") or {}))
            add_slice(begin["name"], begin_ts, ts_ns - begin_ts, args, pid, tid)
        elif ph == "b" and isinstance(name, str) and event.get("id") is not None:
            open_begins[(pid, event.get("cat"), event["id"])].append((ts_ns, event))
        elif ph == "e" and open_begins[(pid, event.get("cat"), event.get("id"))]:
            begin_ts, begin = open_begins[(pid, event.get("cat"), event.get("id"))].pop()
            args = dict(begin.get("args") or {}, **(event.get("args") or {}))
            add_slice(begin["name"], begin_ts, ts_ns - begin_ts, args, pid, tid, bindable=False)
        elif ph in ("i", "I", "n") and isinstance(name, str):
            add_slice(name, ts_ns, 0, event.get("args"), pid, tid, bindable=False)
        elif ph == "C" and isinstance(event.get("args"), dict):
            for value in event["args"].values():
                if _is_number(value):
                    expected.counter_values[(ts_ns, float(value))] += 1
        elif ph in ("s", "t", "f") and event.get("id") is not None:
            flow_events.append((ts_ns, ph, event.get("cat"), event["id"], pid, tid, event.get("bp")))

    _expected_flows(flow_events, spans_by_thread, expected)
    expected.process_names = {pid: " / ".join(sorted(names)) for pid, names in process_names.items()}
    expected.thread_names = {key: _thread_title(names, key[1]) for key, names in thread_names.items()}
    return expected


def _thread_title(names: set, tid) -> str:
    """Kineto's "thread <tid> (<name>)" names keep that form, their names joined inside."""
    inner = [name[len(f"thread {tid} ("):-1] for name in names
             if name.startswith(f"thread {tid} (") and name.endswith(")")]
    if len(inner) == len(names):
        return f"thread {tid} ({' / '.join(sorted(inner))})"
    return " / ".join(sorted(names))


def _expected_flows(flow_events, spans_by_thread, expected: Expected) -> None:
    starts_by_thread = {}
    for key, spans in spans_by_thread.items():
        # Spans alike in start and length are ordered by content, not as read (the converter
        # makes no output depend on the order of events: model/canonical.py), so the deepest of
        # them is the one whose name comes last.
        spans.sort(key=lambda span: (span[0], -span[1], span[2]))
        starts_by_thread[key] = [span[0] for span in spans]
    chains = defaultdict(list)
    for event in flow_events:
        chains[(event[2], event[3])].append(event)
    for chain in chains.values():
        # At one time a chain's start comes before its steps and its end: the converter orders
        # flow events by content, not as read (model/canonical.py).
        chain.sort(key=lambda event: (event[0], "stf".index(event[1])))
        source = None
        for ts, ph, _, _, pid, tid, bp in chain:
            spans = spans_by_thread.get((pid, str(tid)), [])
            starts = starts_by_thread.get((pid, str(tid)), [])
            bound = None
            if ph in ("s", "t") or bp == "e":
                # The latest-starting span that still contains ts is the deepest one.
                for index in range(bisect_right(starts, ts) - 1, -1, -1):
                    if ts <= spans[index][0] + spans[index][1]:
                        bound = spans[index]
                        break
            else:
                index = bisect_left(starts, ts)
                bound = spans[index] if index < len(spans) else None
            if ph == "s":
                source = bound
                continue
            # Perfetto can only draw an arrow whose target still runs when its source begins.
            drawable = bound is not None and source is not None and (
                bound[0] >= source[0] or bound[0] + bound[1] > source[0])
            if drawable and bound != source:
                # trace_processor's flow table always points from the slice that starts first.
                first, second = (bound, source) if bound[0] < source[0] else (source, bound)
                expected.flows[(first[2], first[0], second[2], second[0])] += 1
            if ph == "t":
                source = bound
