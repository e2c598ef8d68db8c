"""Fuzzing the command line with mutated and truncated traces: never a traceback, a hang or a partial file.

The hostile corpus runs, the same way, the inputs an adversarial run once got through: lanes
files that unroll to 10^9 items or nest 1,000 deep, a pp_pattern stage that takes text or
terminal controls, names full of ESC/BEL/OSC-52 sequences, a 5,000-digit baseTimeNanoseconds.
Every run is held to 2 GB of address space, and none may print a control character.

Option fuzzing (the last test) runs random values of --window, --steps, --ranks, --jobs,
--pp-group and -o targets, and merges of ranks whose distributedInfo fields hold weird values,
judged the same way.

Inputs: a small generated CUDA-graph trace and, when ../shared/traces is present, two small real
ones. Each case applies 1-3 seeded mutations -- truncation, byte flips / inserts / deletes, numbers
replaced by strings, NaN or huge values, duplicate and deleted keys, swapped types, deep nesting,
invalid UTF-8, lone surrogates, absurd header values, long digit runs in names -- and sometimes
gzips the result (and truncates or corrupts the gzip). `cgtrace convert` and `cgtrace compact`
then run in a subprocess with a timeout, and must either

  * exit 0 with a complete output file (whole Perfetto packets to the last byte, the size the
    summary reports) and no temp file; a sample of these is loaded in trace_processor, which
    must report no error/data_loss stats; or
  * exit 2 with exactly one stderr line `cgtrace: error: ...`, no output file and no temp file;

and in both cases leave the input untouched. Anything else (a traceback, another exit code, a
timeout, a partial or leftover file) is a failure, reported with the case's seed and mutations;
`FUZZ_KEEP=DIR` keeps every failing input there.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import resource
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from converter.generator import GeneratorConfig, write_trace

from .helpers import SHARED_TRACES, problem_stats, shared_trace_paths

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 30
MEMORY_LIMIT = 2 << 30  # address space per run: what 24 GB once took (a lanes file of 83 bytes) must fit
_TERMINAL_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # all but the newline: ESC, BEL, C1 CSI...
WORKERS = 3            # the CLI spends much of its time starting up; 3 keep 2 cores busy
CASES = {"generated": 40, "hta_triton_small": 28, "dlrm_rank0": 20}
TP_SAMPLE_EVERY = 5    # load every 5th successful output in trace_processor
REAL_INPUTS = {"hta_triton_small": "hta_triton_small.json.gz", "dlrm_rank0": "dlrm_8ranks/rank0_trace.json.gz"}


# -- inputs ---------------------------------------------------------------------------------------------
def _plain(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


class Inputs(dict):
    """Input name -> uncompressed JSON text; a short repr keeps failure reports readable."""

    def __repr__(self) -> str:
        return "Inputs(" + ", ".join(f"{key}: {len(text)} bytes" for key, text in self.items()) + ")"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Inputs:
    generated = write_trace(GeneratorConfig(seed=1, steps=1, graphs_per_step=2, kernels_per_replay=6),
                            tmp_path_factory.mktemp("fuzz_input") / "generated.json")
    texts = Inputs(generated=generated.read_bytes())
    available = {str(p.relative_to(SHARED_TRACES)) for p in shared_trace_paths()}
    for key, relative in REAL_INPUTS.items():
        if relative in available:
            texts[key] = _plain(SHARED_TRACES / relative)
    return texts


# -- mutations: each takes (rng, text) and returns (text, what it did) ----------------------------------------
# Raw JSON literals the json module cannot write (out of double range, or more digits than int() takes).
RAW_LITERALS = {"@@1e400@@": b"1e400", "@@-1e400@@": b"-1e400", "@@1e-400@@": b"1e-400", "@@9x400@@": b"9" * 400,
                "@@-9x400@@": b"-" + b"9" * 400, "@@9x5000@@": b"9" * 5000, "@@NaN@@": b"NaN"}
_RAW = re.compile(rb'"(@@[^"@]+@@)"')
WEIRD_VALUES = [None, [], {}, "", "x", "12.5", True, False, -1, 0, 2**63, 2**64 + 7, 10**30, -(10**30), 1e308,
                -0.0, 5e-324, [1, [2, [3]]], {"a": {"b": None}}, "\ud800", "ProfilerStep#" + "9" * 5000,
                ["name", {"name": "graph_0"}], "name", "\u00b2"]
NUMBER_REPLACEMENTS = [b'"12"', b'"1.5"', b'""', b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400",
                       b"123456789012345678901234567890", b"-99999999999999999999", b"1e-400", b"-0", b"0.0",
                       b"18446744073709551615", b"9223372036854775808", b"null", b"true", b"[]", b"{}",
                       b"1" * 5000, b"9" * 400]
KEYS = [b"ph", b"ts", b"dur", b"pid", b"tid", b"name", b"cat", b"args", b"id", b"bp", b"s", b"traceEvents",
        b"baseTimeNanoseconds"]
TOKENS = [b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"null", b"-", b"e", b".", b"\x00", b"\n", b"\\u",
          b"0", b"9", b"\xff"]
_NUMBER = re.compile(rb"(?<=[:\[,])\s*-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_STRING_START = re.compile(rb'"(?:name|cat|ph)":\s*"')
_NAME_START = re.compile(rb'"name":\s*"')
_ANNOTATION_NAME_START = re.compile(rb'"cat":\s*"gpu_user_annotation",\s*"name":\s*"')
_ANY_STRING_START = re.compile(rb'":\s*"')
_EVENT_START = re.compile(rb'\{\s*"ph"')
_OBJECT_START = re.compile(rb'\{\s*"')
_ARGS_START = re.compile(rb'"args":\s*\{')
_KEY_VALUE = re.compile(rb'"(?:ph|ts|dur|pid|tid|name|cat|args|id|bp|s)":\s*(?:"[^"\\]*"|-?[\d.eE+-]+|null|true|false)\s*,?')


def _matches(pattern: re.Pattern, text: bytes, rng: random.Random, count: int) -> list[re.Match]:
    found = list(pattern.finditer(text))
    return sorted(rng.sample(found, min(count, len(found))), key=lambda m: m.start())


def _splice(text: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    """Replace text[start:end] by new bytes, for non-overlapping (start, end, new) edits."""
    out, position = [], 0
    for start, end, new in sorted(edits):
        if start < position:
            continue
        out += [text[position:start], new]
        position = end
    return b"".join(out + [text[position:]])


def truncate(rng, text):
    at = rng.randrange(len(text))
    return text[:at], f"truncate at byte {at} of {len(text)}"


def flip_bytes(rng, text):
    data, spots = bytearray(text), sorted(rng.sample(range(len(text)), min(len(text), rng.randint(1, 8))))
    for spot in spots:
        data[spot] ^= rng.randrange(1, 256)
    return bytes(data), f"flip bytes at {spots}"


def insert_bytes(rng, text):
    at = rng.randrange(len(text) + 1)
    junk = rng.choice(TOKENS) if rng.random() < 0.6 else rng.randbytes(rng.randint(1, 6))
    return text[:at] + junk + text[at:], f"insert {junk!r} at {at}"


def delete_bytes(rng, text):
    at = rng.randrange(len(text))
    count = rng.choice([1, 1, 2, 7, 50, 400])
    return text[:at] + text[at + count:], f"delete {count} bytes at {at}"


def replace_numbers(rng, text):
    edits = [(m.start(), m.end(), rng.choice(NUMBER_REPLACEMENTS)) for m in _matches(_NUMBER, text, rng, rng.randint(1, 6))]
    return _splice(text, edits), "replace numbers: " + ", ".join(f"@{s}->{_short(n)}" for s, _, n in edits)


def _short(literal: bytes) -> str:
    return repr(literal) if len(literal) <= 24 else f"{literal[:12]!r}...({len(literal)} bytes)"


def poison_event(rng, text):
    """Every number in one event (and a little beyond) becomes the same odd literal."""
    new = rng.choice(NUMBER_REPLACEMENTS)
    starts = _matches(_EVENT_START, text, rng, 1)
    start = starts[0].start() if starts else rng.randrange(len(text))
    end = start + rng.randint(100, 1000)
    edits = [(start + m.start(), start + m.end(), new) for m in _NUMBER.finditer(text[start:end])]
    return _splice(text, edits), f"{len(edits)} numbers from {start} -> {_short(new)}"


def duplicate_key(rng, text):
    edits = []
    for match in _matches(_OBJECT_START, text, rng, rng.randint(1, 4)):
        key = rng.choice(KEYS)
        value = json.dumps(rng.choice(WEIRD_VALUES[:16])).encode()
        edits.append((match.start() + 1, match.start() + 1, b'"%s":%s,' % (key, value)))
    return _splice(text, edits), "duplicate keys: " + ", ".join(f"@{s} {n!r}" for s, _, n in edits)


def delete_key(rng, text):
    edits = [(m.start(), m.end(), b"") for m in _matches(_KEY_VALUE, text, rng, rng.randint(1, 8))]
    return _splice(text, edits), "delete key/values at " + ", ".join(str(s) for s, _, _ in edits)


def invalid_utf8(rng, text):
    junk = rng.choice([b"\xff", b"\xfe\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80",
                       b"\xc0\xaf"])
    matches = _matches(_ANY_STRING_START, text, rng, 1)  # any string: a name, an arg, a header value
    at = matches[0].end() if matches else rng.randrange(len(text) + 1)
    return text[:at] + junk + text[at:], f"invalid UTF-8 {junk!r} at {at}"


def lone_surrogate(rng, text):
    junk = rng.choice([b"\\ud800", b"\\udfff", b"\\ud83d", b"\\u0000", b"\\uZZZZ"])
    matches = _matches(_STRING_START, text, rng, 1)
    at = matches[0].end() if matches else rng.randrange(len(text) + 1)
    return text[:at] + junk + text[at:], f"escape {junk!r} at {at}"


def deep_nesting(rng, text):
    depth = rng.choice([64, 200, 1_000, 3_000, 20_000, 200_000])
    kind = rng.choice([b"[]", b"{}"])
    nested = (b'{"a":' * depth + b"1" + b"}" * depth) if kind == b"{}" else (b"[" * depth + b"]" * depth)
    matches = _matches(_ARGS_START, text, rng, 1) or _matches(_OBJECT_START, text, rng, 1)
    if not matches:
        return nested, f"document replaced by {kind.decode()} nested {depth} deep"
    at = matches[0].end() - (0 if matches[0].re is _ARGS_START else 1)
    return text[:at] + b'"deep":' + nested + b"," + text[at:], f"{kind.decode()} nested {depth} deep at {at}"


def long_digits(rng, text):
    """Names whose digits overflow int(): step numbers, PP stages and microbatches."""
    name = rng.choice([b"ProfilerStep#" + b"7" * 5000, b"PP:" + b"1" * 5000 + b"F0", b"PP:0F" + b"3" * 5000,
                       b"ProfilerStep#" + b"9" * 40])
    pattern = _ANNOTATION_NAME_START if name.startswith(b"PP") and _ANNOTATION_NAME_START.search(text) else _NAME_START
    edits = [(m.end(), m.end(), name) for m in _matches(pattern, text, rng, rng.randint(1, 3))]
    edits = [(start, _skip_string(text, start), new) for start, _, new in edits]
    return _splice(text, edits), f"names -> {_short(name)} at " + ", ".join(str(s) for s, _, _ in edits)


def _skip_string(text: bytes, start: int) -> int:
    """The index of the closing quote of the JSON string whose content starts at `start`."""
    end = start
    while end < len(text) and text[end:end + 1] != b'"':
        end += 2 if text[end:end + 1] == b"\\" else 1
    return end


def structural(rng, text):
    """Swap types and drop keys on parsed events and the header, then re-serialize (NaN allowed)."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        return text, "structural: skipped (not JSON)"
    events = document.get("traceEvents") if isinstance(document, dict) else document
    notes = []
    if isinstance(events, list) and events:
        events = list(events)
        for index in rng.sample(range(len(events)), min(len(events), rng.randint(1, 12))):
            events[index], note = _mutate_event(rng, events[index])
            notes.append(f"event {index}: {note}")
    if isinstance(document, dict):
        document = dict(document, traceEvents=events)
        if rng.random() < 0.3:
            key = rng.choice(["baseTimeNanoseconds", "traceEvents", "distributedInfo", "displayTimeUnit"])
            value = rng.choice([weird_value(rng), -1, 2**70, " 42", "@@9x5000@@",
                                {"rank": 1, "pg_config": [{"pg_desc": "mesh_pp", "ranks": {"1": 2}}]}])
            document[key] = value
            notes.append(f"header {key} = {json.dumps(value)[:40]}")
    else:
        document = events
    return dumps(document), "structural: " + "; ".join(notes)


