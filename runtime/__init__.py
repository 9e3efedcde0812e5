"""Sessions that run Quest graphs in ONNX Runtime with the op library registered."""

from .sessions import QuestModelError, make_session, session_options

__all__ = ["QuestModelError", "make_session", "session_options"]
