"""cgtrace: PyTorch profiler (Kineto) traces of CUDA-graph runs -> readable native Perfetto traces."""

__version__ = "0.1.0"

from .tp import open_trace  # noqa: E402  (the public Python API)

__all__ = ["open_trace", "__version__"]
