"""The packages `export-sparse` needs beyond the base install, checked before it starts.

The exporter imports torch, transformers and optimum-onnx lazily, deep inside the export (and
transformers reaches for gguf and accelerate when it reads a GGUF file): without them the command
would stop part-way with a traceback naming a module, or with transformers' own advice. This
names every missing package on one line, with the install command of the `[export]` extra that
brings them all (pyproject.toml).
"""

from __future__ import annotations

import importlib.util
import pathlib

INSTALL = "pip install 'quest-ort[export]'"
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"

# The distribution -> the module of it the exporter imports. Every Hugging Face export loads a
# model with torch and transformers and traces it with optimum-onnx; to read a GGUF file,
# transformers also needs gguf and accelerate (accelerate is optional otherwise).
MODULES = {"torch": "torch", "transformers": "transformers", "optimum-onnx": "optimum.exporters.onnx",
           "gguf": "gguf", "accelerate": "accelerate"}
_HUGGING_FACE = ("torch", "transformers", "optimum-onnx")
_GGUF = ("gguf", "accelerate")


def _installed(module: str) -> bool:
    try:
        # Locates the module without running it (a dotted name's parents are imported: optimum's
        # are namespace packages, empty); the export then imports it for real.
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package of a dotted name is missing
        return False


def needed(family: str, model: str | None) -> tuple[str, ...]:
    """The distributions an export of `family` from `model` imports (none for `onnx`: the rewrite of
    an exported graph needs only the base install)."""
    if family == "onnx":
        return ()
    gguf = model is not None and pathlib.Path(model).suffix == ".gguf"  # as families.load_checkpoint reads it
    return _HUGGING_FACE + (_GGUF if gguf else ())


def missing_message(family: str, model: str | None) -> str | None:
    """One line naming the missing distributions and how to install them; None when none is missing."""
    absent = [distribution for distribution in needed(family, model) if not _installed(MODULES[distribution])]
    if not absent:
        return None
    message = f"the exporter needs {', '.join(absent)}, not installed: {INSTALL}"
    if "torch" in absent:  # PyPI's default torch wheel for Linux brings CUDA: gigabytes a CPU never uses
        message += f" (for torch's CPU-only build, run first: {CPU_TORCH})"
    return message
