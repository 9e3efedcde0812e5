"""Rewrite an exported model's attention into the Quest operators: rules, then the I/O pass.

```
detect the export kind -> find each layer's cache inputs/outputs -> apply the kind's rule
  -> every layer rewritten? (else ExportError naming the layers and why)
  -> present outputs become the in-place caches -> Quest model I/O (model_io.finish_io)
```
`rewrite_attention` returns per-layer counts: which rule rewrote each layer, which are sparse.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchingTracer

from .attention23 import OnnxAttention
from .context import IR_TYPES, Geometry, RewriteContext, SparseSettings
from .genai_gqa import GenaiGroupQueryAttention
from .layers import LayerSlot, detect_kind, find_layers
from .model_io import ExportError, finish_io, positions_from_past_lens
from .optimum_attention import OptimumAttention
from .probe import SourceProbe

__all__ = ["ExportError", "Geometry", "SparseSettings", "geometry_from_graph", "rewrite_attention"]

RULES = {"optimum": OptimumAttention, "genai": GenaiGroupQueryAttention, "attention23": OnnxAttention}


def _dims(value: ir.Value) -> list:
    return [] if value.shape is None else list(value.shape)


def geometry_from_graph(model: ir.Model, inferred: bool = False) -> Geometry:
    """Layers, heads and head size of an exported graph, from its attention nodes and cache inputs."""
    graph = model.graph
    kind = detect_kind(graph)
    slots = find_layers(graph, kind)
    dims = _dims(slots[0].past_key)
    if len(dims) != 4 or not isinstance(dims[1], int) or not isinstance(dims[3], int):
        raise ExportError(f"cache input {slots[0].past_key.name!r} has shape {dims}, expected [B, N, T, D] "
                          "with N and D known")
    kv_heads, head_dim = dims[1], dims[3]
    heads = None
    for node in graph:
        if kind == "genai" and node.op_type == "GroupQueryAttention":
            heads = node.attributes.get_int("num_heads", 0)
        elif kind == "attention23" and node.op_type == "Attention":
            heads = node.attributes.get_int("q_num_heads", 0) or (
                _dims(node.inputs[0])[1] if len(_dims(node.inputs[0])) == 4 else None)
        if heads:
            break
    if not heads or not isinstance(heads, int):
        if not inferred:  # shapes may be missing in the file: infer them (data propagation) and retry
            import onnx_ir.passes.common as common_passes

            common_passes.ShapeInferencePass(data_prop=True)(model)
            return geometry_from_graph(model, inferred=True)
        raise ExportError("cannot tell the number of query heads from the attention nodes")
    dtype = slots[0].past_key.type.dtype if slots[0].past_key.type is not None else ir.DataType.FLOAT
    names = {ir_type: name for name, ir_type in IR_TYPES.items()}
    if dtype not in names:
        raise ExportError(f"cache input {slots[0].past_key.name!r} holds {dtype.name.lower()}; the Quest ops take "
                          f"{' or '.join(names.values())}")
    return Geometry(len(slots), heads, kv_heads, head_dim, names[dtype])


def _unmatched_reason(model: ir.Model, rule, slot: LayerSlot) -> str:
    """The best partial match of `rule` that touched this layer's cache, as the tracer saw it."""
    tracer = MatchingTracer()
    pattern.RewriteRuleSet([rule]).apply_to_model(model, tracer=tracer)
    users = {id(use.node) for value in (slot.past_key, slot.present_key) for use in value.uses()}
    best = None
    for matches in tracer.best_matches_map.values():
        for info in matches:
            if any(id(node) in users for node in info.match_result.nodes) or best is None:
                best = info
    if best is None:
        return "its attention subgraph does not have the expected structure"
    result = best.match_result
    where = ", ".join(f"{getattr(x, 'name', None) or x}" for x in (result.failure_nodes_and_values or [])[:2])
    return f"{result.reason or 'the structure differs'}" + (f" (at {where})" if where else "")


def rewrite_attention(model: ir.Model, settings: SparseSettings, geometry: Geometry | None = None,
                      capacity: int = 8192) -> dict:
    """Rewrite every attention layer in place; return the counts. Raises ExportError naming the
    layers that did not match or were refused (the model is then left unusable: rewrite a copy).
    `capacity`: the longest context the model is exported for; masks are probed up to it."""
    graph = model.graph
    kind = detect_kind(graph)
    slots = find_layers(graph, kind)
    geometry = geometry or geometry_from_graph(model)
    if len(slots) != geometry.num_layers:
        raise ExportError(f"found {len(slots)} attention layers, the model config says {geometry.num_layers}")
    input_ids = next((v for v in graph.inputs if v.name == "input_ids"), None)
    if input_ids is None:
        raise ExportError("the model has no input_ids input")
    batch = input_ids.shape[0] if input_ids.shape is not None else "batch_size"
    context = RewriteContext(settings, geometry, batch_dim=str(batch), graph=graph)
    for slot in slots:
        context.cache_inputs[id(slot.past_key)] = slot.index
        context.cache_inputs[id(slot.past_value)] = slot.index
    # Before anything changes the graph: the probe evaluates masks and lengths as the source computes them.
    context.probe = SourceProbe(model, slots, capacity)
    context.positions = positions_from_past_lens(graph, context.past_lens, input_ids)
    position_ids = next((v for v in graph.inputs if v.name == "position_ids"), None)
    if position_ids is not None:  # before the rules: their clean-up drops nodes nothing uses yet
        position_ids.replace_all_uses_with(context.positions)
    rule = RULES[kind].rule(context)
    count = pattern.RewriteRuleSet([rule]).apply_to_model(model)
    missing = [slot for slot in slots if slot.index not in context.rewritten]
    if missing:
        reasons = []
        for slot in missing:
            recorded = "; ".join(context.failures.get(slot.index, [])) or _unmatched_reason(model, rule, slot)
            reasons.append(f"layer {slot.index}: {recorded}")
        raise ExportError("attention not rewritten in " + "; ".join(reasons))
    present_key, present_value = {}, {}
    for layer, ((old_key, new_key), (old_value, new_value)) in context.replaced_presents.items():
        for old, new, store in ((old_key, new_key, present_key), (old_value, new_value, present_value)):
            if old.is_graph_output():
                index = list(graph.outputs).index(old)
                graph.outputs[index] = new
            store[layer] = new
    past_key = {slot.index: slot.past_key for slot in slots}
    past_value = {slot.index: slot.past_value for slot in slots}
    finish_io(model, context, past_key, past_value, present_key, present_value,
              drop_inputs=("attention_mask", "position_ids"))
    sparse = context.sparse_layers()
    return {"kind": kind, "rewritten": count, "layers": dict(sorted(context.rewritten.items())),
            "sparse_layers": sparse, "dense_layers": [slot.index for slot in slots if slot.index not in sparse]}
