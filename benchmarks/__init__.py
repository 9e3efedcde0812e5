"""The benchmarks and the quality evaluation, a package run as modules from the repository root (`python -m benchmarks.bench_ops`)."""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# `python -m benchmarks.x` puts the repository root first on sys.path, where `quest_ort` would be
# the source tree (which holds no built library). The root goes last instead: `quest_ort` is the
# installed package, and `benchmarks` (imported already) keeps finding its modules.
if any(pathlib.Path(entry or ".").resolve() == ROOT for entry in sys.path):
    sys.path[:] = [entry for entry in sys.path if pathlib.Path(entry or ".").resolve() != ROOT] + [str(ROOT)]