def dumps(document) -> bytes:
    text = json.dumps(document).encode()
    return _RAW.sub(lambda m: RAW_LITERALS[m.group(1).decode()], text)


def weird_value(rng):
    return rng.choice(WEIRD_VALUES + list(RAW_LITERALS) + [float("inf")])


def _mutate_event(rng, event):
    choice = rng.random()
    if choice < 0.1 or not isinstance(event, dict):
        new = rng.choice([None, "event", 42, [event], list(event.values()) if isinstance(event, dict) else {}])
        return new, f"whole event -> {type(new).__name__}"
    event = dict(event)
    key = rng.choice(list(event) + ["ts", "dur", "args", "id", "bp", "s", "pid", "tid"])
    if choice < 0.4 and key in event:
        del event[key]
        return event, f"del {key}"
    if choice < 0.7:
        value = weird_value(rng)
        event[key] = value
        return event, f"{key} = {json.dumps(value)[:40]}"
    # Poison the args, maybe under another phase: counters, metadata, kernels with a graph label.
    phase = rng.choice([event.get("ph"), "C", "M", "X", "B", "i", "s", "b", "n"])
    args = dict(event["args"]) if isinstance(event.get("args"), dict) else {}
    for _ in range(rng.randint(1, 3)):
        args[rng.choice(list(args) + ["name", "value", "sort_index", "labels", "stream", "a.b"])] = weird_value(rng)
    if rng.random() < 0.3:
        event["cat"], args["name"] = "kernel", "graph_0"
    event.update(ph=phase, args=args)
    if phase == "M":
        event["name"] = rng.choice(["process_name", "thread_name", "process_sort_index", "thread_sort_index",
                                    "process_labels"])
    return event, f"ph={phase} args={json.dumps(args)[:80]}"


