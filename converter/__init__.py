"""cgtrace: PyTorch profiler (Kineto) traces of CUDA-graph runs -> readable native Perfetto traces."""

__version__ = "0.1.0"
