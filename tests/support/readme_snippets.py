"""The README's code blocks, run by the tests as a reader would run them (on folders the tests export)."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
DEFAULT_FOLDER = "qwen3-quest"  # the folder name the README's snippets use


def python_block(holding: str) -> str:
    """The README's first ```python block whose text holds `holding`."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    found = [block for block in blocks if holding in block]
    assert found, f"README.md has no python block holding {holding!r}"
    return found[0]


def run_chat_snippet(folder: pathlib.Path) -> str:
    """Runs the README's chat snippet on `folder` (in place of qwen3-quest); returns what it printed."""
    code = python_block("Chat(")
    assert code.count("\n") < 10, "the README promises a chat in under 10 lines"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace(f'"{DEFAULT_FOLDER}"', repr(str(folder))), "README.md", "exec"), {})
    return printed.getvalue()
