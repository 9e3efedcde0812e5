"""Render each op's interface tables (from schemas.py) into docs/ops.md between generated markers.

`python ops/docgen.py docs/ops.md` rewrites the blocks in place; tests/ops/test_docs.py fails when the
committed document and the schemas disagree.
"""

from __future__ import annotations

import pathlib
import re
import sys

if __package__:
    from .schemas import ALL_OPS, OpSpec
else:  # run as a script from the source tree
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from schemas import ALL_OPS, OpSpec  # type: ignore[no-redef]

BEGIN = "<!-- BEGIN GENERATED {name}: ops/docgen.py from ops/schemas.py -->"
END = "<!-- END GENERATED {name} -->"


def _tensor_rows(tensors) -> list[str]:
    rows = ["| name | type | shape | |", "|---|---|---|---|"]
    for t in tensors:
        optional = " (optional)" if t.optional else ""
        rows.append(f"| `{t.name}`{optional} | {t.elem} | [{', '.join(t.dims)}] | {t.doc} |")
    return rows


def render_op(op: OpSpec) -> str:
    lines = [op.doc, "", "Inputs:", "", *_tensor_rows(op.inputs), "", "Outputs:", "", *_tensor_rows(op.outputs), ""]
    lines += ["Attributes:", "", "| name | kind | default | range | |", "|---|---|---|---|---|"]
    for a in op.attributes:
        default = "required" if a.required else f"`{a.default!r}`"
        if a.choices:
            allowed = " or ".join(f"`{c}`" for c in a.choices)
        else:
            low = "" if a.minimum is None else f">= {a.minimum:g}"
            high = "" if a.maximum is None else f"<= {a.maximum:g}"
            allowed = ", ".join(x for x in (low, high) if x)
        lines.append(f"| `{a.name}` | {a.kind} | {default} | {allowed} | {a.doc} |")
    bound = ", ".join(f"{s} = `{a}`" for s, a in op.symbol_attrs.items())
    derived = ", ".join(d.describe() for d in op.derived)
    lines += ["", f"Dims bound by attributes: {bound}." + (f" Derived: {derived}." if derived else "")]
    return "\n".join(lines)


def update(text: str) -> str:
    for op in ALL_OPS:
        begin, end = BEGIN.format(name=op.name), END.format(name=op.name)
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise ValueError(f"docs/ops.md has no generated block for {op.name}")
        text = pattern.sub(lambda _: f"{begin}\n{render_op(op)}\n{end}", text)
    return text


if __name__ == "__main__":
    path = pathlib.Path(sys.argv[1])
    path.write_text(update(path.read_text()))
