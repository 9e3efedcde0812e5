"""Rewrite an exported model's attention into the Quest operators: rules, then the I/O pass.

`rewrite_attention(model, settings, geometry)` applies the first rule family that matches the
graph, checks that every layer was rewritten (naming any that was not, with the reason), turns the
model I/O into the Quest layout, and returns the per-rule, per-layer counts.
"""

from __future__ import annotations

import re

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchingTracer

from .context import Geometry, RewriteContext, SparseSettings
from .model_io import ExportError, finish_io, positions_from_past_lens
from .optimum_attention import OptimumAttention

__all__ = ["ExportError", "Geometry", "SparseSettings", "rewrite_attention"]

_OPTIMUM_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_OPTIMUM_PRESENT = re.compile(r"^present\.(\d+)\.(key|value)$")


def _unmatched_reason(model: ir.Model, rule, layer: int) -> str:
    """The best partial match of `rule` around layer `layer`, as the onnxscript tracer saw it."""
    tracer = MatchingTracer()
    pattern.RewriteRuleSet([rule]).apply_to_model(model, tracer=tracer)
    best = None
    for matches in tracer.best_matches_map.values():
        for info in matches:
            names = " ".join(node.name or "" for node in info.match_result.nodes)
            if f"layers.{layer}/" in names or f"layers.{layer}." in names:
                best = info
    if best is None:
        return "its attention subgraph does not have the expected structure"
    result = best.match_result
    where = ", ".join(f"{getattr(x, 'name', None) or x}" for x in (result.failure_nodes_and_values or [])[:2])
    return f"{result.reason or 'structure differs'}" + (f" (at {where})" if where else "")


def rewrite_attention(model: ir.Model, settings: SparseSettings, geometry: Geometry) -> dict:
    """Rewrite every attention layer of an optimum-exported model in place; return counts.

    Raises ExportError naming the layers that did not match, before the model is changed further.
    """
    graph = model.graph
    input_ids = next((v for v in graph.inputs if v.name == "input_ids"), None)
    if input_ids is None:
        raise ExportError("the model has no input_ids input")
    batch_dim = input_ids.shape[0] if input_ids.shape is not None else "batch_size"
    context = RewriteContext(settings, geometry, batch_dim=str(batch_dim))
    past_key, past_value = {}, {}
    for value in graph.inputs:
        found = _OPTIMUM_PAST.match(value.name or "")
        if found:
            (past_key if found.group(2) == "key" else past_value)[int(found.group(1))] = value
    if sorted(past_key) != list(range(geometry.num_layers)) or sorted(past_value) != sorted(past_key):
        raise ExportError(
            f"expected past_key_values.<l>.key/value inputs for layers 0..{geometry.num_layers - 1}, "
            f"found layers {sorted(past_key)}: not an optimum text-generation-with-past export")
    present_names = {(int(m.group(1)), m.group(2)): value for value in graph.outputs
                     if (m := _OPTIMUM_PRESENT.match(value.name or ""))}
    rule = OptimumAttention.rule(context)
    count = pattern.RewriteRuleSet([rule]).apply_to_model(model)
    missing = [layer for layer in range(geometry.num_layers) if layer not in context.rewritten]
    if missing:
        reasons = []
        for layer in missing:
            recorded = "; ".join(context.failures.get(layer, [])) or _unmatched_reason(model, rule, layer)
            reasons.append(f"layer {layer}: {recorded}")
        raise ExportError("attention not rewritten in " + "; ".join(reasons))
    present_key, present_value = {}, {}
    for layer, ((old_key, new_key), (old_value, new_value)) in context.replaced_presents.items():
        for old, new, store in ((old_key, new_key, present_key), (old_value, new_value, present_value)):
            if not old.is_graph_output():
                raise ExportError(f"layer {layer}: {old.name!r} is not a graph output")
            _replace_output(graph, old, new)
            store[layer] = new
    del present_names
    position_ids = next((v for v in graph.inputs if v.name == "position_ids"), None)
    if position_ids is not None:
        positions = positions_from_past_lens(graph, context.past_lens, input_ids)
        position_ids.replace_all_uses_with(positions)
    finish_io(model, context, past_key, past_value, present_key, present_value,
              drop_inputs=("attention_mask", "position_ids"))
    return {"rewritten": count, "layers": dict(sorted(context.rewritten.items())),
            "sparse_layers": context.sparse_layers(), "dense_layers": sorted(settings.dense_layers)}


def _replace_output(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Put `new` where `old` stood in the graph outputs (old's producer becomes dead code)."""
    index = list(graph.outputs).index(old)
    graph.outputs[index] = new
