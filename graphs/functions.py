"""Turn Quest nodes into standard ONNX ops: inline expansion, or model-local FunctionProtos.

`expand_quest_ops` replaces every Quest node by its traced body, so the model runs in any ONNX
Runtime (or other engine) without the native library. `attach_function_bodies` keeps the nodes and
adds one FunctionProto per op, which ONNX Runtime inlines only when no kernel claims the node.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxscript

from ..ops.schemas import DOMAIN, OPS_BY_NAME, VERSION
from .bodies import BODIES
from .op_graphs import OPSET

_IMPORTANCE_OUTPUT = OPS_BY_NAME["SparseBlockAttention"].output_index("block_importance")
_CHUNKS_OUTPUT = OPS_BY_NAME["SparseBlockSelect"].output_index("chunk_indices")


def _has_output(node: ir.Node, index: int) -> bool:
    return len(node.outputs) > index and bool(node.outputs[index].name)


def _node_arguments(node: ir.Node) -> tuple[list, dict]:
    """(inputs padded with None to the schema's arity, attributes with defaults) of a Quest node."""
    spec = OPS_BY_NAME[node.op_type]
    inputs = list(node.inputs) + [None] * (len(spec.inputs) - len(node.inputs))
    attributes = spec.defaults() | {name: attr.value for name, attr in node.attributes.items()}
    if node.op_type == "SparseBlockAttention":
        attributes["with_importance"] = _has_output(node, _IMPORTANCE_OUTPUT)
    if node.op_type == "SparseBlockSelect":
        attributes["with_chunks"] = _has_output(node, _CHUNKS_OUTPUT)
    return inputs, attributes


def _quest_nodes(graph: ir.Graph) -> list[ir.Node]:
    nodes = [node for node in graph if node.domain == DOMAIN]
    unknown = sorted({node.op_type for node in nodes} - set(BODIES))
    if unknown:
        raise ValueError(f"no function body for {DOMAIN} ops {unknown}")
    return nodes


def _set_opsets(model: ir.Model, keep_quest: bool) -> None:
    if model.opset_imports.get("", 0) < OPSET:
        model.opset_imports[""] = OPSET
    if not keep_quest:
        model.opset_imports.pop(DOMAIN, None)


def expand_quest_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with every Quest node replaced by its standard-op body, inlined."""
    model_ir = ir.serde.deserialize_model(model)
    expand_quest_nodes(model_ir)
    return ir.serde.serialize_model(model_ir)


def expand_quest_nodes(model_ir: ir.Model) -> None:
    """Replace every Quest node of `model_ir` by its standard-op body, in place."""
    graph = model_ir.graph
    for node in _quest_nodes(graph):
        inputs, attributes = _node_arguments(node)
        tape = onnxscript.TapeBuilder()
        results = BODIES[node.op_type](tape, *inputs, **attributes)
        results = results if isinstance(results, tuple) else (results,)
        pairs = [(old, new) for old, new in zip(node.outputs, results) if old.name]
        ir.convenience.replace_nodes_and_values(
            graph, node, [node], tape.nodes, [old for old, _ in pairs], [new for _, new in pairs]
        )
    # ONNX Runtime runs every node of a graph, consumed or not: the traced nodes no used output
    # needs (e.g. the importance an int8 body computes for its function form) are dropped.
    common_passes.RemoveUnusedNodesPass()(model_ir)
    _set_opsets(model_ir, keep_quest=False)


def function_body(op_name: str, inputs_present: tuple[bool, ...], attributes: dict) -> onnx.FunctionProto:
    """The FunctionProto (domain quest, name op_name) of one specialisation of an op's body."""
    spec = OPS_BY_NAME[op_name]
    present = tuple(inputs_present) + (False,) * (len(spec.inputs) - len(inputs_present))
    formal = [ir.Value(name=t.name) if here else None for t, here in zip(spec.inputs, present)]
    function = onnxscript.build_function(
        lambda op, *args: BODIES[op_name](op, *args, **attributes),
        formal,
        domain=DOMAIN,
        name=op_name,
        opset_imports={"": OPSET},
    )
    for value, tensor in zip(function.outputs, spec.outputs):
        value.name = tensor.name
    return ir.serde.serialize_function(function)


def attach_function_bodies(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` carrying one model-local function per Quest op it uses.

    ONNX allows one function per (domain, name), so every node of an op must share its attributes
    and its pattern of present inputs and outputs; otherwise use `expand_quest_ops`.
    """
    model_ir = ir.serde.deserialize_model(model)
    signatures: dict[str, tuple] = {}
    for node in _quest_nodes(model_ir.graph):
        inputs, attributes = _node_arguments(node)
        signature = (tuple(value is not None for value in inputs), tuple(sorted(attributes.items())))
        if signatures.setdefault(node.op_type, signature) != signature:
            raise ValueError(
                f"{node.op_type} nodes differ in attributes or present inputs ({node.name!r}); "
                "one model-local function cannot serve them all: use expand_quest_ops"
            )
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for op_name, (present, attributes) in signatures.items():
        out.functions.append(function_body(op_name, present, dict(attributes)))
    if not any(o.domain == DOMAIN for o in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid(DOMAIN, VERSION))
    return out
