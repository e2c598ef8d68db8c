"""Backend: the official TraceProcessor API served by trace_processor.wasm in this process.

perfetto's TraceProcessorRpc already speaks the RPC byte protocol (queries)
over any transport; this adds loading a trace, which it leaves unimplemented.
"""

from __future__ import annotations

from perfetto.common.exceptions import PerfettoException
from perfetto.trace_processor.rpc import TraceProcessorRpc

from converter.tp.time_limit import LimitedTraceProcessor, TimeLimit
from converter.tp.wasm_host import WasmTransport

# Room for the envelope around trace bytes (stream and message tags, lengths).
_ENVELOPE = 64


class WasmBackend(TraceProcessorRpc):
    """TraceProcessorRpc plus parse() and notify_eof() (TPM_APPEND/FINALIZE_TRACE_DATA)."""

    def parse(self, chunk: bytes):
        """Appends trace bytes; returns the AppendTraceDataResult (its .error is '' on success).

        Chunks are sent in pieces that fit the module's request buffer: the
        module acts on a request only once it has all of it, so one huge
        request would first be buffered whole in wasm memory.
        """
        piece = self.transport.request_buffer_size - _ENVELOPE
        view = memoryview(chunk)
        for start in range(0, len(view) or 1, piece):
            reply = self._call(
                self.protos.TraceProcessorRpc.TPM_APPEND_TRACE_DATA,
                append_trace_data=bytes(view[start:start + piece]),
            )
            if reply.append_result.error:
                break
        return reply.append_result

    def notify_eof(self):
        """Finishes loading (sorts and flushes pending events); returns the FinalizeDataResult.

        Raises if that fails (e.g. a truncated JSON trace): trace processor
        then creates no tables, and TraceProcessor ignores this result, so
        the problem would otherwise surface only as "no such table" later.
        """
        result = self._call(self.protos.TraceProcessorRpc.TPM_FINALIZE_TRACE_DATA).finalize_data_result
        if result.error:
            raise PerfettoException(f"Failed while finishing loading the trace. Error message: {result.error}")
        return result

    def status(self):
        """The StatusResult (the build's human_readable_version), as the HTTP backend's status() gives it."""
        return self._call(self.protos.TraceProcessorRpc.TPM_GET_STATUS).status

    def _call(self, method: int, **args):
        """Sends one request that has exactly one reply, and returns that reply."""
        stream = self.protos.TraceProcessorRpcStream()
        stream.msg.add(request=method, **args)
        self.transport.send(stream.SerializeToString())
        reply = self.protos.TraceProcessorRpc()
        reply.ParseFromString(self._read_payload())
        self._check_envelope(reply)
        return reply


class WasmTraceProcessor(LimitedTraceProcessor):
    """perfetto's TraceProcessor, backed by trace_processor.wasm instead of a trace_processor_shell process."""

    def __init__(self, trace, limit: TimeLimit, transport: WasmTransport):
        """`transport`: made before the time limit starts: compiling the module (seconds, on
        first use) is not trace_processor's work, and the module must exist for the limit to
        stop it."""
        self._transport = transport
        super().__init__(trace, limit)

    def _create_backend(self, remote, addr):
        return WasmBackend(self._transport, self.protos)

    def _stop(self) -> None:
        self._transport.interrupt()
