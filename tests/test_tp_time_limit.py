"""Every call into trace_processor has a time limit: inputs that send it into an endless loop end
in one line and exit 2, never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from converter.errors import CgtraceError
from converter.jobs.verify import Expected, verify_output
from converter.tp.time_limit import ENV, TimeLimit, TimeLimitExceeded

REPO = Path(__file__).resolve().parents[1]
# trace_processor's JSON importer loops forever on a counter whose args hold these (127 bytes).
LOOPING = '{"traceEvents":[{"ph":"C","name":"c","pid":1,"tid":1,"ts":1,"args":{"v":%s}},' \
          '{"ph":"X","name":"k","pid":1,"tid":1,"ts":2,"dur":1}]}'


def cgtrace(args: list[str], cwd: Path, limit: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), **{ENV: limit})
    return subprocess.run([sys.executable, "-m", "converter.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("command", [["query", "trace.json", "select count(*) from slice"], ["report", "trace.json"]])
@pytest.mark.parametrize("value", ["NaN", "-Infinity", "1e400"])
def test_a_trace_that_would_loop_trace_processor_ends_in_one_line(tmp_path, command, value):
    """report and query read raw JSON through cgtrace's own reader, which refuses NaN and
    infinities (and skips a counter value beyond double range) before trace_processor sees it."""
    (tmp_path / "trace.json").write_text(LOOPING % value)
    started = time.monotonic()
    run = cgtrace(command, tmp_path, "1")
    assert time.monotonic() - started < 30
    assert "Traceback" not in run.stderr and len(run.stderr.splitlines()) <= 1
    if run.returncode != 0:
        assert run.returncode == 2 and run.stderr.startswith("cgtrace: error: trace.json: ")


@pytest.mark.parametrize("value", ["abc", "0", "-5", "inf", "nan", "1e10", "604801"])
def test_a_bad_limit_is_refused(tmp_path, value):
    (tmp_path / "trace.json").write_text(LOOPING % "1")
    run = cgtrace(["query", "trace.json", "select 1"], tmp_path, value)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [f"cgtrace: error: cannot open trace trace.json: {ENV}={value}: not a time "
                                       "limit; set it to a number of seconds above 0, at most 604800 (a week)"]


def test_the_default_limit_grows_with_the_trace(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert TimeLimit("t", 127).seconds == 60
    assert TimeLimit("t", 500_000_000).seconds == 500


def test_verify_is_bounded_too(tmp_path, monkeypatch):
    """--verify's reload obeys the limit (verify_output opens any trace; this one loops)."""
    looping = tmp_path / "trace.json"
    looping.write_text(LOOPING % "NaN")
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(TimeLimitExceeded) as stopped:
        verify_output(looping, Expected(1, 0, 1), shown_as=tmp_path / "out.perfetto-trace")
    assert isinstance(stopped.value, CgtraceError)
    assert f"set {ENV}=SECONDS" in stopped.value.message
