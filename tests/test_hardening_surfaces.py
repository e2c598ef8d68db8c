"""Input that got through the third adversarial round (issue 58): the reader's retries, share,
diff, the handler, report at scale. Each is refused in one line (exit 2, nothing written, the
input untouched), or handled, in time that grows with the input, not its square."""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pytest

from converter.errors import CgtraceError
from converter.generator import GeneratorConfig, write_pp_run, write_trace
from converter.inputs.kineto_reader import parse_trace_text
from converter.tuning import Tuning
from tests.helpers import rows, write_json
from tests.oracle import expected_from
from tests.test_bad_input import assert_clean_error, run_cli, snapshot

SMALL_PIECES = Tuning(piece_bytes=64 << 10)
ANNOTATION_CATEGORIES = ("gpu_user_annotation", "cuda_graph_label")


def _best_cpu_seconds(work: Callable[[], object], repeats: int = 3) -> float:
    """The least CPU time of a few runs: what the work costs, less the machine's other load."""
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best


def _kernels(count: int, first: int = 0) -> list[dict]:
    return [{"name": f"k{i}", "cat": "kernel", "ph": "X", "ts": 10 * i, "dur": 5, "pid": 0, "tid": 7,
             "args": {"stream": 7, "grid": [i, 1, 1]}} for i in range(first, first + count)]


def _with_bad_first_time(count: int, bad: bytes) -> bytes:
    """A trace whose first event's `ts` is `bad` (not JSON), then `count` good events."""
    rest = json.dumps(_kernels(count, first=1))[1:-1].encode()
    return b'{"traceEvents":[{"name":"k0","cat":"kernel","ph":"X","ts":' + bad + b',"dur":5,"pid":0,"tid":7},' \
        + rest + b"]}"


def _refuse(text: bytes) -> None:
    with pytest.raises(CgtraceError, match="not valid JSON"):
        parse_trace_text(text, tuning=SMALL_PIECES)


BAD_TOKENS = {"nan": b"NaN", "infinity": b"Infinity", "lone_surrogate": b'"\\ud800"', "control_character": b'"\x01"'}


@pytest.mark.parametrize("bad", BAD_TOKENS.values(), ids=BAD_TOKENS.keys())
def test_a_trace_that_is_not_json_near_its_start_is_refused_in_the_time_of_one_read(bad):
    """Row 1: each failed piece was re-copied and re-decoded up to every later `},{`, quadratic
    in the file (26 MB: 118 s). 4x the file may cost at most 5x."""
    small, large = _with_bad_first_time(6_000, bad), _with_bad_first_time(24_000, bad)
    assert len(large) > 3 << 20
    cpu_small, cpu_large = _best_cpu_seconds(lambda: _refuse(small)), _best_cpu_seconds(lambda: _refuse(large))
    assert cpu_large < 5 * cpu_small + 0.05, (cpu_small, cpu_large)


def test_a_trace_that_is_not_json_is_one_line_naming_it(tmp_path):
    source = tmp_path / "trace.json"
    source.write_bytes(_with_bad_first_time(24_000, b"NaN"))
    before = snapshot(tmp_path)

    assert_clean_error(run_cli(tmp_path, "report", source), "trace.json: not valid JSON", tmp_path, before)


TINY_PIECES = Tuning(piece_bytes=4 << 10)


def _with_string_across_a_piece(text: str) -> bytes:
    """A valid trace whose args string `text` starts just before the first piece's end and
    runs past it."""
    before: list[dict] = []
    while len(json.dumps(before)) < TINY_PIECES.piece_bytes - 500:
        before += _kernels(1, first=len(before))
    long_one = {"name": "long", "cat": "cpu_op", "ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 1,
                "args": {"text": text}}
    return json.dumps({"traceEvents": [*before, long_one, *_kernels(2_000, first=len(before))]}).encode()


