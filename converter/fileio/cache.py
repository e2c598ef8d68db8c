"""cgtrace's cache folder: what is worth keeping between runs but belongs to no input, such as
the compiled trace_processor module and the traces `cgtrace view` made."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/cgtrace`, else `~/.cache/cgtrace` (not created here)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cgtrace"
