"""Input that once got through: a tiny lanes file that ate 24 GB, quadratic layouts, two inputs
for one output, terminal escapes in names. Each is refused in one line (exit 2, nothing written)
or handled, quickly and within bounded memory."""

from __future__ import annotations

import gzip
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
import numpy as np
import pytest

from converter.generator import write_pp_run
from tests.test_bad_input import KERNELS_OF_AS, assert_clean_error, make_input, run_cli, snapshot

MEMORY_LIMIT = 2 << 30

GROUPS = '[[groups]]\nid = "c"\nlabel = "C"\n'
NASTY_LANES = {
    "unrolls_to_a_billion": GROUPS + '[[rules]]\nname = "(?:(?:a{1000}){1000}){1000}"\ngroup = "c"\n',
    "unrolls_in_a_class": GROUPS + '[[rules]]\nname = "(?:[ab]{100000}){100000}"\ngroup = "c"\n',
    "huge_count": GROUPS + '[[rules]]\nname = "a{' + "9" * 200 + '}"\ngroup = "c"\n',
    "regex_nested_deep": GROUPS + '[[rules]]\nname = "' + "(" * 400 + ")" * 400 + '"\ngroup = "c"\n',
    "pp_pattern_nested_deep": "pp_pattern = '" + "(?:" * 150 + ")" * 150 + "'\n" + GROUPS,
    "toml_nested_deep": "a = " + "[" * 500 + "]" * 500,
    "toml_tables_nested_deep": "a = " + "{b=" * 250 + "1" + "}" * 250,
}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@pytest.mark.parametrize("command", ["compact", "report", "merge", "diff"])  # every command that takes --lanes
@pytest.mark.parametrize("case", sorted(NASTY_LANES))
def test_small_lanes_files_are_refused_quickly_in_bounded_memory(tmp_path, case, command):
    text = NASTY_LANES[case]
    assert len(text.encode()) < 1024
    source = make_input(tmp_path, KERNELS_OF_AS, "trace.json")
    (tmp_path / "lanes.toml").write_text(text)
    before = snapshot(tmp_path)
    started = time.monotonic()

    traces = [str(source)] * (2 if command in ("merge", "diff") else 1)
    run = subprocess.run([sys.executable, "-m", "converter.cli", command, *traces, "--lanes", "lanes.toml"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, preexec_fn=_limit_memory)

    assert time.monotonic() - started < 30
    assert_clean_error(run, "lanes.toml: invalid lane rules", tmp_path, before)
    if case.startswith(("unrolls", "huge", "regex")):
        assert "rule 1 (group 'c') name" in run.stderr
    elif case.startswith("pp_pattern"):
        assert "pp_pattern" in run.stderr


def test_a_rule_with_a_bad_regex_is_named(tmp_path):
    source = make_input(tmp_path, KERNELS_OF_AS, "trace.json")
    (tmp_path / "lanes.toml").write_text(GROUPS + '[[rules]]\ncategory = "kernel"\ngroup = "c"\n'
                                         '[[rules]]\nname = "(unclosed"\ngroup = "c"\n')
    before = snapshot(tmp_path)

    assert_clean_error(run_cli(tmp_path, "compact", source, "--lanes", "lanes.toml"),
                       "rule 2 (group 'c') name: missing )", tmp_path, before)


def test_rules_within_the_bounds_still_work(tmp_path):
    source = make_input(tmp_path, KERNELS_OF_AS, "trace.json")
    (tmp_path / "lanes.toml").write_text(GROUPS + '[[groups]]\nid = "m"\nlabel = "M"\n'
                                         '[[rules]]\nname = "^(?:a{3}){11}b"\ngroup = "m"\n')

    run = run_cli(tmp_path, "compact", source, "--lanes", "lanes.toml")

    assert run.returncode == 0, run.stderr[-1500:]
    assert json.loads(run.stdout)["slice_groups"] == {"C": 2, "M": 1}


def test_matching_time_in_all_is_bounded_and_the_slowest_rule_named(tmp_path):
    """Every match within its own budget, 20 rules on 300 names would still take minutes."""
    kernels = [{"name": "x" * 13 + f"_{i}", "cat": "kernel", "ph": "X", "ts": 10 * i, "dur": 5, "pid": 1, "tid": 7}
               for i in range(300)]
    source = tmp_path / "trace.json"
    source.write_text(json.dumps({"traceEvents": kernels}))
    slow = '[[rules]]\nname = "^(?:x|x)+y"\ngroup = "c"\n'
    (tmp_path / "lanes.toml").write_text(GROUPS + '[[rules]]\ncategory = "memset"\ngroup = "c"\n' + slow * 20)
    before = snapshot(tmp_path)
    budget_of_2_s = "import converter.lane_rules as r; r.TOTAL_MATCH_SECONDS = 2; from converter.cli import console; console()"
    started = time.monotonic()

    run = subprocess.run([sys.executable, "-c", budget_of_2_s, "compact", "trace.json", "--lanes", "lanes.toml"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)

    assert time.monotonic() - started < 30
    assert_clean_error(run, "matching kernel names took over 2 s in all", tmp_path, before)
    assert re.search(r"s of it in rule \d+ \(group 'c'\); simplify its regex", run.stderr), run.stderr


def _staircase(count: int) -> list[dict]:
    """`count` slices on one thread, each starting inside all earlier ones and ending after
    them: every one partially overlaps every later one, so each takes an overlap track."""
    return [{"name": f"s{i}", "cat": "cpu_op", "ph": "X", "ts": i, "dur": count, "pid": 1, "tid": 1}
            for i in range(count)]


def _layering_seconds(count: int) -> float:
    from converter.model import NO_ARGS, SliceTable, Track
    from converter.model.nesting import nested_layers

    table, track = SliceTable(), Track(name="thread")
    for event in _staircase(count):
        table.append(event["ts"], event["dur"], event["name"], "cpu_op", NO_ARGS, track)
    rows = np.arange(count)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        assert len(nested_layers(table, rows)) == count
        best = min(best, time.perf_counter() - started)
    return best


def test_overlap_layers_of_a_staircase_take_about_linear_time():
    """Quadratic, 4x the slices would take 16x the time; n log n takes a little over 4x."""
    assert _layering_seconds(8000) < 10 * _layering_seconds(2000)


def _convert_cpu_seconds(source: Path) -> float:
    """The CPU time `cgtrace convert` takes (user and system, its whole process): unlike wall
    time, it does not grow with what else the machine runs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = subprocess.run([sys.executable, "-m", "converter.cli", "convert", str(source), "-q", "--overwrite"],
                         capture_output=True, text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert run.returncode == 0, run.stderr[-1500:]
    count = len(json.loads(source.read_text())["traceEvents"])
    assert json.loads(run.stdout)["overlaps_moved"] == count - 1  # every slice but the first on a track of its own
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def test_a_staircase_converts_in_seconds_and_twice_the_slices_cost_about_twice(tmp_path):
    """30,000 slices each overlapping the next once took minutes (quadratic layering): now under
    5 s, and the 6 MB case of 60,000 costs per slice, not per pair (quadratic would be 4x)."""
    small, large = tmp_path / "stair30k.json", tmp_path / "stair60k.json"
    small.write_text(json.dumps({"traceEvents": _staircase(30_000)}))
    large.write_text(json.dumps({"traceEvents": _staircase(60_000)}))
    assert large.stat().st_size > 5 << 20

    cpu_small, cpu_large = _convert_cpu_seconds(small), _convert_cpu_seconds(large)

    assert cpu_small < 5
    assert cpu_large < 3 * cpu_small, (cpu_small, cpu_large)


TWO_STEPS = {"traceEvents": [
    {"name": f"ProfilerStep#{step}", "cat": "cpu_op", "ph": "X", "ts": 100 * step, "dur": 90, "pid": 1, "tid": 1}
    for step in (1, 2)] + [
    {"name": f"k{step}", "cat": "kernel", "ph": "X", "ts": 100 * step + 10, "dur": 5, "pid": 1, "tid": 7}
    for step in (1, 2)]}


def test_split_steps_checks_only_the_files_it_writes(tmp_path):
    source = tmp_path / "trace.json"
    source.write_text(json.dumps(TWO_STEPS))
    unsplit = tmp_path / "trace_compacted.perfetto-trace"
    unsplit.write_text("an earlier compact, not split")

    run = run_cli(tmp_path, "compact", source, "--split-steps", "-q")

    assert run.returncode == 0, run.stderr[-1500:]
    assert unsplit.read_text() == "an earlier compact, not split"
    written = ["trace_compacted_step1.perfetto-trace", "trace_compacted_step2.perfetto-trace"]
    assert sorted(p.name for p in tmp_path.glob("*_step*")) == written
    summary = json.loads(run.stdout)  # names the files written, not the base
    assert "output" not in summary and [Path(step["output"]).name for step in summary["steps"]] == written
    before = snapshot(tmp_path)
    assert_clean_error(run_cli(tmp_path, "compact", source, "--split-steps"),
                       "trace_compacted_step1.perfetto-trace: already exists", tmp_path, before)


@pytest.mark.parametrize("base", [b'"' + b"9" * 5000 + b'"', b"9" * 5000], ids=["text", "number"])
def test_a_5000_digit_base_time_is_refused_in_one_line(tmp_path, base):
    source = tmp_path / "trace.json"
    source.write_bytes(b'{"baseTimeNanoseconds":' + base + b',"traceEvents":' + json.dumps(TWO_STEPS["traceEvents"]).encode() + b"}")
    before = snapshot(tmp_path)

    assert_clean_error(run_cli(tmp_path, "convert", source), "trace.json: baseTimeNanoseconds", tmp_path, before)


@pytest.mark.parametrize("command", ["compact", "report"])
def test_a_pp_pattern_whose_stage_takes_text_is_refused_in_one_line(tmp_path, command):
    source = tmp_path / "trace.json"
    source.write_text(json.dumps({"traceEvents": [
        {"name": "PP:xF1", "cat": "gpu_user_annotation", "ph": "X", "ts": 1, "dur": 20, "pid": 1, "tid": 7},
        {"name": "PP:xF1", "cat": "user_annotation", "ph": "X", "ts": 0, "dur": 20, "pid": 2, "tid": 2},
        {"name": "k", "cat": "kernel", "ph": "X", "ts": 2, "dur": 2, "pid": 1, "tid": 7}]}))
    (tmp_path / "lanes.toml").write_text(r"pp_pattern = '^PP:(?P<stage>\w+)(?P<action>F|B)(?P<microbatch>\d*)$'"
                                         "\n" + GROUPS)
    before = snapshot(tmp_path)

    assert_clean_error(run_cli(tmp_path, command, source, "--lanes", "lanes.toml"),
                       "lanes.toml: pp_pattern's stage group took 'x' from 'PP:xF1'", tmp_path, before)


@pytest.mark.parametrize("command", ["convert", "compact"])
@pytest.mark.parametrize("overwrite", [(), ("--overwrite",)], ids=["plain", "overwrite"])
def test_two_rank_files_for_one_output_are_refused_naming_both(tmp_path, overwrite, command):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "rank0_trace.json").write_text(json.dumps(TWO_STEPS))
    (traces / "rank0_trace.json.gz").write_bytes(gzip.compress(json.dumps(TWO_STEPS).encode()))
    before = snapshot(tmp_path)

    run = run_cli(tmp_path, command, traces, *overwrite)

    assert_clean_error(run, "rank0_trace.json and ", tmp_path, before)
    assert "rank0_trace.json.gz: both would be written to" in run.stderr


OSC_52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"
HOSTILE_NAME = f"k{OSC_52}\x1b[2J\x9b31m\x7f"


def _hostile_kernel(dur: int) -> str:
    return json.dumps({"traceEvents": [
        {"name": HOSTILE_NAME, "cat": "kernel", "ph": "X", "ts": 10, "dur": dur, "pid": 1, "tid": 7, "args": {"device": 0}}]})


@pytest.fixture(scope="module")
def hostile_trace(tmp_path_factory) -> Path:
    """A kernel named to set the clipboard and clear the screen, and beside it (slower.json)
    the same kernel slower, which a diff names in its findings."""
    path = tmp_path_factory.mktemp("hostile") / "trace.json"
    path.write_text(_hostile_kernel(5))
    (path.parent / "slower.json").write_text(_hostile_kernel(9))
    return path


def _controls(text: str) -> list[str]:
    return [char for char in text if ord(char) < 0x20 and char != "\n" or 0x7f <= ord(char) < 0xa0]


@pytest.mark.parametrize("args", [("query", "{trace}", "select name from slice"),
                                  ("query", "{trace}", f"select 1 as \"{OSC_52}\""),
                                  ("report", "{trace}"),
                                  ("diff", "{trace}", "slower.json")],
                         ids=["query_cell", "query_column", "report_text", "diff_text"])
def test_control_characters_in_names_reach_the_terminal_escaped(hostile_trace, args):
    run = run_cli(hostile_trace.parent, *[arg.format(trace=hostile_trace) for arg in args])

    assert run.returncode == 0, run.stderr[-1500:]
    assert _controls(run.stdout) == []
    assert "\\x1b]52;c;" in run.stdout


def test_json_and_csv_keep_names_as_they_are(hostile_trace):
    sql = "select name from slice"
    as_json = run_cli(hostile_trace.parent, "query", hostile_trace, sql, "--format", "json")
    as_csv = run_cli(hostile_trace.parent, "query", hostile_trace, sql, "--format", "csv")

    assert json.loads(as_json.stdout) == [{"name": HOSTILE_NAME}]
    assert HOSTILE_NAME in as_csv.stdout


@pytest.mark.parametrize("odd", ["fifo", "dangling_symlink"])
@pytest.mark.parametrize("command", ["merge", "compact"])
def test_a_special_file_named_like_a_rank_trace_is_named(tmp_path, odd, command):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "rank0_trace.json").write_text(json.dumps(TWO_STEPS))
    odd_path = traces / "rank1_trace.json"
    if odd == "fifo":
        os.mkfifo(odd_path)
    else:
        odd_path.symlink_to(traces / "moved_away.json")
    before = sorted(os.listdir(traces))  # snapshot() would follow the dangling link

    run = run_cli(tmp_path, command, traces)

    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr[-1500:]
    assert run.stderr.startswith(f"cgtrace: error: {odd_path}: named like a trace but"), run.stderr
    assert "; remove it, or make it the trace file" in run.stderr
    assert sorted(os.listdir(traces)) == before


HPC_LOGIN_NODE_LIMIT = 4 << 30  # `ulimit -v 4G`


def _run_with_address_space(cwd: Path, args: list[str], limit: int) -> subprocess.CompletedProcess:
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return subprocess.run([sys.executable, "-m", "converter.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, preexec_fn=limited)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS as Linux applies it")
def test_query_and_report_answer_under_an_address_space_limit(tmp_path):
    """wasmtime reserves 4 GiB and guard pages per module by default, which `ulimit -v 4G`
    refuses: under a limit the module's memory is mapped as it grows, so answers still come."""
    ranks = tmp_path / "ranks"
    write_pp_run(ranks, 2, events_per_rank=3_000)
    count = "select count(*) as n from slice"
    free = run_cli(tmp_path, "query", ranks / "rank0_trace.json", count, "--format", "json")
    for args in (["query", "ranks/rank0_trace.json", count, "--format", "json"],
                 ["query", "ranks", count, "--format", "json", "--jobs", "2"],
                 ["report", "ranks/rank0_trace.json", "--format", "json"]):
        run = _run_with_address_space(tmp_path, args, HPC_LOGIN_NODE_LIMIT)
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-1500:]
        if args[1] == "ranks/rank0_trace.json" and args[0] == "query":
            assert json.loads(run.stdout) == json.loads(free.stdout)
        if args[1] == "ranks":
            assert len(json.loads(run.stdout)) == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS as Linux applies it")
def test_too_little_address_space_is_one_line_naming_the_limit(tmp_path):
    """With less left than the module needs to start, wasmtime would abort the process (no
    error to catch): cgtrace checks first and says which limit to raise."""
    source = tmp_path / "trace.json"
    write_pp_run(tmp_path / "ranks", 2, events_per_rank=3_000)
    (tmp_path / "ranks" / "rank0_trace.json").rename(source)
    before = snapshot(tmp_path)
    probe = ("import os, resource, sys; from converter.cli import main; import converter.tp.wasm_host; "
             "mapped = int(open('/proc/self/statm').read().split()[0]) * os.sysconf('SC_PAGE_SIZE'); "
             "resource.setrlimit(resource.RLIMIT_AS, (mapped + (160 << 20),) * 2); "
             "sys.exit(main(['query', 'trace.json', 'select 1']))")
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert_clean_error(run, "ulimit -v", tmp_path, before)


@pytest.fixture(scope="module")
def plain_ranks(tmp_path_factory) -> Path:
    """4 uncompressed rank traces: with no gunzip file first, every later file of a merge is
    the largest at some size limit."""
    folder = tmp_path_factory.mktemp("plain_ranks")
    write_pp_run(folder, 4, events_per_rank=3_000)
    return folder


def _with_file_size_limit(cwd: Path, args: list, limit: int) -> subprocess.CompletedProcess:
    """A full disk, as RLIMIT_FSIZE gives it without root: a write past `limit` bytes fails
    (EFBIG; Python ignores SIGXFSZ), in every worker too. TMPDIR is inside `cwd`."""
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    (cwd / "tmp").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "converter.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, preexec_fn=limited, env=dict(os.environ, TMPDIR=str(cwd / "tmp")))


# Limits at which each of a merge's files is the first too large: the args store, a rank's
# part of the output (from its snapshot), the output itself.
@pytest.mark.parametrize("limit_kb, failing", [(20, "args"), (250, "part of the merge"), (900, "write failed")])
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_full_disk_at_any_point_of_a_merge_is_one_line_and_leaves_nothing(tmp_path, plain_ranks, limit_kb, failing,
                                                                             jobs):
    assert min(path.stat().st_size for path in plain_ranks.iterdir()) > 20 << 10
    (tmp_path / "out").mkdir()
    run = _with_file_size_limit(tmp_path, ["merge", plain_ranks, "-o", "out/m.perfetto-trace", "--jobs", jobs],
                                limit_kb << 10)
    assert "Traceback" not in run.stderr and run.returncode == 2, run.stderr[-1500:]
    assert len(run.stderr.splitlines()) == 1 and failing in run.stderr, run.stderr
    assert list((tmp_path / "out").iterdir()) == [] and list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("limit_kb", [16, 200, 600])
def test_a_demo_that_fills_the_disk_takes_back_what_it_wrote(tmp_path, limit_kb):
    run = _with_file_size_limit(tmp_path, ["demo", "demo"], limit_kb << 10)
    assert run.returncode == 2 and run.stderr.splitlines() == [
        f"cgtrace: error: demo: cannot write the demo there ({os.strerror(27)}); free disk space or pass another DIR"]
    assert not (tmp_path / "demo").exists() and list((tmp_path / "tmp").iterdir()) == []