# Semantic mutations mostly keep the JSON valid, so the trace is read; destructive ones mostly do not.
SEMANTIC = [replace_numbers, poison_event, duplicate_key, delete_key, long_digits, structural, structural,
            structural]
DESTRUCTIVE = [truncate, flip_bytes, insert_bytes, delete_bytes, invalid_utf8, lone_surrogate, deep_nesting]


@dataclass
class Case:
    label: str
    data: bytes
    name: str
    notes: list[str] = field(default_factory=list)
    lanes: str | None = None  # a --lanes file: compact alone runs, with it


def make_case(source: str, text: bytes, index: int) -> Case:
    rng = random.Random(f"{source}:{index}")
    notes = []
    mutations = [rng.choice(SEMANTIC) for _ in range(rng.choice([1, 1, 2, 3]))]
    if rng.random() < 0.4:
        mutations.append(rng.choice(DESTRUCTIVE))
    for mutation in mutations:
        if not text:
            break
        text, note = mutation(rng, text)
        notes.append(f"{mutation.__name__}: {note}")
    name = "trace.json"
    if rng.random() < 0.3:
        text, name = gzip.compress(text, mtime=0), "trace.json.gz"
        notes.append("gzip")
        if rng.random() < 0.3:
            text, note = (truncate if rng.random() < 0.6 else flip_bytes)(rng, text)
            notes.append(f"then {note}")
    return Case(f"{source}#{index}", text, name, notes)


