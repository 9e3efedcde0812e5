"""What users run: the one package that may import both `export` and `runtime`.

`pipeline` (`export_sparse`, `rewrite_onnx`) and its `validate`, the `export-sparse` command
(`export_cli`), the demos (`demo`, `ops_demo`). Nothing is imported here: `export-sparse --help`
loads no ONNX Runtime session code.
"""