def _read_seconds(document: bytes) -> float:
    return _best_cpu_seconds(lambda: parse_trace_text(document, tuning=TINY_PIECES))


def test_cut_like_bytes_in_a_string_across_a_piece_cost_one_read():
    """Row 2: every `},{` inside a string past the piece's end cost a copy and a decode of the
    piece so far (4,000: 0.3 s -> 11.5 s). 4x the copies may cost at most 5x, and the string
    costs about what a string as long without them does."""
    small, large = _with_string_across_a_piece("},{" * 5_000), _with_string_across_a_piece("},{" * 20_000)
    trace = parse_trace_text(large, tuning=TINY_PIECES)

    events = json.loads(large)["traceEvents"]
    assert len(trace.slices) == len(events)
    long_row = [row for row, name in enumerate(trace.slices.rows()) if name.name == "long"]
    expected = [event["args"] for event in events if event["name"] == "long"]
    assert [json.loads(args or b"") for args in trace.args_texts(np.array(long_row))] == expected
    cpu_small, cpu_large = _read_seconds(small), _read_seconds(large)
    assert cpu_large < 5 * cpu_small + 0.05, (cpu_small, cpu_large)
    cpu_plain = _read_seconds(_with_string_across_a_piece("x,y" * 20_000))
    assert cpu_large < 3 * cpu_plain + 0.05, (cpu_plain, cpu_large)


MISSING_INPUTS = {
    "view_missing": (["view", "missing.json", "--no-browser", "--port", "0"], "missing.json: no such file"),
    "share_missing": (["share", "missing.json"], "missing.json: no such file"),
    "share_dangling_symlink": (["share", "../links/dangling.json"],
                               "dangling.json: no such file (a symbolic link to nothing)"),
}


@pytest.mark.parametrize("case", MISSING_INPUTS)
def test_a_missing_input_to_view_or_share_is_one_line(tmp_path, case):
    """Row 5: FileNotFoundError tracebacks, exit 1."""
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "dangling.json").symlink_to(tmp_path / "nothing")
    work = tmp_path / "work"  # apart from the link, which a snapshot cannot stat
    work.mkdir()
    arguments, expected = MISSING_INPUTS[case]
    before = snapshot(work)

    assert_clean_error(run_cli(work, *arguments), expected, work, before)


def test_share_of_the_current_directory_writes_beside_it(tmp_path):
    """Row 5: `cd ranks && cgtrace share .` raised ValueError ('.' has an empty name). The
    bundle goes where `share ranks` from above puts it, and holds the merged trace."""
    write_pp_run(tmp_path / "ranks", pp_size=2, steps=1, seed=1, graphs_per_step=1, kernels_per_replay=2,
                 microbatches=2)

    run = run_cli(tmp_path / "ranks", "share", ".", "-q")

    assert run.returncode == 0 and run.stderr == "", run.stderr[-1500:]
    [bundle] = [entry for entry in tmp_path.iterdir() if entry.name.endswith("_share")]
    assert (bundle / "index.html").is_file() and list(bundle.glob("*.perfetto-trace"))


@pytest.fixture
def two_ranks(tmp_path) -> list:
    return write_pp_run(tmp_path / "ranks", pp_size=2, steps=1, seed=1, graphs_per_step=1, kernels_per_replay=2,
                        microbatches=2)


OUTPUT_IS_AN_INPUT = {
    "merge": ["merge", "ranks", "-o", "ranks/rank0_trace.json", "--overwrite"],
    "report": ["report", "ranks/rank0_trace.json", "-o", "ranks/rank0_trace.json", "--overwrite"],
    "report_dir": ["report", "ranks", "-o", "ranks/rank1_trace.json", "--overwrite"],
    "diff": ["diff", "ranks/rank0_trace.json", "ranks/rank1_trace.json", "-o", "ranks/rank1_trace.json",
             "--overwrite"],
    "convert": ["convert", "ranks/rank0_trace.json", "-o", "ranks/rank0_trace.json", "--overwrite"],
}


