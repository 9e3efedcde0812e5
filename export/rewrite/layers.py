"""Find the attention layers of an exported graph, and the cache inputs and outputs of each.

Three kinds of export are understood; each layer is identified structurally (not by name), in
graph order:
- "optimum": optimum's TorchScript export: Concat(past_key_values.l.key, k) as present.l.key;
- "genai": ONNX Runtime GenAI builder graphs: com.microsoft.GroupQueryAttention nodes whose past
  inputs and present outputs are graph inputs and outputs;
- "attention23": torch.onnx dynamo exports at opset 23: ONNX Attention nodes whose (repeated) K/V
  come from Concat(past, new) with the past a graph input.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from .model_io import ExportError


@dataclasses.dataclass
class LayerSlot:
    index: int
    past_key: ir.Value
    past_value: ir.Value
    present_key: ir.Value
    present_value: ir.Value


def detect_kind(graph: ir.Graph) -> str:
    ops = {(node.domain, node.op_type) for node in graph}
    if ("com.microsoft", "GroupQueryAttention") in ops:
        return "genai"
    if ("", "Attention") in ops:
        return "attention23"
    if ("", "Softmax") in ops and any((value.name or "").startswith("past_key_values.") for value in graph.inputs):
        return "optimum"
    raise ExportError("no attention found: expected an optimum export (decomposed attention with "
                      "past_key_values.<l>.key inputs), GroupQueryAttention nodes, or ONNX Attention nodes")


def _concat_of_past(value: ir.Value | None) -> tuple[ir.Value, ir.Value] | None:
    """(past graph input, Concat output) when `value` is, or repeats, Concat(past, new)."""
    while value is not None:
        node = value.producer()
        if node is None:
            return None
        if node.op_type == "Concat" and len(node.inputs) == 2 and node.inputs[0] is not None \
                and node.inputs[0].is_graph_input():
            return node.inputs[0], value
        if node.op_type not in ("Reshape", "Expand", "Unsqueeze"):
            return None
        value = node.inputs[0]
    return None


def repeat_kv_problem(value: ir.Value, present: ir.Value) -> str | None:
    """Why `value` is not `present` [B, N, T, D] as transformers' repeat_kv repeats it (or as is):
    Unsqueeze at axis 2, Expand, Reshape, so that query head h reads KV head h // G, as the Quest
    ops do. Unsqueezing at axis 1 instead would interleave the heads (h reads h % N)."""
    while value is not present:
        node = value.producer()
        if node is None or node.op_type not in ("Reshape", "Expand", "Unsqueeze"):
            return f"{value.name!r} is not the cache repeated by Unsqueeze, Expand and Reshape"
        if node.op_type == "Unsqueeze":
            axes = ir.convenience.get_const_tensor(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
            axes = None if axes is None else axes.numpy().reshape(-1).tolist()
            if axes not in ([2], [-3]):
                return (f"Unsqueeze {node.name!r} inserts the repeat axis at {axes}; the KV heads repeat as query "
                        "head h reading KV head h // G only with axis 2")
        value = node.inputs[0]
    return None


def find_layers(graph: ir.Graph, kind: str) -> list[LayerSlot]:
    slots: list[LayerSlot] = []
    for node in graph:
        pair = None
        if kind == "genai" and node.op_type == "GroupQueryAttention":
            if len(node.inputs) < 5 or len(node.outputs) < 3:
                raise ExportError(f"GroupQueryAttention {node.name!r} has no past/present key and value")
            pair = (node.inputs[3], node.inputs[4], node.outputs[1], node.outputs[2])
        elif kind == "attention23" and node.op_type == "Attention" and node.domain == "":
            key, value = _concat_of_past(node.inputs[1]), _concat_of_past(node.inputs[2])
            if key is None or value is None:
                raise ExportError(f"Attention {node.name!r}: its K/V do not come from Concat(past graph input, new)")
            pair = (key[0], value[0], key[1], value[1])
        elif kind == "optimum" and node.op_type == "Concat" and len(node.inputs) == 2 and \
                (node.inputs[0].name or "").startswith("past_key_values.") and (node.inputs[0].name or "").endswith(".key"):
            stem = node.inputs[0].name[: -len(".key")]
            value_input = next((v for v in graph.inputs if v.name == stem + ".value"), None)
            present_value = next((use.node.outputs[0] for use in value_input.uses()
                                  if use.node.op_type == "Concat"), None) if value_input else None
            if present_value is None:
                raise ExportError(f"{stem}.value is missing or not concatenated like {stem}.key")
            pair = (node.inputs[0], value_input, node.outputs[0], present_value)
        if pair is None:
            continue
        past_key, past_value, present_key, present_value = pair
        where = f"layer {len(slots)} ({node.name or node.op_type})"
        for value, role in ((past_key, "past key"), (past_value, "past value")):
            if value is None or not value.is_graph_input():
                raise ExportError(f"{where}: the {role} is not a graph input")
        for value, role in ((present_key, "present key"), (present_value, "present value")):
            if not value.is_graph_output():
                raise ExportError(f"{where}: the {role} is not a graph output")
        slots.append(LayerSlot(len(slots), past_key, past_value, present_key, present_value))
    if not slots:
        raise ExportError(f"no attention layers found in this {kind} export")
    return slots
