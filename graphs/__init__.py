"""ONNX graph building blocks: standard-op function bodies of the Quest ops and small graphs."""

from .op_graphs import OPSET, op_model

__all__ = ["OPSET", "op_model"]