@pytest.mark.parametrize("case", OUTPUT_IS_AN_INPUT)
def test_an_output_that_is_an_input_is_refused_even_with_overwrite(tmp_path, two_ranks, case):
    """Row 9: merge, report and diff replaced their input with their output."""
    arguments = OUTPUT_IS_AN_INPUT[case]
    before = snapshot(tmp_path)

    assert_clean_error(run_cli(tmp_path, *arguments), f"{arguments[arguments.index('-o') + 1]}: is an input",
                       tmp_path, before)


def test_cgtraces_own_json_output_compacts_and_reports_again(tmp_path):
    """Row 7: compacting or reporting `compact --format json` output failed its self-check
    (51 measured slices before, 50 after): the kernel label spans it holds were counted as
    measured, then derived a second time. The measured slices stay the original input's, and
    the label spans are as many as the JSON holds, not twice that."""
    source = write_trace(GeneratorConfig(seed=1, steps=2, graphs_per_step=2, kernels_per_replay=4),
                         tmp_path / "trace.json")
    assert run_cli(tmp_path, "compact", source, "--format", "json", "-o", "once.json", "-q").returncode == 0
    once = tmp_path / "once.json"
    before = snapshot(tmp_path)

    again = run_cli(tmp_path, "compact", once, "-o", "again.perfetto-trace", "-q")
    report = run_cli(tmp_path, "report", once, "--format", "json")

    assert again.returncode == 0 and report.returncode == 0, again.stderr + report.stderr
    assert json.loads(report.stdout)["gpus"]
    measured = Counter((row["name"], row["ts"], row["dur"]) for row in rows(tmp_path / "again.perfetto-trace", f"""
        select name, ts, dur from slice where coalesce(category, '') not in {ANNOTATION_CATEGORIES}"""))
    assert measured == expected_from(source, skip_categories=ANNOTATION_CATEGORIES).slices
    labels_in_json = sum(event.get("cat") == "cuda_graph_label" for event in json.loads(once.read_text())["traceEvents"])
    [labels_again] = rows(tmp_path / "again.perfetto-trace",
                          "select count(*) n from cgtrace_derived_slice where category = 'cuda_graph_label'")
    assert labels_in_json > 0 and labels_again["n"] == labels_in_json
    after = snapshot(tmp_path)
    del after["again.perfetto-trace"]
    assert after == before  # the input as it was, nothing else written


def test_the_python_api_checks_its_arguments_as_the_command_line_does(tmp_path):
    """Row 14: merge([]) raised IndexError, report(top=10**30) an SQL error naming a deleted
    scratch file, and diff(A, A).beyond(-1) named 9 unchanged figures as moved past -1%."""
    import converter

    source = write_trace(GeneratorConfig(seed=1, steps=2, graphs_per_step=2, kernels_per_replay=4),
                         tmp_path / "trace.json")
    with pytest.raises(CgtraceError, match="no rank traces to merge"):
        converter.merge([])
    for top in (10**30, -1, 2.5, True):
        with pytest.raises(CgtraceError, match="top="):
            converter.report(source, top=top)
    with pytest.raises(CgtraceError, match="jobs=0"):
        converter.diff(source, source, jobs=0)
    same = converter.diff(source, source, jobs=1)
    assert same.beyond(0) == ()
    for pct in (-1, float("inf"), float("nan")):
        with pytest.raises(CgtraceError, match=r"beyond\("):
            same.beyond(pct)


def _rank_with(tmp_path, change: Callable[[dict], None]):
    [rank0, _] = write_pp_run(tmp_path / "ranks", pp_size=2, steps=1, seed=1, graphs_per_step=1,
                              kernels_per_replay=2, microbatches=2)
    document = json.loads(rank0.read_text())
    change(document)
    rank0.write_text(json.dumps(document))
    return rank0, document


