"""The per-layer sparse attention subgraph (docs/ops.md: the three ops in a layer) as a model of its own.

```
key ----------> QuestMetadata(block_max, block_min, past_lens) --> block_max_out, block_min_out
key ----------> QuestMetadata(super_max, super_min, past_lens,  --> super_max_out, super_min_out
                              block_size = P * U)                   (superblocks only)
                     |
query --------> SparseBlockSelect(block_max', block_min', past_lens, [super_max', super_min'])
                     |                                                            --> block_indices
query, key, value --> SparseBlockAttention(key_cache, value_cache, past_lens, block_indices,
                                           [key_scale, value_scale])            (int8 caches)
                          --> output, key_cache_out, value_cache_out, [key_scale_out, value_scale_out]
```
A dense layer is the same graph without the QuestMetadata and SparseBlockSelect nodes and without
block_indices. With int8 caches QuestMetadata bounds the keys as the cache stores them
(key_cache_type 'int8'). With `superblock_size` U the layer also keeps bounds over superblocks of U
blocks, as the exporter's sparse layers do (export/rewrite/context.py), and the select ranks blocks
hierarchically (docs/ops.md).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..ops.schemas import DOMAIN, SPARSE_BLOCK_SELECT, VERSION
from .op_graphs import IR_VERSION, OPSET, elem_type


def attention_layer_model(
    *,
    num_heads: int,
    kv_num_heads: int,
    head_dim: int,
    capacity: int,
    block_size: int,
    top_k: int | None,
    activation_dtype=np.float32,
    cache_dtype=np.float32,
    bounds_dtype=None,
    sink_blocks: int = 1,
    recent_blocks: int = 1,
    group_reduce: str = "mean",
    superblock_size: int = 0,
    candidate_factor: int | None = None,
) -> onnx.ModelProto:
    """One layer's decode/prefill dataflow; `top_k=None` gives the dense layer. The block bounds are
    `bounds_dtype` (default: the cache's; float16 with int8 caches); int8 bounds come with their
    per-block exponents (block_exponent in, block_exponent_out out). `superblock_size` > 0 adds the
    superblock bounds (super_max, super_min [B, N, ceil(M / U), D], super_exponent with int8 bounds;
    in and out) and SparseBlockSelect's superblock_size and candidate_factor (None: the op's default)."""
    H, N, D, C, P = num_heads, kv_num_heads, head_dim, capacity, block_size
    M = -(-C // P)
    int8 = np.dtype(cache_dtype) == np.int8
    t, tc = elem_type(activation_dtype), elem_type(cache_dtype)
    tm = elem_type(bounds_dtype if bounds_dtype is not None else np.float16 if int8 else cache_dtype)
    inputs = [
        helper.make_tensor_value_info("query", t, ["B", H, "S", D]),
        helper.make_tensor_value_info("key", t, ["B", N, "S", D]),
        helper.make_tensor_value_info("value", t, ["B", N, "S", D]),
        helper.make_tensor_value_info("key_cache", tc, ["B", N, C, D]),
        helper.make_tensor_value_info("value_cache", tc, ["B", N, C, D]),
        helper.make_tensor_value_info("past_lens", onnx.TensorProto.INT32, ["B"]),
    ]
    outputs = [
        helper.make_tensor_value_info("output", t, ["B", "S", H * D]),
        helper.make_tensor_value_info("key_cache_out", tc, ["B", N, C, D]),
        helper.make_tensor_value_info("value_cache_out", tc, ["B", N, C, D]),
    ]
    scales = ["key_scale", "value_scale"] if int8 else []
    inputs += [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT16, ["B", N, C]) for name in scales]
    outputs += [helper.make_tensor_value_info(f"{name}_out", onnx.TensorProto.FLOAT16, ["B", N, C]) for name in scales]
    nodes = []
    indices = ""
    if top_k is not None:
        exponent = tm == onnx.TensorProto.INT8  # int8 bounds come with their per-block exponents
        bound_sets = [("block", P, M)] + ([("super", P * superblock_size, -(-M // superblock_size))]
                                          if superblock_size else [])
        for prefix, tokens, count in bound_sets:  # the keys' bounds over blocks, then over superblocks
            names = [f"{prefix}_max", f"{prefix}_min"] + ([f"{prefix}_exponent"] if exponent else [])
            inputs += [helper.make_tensor_value_info(name, tm, ["B", N, count, D]) for name in names[:2]]
            outputs += [helper.make_tensor_value_info(f"{name}_out", tm, ["B", N, count, D]) for name in names[:2]]
            if exponent:
                inputs.append(helper.make_tensor_value_info(names[2], onnx.TensorProto.INT8, ["B", N, count]))
                outputs.append(helper.make_tensor_value_info(f"{names[2]}_out", onnx.TensorProto.INT8, ["B", N, count]))
            nodes.append(helper.make_node("QuestMetadata", ["key", *names[:2], "past_lens"]
                                          + (["", names[2]] if exponent else []), [f"{name}_out" for name in names],
                                          domain=DOMAIN, block_size=tokens,
                                          **({"key_cache_type": "int8"} if int8 else {})))
        select_feeds = dict(query="query", block_max="block_max_out", block_min="block_min_out", past_lens="past_lens")
        hierarchy = {}
        if exponent:
            select_feeds["block_exponent"] = "block_exponent_out"
        if superblock_size:
            select_feeds.update(super_max="super_max_out", super_min="super_min_out",
                                **({"super_exponent": "super_exponent_out"} if exponent else {}))
            hierarchy["superblock_size"] = superblock_size
            if candidate_factor is not None:  # else the op's default
                hierarchy["candidate_factor"] = candidate_factor
        select_inputs = [""] * (max(SPARSE_BLOCK_SELECT.input_index(name) for name in select_feeds) + 1)
        for name, value in select_feeds.items():
            select_inputs[SPARSE_BLOCK_SELECT.input_index(name)] = value
        nodes.append(helper.make_node(
            "SparseBlockSelect", select_inputs, ["block_indices"],
            domain=DOMAIN, num_heads=H, kv_num_heads=N, block_size=P, top_k=top_k, sink_blocks=sink_blocks,
            recent_blocks=recent_blocks, group_reduce=group_reduce, **hierarchy))
        indices = "block_indices"
    attention_inputs = ["query", "key", "value", "key_cache", "value_cache", "past_lens", indices]
    attention_inputs += ["", ""] + scales if int8 else []  # total_lens, exact_lens absent
    while attention_inputs[-1] == "":
        attention_inputs.pop()
    attention_outputs = ["output", "key_cache_out", "value_cache_out"] + (["", "key_scale_out", "value_scale_out"]
                                                                          if int8 else [])
    nodes.append(helper.make_node("SparseBlockAttention", attention_inputs, attention_outputs, domain=DOMAIN,
                                  num_heads=H, kv_num_heads=N, block_size=P))
    graph = helper.make_graph(nodes, "sparse_attention_layer" if top_k else "dense_attention_layer", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, VERSION)],
                             ir_version=IR_VERSION, producer_name="quest_ort")


# Present outputs and the past inputs whose buffers they share in an in-place step.
LAYER_ALIASES = {
    "key_cache_out": "key_cache",
    "value_cache_out": "value_cache",
    "block_max_out": "block_max",
    "block_min_out": "block_min",
    "key_scale_out": "key_scale",
    "value_scale_out": "value_scale",
    "block_exponent_out": "block_exponent",
    "super_max_out": "super_max",
    "super_min_out": "super_min",
    "super_exponent_out": "super_exponent",
}
