"""No partial results: step files appear all or none, a failed --verify writes nothing, and only
a regular file is ever replaced at -o."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from converter.errors import CgtraceError
from converter.fileio import atomic, direct
from converter.fileio.atomic import check_output_path
from converter.generator import GeneratorConfig, write_trace
from converter.jobs import runner

from .helpers import convert_file

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return write_trace(GeneratorConfig(seed=6, steps=3, graphs_per_step=3, kernels_per_replay=8),
                       tmp_path_factory.mktemp("partial") / "trace.json")


def cgtrace(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "converter.cli", *args, "-q"], cwd=cwd, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)


def test_a_full_disk_on_a_later_step_file_writes_no_step_file(trace, tmp_path, monkeypatch):
    pwrite = os.pwrite

    def full_on_step_two(fd: int, data, offset: int) -> int:
        if "_step1.perfetto-trace" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return pwrite(fd, data, offset)

    monkeypatch.setattr(direct.os, "pwrite", full_on_step_two)
    with pytest.raises(CgtraceError, match="_step1.perfetto-trace: write failed .No space left on device.; "
                                           "nothing was written; free disk space"):
        convert_file(trace, tmp_path / "out.perfetto-trace", split_steps=True)
    assert list(tmp_path.iterdir()) == []


def test_a_move_failing_half_way_takes_back_the_step_files_already_moved(trace, tmp_path, monkeypatch):
    replace, moves = os.replace, []

    def fail_second(source, target) -> None:
        moves.append(target)
        if len(moves) == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        replace(source, target)

    monkeypatch.setattr(atomic.os, "replace", fail_second)
    with pytest.raises(CgtraceError, match="write failed"):
        convert_file(trace, tmp_path / "out.perfetto-trace", split_steps=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_verify_writes_nothing(trace, tmp_path, existing):
    """A self-check that cannot pass (the trace_processor named is no program) keeps what was there."""
    output = tmp_path / "out.perfetto-trace"
    if existing:
        output.write_bytes(b"earlier")
    with pytest.raises(CgtraceError, match="not an executable"):
        convert_file(trace, output, verify=True, overwrite=True, tp_bin=str(trace))
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out.perfetto-trace"] if existing else [])
    if existing:
        assert output.read_bytes() == b"earlier"


def test_a_dangling_symlink_at_o_is_refused(trace, tmp_path):
    (tmp_path / "out.perfetto-trace").symlink_to(tmp_path / "nowhere")
    run = cgtrace(["convert", str(trace), "-o", "out.perfetto-trace"], tmp_path)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "cgtrace: error: out.perfetto-trace: is a symbolic link, which cgtrace never replaces, not even with "
        "--overwrite; choose another path with -o"]
    assert os.readlink(tmp_path / "out.perfetto-trace") == str(tmp_path / "nowhere")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.perfetto-trace"]


@pytest.mark.parametrize("kind", ["symbolic link", "FIFO"])
def test_overwrite_replaces_only_a_regular_file(trace, tmp_path, kind):
    output = tmp_path / "out.perfetto-trace"
    if kind == "FIFO":
        os.mkfifo(output)
    else:
        (tmp_path / "target").write_bytes(b"kept")
        output.symlink_to(tmp_path / "target")
    run = cgtrace(["convert", str(trace), "-o", "out.perfetto-trace", "--overwrite"], tmp_path)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"cgtrace: error: out.perfetto-trace: is a {kind}, which cgtrace never replaces, not even with --overwrite; "
        "choose another path with -o"]
    assert output.is_symlink() or output.is_fifo()
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.skipif(not Path("/dev/null").is_char_device(), reason="needs /dev/null")
def test_a_device_is_never_an_output():
    """Checked on the path alone: a regression must not get to replace /dev/null when run as root."""
    with pytest.raises(CgtraceError, match="/dev/null: is a device, which cgtrace never replaces"):
        check_output_path(Path("/dev/null"), overwrite=True)
