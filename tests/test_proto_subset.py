"""proto/cgtrace_subset.proto: upstream-exact, and all the hand-encoding writer ever emits."""

import io
import json
import re
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor as FD
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from converter.engine.layout import separate_overlaps
from converter.model import CounterScale, Track
from converter.outputs import fields
from converter.outputs.perfetto_writer import PerfettoWriter
from converter.inputs.kineto_reader import parse_trace_text

ROOT = Path(__file__).resolve().parent.parent
SUBSET_PATH = ROOT / "proto" / "cgtrace_subset.proto"
SCALARS = {
    "double": FD.TYPE_DOUBLE, "float": FD.TYPE_FLOAT, "int64": FD.TYPE_INT64, "uint64": FD.TYPE_UINT64,
    "int32": FD.TYPE_INT32, "uint32": FD.TYPE_UINT32, "sint32": FD.TYPE_SINT32, "sint64": FD.TYPE_SINT64,
    "fixed64": FD.TYPE_FIXED64, "fixed32": FD.TYPE_FIXED32, "sfixed64": FD.TYPE_SFIXED64,
    "sfixed32": FD.TYPE_SFIXED32, "bool": FD.TYPE_BOOL, "string": FD.TYPE_STRING, "bytes": FD.TYPE_BYTES,
}
# uint32 fields that carry a bit set of an enum's values.
FLAG_FIELDS = {("perfetto.protos.TracePacket", "sequence_flags"): "perfetto.protos.TracePacket.SequenceFlags"}

_STATEMENT = re.compile(r"""\s*(?:
    (?P<kind>message|enum)\s+(?P<block>\w+)\s*\{
  | (?P<close>\})
  | (?P<label>optional|repeated)\s+(?P<type>[\w.]+)\s+(?P<field>\w+)\s*=\s*(?P<number>\d+)\s*;
  | (?P<value>[A-Z][A-Z0-9_]*)\s*=\s*(?P<value_number>\d+)\s*;
  | (?P<syntax>syntax\s*=\s*"proto2"\s*;)
  | package\s+(?P<package>[\w.]+)\s*;
)""", re.X)


def parse_subset(text: str):
    """-> (messages: {full name: {field: (label, type, number)}}, enums: {full name: {value: number}}).

    Message and enum type names in fields are resolved to full names the way protoc scopes them."""
    text = re.sub(r"//[^\n]*", "", text)
    messages, enums, scope, package, pos = {}, {}, [], None, 0
    while text[pos:].strip():
        match = _STATEMENT.match(text, pos)
        assert match, f"cannot parse subset near: {text[pos:pos + 60].strip()!r}"
        pos = match.end()
        if match["syntax"]:
            continue
        if match["package"]:
            package = match["package"]
        elif match["kind"]:
            scope.append(f"{scope[-1] if scope else package}.{match['block']}")
            (messages if match["kind"] == "message" else enums)[scope[-1]] = {}
        elif match["close"]:
            scope.pop()
        elif match["field"]:
            assert scope and scope[-1] in messages, f"field {match['field']} outside a message"
            messages[scope[-1]][match["field"]] = (match["label"], match["type"], int(match["number"]))
        else:
            assert scope and scope[-1] in enums, f"value {match['value']} outside an enum"
            enums[scope[-1]][match["value"]] = int(match["value_number"])
    assert package and not scope, "missing package or unbalanced braces"
    for full_name, fields in messages.items():
        for name, (label, type_, number) in fields.items():
            if type_ not in SCALARS:
                outer = full_name.split(".")
                candidates = [".".join(outer[:i] + [type_]) for i in range(len(outer), 0, -1)]
                resolved = [c for c in candidates if c in messages or c in enums]
                assert resolved, f"{full_name}.{name}: type {type_} is not declared in the subset"
                fields[name] = (label, resolved[0], number)
    return messages, enums


MESSAGES, ENUMS = parse_subset(SUBSET_PATH.read_text())
POOL = pb.DESCRIPTOR.pool


def is_repeated(field) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 6; `label` before
    return repeated if repeated is not None else field.label == FD.LABEL_REPEATED


