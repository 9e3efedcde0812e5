"""quest_ort: Quest query-aware block-sparse attention as ONNX Runtime custom operators.

Subpackages: `ops` (schemas, NumPy references, the native op library), `graphs` (standard-op
function bodies and graph builders), `export` (model rewriting), `runtime` (sessions).
"""

from .ops import get_library_path

__version__ = "0.1.0"

__all__ = ["__version__", "get_library_path"]
