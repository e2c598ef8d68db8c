"""cgtrace: PyTorch profiler (Kineto) traces of CUDA-graph runs -> readable native Perfetto traces.

The Python API (converter/api): `convert`, `compact`, `merge`, `report`, `diff`, `open_trace` and
`trace_handler` (a torch.profiler callback); each raises `CgtraceError` with the command
line's one-line message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import CgtraceError

if TYPE_CHECKING:
    from .api import compact, convert, diff, merge, open_trace, report, trace_handler

__version__ = "0.1.0"

__all__ = ["CgtraceError", "compact", "convert", "diff", "merge", "open_trace", "report", "trace_handler", "__version__"]
_API = frozenset(__all__) - {"CgtraceError", "__version__"}


def __getattr__(name: str) -> object:
    """The API, imported on first use: it brings in the reader, numpy and (for open_trace)
    perfetto and wasmtime, which `import converter` and every CLI command would otherwise pay
    for at start-up, in time and memory."""
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
