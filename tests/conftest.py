"""Test set-up: the tests exercise the installed package (with its built library), never the sources."""

from __future__ import annotations

import pathlib

import quest_ort

REPO = pathlib.Path(__file__).resolve().parents[1]

if pathlib.Path(quest_ort.__file__).resolve().parent == REPO / "quest_ort":
    raise RuntimeError(
        "quest_ort was imported from the source tree, which holds no built library; "
        "run the tests with `make test` (it installs the package into .venv first)"
    )
