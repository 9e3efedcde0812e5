"""Create ONNX Runtime sessions with the Quest op library registered (the path never comes from a model)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from ..ops import get_library_path
from ..ops.registry import check_model

# The NumPy type of each ONNX Runtime tensor type a model's inputs and outputs have here.
NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
               "tensor(float16)": np.float16, "tensor(bool)": np.bool_}


def session_options(*, threads: int | None = None, register_library: bool = True,
                    initializers: dict | None = None) -> ort.SessionOptions:
    """Session options with the native library registered; `threads` sets the intra-op pool size;
    `initializers` (name -> OrtValue) replace the model's own, so sessions can share one copy."""
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    if register_library:
        options.register_custom_ops_library(get_library_path())
    for name, value in (initializers or {}).items():
        options.add_initializer(name, value)
    if initializers:
        # Pre-packing would give every session its own packed copy of each weight matrix (about the
        # model's size again per session), which defeats sharing one copy.
        options.add_session_config_entry("session.disable_prepacking", "1")
    return options


def make_session(model, *, threads: int | None = None, register_library: bool = True, providers=None,
                 initializers: dict | None = None) -> ort.InferenceSession:
    """An InferenceSession for a ModelProto, serialized model or path.

    When ONNX Runtime rejects a ModelProto, the Quest checker runs on it to name the input at fault
    (ORT alone reports, e.g., only that no kernel matches a node's input types).
    """
    serialized = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    try:
        session = ort.InferenceSession(
            serialized,
            session_options(threads=threads, register_library=register_library, initializers=initializers),
            providers=providers or ["CPUExecutionProvider"],
        )
        # No silent re-creation of the session after a failed run: errors surface as they are.
        session.disable_fallback()
        return session
    except Exception as ort_error:
        if isinstance(model, onnx.ModelProto):
            try:
                check_model(model)
            except Exception as diagnosis:
                raise QuestModelError(f"{diagnosis}\n(ONNX Runtime: {ort_error})") from ort_error
        raise


class QuestModelError(ValueError):
    """A model ONNX Runtime refused, with the Quest checker's diagnosis of the input at fault."""