# -- running the CLI and judging the result -----------------------------------------------------------------
def complete_perfetto_file(data: bytes) -> bool:
    """Whole TracePackets (Trace field 1, length-delimited) up to the last byte."""
    position = 0
    while position < len(data):
        if data[position] != 0x0A:
            return False
        position, length, shift = position + 1, 0, 0
        while True:
            if position >= len(data) or shift > 63:
                return False
            byte = data[position]
            position += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        position += length
    return position == len(data) and len(data) > 0


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_case(case: Case, workdir: Path) -> tuple[list[str], list[Path]]:
    """Both commands on one case (compact alone with a lanes file, which convert does not
    take), each within TIMEOUT_S and MEMORY_LIMIT; (problems, successful outputs)."""
    directory = workdir / case.label.replace("#", "_")
    directory.mkdir()
    source = directory / case.name
    source.write_bytes(case.data)
    lanes = []
    if case.lanes is not None:
        (directory / "lanes.toml").write_text(case.lanes)
        lanes = ["--lanes", str(directory / "lanes.toml")]
    before = (source.read_bytes(), source.stat().st_mtime_ns)
    problems, outputs = [], []
    for command in ("compact",) if lanes else ("convert", "compact"):
        output = directory / f"{command}.perfetto-trace"
        try:
            run = subprocess.run([sys.executable, "-m", "converter.cli", command, str(source), "-o", str(output),
                                  *lanes], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S,
                                 env={**os.environ, "PYTHONWARNINGS": "default"}, preexec_fn=_limit_memory)
        except subprocess.TimeoutExpired:
            problems.append(f"{command}: no result after {TIMEOUT_S} s (a hang)")
            continue
        problem = judge(run, output)
        if problem:
            problems.append(f"{command}: {problem}")
        elif run.returncode == 0:
            outputs.append(output)
        leftovers = sorted(p.name for p in directory.iterdir() if p.name.startswith(f".{output.name}."))
        if leftovers:
            problems.append(f"{command}: temp files left behind: {leftovers}")
    if (source.read_bytes(), source.stat().st_mtime_ns) != before:
        problems.append("the input file was changed")
    return problems, outputs


