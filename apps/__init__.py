"""What users run: the export pipeline with its validation (`export_sparse`, `rewrite_onnx`), the
`export-sparse` command and the demos. The one package that imports both `export` and `runtime`."""

from .pipeline import ExportReport, export_sparse, rewrite_onnx

__all__ = ["ExportReport", "export_sparse", "rewrite_onnx"]
