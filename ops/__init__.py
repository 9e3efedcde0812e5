"""The Quest operators: schemas, NumPy references, and the native ONNX Runtime custom-op library."""

from __future__ import annotations

import ctypes
import functools
import pathlib

from .schemas import ALL_OPS, DOMAIN, OPS_BY_NAME, VERSION

LIBRARY_FILE = "libquest_ort_ops.so"


def get_library_path() -> str:
    """Absolute path of the custom-op library, for `SessionOptions.register_custom_ops_library`."""
    # Every folder of this package: an editable install (`pip install -e .`) keeps the Python files
    # in the source tree and the built library in site-packages, both on __path__.
    folders = [pathlib.Path(folder).resolve() for folder in __path__]
    for folder in folders:
        if (folder / LIBRARY_FILE).is_file():
            return str(folder / LIBRARY_FILE)
    raise FileNotFoundError(
        f"{LIBRARY_FILE} is in none of {[str(f) for f in folders]}: quest_ort was not built. Install "
        "it with `pip install .` or `pip install -e .` (or `make install`) from the source tree."
    )


@functools.cache
def _library() -> ctypes.CDLL:
    library = ctypes.CDLL(get_library_path())
    for symbol in ("QuestOrtOpNames", "QuestOrtKernelIsa", "QuestOrtSupportedIsas"):
        getattr(library, symbol).restype = ctypes.c_char_p
    library.QuestOrtCopiedBytes.restype = ctypes.c_uint64
    return library


def native_op_names() -> tuple[str, ...]:
    """The ops the native library registers with ONNX Runtime."""
    return tuple(_library().QuestOrtOpNames().decode().split(","))


def native_kernel_isa() -> str:
    """The kernel variant the native library uses ("avx512vnni", "avx512", "avx2", "neon" or "scalar").

    The best variant the CPU supports, unless the environment variable QUEST_ORT_ISA names another
    supported one (QUEST_ORT_ISA=scalar forces the scalar reference kernels).
    """
    return _library().QuestOrtKernelIsa().decode()


def native_supported_isas() -> tuple[str, ...]:
    """Kernel variants this CPU can run, best first."""
    return tuple(_library().QuestOrtSupportedIsas().decode().split(","))


def native_copied_bytes() -> int:
    """Bytes the native ops copied because an output cache was not bound to its input buffer.

    Counts within this process, for the library instance ONNX Runtime loaded: a decode step whose
    present caches are bound in place (IOBinding) adds nothing.
    """
    return int(_library().QuestOrtCopiedBytes())


__all__ = [
    "ALL_OPS",
    "DOMAIN",
    "OPS_BY_NAME",
    "VERSION",
    "get_library_path",
    "native_copied_bytes",
    "native_kernel_isa",
    "native_op_names",
    "native_supported_isas",
]