def judge(run: subprocess.CompletedProcess, output: Path) -> str | None:
    """None when the run is one of the two allowed outcomes, else what is wrong."""
    stderr_tail = run.stderr[-2000:]
    if "Traceback" in run.stderr:
        return f"traceback (exit {run.returncode}):\n{stderr_tail}"
    controls = sorted({char for char in run.stdout + run.stderr if _TERMINAL_CONTROL.match(char)})
    if controls:
        return f"control characters {controls} reach the terminal:\n{stderr_tail!r}"
    if run.returncode == 2:
        lines = run.stderr.splitlines()
        if len(lines) != 1 or not lines[0].startswith("cgtrace: error: "):
            return f"exit 2 without exactly one 'cgtrace: error:' line:\n{stderr_tail}"
        if output.exists():
            return f"exit 2 but the output exists ({output.stat().st_size} bytes)"
        if run.stdout:
            return f"exit 2 but stdout has {run.stdout[:200]!r}"
        return None
    if run.returncode != 0:
        return f"exit {run.returncode}:\n{stderr_tail}"
    if not output.is_file():
        return "exit 0 but no output file"
    data = output.read_bytes()
    if not complete_perfetto_file(data):
        return f"exit 0 but the output is not whole Perfetto packets ({len(data)} bytes)"
    try:
        summary = json.loads(run.stdout)
    except ValueError:
        return f"exit 0 but stdout is not a JSON summary: {run.stdout[:300]!r}"
    if summary.get("output") != str(output) or summary.get("output_bytes") != len(data):
        return f"summary names {summary.get('output')!r}, {summary.get('output_bytes')} bytes; file has {len(data)}"
    return None


