"""quest_ort: Quest query-aware block-sparse attention as ONNX Runtime custom operators.

The repository root is this package (docs/architecture.md); CMakeLists.txt installs this file as
quest_ort/__init__.py, so an edit here needs a reinstall even in an editable install.

Subpackages: `ops` (schemas, NumPy references, the native op library), `graphs` (standard-op
function bodies and graph builders), `export` (model rewriting), `runtime` (sessions).
"""

from .ops import get_library_path

__version__ = "0.1.0"

__all__ = ["__version__", "get_library_path"]
