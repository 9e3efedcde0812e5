"""The documentation matches the code: op tables in docs/ops.md are those the schemas generate."""

from __future__ import annotations

import pathlib

from quest_ort.ops.docgen import update

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_ops_doc_tables_match_the_schemas():
    text = (REPO / "docs" / "ops.md").read_text()
    assert update(text) == text, "docs/ops.md is stale: run `python ops/docgen.py docs/ops.md`"


def test_readme_names_the_two_setup_commands():
    readme = (REPO / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
