"""Rewrite an exported model's attention into the Quest operators: rules, then the I/O pass.

```
detect the export kind -> find each layer's cache inputs/outputs -> apply the kind's rule
  -> every layer rewritten? (else ExportError naming the layers and why)
  -> present outputs become the in-place caches -> the head slices its rows (logits.py)
  -> Quest model I/O (model_io.finish_io)
```
`rewrite_attention` returns per-layer counts: which rule rewrote each layer, which are sparse, and
why the graph has no logits_keep input when it has none.
"""

from __future__ import annotations

import dataclasses
import pathlib

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchingTracer

from .attention23 import OnnxAttention
from .context import IR_TYPES, Geometry, RewriteContext, SparseSettings
from .genai_config import FILE, read_genai_config
from .genai_gqa import GenaiGroupQueryAttention
from .layers import LayerSlot, detect_kind, find_layers
from .logits import keep_last_logits
from .model_io import ExportError, finish_io, positions_from_past_lens
from .optimum_attention import OptimumAttention
from .probe import SourceProbe

__all__ = ["ExportError", "Geometry", "RewriteResult", "SparseSettings", "geometry_from_graph", "rewrite_attention"]

RULES = {"optimum": OptimumAttention, "genai": GenaiGroupQueryAttention, "attention23": OnnxAttention}


def _dims(value: ir.Value) -> list:
    return [] if value.shape is None else list(value.shape)


def _query_width(value: ir.Value) -> int | None:
    """The last dim of a GroupQueryAttention query: from its shape, else from the projection that
    writes it (MatMulNBits' N, a MatMul's constant weight, through a bias Add). The builder leaves
    these shapes out of its graph, and onnx's shape inference does not know the contrib ops."""
    for _ in range(4):
        dims = _dims(value)
        if dims and isinstance(dims[-1], int):
            return dims[-1]
        node = value.producer()
        if node is None:
            return None
        if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
            return node.attributes.get_int("N", 0) or None
        if node.op_type == "MatMul":
            weight = ir.convenience.get_const_tensor(node.inputs[1]) if node.inputs[1] is not None else None
            return int(weight.shape[-1]) if weight is not None else None
        if node.op_type != "Add":
            return None
        constant = [ir.convenience.get_const_tensor(x) is not None for x in node.inputs]
        if constant.count(False) != 1:
            return None
        value = node.inputs[constant.index(False)]
    return None