def _huge_rank(document: dict) -> None:
    document["distributedInfo"]["rank"] = 2**70


def _huge_stage(document: dict) -> None:
    for event in document["traceEvents"]:
        if event.get("name") == "PP:1F0":
            event["name"] = "PP:" + "1" * 100_000 + "F0"


@pytest.mark.parametrize("change", [_huge_rank, _huge_stage], ids=["rank_2_70", "stage_of_100000_digits"])
@pytest.mark.parametrize("command", [["report", "--format", "json"], ["report"], ["diff", "--format", "json"]],
                         ids=["report_json", "report_text", "diff_json"])
def test_numbers_beyond_int64_in_a_trace_are_no_rank_or_stage(tmp_path, change, command):
    """Row 10: a rank of 2**70 crashed the JSON writer (Integer exceeds 64-bit range), a stage
    of 100,000 digits int() (ValueError) in every format. Neither is a rank or stage: the
    report answers without them, with every GPU of the trace."""
    source, document = _rank_with(tmp_path, change)
    traces = [source] * (2 if command[0] == "diff" else 1)

    run = run_cli(tmp_path, command[0], *traces, *command[1:])

    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-1500:]
    if command[0] == "report" and "json" in command:
        gpu_pids = {event["pid"] for event in document["traceEvents"] if event.get("cat") == "kernel"}
        figures = json.loads(run.stdout)
        assert len(figures["gpus"]) == len(gpu_pids)
        assert all("2361183241434822606848" not in gpu["gpu"] for gpu in figures["gpus"])


HOSTILE_NAME = "x\x1b]0;title\x07\x1b[31m"
_RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _one_escaped_line(run) -> str:
    """stderr as one line, every control character in it escaped, the name's escape shown."""
    assert "Traceback" not in run.stderr, run.stderr[-1500:]
    assert not _RAW_CONTROL.search(run.stderr) and run.stderr.count("\n") == 1, repr(run.stderr)
    assert "x\\x1b]0;title\\x07\\x1b[31m" in run.stderr or "a\\nb" in run.stderr, repr(run.stderr)
    return run.stderr


def test_control_characters_in_file_names_reach_the_terminal_escaped(tmp_path):
    """Row 13: file names (given, or found in a directory) and -o paths holding ESC, BEL or a
    newline were printed raw in errors and in summaries' last lines."""
    source = write_trace(GeneratorConfig(seed=1, steps=1, graphs_per_step=1, kernels_per_replay=2),
                         tmp_path / f"{HOSTILE_NAME}.json")
    broken = tmp_path / "ranks" / f"rank0_{HOSTILE_NAME}_trace.json"
    broken.parent.mkdir()
    broken.write_text("not json")
    (tmp_path / "ranks" / "rank1_trace.json").write_bytes(source.read_bytes())

    errors = [run_cli(tmp_path, "report", tmp_path / f"{HOSTILE_NAME}missing.json"),
              run_cli(tmp_path, "merge", tmp_path / "ranks")]
    for run in errors:
        assert run.returncode == 2
        _one_escaped_line(run)
    written = [run_cli(tmp_path, "convert", source, "-o", "a\nb.perfetto-trace"),
               run_cli(tmp_path, "share", source, "-o", f"{HOSTILE_NAME}_bundle")]
    for run in written:
        assert run.returncode == 0
        _one_escaped_line(run)


def _on_a_full_disk(cwd, limit_kb: int, *arguments) -> subprocess.CompletedProcess:
    """The command with writes past `limit_kb` failing (RLIMIT_FSIZE: a full disk without
    root), TMPDIR and the cache folder inside `cwd`."""
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_kb << 10, limit_kb << 10))
    for folder in ("tmp", "cache"):
        (cwd / folder).mkdir(exist_ok=True)
    environment = dict(os.environ, TMPDIR=str(cwd / "tmp"), XDG_CACHE_HOME=str(cwd / "cache"))
    return subprocess.run([sys.executable, "-m", "converter.cli", *map(str, arguments)], cwd=cwd, capture_output=True,
                          text=True, timeout=120, preexec_fn=limited, env=environment)