def test_parser_reads_the_subset():
    assert MESSAGES["perfetto.protos.TrackEvent"]["flow_ids"] == ("repeated", "fixed64", 47)
    assert MESSAGES["perfetto.protos.TrackEvent"]["type"] == ("optional", "perfetto.protos.TrackEvent.Type", 9)
    assert MESSAGES["perfetto.protos.CounterDescriptor"] == {"unit_name": ("optional", "string", 6),
                                                             "y_axis_share_key": ("optional", "string", 7)}
    assert ENUMS["perfetto.protos.TrackDescriptor.SiblingMergeBehavior"]["SIBLING_MERGE_BEHAVIOR_NONE"] == 2


@pytest.mark.parametrize("full_name", sorted(MESSAGES))
def test_message_matches_upstream(full_name):
    descriptor = POOL.FindMessageTypeByName(full_name)
    for name, (label, type_, number) in MESSAGES[full_name].items():
        assert name in descriptor.fields_by_name, f"{full_name} has no field {name} upstream"
        field = descriptor.fields_by_name[name]
        assert field.number == number, f"{full_name}.{name}"
        assert is_repeated(field) == (label == "repeated"), f"{full_name}.{name}"
        if type_ in SCALARS:
            assert field.type == SCALARS[type_], f"{full_name}.{name}"
        elif type_ in ENUMS:
            assert field.type == FD.TYPE_ENUM and field.enum_type.full_name == type_, f"{full_name}.{name}"
        else:
            assert field.type == FD.TYPE_MESSAGE and field.message_type.full_name == type_, f"{full_name}.{name}"


@pytest.mark.parametrize("full_name", sorted(ENUMS))
def test_enum_matches_upstream(full_name):
    upstream = {value.name: value.number for value in POOL.FindEnumTypeByName(full_name).values}
    for name, number in ENUMS[full_name].items():
        assert upstream.get(name) == number, f"{full_name}.{name}"


def named_in(owner: type, full_name: str) -> dict[str, dict[str, int]]:
    """fields.py's classes under `owner`, by the full name of the message or enum each stands
    for: {full name: {attribute: number}}."""
    named = {}
    for name, value in vars(owner).items():
        if isinstance(value, type) and value.__module__ == fields.__name__:
            full = f"{full_name}.{name}"
            named[full] = {key: number for key, number in vars(value).items()
                           if not key.startswith("_") and not isinstance(number, type)}
            named.update(named_in(value, full))
    return named


def test_fields_module_names_exactly_the_subset():
    """converter/outputs/fields.py is the .proto's numbers by name: each message's fields
    upper-cased, each enum's nonzero values; nothing more, nothing less, nothing renumbered."""
    assert all(name.islower() for fields_ in MESSAGES.values() for name in fields_)
    declared = {message: {name.upper(): number for name, (_, _, number) in fields_.items()}
                for message, fields_ in MESSAGES.items() if fields_}
    declared.update({enum: {name: number for name, number in values.items() if number}
                     for enum, values in ENUMS.items()})
    assert named_in(fields, "perfetto.protos") == declared


def test_writer_names_every_field_number():
    """Field numbers are written only in fields.py: the writer's encoders never get a bare one."""
    bare = re.compile(r"\b(?:tag|[a-z_]*_field)\(\s*\d")
    found = [f"{path.name}:{number}" for path in sorted((ROOT / "converter" / "outputs").glob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if bare.search(line)]
    assert not found, f"bare field numbers (name them in fields.py): {found}"


SAMPLE_EVENTS = [
    {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "worker"}},
    {"name": "process_labels", "ph": "M", "pid": 1, "args": {"labels": "rank0,gpu"}},
    {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "main"}},
    {"name": "outer", "cat": "c", "ph": "X", "ts": 10, "dur": 100, "pid": 1, "tid": 2, "args": {"k": 1, "n": None}},
    {"name": "inner", "cat": "c", "ph": "X", "ts": 20, "dur": 30, "pid": 1, "tid": 2, "args": {"s": "x", "f": 0.5, "b": True, "u": 2**64 - 1, "d": {"x": [1, []]}}},
    {"name": "overlapping", "cat": "c", "ph": "X", "ts": 90, "dur": 40, "pid": 1, "tid": 2},
    {"name": "mark", "cat": "c", "ph": "i", "ts": 60, "pid": 1, "tid": 2, "s": "t"},
    {"name": "proc mark", "ph": "i", "ts": 70, "pid": 1, "s": "p", "args": {"a": [1, 2]}},
    {"name": "global mark", "ph": "i", "ts": 80, "pid": 1, "s": "g"},
    {"name": "launch", "cat": "f", "ph": "s", "ts": 25, "pid": 1, "tid": 2, "id": 7},
    {"name": "launch", "cat": "f", "ph": "f", "ts": 41, "pid": 1, "tid": 3, "id": 7, "bp": "e"},
    # This arrow's target began before its source: it terminates at the target's END.
    {"name": "back", "cat": "f", "ph": "s", "ts": 43, "pid": 1, "tid": 3, "id": 8},
    {"name": "back", "cat": "f", "ph": "f", "ts": 44, "pid": 1, "tid": 2, "id": 8, "bp": "e"},
    {"name": "kernel", "cat": "k", "ph": "X", "ts": 40, "dur": 5, "pid": 1, "tid": 3},
    {"name": "mem", "ph": "C", "ts": 10, "pid": 1, "args": {"bytes": 5}},
    {"name": "mem", "ph": "C", "ts": 20, "pid": 1, "args": {"bytes": 7.5}},
]


