"""cgtrace: PyTorch profiler (Kineto) traces of CUDA-graph runs -> readable native Perfetto traces."""

__version__ = "0.1.0"

__all__ = ["open_trace", "__version__"]


def __getattr__(name: str):
    """`converter.open_trace`, imported on first use: trace_processor brings in perfetto and
    wasmtime, which every CLI command would otherwise pay for at start-up, in time and memory."""
    if name == "open_trace":
        from .tp import open_trace

        return open_trace
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