def _short_line(run: subprocess.CompletedProcess, *expected: str) -> str:
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-1500:]
    [line] = run.stderr.splitlines()
    assert len(line) < 300 and all(part in line for part in expected), line
    return line


def test_a_full_disk_or_missing_input_under_share_and_report_names_what_to_fix(tmp_path, two_ranks):
    """Row 12: share of a missing Perfetto trace blamed the output; share onto a full disk
    printed a 23-25 KB line, every failed copy of its UI; report DIR and share with a full
    TMPDIR or cache folder advised -o, which they were not given."""
    source = write_trace(GeneratorConfig(seed=1, steps=1, graphs_per_step=1, kernels_per_replay=2),
                         tmp_path / "trace.json")
    _short_line(run_cli(tmp_path, "share", "missing.perfetto-trace", "-o", "B"), "missing.perfetto-trace: no such file")
    # First, while the cache holds no compacted trace: a limit the args fit under, the output not.
    cache_full = _short_line(_on_a_full_disk(tmp_path, 8, "share", source, "-o", "C"),
                             str(tmp_path / "cache"), "XDG_CACHE_HOME")
    _short_line(_on_a_full_disk(tmp_path, 1024, "share", source, "-o", "B"), "B: cannot write the bundle")
    tmp_full = _short_line(_on_a_full_disk(tmp_path, 16, "report", "ranks"), "TMPDIR")
    assert "with -o" not in tmp_full and "with -o" not in cache_full
    assert not (tmp_path / "B").exists() and not (tmp_path / "C").exists()
    assert list((tmp_path / "tmp").iterdir()) == []


_CTRL_C_WHILE_IMPORTING = """
import os, runpy, signal, sys

AT = sys.argv[1]
# As at a terminal: a process started in the background by a shell without job control (a CI
# runner's) inherits SIGINT ignored, and Python then raises no KeyboardInterrupt at all.
signal.signal(signal.SIGINT, signal.default_int_handler)

class CtrlCAt:
    '''Ctrl-C as the command's start-up imports reach a module: where it lands most often.'''
    def find_spec(self, name, path=None, target=None):
        if name == AT:
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlCAt())
sys.argv = ["cgtrace", "compact", "trace.json"]
runpy.run_module("converter.cli", run_name="__main__")
"""


@pytest.mark.parametrize("module", ["msgspec", "numpy", "converter.inputs.kineto_reader", "converter.cli.answers"])
def test_ctrl_c_while_cgtrace_imports_is_one_line(tmp_path, module):
    """Row 15: Ctrl-C in the first 0.1-0.4 s exited 130 with a 22-line traceback."""
    source = write_trace(GeneratorConfig(seed=1, steps=1, graphs_per_step=1, kernels_per_replay=2),
                         tmp_path / "trace.json")
    before = snapshot(tmp_path)

    run = subprocess.run([sys.executable, "-c", _CTRL_C_WHILE_IMPORTING, module], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1])))

    assert source.exists() and (run.returncode, run.stderr) == (130, "cgtrace: interrupted; nothing was written\n"), \
        run.stderr[-1500:]
    assert snapshot(tmp_path) == before


def _status(port: int, path: str, host: str) -> int:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest("GET", path, skip_host=True)
        connection.putheader("Host", host)
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


