"""Command-line frictions: progress that ends its line, `lanes` alone, summaries without
sections that do not apply, and the pandas extra."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from converter.cli import main
from converter.generator import GeneratorConfig, write_trace
from converter.lane_rules import DEFAULT_LANES_TOML

from .helpers import compact_file, convert_file, write_json

ROOT = Path(__file__).resolve().parent.parent
CLEAR = b"\r\x1b[2K"   # what the progress line writes before each draw, and to end itself


def run_on_a_terminal(argv: list[str]) -> tuple[int, bytes]:
    """cgtrace with stderr on a pseudo-terminal (where progress shows), progress from the first
    moment rather than after a second; returns the exit code and what the terminal got."""
    probe = ("import sys, converter.progress as p; p._DELAY_S = 0; from converter.cli import main; "
             f"sys.exit(main({argv!r}))")
    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-c", probe], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=follower, env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(follower)
    received = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:   # the other end closed
            break
        if not chunk:
            break
        received += chunk
    os.close(leader)
    return process.wait(timeout=300), received


def screen_lines(received: bytes) -> list[str]:
    """What a person sees: each line as left after its last clear."""
    return [line.rsplit(CLEAR, 1)[-1].decode() for line in received.split(b"\r\n")]


def test_progress_covers_verify_and_ends_its_line(tmp_path):
    source = write_trace(GeneratorConfig(steps=2, graphs_per_step=4, kernels_per_replay=16), tmp_path / "t.json")
    output = tmp_path / "t.perfetto-trace"
    code, received = run_on_a_terminal(["compact", str(source), "-o", str(output), "--verify"])
    assert code == 0, received
    assert b"cgtrace: writing " in received and b"cgtrace: verifying t.perfetto-trace" in received
    [line] = [line for line in screen_lines(received) if line]   # progress left nothing behind
    assert line.startswith("cgtrace: GPU 0: ") and line.endswith(f" lanes -> {output}"), line
    assert CLEAR + line.encode() in received   # the summary starts on a cleared line


def test_errors_after_progress_start_their_own_line(tmp_path):
    source = write_trace(GeneratorConfig(steps=1, graphs_per_step=2, kernels_per_replay=8), tmp_path / "t.json")
    code, received = run_on_a_terminal(["convert", str(source), "-o", str(tmp_path / "missing" / "t.perfetto-trace")])
    lines = [line for line in screen_lines(received) if line]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("cgtrace: error: "), lines


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


def test_lanes_alone_prints_its_help():
    code, out = run("lanes")
    assert code == 0 and out.startswith("usage: cgtrace lanes") and "--print-default" in out
    assert run("lanes", "--print-default") == (0, DEFAULT_LANES_TOML)


def test_a_summary_leaves_out_what_does_not_apply(tmp_path):
    plain = write_json(tmp_path / "plain.json", {"traceEvents": [
        {"ph": "X", "name": "gemm", "cat": "kernel", "pid": 0, "tid": 7, "ts": 0, "dur": 5}]})
    piped = write_json(tmp_path / "pp.json", {"traceEvents": [
        {"ph": "X", "name": "PP:0F0", "cat": "gpu_user_annotation", "pid": 0, "tid": 7, "ts": 0, "dur": 9},
        {"ph": "X", "name": "gemm", "cat": "kernel", "pid": 0, "tid": 7, "ts": 1, "dur": 5}]})
    for source, has_pp in ((plain, False), (piped, True)):
        summary = compact_file(source, tmp_path / f"{source.stem}.perfetto-trace")
        keys = [key for key in summary if key.startswith("pp_")]
        assert bool(keys) == has_pp, keys
        if has_pp:
            assert {"pp_annotations", "pp_rank", "pp_compute_dependency_pairs"} <= set(keys)


def test_the_pandas_extra(tmp_path):
    """`pip install 'cgtrace[pandas]'` brings what Perfetto's as_pandas_dataframe() needs."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [requirement.split(">")[0] for requirement in extras["pandas"]] == ["pandas"]
    pytest.importorskip("pandas", reason="pandas is not installed: pip install -e '.[pandas]'")
    from converter import open_trace

    source = write_json(tmp_path / "t.json", {"traceEvents": [
        {"ph": "X", "name": "gemm", "cat": "kernel", "pid": 0, "tid": 7, "ts": 0, "dur": 5}]})
    output = tmp_path / "t.perfetto-trace"
    convert_file(source, output)
    with open_trace(output) as tp:
        frame = tp.query("select name, dur from slice").as_pandas_dataframe()
    assert frame.to_dict("records") == [{"name": "gemm", "dur": 5000}]


def test_every_command_takes_q_and_then_says_nothing_on_stderr(tmp_path, capsys):
    """README: every command takes -q; report, diff and query say nothing on stderr with it."""
    from converter.cli import _COMMANDS

    for command in _COMMANDS:
        with pytest.raises(SystemExit) as done, redirect_stdout(io.StringIO()) as shown:
            main([command, "--help"])
        assert done.value.code == 0 and "-q, --quiet" in shown.getvalue(), command
    trace = write_trace(GeneratorConfig(steps=2, graphs_per_step=2, kernels_per_replay=4, seed=2),
                        tmp_path / "trace.json")
    capsys.readouterr()
    for arguments in (["report", trace, "-o", tmp_path / "r.json", "--format", "json"],
                      ["diff", trace, trace, "-o", tmp_path / "d.json", "--format", "json"],
                      ["query", trace, "select count(*) from cgtrace_slice"]):
        assert main([*map(str, arguments), "-q"]) == 0
        assert capsys.readouterr().err == "", arguments[0]
