"""Shared test helpers: real traces from ../shared (skipped when absent) and SQL over outputs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from converter import open_trace

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def shared_trace_paths() -> list[Path]:
    if not SHARED_TRACES.is_dir():
        return []
    return sorted(p for p in SHARED_TRACES.rglob("*.json*") if p.is_file())


def shared_trace_param(path: Path):
    return pytest.param(path, id=str(path.relative_to(SHARED_TRACES)))


def require_shared_traces() -> None:
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces is not present: real-trace tests need it")


def rows(trace_path, sql: str) -> list[dict]:
    """Run SQL on a trace through the real consumer, trace_processor; rows as dicts."""
    with open_trace(trace_path) as tp:
        return [row.__dict__.copy() for row in tp.query(sql)]


def problem_stats(trace_path) -> list[dict]:
    return rows(trace_path, "select name, value from stats "
                            "where severity in ('error', 'data_loss') and value > 0")


def write_json(path: Path, document) -> Path:
    text = json.dumps(document).encode()
    path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)
    return path
