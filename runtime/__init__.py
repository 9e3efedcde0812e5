"""Sessions that run Quest graphs in ONNX Runtime with the op library registered."""

from .sessions import make_session, session_options

__all__ = ["make_session", "session_options"]
