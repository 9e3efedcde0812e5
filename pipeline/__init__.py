"""The export pipeline: a checkpoint or an ONNX file in, a rewritten, saved, validated (and
quantized) model folder out (run.py), with its validation (validate.py) and the int8 caches' key
calibration (calibrate.py). It runs `export` and `runtime`; the commands (apps/) run it."""

from .run import ExportReport, export_sparse, rewrite_onnx

__all__ = ["ExportReport", "export_sparse", "rewrite_onnx"]
