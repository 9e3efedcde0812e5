"""The per-layer sparse attention subgraph (docs/ops.md: the three ops in a layer) as a model of its own.

```
key ----------> QuestMetadata(block_max, block_min, past_lens) --> block_max_out, block_min_out
                     |
query --------> SparseBlockSelect(block_max', block_min', past_lens) --> block_indices
                     |
query, key, value --> SparseBlockAttention(key_cache, value_cache, past_lens, block_indices,
                                           [key_scale, value_scale])            (int8 caches)
                          --> output, key_cache_out, value_cache_out, [key_scale_out, value_scale_out]
```
A dense layer is the same graph without the first two nodes and without block_indices. With int8
caches QuestMetadata bounds the keys as the cache stores them (key_cache_type 'int8').
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..ops.schemas import DOMAIN, VERSION
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
) -> onnx.ModelProto:
    """One layer's decode/prefill dataflow; `top_k=None` gives the dense layer. The block bounds are
    `bounds_dtype` (default: the cache's; float16 with int8 caches); int8 bounds come with their
    per-block exponents (block_exponent in, block_exponent_out out)."""
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
        inputs += [helper.make_tensor_value_info(name, tm, ["B", N, M, D]) for name in ("block_max", "block_min")]
        outputs += [helper.make_tensor_value_info(name, tm, ["B", N, M, D]) for name in ("block_max_out", "block_min_out")]
        exponent = tm == onnx.TensorProto.INT8
        if exponent:
            inputs.append(helper.make_tensor_value_info("block_exponent", onnx.TensorProto.INT8, ["B", N, M]))
            outputs.append(helper.make_tensor_value_info("block_exponent_out", onnx.TensorProto.INT8, ["B", N, M]))
        nodes.append(helper.make_node("QuestMetadata", ["key", "block_max", "block_min", "past_lens"]
                                      + (["", "block_exponent"] if exponent else []),
                                      ["block_max_out", "block_min_out"] + (["block_exponent_out"] if exponent else []),
                                      domain=DOMAIN, block_size=P, **({"key_cache_type": "int8"} if int8 else {})))
        select_inputs = ["query", "block_max_out", "block_min_out", "past_lens"]
        select_inputs += ["", "", "", "", "", "block_exponent_out"] if exponent else []
        nodes.append(helper.make_node(
            "SparseBlockSelect", select_inputs, ["block_indices"],
            domain=DOMAIN, num_heads=H, kv_num_heads=N, block_size=P, top_k=top_k, sink_blocks=sink_blocks,
            recent_blocks=recent_blocks, group_reduce=group_reduce))
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
}