@pytest.mark.parametrize("source", list(CASES))
def test_mutated_traces_fail_cleanly_or_convert_completely(inputs, tmp_path, source):
    if source not in inputs:
        pytest.skip(f"../shared/traces/{REAL_INPUTS[source]} is not present")
    cases = [make_case(source, inputs[source], index) for index in range(CASES[source])]
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(lambda case: run_case(case, tmp_path), cases))

    failures = []
    successful = []
    for case, (problems, outputs) in zip(cases, results):
        successful += [(case, output) for output in outputs]
        if problems:
            failures.append((case, problems))
    for number, (case, output) in enumerate(successful):
        if number % TP_SAMPLE_EVERY == 0:
            try:
                stats = problem_stats(output)
            except Exception as error:  # noqa: BLE001 - any load failure is a finding
                stats = f"cannot load: {error}"
            if stats:
                failures.append((case, [f"{output.name}: trace_processor problem stats {stats}"]))
    keep = os.environ.get("FUZZ_KEEP")
    if keep:
        for case, _ in failures:
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / f"{case.label.replace('#', '_')}_{case.name}").write_bytes(case.data)
    assert not failures, "\n\n".join(
        f"{case.label} ({case.name}, {len(case.data)} bytes; {' | '.join(case.notes)[:600]}):\n  "
        + "\n  ".join(problems) for case, problems in failures)
    # The fuzzing must reach both outcomes, or it tests little.
    assert successful and len(successful) < 2 * len(cases)


# -- the hostile corpus: inputs that once got through (issue 38), run and judged as the cases above ----------
OSC_52 = "\x1b]52;c;ZWNobyBwd25lZA=="  # set the clipboard, ended by BEL below
CONTROLS = f"{OSC_52}\x07\x1b[2J\x9b31m\x7f"  # clear the screen, a C1 CSI, DEL
GROUPS = '[[groups]]\nid = "c"\nlabel = "C"\n'
STAGE_TAKES_TEXT = r"pp_pattern = '^PP:(?P<stage>.+)(?P<action>F|B)(?P<microbatch>\d*)$'" + "\n" + GROUPS


def _rule(regex: str) -> str:
    return GROUPS + f'[[rules]]\nname = "{regex}"\ngroup = "c"\n'


HOSTILE_LANES = {  # each a few bytes to a few KB
    "regex unrolling to 10^9 items": _rule("(?:(?:a{1000}){1000}){1000}"),
    "regex unrolling in a class": _rule("(?:[ab]{100000}){100000}"),
    "regex count of 200 digits": _rule("a{" + "9" * 200 + "}"),
    "regex nested 1,000 deep": _rule("(" * 1000 + ")" * 1000),
    "pp_pattern nested 1,000 deep": "pp_pattern = '" + "(?:" * 1000 + ")" * 1000 + "'\n" + GROUPS,
    "TOML arrays nested 1,000 deep": "a = " + "[" * 1000 + "]" * 1000,
    "TOML tables nested 1,000 deep": "a = " + "{b=" * 1000 + "1" + "}" * 1000,
    "pp_pattern stage taking text": STAGE_TAKES_TEXT,
    "pp_pattern stage taking control characters": STAGE_TAKES_TEXT,
}