def written_trace() -> bytes:
    """Every feature the writer has: thread, process-scoped, global, nested, overlap and counter
    tracks, an explicitly ordered group, nested slices, instants, a flow, args and labels."""
    trace = parse_trace_text(json.dumps({"traceEvents": SAMPLE_EVENTS}).encode())
    assert not trace.skipped and len(trace.flows) == 2 and trace.counters
    separate_overlaps(trace)
    process = trace.processes[0]
    group = trace.add_track(Track(name="group", process=process, orders_children=True))
    for track in trace.tracks:
        if track.name == "process-scoped instants":
            track.parent, track.order = group, 2
        if track.is_counter:
            track.scale = CounterScale(unit="threads busy", shared_by="cpu")
    stream = io.BytesIO()
    writer = PerfettoWriter(stream)
    writer.write(trace)
    writer.close()
    return stream.getvalue()


def walk(message, seen_fields: set, seen_values: set) -> None:
    """Every set (message full name, field name), recursively; enum and flag values by enum."""
    owner = message.DESCRIPTOR.full_name
    for field, value in message.ListFields():
        seen_fields.add((owner, field.name))
        values = value if is_repeated(field) else [value]
        if field.type == FD.TYPE_MESSAGE:
            for item in values:
                walk(item, seen_fields, seen_values)
        elif field.type == FD.TYPE_ENUM:
            seen_values.update((field.enum_type.full_name, field.enum_type.values_by_number[v].name) for v in values)
        elif (owner, field.name) in FLAG_FIELDS:
            enum = POOL.FindEnumTypeByName(FLAG_FIELDS[owner, field.name])
            for flags in values:
                bits = [1 << b for b in range(flags.bit_length()) if flags >> b & 1]
                assert all(bit in enum.values_by_number for bit in bits), f"{owner}.{field.name}={flags}"
                seen_values.update((enum.full_name, enum.values_by_number[bit].name) for bit in bits)


def test_writer_emits_exactly_the_subset():
    data = written_trace()
    trace = pb.Trace.FromString(data)
    # A wrong field number or wire type parses as an unknown field, a doubled singular field
    # keeps only its last value: either way the known fields re-encode to fewer bytes.
    trace.DiscardUnknownFields()
    assert trace.ByteSize() == len(data), "unknown, mistyped or doubled fields in the written trace"

    seen_fields, seen_values = set(), set()
    walk(trace, seen_fields, seen_values)
    declared_fields = {(message, field) for message, fields in MESSAGES.items() for field in fields}
    declared_values = {(enum, name) for enum, values in ENUMS.items() for name, number in values.items() if number}
    assert seen_fields - declared_fields == set(), "writer emits fields outside proto/cgtrace_subset.proto"
    assert seen_values - declared_values == set(), "writer emits enum values outside the subset"
    # ... and the subset holds nothing the writer does not emit (declared empty messages aside).
    assert declared_fields - seen_fields == set(), "subset declares fields the writer never emits"
    assert declared_values - seen_values == set(), "subset declares enum values the writer never emits"
    assert {m for m in MESSAGES if not MESSAGES[m]} <= {f.message_type.full_name for f in _set_message_fields(trace)}


def _set_message_fields(message):
    for field, value in message.ListFields():
        if field.type == FD.TYPE_MESSAGE:
            yield field
            for item in value if is_repeated(field) else [value]:
                yield from _set_message_fields(item)
