"""SIGTERM stops every phase of convert, compact and merge like Ctrl-C: exit 143 (130 for
SIGINT), one line on stderr, no temporary file, no scratch directory, no process left behind.

Each case starts the command line, waits until the run is in the phase under test (seen from
outside: a mapped input, a temporary output, worker processes, a merge's parts), freezes it
there with SIGSTOP, queues the signal and lets it go on, so the signal lands in that phase.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from converter.generator import GeneratorConfig, write_pp_run, write_trace

from .helpers import child_pids

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")

REPO = Path(__file__).resolve().parents[1]
MARK = "CGTRACE_SIGNAL_TEST"  # inherited by every process a run forks, so leftovers can be found

Phase = Callable[[int, Path], bool]  # (pid of the run, its output folder) -> is it there yet
WORKERS_SCRATCH = "cgtrace-workers-*"  # the folder in TMPDIR where a command's local workers keep theirs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("signal_inputs")
    write_trace(GeneratorConfig(seed=4, target_events=150_000), folder / "trace.json")
    write_pp_run(folder / "ranks", 4, events_per_rank=60_000)
    return folder




def _maps(pid: int, path: Path) -> bool:
    return str(path) in Path(f"/proc/{pid}/maps").read_text()


def _scratch(out: Path) -> list[Path]:
    return list(out.glob(".cgtrace-merge-*"))


def reading(input_name: str) -> Phase:
    return lambda pid, out: _maps(pid, (out.parent / "in" / input_name).resolve())


def writing(pid: int, out: Path) -> bool:
    return any(out.glob(".*.tmp"))


def _parts(out: Path) -> list[Path]:
    return [part for folder in _scratch(out) for part in folder.glob("*.part")]


def merge_pass_one(pid: int, out: Path) -> bool:
    """Workers reading ranks (their snapshots go to the scratch folder), no part written yet."""
    return bool(child_pids(pid)) and not _parts(out)


def merge_pass_two(pid: int, out: Path) -> bool:
    return bool(_parts(out))


def _survivors(mark: str) -> list[int]:
    """Processes that still carry this run's mark in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"{MARK}={mark}".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone, or not ours
                continue
    return found


