"""Test set-up: the tests exercise the installed package (regular or editable) with its built library."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import quest_ort

try:
    quest_ort.get_library_path()
except FileNotFoundError as missing:
    raise RuntimeError(f"{missing}\nRun the tests with `make test` (it installs the package into .venv first)")

REPO = pathlib.Path(__file__).resolve().parents[1]

# The benchmarks are imported as the package `benchmarks` (tests/benchmarks, tests/runtime), from
# the repository root put on sys.path; `quest_ort` stays the installed package checked above, as no
# folder at the root is named quest_ort (docs/architecture.md). (The test areas have no
# __init__.py; their helpers are the package `support`, found through pyproject's pythonpath.)
sys.path.append(str(REPO))

# make test-sanitize sets this: the run must really use the ASan+UBSan build of the library.
if os.environ.get("QUEST_ORT_EXPECT_SANITIZED"):
    from quest_ort.ops import get_library_path

    needed = subprocess.run(["ldd", get_library_path()], capture_output=True, text=True).stdout
    if "libasan" not in needed or "libubsan" not in needed:
        raise RuntimeError(f"{get_library_path()} is not the sanitizer build (ldd: {needed.strip()})")
