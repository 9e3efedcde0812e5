"""Create ONNX Runtime sessions with the Quest op library registered (the path never comes from a model)."""

from __future__ import annotations

import onnxruntime as ort

from ..ops import get_library_path


def session_options(*, threads: int | None = None, register_library: bool = True) -> ort.SessionOptions:
    """Session options with the native library registered; `threads` sets the intra-op pool size."""
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    if register_library:
        options.register_custom_ops_library(get_library_path())
    return options


def make_session(model, *, threads: int | None = None, register_library: bool = True, providers=None) -> ort.InferenceSession:
    """An InferenceSession for a ModelProto, serialized model or path."""
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    return ort.InferenceSession(
        model,
        session_options(threads=threads, register_library=register_library),
        providers=providers or ["CPUExecutionProvider"],
    )