def stop_in_phase(tmp_path: Path, inputs: Path, args: list[str], phase: Phase, signum: int,
                  quiet: bool = True) -> subprocess.Popen:
    """Run `cgtrace args` (inputs under tmp_path/in, outputs in tmp_path/out, the system's
    temporary files in tmp_path/out too), deliver `signum` once `phase` holds, and wait for
    the run to end."""
    (tmp_path / "in").symlink_to(inputs)
    out = tmp_path / "out"
    out.mkdir()
    mark = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(out), **{MARK: mark})
    run = subprocess.Popen([sys.executable, "-m", "converter.cli", *args, *["-q"] * quiet], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    try:
        while not phase(run.pid, out):
            assert run.poll() is None, f"the run ended before the phase: {run.stderr.read()}"
            assert time.monotonic() < deadline, "the phase never came"
            time.sleep(0.002)
        os.kill(run.pid, signal.SIGSTOP)
        os.kill(run.pid, signum)
        os.kill(run.pid, signal.SIGCONT)
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    deadline = time.monotonic() + 5  # a killed worker's exit may take a moment to show
    while _survivors(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _survivors(mark), "processes of the run outlived it"
    run.leftovers = sorted(p.name for p in out.iterdir())  # type: ignore[attr-defined]
    return run


CASES = {
    "convert reading": (["convert", "in/trace.json", "-o", "out/t.perfetto-trace"], reading("trace.json")),
    "convert writing": (["convert", "in/trace.json", "-o", "out/t.perfetto-trace"], writing),
    "compact --split-steps writing": (["compact", "in/trace.json", "-o", "out/t.perfetto-trace", "--split-steps"],
                                      writing),
    "merge pass one": (["merge", "in/ranks", "-o", "out/m.perfetto-trace", "--jobs", "2"], merge_pass_one),
    "merge pass two": (["merge", "in/ranks", "-o", "out/m.perfetto-trace", "--jobs", "2"], merge_pass_two),
    "merge writing": (["merge", "in/ranks", "-o", "out/m.perfetto-trace", "--jobs", "2"], writing),
}


@pytest.mark.parametrize("case", CASES)
def test_sigterm_stops_cleanly(tmp_path, inputs, case):
    args, phase = CASES[case]
    run = stop_in_phase(tmp_path, inputs, args, phase, signal.SIGTERM)
    stderr = run.stderr.read()
    assert run.returncode == 143, stderr
    assert stderr.splitlines() == ["cgtrace: interrupted; nothing was written"]
    assert run.leftovers == []


def test_ctrl_c_to_the_whole_group_stops_a_merge_cleanly(tmp_path, inputs):
    """A terminal's Ctrl-C reaches the workers too; only the main process may act on it."""
    args, phase = CASES["merge pass two"]

    def whole_group(pid: int, out: Path) -> bool:
        if not phase(pid, out):
            return False
        for child in child_pids(pid):
            os.kill(child, signal.SIGINT)
        return True

    run = stop_in_phase(tmp_path, inputs, args, whole_group, signal.SIGINT)
    stderr = run.stderr.read()
    assert run.returncode == 130, stderr
    assert stderr.splitlines() == ["cgtrace: interrupted; nothing was written"]
    assert run.leftovers == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_killed_merge(tmp_path, inputs):
    """SIGKILL allows no cleanup (the scratch folder stays), but no worker may go on alone."""
    args, phase = CASES["merge pass two"]
    run = stop_in_phase(tmp_path, inputs, args, phase, signal.SIGKILL)
    assert run.returncode == -signal.SIGKILL


def test_sigterm_stops_a_batch_cleanly(tmp_path, inputs):
    """compact DIR: the workers are stopped, no temporary output stays, what was written
    before the signal is complete (a rerun skips it), and the last line counts it."""
    run = stop_in_phase(tmp_path, inputs, ["compact", "in/ranks", "-o", "out", "--jobs", "2"], writing, signal.SIGTERM)
    stderr = run.stderr.read()
    assert run.returncode == 143, stderr
    assert all(name.endswith("_compacted.perfetto-trace") for name in run.leftovers), run.leftovers
    if run.leftovers:
        assert stderr.splitlines()[-1].startswith(
            f"cgtrace: interrupted; the {len(run.leftovers)} outputs finished before the stop were kept"), stderr
    else:
        assert stderr.splitlines() == ["cgtrace: interrupted; nothing was written"]


def _some_outputs_written(pid: int, out: Path) -> bool:
    return any(out.glob("*_compacted.perfetto-trace"))


def test_sigterm_to_a_batch_after_some_outputs_names_what_it_kept(tmp_path, inputs):
    """Once said "nothing was written" with finished outputs on disk: the last line counts and
    names them, each is whole (it loads), and no other file stays."""
    from .helpers import rows

    run = stop_in_phase(tmp_path, inputs, ["compact", "in/ranks", "-o", "out", "--jobs", "2"], _some_outputs_written,
                        signal.SIGTERM)
    stderr = run.stderr.read()
    assert run.returncode == 143, stderr
    kept = run.leftovers
    assert 1 <= len(kept) < 4 and all(name.endswith("_compacted.perfetto-trace") for name in kept), kept
    assert stderr.splitlines()[-1] in [
        f"cgtrace: interrupted; the {len(kept)} outputs finished before the stop were kept "
        f"(first {Path('out') / name}); run the same command again to write only the rest" for name in kept], stderr
    for name in kept:
        assert rows(tmp_path / "out" / name, "select count(*) as n from slice")[0]["n"] > 0


def _converting_in_a_worker(pid: int, out: Path) -> bool:
    """A worker is turning a rank's profiler output into a temporary trace to answer from."""
    return bool(child_pids(pid)) and any(out.glob(f"{WORKERS_SCRATCH}/cgtrace-*"))


def _answering_in_a_worker(pid: int, out: Path) -> bool:
    """A worker's temporary trace is written: trace_processor loads it or answers from it
    (much of that time inside wasmtime, which calls back into Python)."""
    return bool(child_pids(pid)) and any(out.glob(f"{WORKERS_SCRATCH}/cgtrace-*/*.perfetto-trace"))


def _at_once(pid: int, out: Path) -> bool:
    """As the command starts: Python may not have reached cgtrace's handlers yet."""
    return True


@pytest.mark.parametrize("phase", [_at_once, _converting_in_a_worker, _answering_in_a_worker],
                         ids=["at once", "converting", "answering"])
@pytest.mark.parametrize("args", [["report", "in/ranks", "--jobs", "2"],
                                  ["query", "in/ranks", "select count(*) from slice", "--jobs", "2"]],
                         ids=["report DIR", "query DIR"])
def test_sigterm_to_answers_across_ranks_leaves_no_scratch(tmp_path, inputs, args, phase):
    """Workers are stopped, not killed: each removes the temporary trace it was answering from,
    wherever the signal lands."""
    run = stop_in_phase(tmp_path, inputs, args, phase, signal.SIGTERM, quiet=False)
    stderr = run.stderr.read()
    assert run.leftovers == [], [str(p.relative_to(tmp_path)) for p in (tmp_path / "out").rglob("*")]
    if phase is _at_once and run.returncode == -signal.SIGTERM:
        return  # ended by the signal's default action, before it had made anything
    assert run.returncode == 143, stderr
    assert stderr.splitlines() == ["cgtrace: interrupted; nothing was written"]


def test_a_local_worker_killed_outright_leaves_nothing_in_tmpdir(tmp_path):
    """A worker killed outright (the OOM killer; here os._exit) runs none of its cleanup, and one
    stopped inside its own cleanup runs it only in part: what it made in its TMPDIR goes with
    the folder the command keeps for its workers, removed once they are gone."""
    script = """
import os
from converter.errors import CgtraceError
from converter.fileio.atomic import scratch_folder
from converter.jobs.executors import open_workers, run_tasks

def make_a_scratch_folder_and_die():
    with scratch_folder("cgtrace-") as folder:
        (folder / "rank0.perfetto-trace").write_bytes(b"half written")
        os._exit(9)

try:
    with open_workers(2, None) as workers:
        run_tasks(workers, make_a_scratch_folder_and_die, [(), ()], ["rank0", "rank1"], "converting",
                  stop_at_failure=True)
except CgtraceError as error:
    print(error.message)
"""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, TMPDIR=str(tmp)))
    assert run.stdout.startswith("rank0: its worker process died (exit code 9)"), run.stdout + run.stderr
    assert list(tmp.iterdir()) == []
