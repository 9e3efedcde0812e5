"""quest_ort: Quest query-aware block-sparse attention as ONNX Runtime custom operators.

The repository root is this package (docs/architecture.md); CMakeLists.txt installs this file as
quest_ort/__init__.py, so an edit here needs a reinstall even in an editable install.

Subpackages: `ops` (schemas, NumPy references, the native op library), `graphs` (standard-op
function bodies and graph builders), `model_folder` (the exported folder's contract), `export`
(model rewriting), `runtime` (sessions, generation), `apps` (the export pipeline, commands, demos).
"""

# Absolute, not relative: pytest imports the repository root's copy of this file on its own (the
# root holds an __init__.py), as a module named after the checkout's folder or as "__init__" when
# that name is no identifier (quest-ort, ci.1); either way this line must import the installed package.
from quest_ort.ops import get_library_path

__version__ = "0.1.0"

__all__ = ["__version__", "get_library_path"]