def _with_events(text: bytes, events: list[dict], **header) -> bytes:
    document = json.loads(text)
    document.update(header, traceEvents=document["traceEvents"] + events)
    return dumps(document)


def _pp_annotations(stage: str) -> list[dict]:
    """A PP forward on the GPU and its CPU side, the stage written as `stage`."""
    return [{"name": f"PP:{stage}F1", "cat": "gpu_user_annotation", "ph": "X", "ts": 1, "dur": 20, "pid": 1,
             "tid": 7},
            {"name": f"PP:{stage}F1", "cat": "user_annotation", "ph": "X", "ts": 0, "dur": 20, "pid": 2, "tid": 2}]


def hostile_cases(generated: bytes) -> list[Case]:
    """The generated trace made hostile: names full of terminal controls (as JSON escapes, and
    as raw bytes JSON forbids), a 5,000-digit baseTimeNanoseconds (number and text), and each
    hostile lanes file (with the PP annotations a pp_pattern reads)."""
    escaped = json.dumps(CONTROLS)[1:-1].encode()
    named = _NAME_START.sub(lambda m: m.group(0) + escaped, generated)
    raw = _NAME_START.sub(lambda m: m.group(0) + b"\x1b]52;c;eA==\x07\x1b[2J", generated, count=3)
    long_base = {"number": "@@9x5000@@", "text": "9" * 5000}
    cases = [Case("names with terminal controls#0", named, "trace.json"),
             Case("names with raw control bytes#0", raw, "trace.json"),
             *(Case(f"baseTimeNanoseconds of 5,000 digits#{form}", _with_events(generated, [], baseTimeNanoseconds=base),
                    "trace.json") for form, base in long_base.items())]
    for number, (label, lanes) in enumerate(HOSTILE_LANES.items()):
        stage = CONTROLS if "control" in label else "x"
        cases.append(Case(f"lanes {label}#{number}", _with_events(generated, _pp_annotations(stage)), "trace.json",
                          [label], lanes))
    return cases


def test_the_hostile_corpus_fails_cleanly_or_converts_completely(inputs, tmp_path):
    """What once ate 24 GB, overflowed the stack, raised ValueError or wrote escapes to the
    terminal: each case is one clean line or a whole trace, within the time and memory bounds."""
    cases = hostile_cases(inputs["generated"])
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(lambda case: run_case(case, tmp_path), cases))
    failures = [f"{case.label}: " + "\n  ".join(problems) for case, (problems, _) in zip(cases, results) if problems]
    assert not failures, "\n\n".join(failures)
    converted = {case.label.split("#")[0] for case, (_, outputs) in zip(cases, results) if outputs}
    assert converted == {"names with terminal controls"}, converted  # all else is refused


# -- option and rank-metadata fuzzing: random values for every option that takes one --------------------------
OPTION_CASES = 12
MERGE_CASES = 6
_NUMBERS = ["0", "1", "2", "-1", "1.5", "", "x", "nan", "inf", "1e400", "9" * 25, " 3 ", "\u00b2", "1_0"]


def _number(rng: random.Random) -> str:
    return rng.choice(_NUMBERS) if rng.random() < 0.7 else str(rng.randint(-5, 10**rng.randint(1, 12)))


def random_options(rng: random.Random, merge: bool) -> list[str]:
    """One or two options, each with a value that is sometimes sound and often not."""
    makers = {
        "--window": lambda: f"{_number(rng)}{rng.choice([':', ':', '-', ''])}{_number(rng)}",
        "--steps": lambda: f"{_number(rng)}{rng.choice(['-', '', ':'])}{_number(rng) if rng.random() < 0.5 else ''}",
        "--jobs": lambda: _number(rng),
        "--ranks": lambda: ",".join(f"{_number(rng)}{rng.choice(['', '-' + _number(rng)])}"
                                    for _ in range(rng.randint(1, 3))),
        "--pp-group": lambda: _number(rng),
    }
    names = list(makers) if merge else ["--window", "--steps"]
    chosen = rng.sample(names, k=rng.randint(1, 2))
    if "--window" in chosen and "--steps" in chosen:
        chosen.remove("--steps")
    return [part for name in chosen for part in (name, makers[name]())]