def test_the_share_bundles_server_answers_only_requests_addressed_to_it(tmp_path):
    """Row 6: the bundle's open.py served the trace and folder listings to any Host (a page
    that rebinds its DNS name to 127.0.0.1 could read them); view answered 403."""
    source = write_trace(GeneratorConfig(seed=1, steps=1, graphs_per_step=1, kernels_per_replay=2),
                         tmp_path / "trace.json")
    assert run_cli(tmp_path, "share", source, "-o", "bundle", "-q").returncode == 0
    bundle = tmp_path / "bundle"
    [trace] = [path.name for path in bundle.glob("*.perfetto-trace")]
    server = subprocess.Popen([sys.executable, "open.py", "--port", "0", "--no-browser"], cwd=bundle,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(re.search(r"127\.0\.0\.1:(\d+)/", server.stdout.readline()).group(1))
        own = f"127.0.0.1:{port}"
        assert [_status(port, f"/{trace}", host) for host in (own, f"localhost:{port}")] == [200, 200]
        assert [_status(port, path, "evil.example.com") for path in (f"/{trace}", "/", "/index.html")] == [403] * 3
        assert _status(port, f"/{trace}", f"evil.example.com:{port}") == 403
        unindexed = next(path for path in (bundle / "ui").rglob("*") if path.is_dir() and
                         not (path / "index.html").exists())
        assert _status(port, f"/{unindexed.relative_to(bundle)}/", own) == 404  # no folder listings
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_a_merge_says_what_a_ranks_base_time_put_out_of_range(tmp_path, two_ranks):
    """Row 11: a rank whose baseTimeNanoseconds is 2**63 - 1 (accepted) lost nearly all its
    events past int64 ns, and the merge said nothing. Its summary and last line say so, with
    as many events as the oracle finds past the range; --strict refuses."""
    text = two_ranks[1].read_text()
    rank1 = json.loads(text)
    rank1["baseTimeNanoseconds"] = 2**63 - 1
    two_ranks[1].write_text(json.dumps(rank1))
    past = sum(1 for event in json.loads(text, parse_float=Decimal)["traceEvents"]
               if event.get("ph") != "M" and 2**63 - 1 + int(Decimal(event["ts"]) * 1000) > 2**63 - 1)

    run = run_cli(tmp_path, "merge", "ranks", "-o", "m.perfetto-trace")

    assert run.returncode == 0, run.stderr[-1500:]
    summary = json.loads(run.stdout)
    assert past > 100 and summary["events_skipped"] == past and summary["skipped_by_reason"] == {"ts_out_of_range": past}
    assert f"({past} unusable events skipped; see skipped_by_reason)" in run.stderr
    before = snapshot(tmp_path)
    assert_clean_error(run_cli(tmp_path, "merge", "ranks", "-o", "strict.perfetto-trace", "--strict"),
                       "ts_out_of_range", tmp_path, before)


def test_ranks_whose_pp_groups_contradict_are_refused_naming_both(tmp_path, two_ranks):
    """Row 8: rank 0 listing mesh_pp [1, 0] and rank 1 [0, 1] merged, exit 0, as two
    "pipelines" with both ranks at PP rank 1 in each."""
    document = json.loads(two_ranks[1].read_text())
    [mesh_pp] = [group for group in document["distributedInfo"]["pg_config"] if group.get("pg_desc") == "mesh_pp"]
    mesh_pp["ranks"] = mesh_pp["ranks"][::-1]
    two_ranks[1].write_text(json.dumps(document))
    before = snapshot(tmp_path)

    run = run_cli(tmp_path, "merge", "ranks")

    assert_clean_error(run, "contradicts", tmp_path, before)
    assert "rank0_trace.json" in run.stderr and "rank1_trace.json" in run.stderr


class _Profiler:
    """What trace_handler uses of torch.profiler.profile; `fail_after` bytes written, the
    export dies, as a profiler killed or out of disk half-way does."""

    def __init__(self, trace: bytes, fail_after: Optional[int] = None):
        self.trace, self.fail_after = trace, fail_after

    def export_chrome_trace(self, path: str) -> None:
        with open(path, "wb") as stream:
            stream.write(self.trace[:self.fail_after])
            if self.fail_after is not None:
                raise OSError(errno.ENOSPC, "No space left on device")


def _as_exported(kineto: bytes) -> dict:
    """The JSON but its traceName, which the handler sets to the name it keeps the file under."""
    document = json.loads(kineto)
    document.pop("traceName", None)
    return document


def _left_behind(folder) -> list[str]:
    """Hidden, temporary or empty files: what a failed step must not leave."""
    return sorted(path.name for path in folder.iterdir()
                  if path.name.startswith(".") or path.name.endswith(".tmp") or path.stat().st_size == 0)


@pytest.fixture
def kineto(tmp_path) -> bytes:
    return write_trace(GeneratorConfig(seed=1, steps=1, graphs_per_step=1, kernels_per_replay=2),
                       tmp_path / "kineto.json").read_bytes()


def test_the_handler_never_raises_and_leaves_nothing_partial(tmp_path, kineto, monkeypatch):
    """Row 3: the keep / gzip / drop step ran outside the guard: a full disk while gzipping or
    a .gz path that cannot be written raised into the training loop, left a 0-byte or partial
    .json.gz and counted no failure; an export that died half-way left a hidden file."""
    import converter

    died = converter.trace_handler(tmp_path / "died", worker_name="w")
    died(_Profiler(kineto, fail_after=1000))
    assert died.failures == 1 and list((tmp_path / "died").iterdir()) == []

    blocked = converter.trace_handler(tmp_path / "blocked", worker_name="w", gzip_json=True)
    (tmp_path / "blocked" / "w.cycle1.steps0.pt.trace.json.gz").mkdir(parents=True)   # the one ProfilerStep#0
    blocked(_Profiler(kineto))
    kept = tmp_path / "blocked" / "w.cycle1.steps0.pt.trace.json"
    assert blocked.failures == 1 and _as_exported(kept.read_bytes()) == _as_exported(kineto)
    assert json.loads(kept.read_bytes())["traceName"] == str(kept)   # not the .gz never written
    assert _left_behind(tmp_path / "blocked") == []

    def disk_fills(source, target, length=0):
        target.write(source.read(4096))
        raise OSError(errno.ENOSPC, "No space left on device")

    full = converter.trace_handler(tmp_path / "full", worker_name="w", gzip_json=True)
    with monkeypatch.context() as patch:
        patch.setattr("converter.api.handler.shutil.copyfileobj", disk_fills)
        full(_Profiler(kineto))
    assert full.failures == 1 and "No space left" in (full.last_error or "")
    assert sorted(path.name for path in (tmp_path / "full").iterdir()) == [
        "w.cycle1.steps0.pt.trace.json", "w.cycle1.steps0.pt.trace.perfetto-trace"]
    assert _left_behind(tmp_path / "full") == []


@pytest.mark.parametrize("keep", ["gzip_json", "keep_json=False"])
def test_six_threads_on_one_handler_and_step_never_raise(tmp_path, kineto, keep):
    """Row 3: 6 threads exporting the same rank and step into one directory raised
    FileNotFoundError / OSError into 5 of them. Each call returns; what is there is whole
    (each call is the worker's next profiling cycle, so a file of its own)."""
    import converter

    handler = converter.trace_handler(tmp_path / "out", worker_name="w", gzip_json=keep == "gzip_json",
                                      keep_json=keep == "gzip_json")
    raised: list[BaseException] = []

    def step() -> None:
        try:
            handler(_Profiler(kineto))
        except BaseException as error:  # noqa: BLE001 (what the test looks for)
            raised.append(error)

    threads = [threading.Thread(target=step) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert raised == [] and handler.failures <= 6
    out = tmp_path / "out"
    assert _left_behind(out) == []
    for cycle in range(1, 7):
        if keep == "gzip_json" and (out / f"w.cycle{cycle}.steps0.pt.trace.json.gz").exists():
            assert _as_exported(gzip.decompress((out / f"w.cycle{cycle}.steps0.pt.trace.json.gz").read_bytes())) \
                == _as_exported(kineto)
        assert rows(out / f"w.cycle{cycle}.steps0.pt.trace.perfetto-trace", "select count(*) n from slice")[0]["n"] > 0


def _many_steps(steps: int, kernels_per_step: int = 10) -> dict:
    """A GPU trace of `steps` ProfilerSteps, each with a few kernels."""
    events: list[dict] = []
    for step in range(steps):
        events.append({"name": f"ProfilerStep#{step}", "cat": "user_annotation", "ph": "X", "ts": 100 * step,
                       "dur": 90, "pid": 1, "tid": 1})
        events += [{"name": f"k{k}", "cat": "kernel", "ph": "X", "ts": 100 * step + 1 + 8 * k, "dur": 5, "pid": 0,
                    "tid": 7, "args": {"device": 0, "stream": 7}} for k in range(kernels_per_step)]
    return {"traceEvents": events}


def _command_cpu_seconds(cwd, *arguments) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = run_cli(cwd, *arguments)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert run.returncode == 0, run.stderr[-1500:]
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


@pytest.mark.parametrize("command", ["report", "diff"])
def test_report_and_diff_of_4x_the_steps_cost_at_most_5x(tmp_path, command):
    """Row 4: every GPU slice was joined with every step window in SQL: 1,000 -> 4,000 steps of
    10 kernels took 4.5 -> 46 s of CPU. Now both figures are two key lookups per slice."""
    cpu = []
    for steps in (500, 2_000):
        source = write_json(tmp_path / f"steps{steps}.json", _many_steps(steps))
        traces = [source] * (2 if command == "diff" else 1)
        cpu.append(_command_cpu_seconds(tmp_path, command, *traces, "--format", "json", "-o", f"{steps}.json"))
    assert cpu[1] < 5 * cpu[0], cpu
    figures = json.loads((tmp_path / "2000.json").read_text())
    if command == "report":  # all 2,000 steps there, each with its 10 kernels' 50 us busy
        [gpu] = figures["gpus"]
        assert len(gpu["steps"]) == 2_000 and {step["compute_busy_ns"] for step in gpu["steps"]} == {50_000}
        assert {kernel["count"] for kernel in figures["top_kernels"]} == {2_000}


@pytest.fixture(scope="module")
def merged_pipelines(tmp_path_factory) -> dict[int, Path]:
    folder = tmp_path_factory.mktemp("pipelines")
    merged = {}
    for steps in (50, 200):
        ranks = write_pp_run(folder / f"ranks{steps}", pp_size=2, steps=steps, seed=1, graphs_per_step=1,
                             kernels_per_replay=2, microbatches=2)
        merged[steps] = folder / f"merged{steps}.perfetto-trace"
        assert run_cli(folder, "merge", ranks[0].parent, "-o", merged[steps], "-q").returncode == 0
    return merged


def test_the_report_of_a_merged_pipeline_with_4x_the_steps_costs_at_most_5x(merged_pipelines):
    """Row 4: the pipeline anatomy and the RECV/SEND figures intersected whole-trace interval
    lists once per step (200 -> 800 steps: 2.4 -> 21 s; here 50 -> 200 steps took 7x the
    CPU). Each step now takes its part of them by bisection."""
    from converter.analysis.report import build_report

    build_report(merged_pipelines[50])  # trace_processor's module compiled and cached first
    cpu = [_best_cpu_seconds(lambda: build_report(merged_pipelines[steps]), repeats=2) for steps in (50, 200)]
    assert cpu[1] < 5 * cpu[0], cpu
    stages = build_report(merged_pipelines[200]).figures["pipeline"]["stages"]
    assert len(stages) == 2 * 200
    for row in stages:  # the parts add up to the step, as defined
        assert sum(row[part] for part in ("compute_ns", "warmup_ns", "drain_ns", "recv_wait_ns", "exposed_comm_ns",
                                          "other_ns")) == row["step_ns"]
