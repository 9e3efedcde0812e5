"""Generate the C++ schema header (`quest_schemas.gen.h`) from `schemas.py` at build time.

Run by CMake with only the standard library: `python ops/schema_codegen.py OUT_HEADER`.
The header gives the ORT adapter the same input/output order, dims, optionality and attribute
defaults as the Python side, so the two can never drift apart.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

_HERE = pathlib.Path(__file__).resolve().parent


def _load_schemas():
    spec = importlib.util.spec_from_file_location("quest_schemas", _HERE / "schemas.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


_ELEM = {"T": "Elem::T", "TC": "Elem::TC", "int32": "Elem::Int32", "int8": "Elem::Int8", "float32": "Elem::Float32",
         "float16": "Elem::Float16"}
_KIND = {"int": "AttrKind::Int", "float": "AttrKind::Float", "string": "AttrKind::String"}


def _c_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _tensor_row(t) -> str:
    dims = ", ".join(_c_str(d) for d in t.dims)
    return (
        f"    {{{_c_str(t.name)}, {_ELEM[t.elem]}, {'true' if t.optional else 'false'}, "
        f"{len(t.dims)}, {{{dims}}}}},"
    )


def _attr_row(a) -> str:
    default_int = a.default if a.kind == "int" and a.default is not None else 0
    default_float = a.default if a.kind == "float" and a.default is not None else 0.0
    default_str = _c_str(a.default) if a.kind == "string" and a.default is not None else "nullptr"
    choices = f"k{a.name}_choices" if a.choices else "nullptr"
    has_min = "true" if a.minimum is not None else "false"
    has_max = "true" if a.maximum is not None else "false"
    return (
        f"    {{{_c_str(a.name)}, {_KIND[a.kind]}, {'true' if a.required else 'false'}, "
        f"{int(default_int)}, {float(default_float)!r}, {default_str}, {choices}, {len(a.choices)}, "
        f"{has_min}, {float(a.minimum or 0.0)!r}, {has_max}, {float(a.maximum or 0.0)!r}}},"
    )


def _op_block(op) -> str:
    lines = [f"namespace {op.name} {{"]
    lines.append("namespace in {")
    lines += [f"inline constexpr int {t.name} = {i};" for i, t in enumerate(op.inputs)]
    lines.append("}  // namespace in")
    lines.append("namespace out {")
    lines += [f"inline constexpr int {t.name} = {i};" for i, t in enumerate(op.outputs)]
    lines.append("}  // namespace out")
    lines.append("inline constexpr TensorSpec kInputs[] = {")
    lines += [_tensor_row(t) for t in op.inputs]
    lines.append("};")
    lines.append("inline constexpr TensorSpec kOutputs[] = {")
    lines += [_tensor_row(t) for t in op.outputs]
    lines.append("};")
    for a in op.attributes:
        if a.choices:
            choices = ", ".join(_c_str(c) for c in a.choices)
            lines.append(f"inline constexpr const char* k{a.name}_choices[] = {{{choices}}};")
    lines.append("inline constexpr AttrSpec kAttributes[] = {")
    lines += [_attr_row(a) for a in op.attributes]
    lines.append("};")
    lines.append("inline constexpr SymbolAttr kSymbolAttrs[] = {")
    lines += [f"    {{{_c_str(s)}, {_c_str(a)}}}," for s, a in op.symbol_attrs.items()]
    lines.append("};")
    kinds = {"mul": "DerivedKind::Product", "ceil_div": "DerivedKind::CeilDiv", "pick": "DerivedKind::Pick"}
    derived = [f"    {{{_c_str(d.name)}, {kinds[d.op]}, {_c_str(d.a)}, {_c_str(d.b)}, "
               f"{_c_str(d.when[0]) if d.when else 'nullptr'}, {_c_str(d.when[1]) if d.when else 'nullptr'}}},"
               for d in op.derived]
    if derived:
        lines.append("inline constexpr DerivedSpec kDerived[] = {")
        lines += derived
        lines.append("};")
    derived_ref = ("kDerived", len(op.derived)) if derived else ("nullptr", 0)
    lines.append(f"inline constexpr bool kInt8Cache = {'true' if 'int8' in op.cache_types else 'false'};")
    lines.append(
        f"inline constexpr OpSchema kSchema = {{{_c_str(op.name)}, kInputs, {len(op.inputs)}, "
        f"kOutputs, {len(op.outputs)}, kAttributes, {len(op.attributes)}, kSymbolAttrs, "
        f"{len(op.symbol_attrs)}, {derived_ref[0]}, {derived_ref[1]}, kInt8Cache}};"
    )
    lines.append(f"}}  // namespace {op.name}")
    return "\n".join(lines)


def render() -> str:
    schemas = _load_schemas()
    blocks = "\n\n".join(_op_block(op) for op in schemas.ALL_OPS)
    names = ", ".join(_c_str(op.name) for op in schemas.ALL_OPS)
    return f"""// Generated from ops/schemas.py by ops/schema_codegen.py. Do not edit.
#pragma once
#include "schema_types.h"

namespace quest::schema {{

inline constexpr const char* kDomain = {_c_str(schemas.DOMAIN)};
inline constexpr int kVersion = {schemas.VERSION};
inline constexpr const char* kOpNames[] = {{{names}}};

{blocks}

}}  // namespace quest::schema
"""


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: schema_codegen.py OUT_HEADER", file=sys.stderr)
        return 2
    out = pathlib.Path(argv[1])
    text = render()
    if not out.exists() or out.read_text() != text:  # keep the timestamp when nothing changed
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