def random_rank_header(rng: random.Random, document: dict) -> str:
    """Set one distributedInfo (or clock) field to a weird value; returns what it did."""
    info = document["distributedInfo"]
    pp = next(group for group in info["pg_config"] if group["pg_desc"] == "mesh_pp")
    value = weird_value(rng)
    target, key = rng.choice([(info, "rank"), (info, "world_size"), (info, "pg_config"), (pp, "ranks"),
                              (pp, "pg_desc"), (document, "baseTimeNanoseconds"), (document, "distributedInfo")])
    target[key] = value
    return f"{key} = {value!r:.60}"


def run_option_case(rng_seed: str, text: bytes, ranks: list[Path], workdir: Path) -> tuple[list[str], int]:
    """(problems, exit code) of one random command line."""
    rng = random.Random(rng_seed)
    directory = workdir / rng_seed.replace(":", "_")
    directory.mkdir()
    merge = rng_seed.startswith("merge")
    notes = []
    if merge:
        sources = []
        for path in ranks:
            document = json.loads(path.read_text())
            if rng.random() < 0.5:
                notes.append(random_rank_header(rng, document))
            sources.append(directory / path.name)
            sources[-1].write_text(json.dumps(document))
        command = ["merge", *map(str, sources)]
    else:
        source = directory / "trace.json"
        source.write_bytes(text)
        command = [rng.choice(["convert", "compact"]), str(source)]
    target = rng.choice(["fresh", "fresh", "fresh", "directory", "missing directory", "empty"])
    output = {"fresh": directory / "out.perfetto-trace", "directory": directory,
              "missing directory": directory / "missing" / "out.perfetto-trace", "empty": Path("")}[target]
    options = random_options(rng, merge) if rng.random() < 0.7 else []  # some runs must succeed
    args = [*command, "-o", str(output) if target != "empty" else "", *options]
    notes.append(f"cgtrace {' '.join(args[:1] + args[2 if not merge else 3:])} (-o {target})")
    try:
        run = subprocess.run([sys.executable, "-m", "converter.cli", *args], cwd=REPO, capture_output=True,
                             text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [f"{notes}: no result after {TIMEOUT_S} s (a hang)"], -1
    problems = []
    if target != "fresh" and run.returncode != 2:
        problems.append(f"-o {target} gave exit {run.returncode}:\n{run.stderr[-2000:]}")
    problem = judge(run, output if target == "fresh" else directory / "never-written")
    if problem:
        problems.append(problem)
    leftovers = sorted(p.name for p in directory.rglob("*") if p.name.endswith(".tmp") or ".cgtrace-merge-" in p.name)
    if leftovers:
        problems.append(f"temp files left behind: {leftovers}")
    return [f"{' | '.join(notes)}: {problem}" for problem in problems], run.returncode


def test_random_options_and_rank_headers_fail_cleanly_or_work(inputs, tmp_path):
    from converter.generator import write_pp_run

    ranks = write_pp_run(tmp_path / "ranks", pp_size=2, steps=2, seed=3, graphs_per_step=1, kernels_per_replay=2,
                         microbatches=2)
    seeds = [f"options:{index}" for index in range(OPTION_CASES)] + [f"merge:{index}" for index in range(MERGE_CASES)]
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(lambda seed: run_option_case(seed, inputs["generated"], ranks, tmp_path), seeds))
    failures = [problem for problems, _ in results for problem in problems]
    assert not failures, "\n\n".join(failures)
    assert {0, 2} <= {code for _, code in results}  # both outcomes reached, or it tests little
