"""Turn a rewritten graph's I/O into the Quest model I/O (docs/export.md, "The Quest model I/O").

- inputs: input_ids, past_lens, total_lens, exact_lens and chunk_lens (when a layer is sparse), logits_keep (when
  the logits come from a head the rewrite can slice: logits.py), and per layer
  past_key.l, past_value.l [B,N,C,D] (+ past_block_max.l, past_block_min.l [B,N,M,D] for sparse
  layers, and past_super_max.l, past_super_min.l [B,N,MS,D] where they select hierarchically);
- outputs: logits and present_*.l, each bound in place to its past input by the runtime;
- RoPE positions come from past_lens (`past_lens[b] + i`), not from a position_ids input;
- the attention mask input is gone: validity comes from past_lens and total_lens.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from ...ops.schemas import DOMAIN, OPS_BY_NAME
from .context import RewriteContext


class ExportError(ValueError):
    """The model cannot be rewritten; the message says which layer or input and why."""


def _const(graph_nodes: list, value, dtype) -> ir.Value:
    node = ir.node("Constant", [], attributes={"value": ir.tensor(np.asarray(value, dtype=dtype))})
    graph_nodes.append(node)
    return node.outputs[0]


def positions_from_past_lens(graph: ir.Graph, past_lens: ir.Value, input_ids: ir.Value) -> ir.Value:
    """[B, S] int64 positions `past_lens[b] + i`.

    ```
    past_lens -Cast(int64)-Unsqueeze(1)--.
    input_ids -Shape[1:2]-Squeeze-Range(0, S)-Add--> positions
    ```
    """
    nodes: list[ir.Node] = []

    def add(op_type, inputs, **attributes):
        node = ir.node(op_type, inputs, attributes=attributes)
        nodes.append(node)
        return node.outputs[0]

    past = add("Unsqueeze", [add("Cast", [past_lens], to=ir.DataType.INT64), _const(nodes, [1], np.int64)])
    length = add("Squeeze", [add("Shape", [input_ids], start=1, end=2), _const(nodes, [0], np.int64)])
    steps = add("Range", [_const(nodes, 0, np.int64), length, _const(nodes, 1, np.int64)])
    positions = add("Add", [past, steps])
    positions.name = "quest_positions"
    graph.extend(nodes)
    return positions


def _retype(value: ir.Value, name: str, dtype: ir.DataType, shape: list) -> None:
    value.name = name
    value.type = ir.TensorType(dtype)
    value.shape = ir.Shape(shape)


def finish_io(model: ir.Model, context: RewriteContext, past_key: dict, past_value: dict,
              present_key: dict, present_value: dict, drop_inputs: tuple[str, ...],
              logits_keep: ir.Value | None = None) -> None:
    """Rename, retype and add the model inputs and outputs after every layer was rewritten.

    `past_key` etc. map layer -> the original graph value; `drop_inputs` are inputs the Quest model
    no longer takes (they must have no use left once dead nodes are removed).
    """
    graph = model.graph
    g = context.geometry
    N, D = g.kv_num_heads, g.head_dim
    cache_shape = [context.batch_dim, N, "capacity", D]
    meta_shape = [context.batch_dim, N, "num_blocks", D]
    super_shape = [context.batch_dim, N, "num_superblocks", D]
    for layer in range(g.num_layers):
        _retype(past_key[layer], f"past_key.{layer}", context.kv_dtype, cache_shape)
        _retype(past_value[layer], f"past_value.{layer}", context.kv_dtype, cache_shape)
        _retype(present_key[layer], f"present_key.{layer}", context.kv_dtype, cache_shape)
        _retype(present_value[layer], f"present_value.{layer}", context.kv_dtype, cache_shape)
    inputs = list(graph.inputs)
    position_of = {value.name: i for i, value in enumerate(inputs)}
    after_ids = position_of.get("input_ids", -1) + 1
    new_inputs = [context.past_lens, context.total_lens]
    new_inputs += [context.exact_lens, context.chunk_lens] if context.sparse_layers() else []
    new_inputs += [logits_keep] if logits_keep is not None else []
    for layer, (key_scale, value_scale) in context.scale_outputs.items():
        new_inputs += [context.key_scale[layer], context.value_scale[layer]]
        _retype(key_scale, f"present_key_scale.{layer}", ir.DataType.FLOAT16, cache_shape[:3])
        _retype(value_scale, f"present_value_scale.{layer}", ir.DataType.FLOAT16, cache_shape[:3])
        graph.outputs.extend([key_scale, value_scale])
    for layer in context.sparse_layers():
        new_inputs += [context.block_max[layer], context.block_min[layer]]
        block_max, block_min, *exponent = context.metadata_outputs[layer]
        _retype(block_max, f"present_block_max.{layer}", context.bounds_dtype, meta_shape)
        _retype(block_min, f"present_block_min.{layer}", context.bounds_dtype, meta_shape)
        graph.outputs.extend([block_max, block_min])
        if exponent:  # int8 bounds
            new_inputs.append(context.block_exponent[layer])
            _retype(exponent[0], f"present_block_exponent.{layer}", ir.DataType.INT8, meta_shape[:3])
            graph.outputs.append(exponent[0])
        if layer in context.super_outputs:  # the hierarchical selection's superblock bounds
            super_max, super_min, *super_exponent = context.super_outputs[layer]
            new_inputs += [context.super_max[layer], context.super_min[layer]]
            _retype(super_max, f"present_super_max.{layer}", context.bounds_dtype, super_shape)
            _retype(super_min, f"present_super_min.{layer}", context.bounds_dtype, super_shape)
            graph.outputs.extend([super_max, super_min])
            if super_exponent:
                new_inputs.append(context.super_exponent[layer])
                _retype(super_exponent[0], f"present_super_exponent.{layer}", ir.DataType.INT8, super_shape[:3])
                graph.outputs.append(super_exponent[0])
        if layer in context.importance_outputs:
            new_inputs.append(context.block_importance[layer])
            importance = context.importance_outputs[layer]
            _retype(importance, f"present_block_importance.{layer}", ir.DataType.FLOAT, meta_shape[:3])
            graph.outputs.remove(importance)  # placed during the rewrite; moved after its layer's metadata
            graph.outputs.append(importance)
    graph.inputs.clear()
    graph.inputs.extend(inputs[:after_ids] + new_inputs + inputs[after_ids:])
    common_passes.RemoveUnusedNodesPass()(model)
    for name in drop_inputs:
        value = next((v for v in graph.inputs if v.name == name), None)
        if value is None:
            continue
        if value.uses():
            users = sorted({use.node.name or use.node.op_type for use in value.uses()})[:4]
            raise ExportError(f"input {name!r} is still used after the rewrite (by {users}); "
                              "the model computes something the Quest ops do not replace")
        graph.inputs.remove(value)
    common_passes.RemoveUnusedNodesPass()(model)
    graph.sort()


def unname_unread_outputs(graph: ir.Graph) -> int:
    """Give the optional outputs of the Quest nodes that nothing reads the empty name, ONNX's absent
    output; returns how many. The rewriter names every unnamed value when a rule set applies
    (onnxscript's NameFixPass), so an output the rewrite left out this way came back as "v_3": the
    op then computed it for nothing (an int8 cache's SparseBlockAttention its block importance, in
    every step). Run last, just before the graph is saved."""
    cleared = 0
    for node in graph:
        if node.domain != DOMAIN:
            continue
        for value, tensor in zip(node.outputs, OPS_BY_NAME[node.op_type].outputs):
            if tensor.optional and value.name and not value.uses() and not value.is_graph_output():
                value.name = ""
                cleared += 1
    return cleared