def _gqa_geometry(graph: ir.Graph) -> dict[str, tuple[int | None, str]]:
    """num_heads, kv_num_heads and the head size that the first GroupQueryAttention node states,
    each with where it was read."""
    node = next(n for n in graph if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft")
    where = f"GroupQueryAttention {node.name!r}"
    heads = node.attributes.get_int("num_heads", 0) or None
    kv_heads = node.attributes.get_int("kv_num_heads", 0) or None
    packed = len(node.inputs) < 2 or node.inputs[1] is None
    width = _query_width(node.inputs[0])
    head_dim = None
    if width is not None and heads and kv_heads:
        per_token = heads + 2 * kv_heads if packed else heads
        if width % per_token:
            raise ExportError(f"{where}: its query has {width} channels, not a multiple of the "
                              f"{per_token} {'packed q/k/v ' if packed else ''}heads")
        head_dim = width // per_token
    return {"num_heads": (heads, f"{where} attribute num_heads"),
            "kv_num_heads": (kv_heads, f"{where} attribute kv_num_heads"),
            "head_dim": (head_dim, f"{where}'s query width")}


def geometry_from_graph(model: ir.Model, inferred: bool = False, folder: pathlib.Path | None = None) -> Geometry:
    """Layers, heads and head size of an exported graph, from its cache inputs and attention nodes,
    and from onnxruntime-genai's genai_config.json when `folder` has one. Every source that states a
    number must agree; a number no source states is an error."""
    graph = model.graph
    kind = detect_kind(graph)
    slots = find_layers(graph, kind)
    dims = _dims(slots[0].past_key)
    if len(dims) != 4:
        raise ExportError(f"cache input {slots[0].past_key.name!r} has shape {dims}, expected [B, N, T, D]")
    # name -> [(value, where it was read)]; symbolic dims (the builder's kv_cache_dim) state nothing
    stated: dict[str, list] = {"num_layers": [(len(slots), "the graph's attention layers")], "num_heads": [],
                               "kv_num_heads": [], "head_dim": []}
    cache = f"cache input {slots[0].past_key.name!r}"
    for name, dim in (("kv_num_heads", dims[1]), ("head_dim", dims[3])):
        if isinstance(dim, int):
            stated[name].append((dim, f"{cache}'s shape"))
    if kind == "genai":
        for name, (value, where) in _gqa_geometry(graph).items():
            if value is not None:
                stated[name].append((value, where))
    for node in graph:
        if kind == "attention23" and node.op_type == "Attention":
            heads = node.attributes.get_int("q_num_heads", 0) or (
                _dims(node.inputs[0])[1] if len(_dims(node.inputs[0])) == 4 else None)
            if heads and isinstance(heads, int):
                stated["num_heads"].append((heads, f"Attention {node.name!r}"))
                break
    config = read_genai_config(folder) if folder is not None else None
    if config is not None:
        for name, field in (("num_layers", "num_hidden_layers"), ("num_heads", "num_attention_heads"),
                            ("kv_num_heads", "num_key_value_heads"), ("head_dim", "head_size")):
            if getattr(config, field) is not None:
                stated[name].append((getattr(config, field), f"{config.path.name}'s {field}"))
    if not stated["num_heads"] and kind == "attention23" and not inferred:
        # shapes may be missing in the file: infer them (data propagation) and retry
        import onnx_ir.passes.common as common_passes

        common_passes.ShapeInferencePass(data_prop=True)(model)
        return geometry_from_graph(model, inferred=True, folder=folder)
    values = {}
    for name, sources in stated.items():
        if not sources:
            raise ExportError(f"cannot tell the model's {name} ({cache} has shape {dims}; the attention nodes"
                              f"{' and ' + FILE if folder is not None else ''} do not state it)")
        (value, where), *others = sources
        for other, other_where in others:
            if other != value:
                raise ExportError(f"the model's {name} is {value} by {where} but {other} by {other_where}")
        values[name] = value
    dtype = slots[0].past_key.type.dtype if slots[0].past_key.type is not None else ir.DataType.FLOAT
    names = {ir_type: name for name, ir_type in IR_TYPES.items()}
    if dtype not in names:
        raise ExportError(f"cache input {slots[0].past_key.name!r} holds {dtype.name.lower()}; the Quest ops take "
                          f"{' or '.join(names.values())}")
    return Geometry(values["num_layers"], values["num_heads"], values["kv_num_heads"], values["head_dim"], names[dtype])


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


@dataclasses.dataclass(frozen=True)
class RewriteResult:
    """What rewrite_attention did to a model."""

    kind: str  # the source's attention form (layers.detect_kind: "optimum", "genai", "attention23")
    rules_applied: int  # matches the rewrite rule set replaced
    layers: dict[int, str]  # layer -> the rule that rewrote it
    sparse_layers: list[int]  # layers with block bounds and selection
    dense_layers: list[int]  # the others (attending exactly)
    logits_keep: bool  # whether the graph takes logits_keep (the head sliced to a step's last positions)
    logits_keep_refused: str | None  # if not, why
    settings: SparseSettings  # as exported, every default resolved (RewriteContext.exported_settings)


def rewrite_attention(model: ir.Model, settings: SparseSettings, geometry: Geometry | None = None,
                      capacity: int = 8192, key_factors: dict | None = None) -> RewriteResult:
    """Rewrite every attention layer in place; return what was done. Raises ExportError naming the
    layers that did not match or were refused (the model is then left unusable: rewrite a copy).
    `capacity`: the longest context the model is exported for; masks are probed up to it.
    `key_factors`: with int8 caches, each layer's key channel factors [N, D] (pipeline/calibrate.py)."""
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
    context = RewriteContext(settings, geometry, batch_dim=str(batch), graph=graph, key_factors=key_factors)
    for slot in slots:
        context.cache_inputs[id(slot.past_key)] = slot.index
        context.cache_inputs[id(slot.past_value)] = slot.index
    # Before anything changes the graph: the probe evaluates masks and lengths as the source computes them.
    context.probe = SourceProbe(model, slots, capacity, geometry)
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
    logits_keep, no_keep_reason = keep_last_logits(graph)
    finish_io(model, context, past_key, past_value, present_key, present_value,
              drop_inputs=("attention_mask", "position_ids"), logits_keep=logits_keep)
    sparse = context.sparse_layers()
    return RewriteResult(kind, count, dict(sorted(context.rewritten.items())), sparse,
                         [slot.index for slot in slots if slot.index not in sparse], logits_keep is not None,
                         no_keep_reason or None, context.exported_settings())
