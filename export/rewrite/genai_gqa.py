"""Rule: ONNX Runtime GenAI's com.microsoft.GroupQueryAttention -> the Quest operators.

```
query [B,S,H*D] (or packed [B,S,(H+2N)*D]) --Split--> q, k, v
q, k -Reshape[B,S,heads,D]-Transpose--> [B,heads,S,D] -rotary(cos/sin caches at past_lens + i)-->
v    -Reshape-Transpose--> [B,N,S,D]
   --> the layer's Quest nodes (RewriteContext.emit_layer) --> output [B,S,H*D]
```
The GQA's past/present key/value become the in-place caches; seqlens_k and the total length,
computed from the attention mask, become dead code once the probe has shown they are the lengths
the Quest ops take from past_lens and total_lens. Every other input and attribute of the op (ORT
1.32's contrib spec) is carried over (scale, softcap, rotary) or refused: `CONTRACT`.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from .contract import MODELLED, NodeContract, absent, finite_at_least, only
from .rope import apply_rotary

_QUANTIZED = "a quantized KV cache, which the Quest caches do not hold"
_NORM = "a per-head RMS norm of Q and K fused into the op, which this rule does not carry over"

CONTRACT = NodeContract(
    op="GroupQueryAttention",
    spec="com.microsoft.GroupQueryAttention (ONNX Runtime 1.32 contrib ops)",
    inputs=("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
            "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
            "k_norm_weight", "query_seqlens"),
    outputs=("output", "present_key", "present_value", "output_qk"),
    refused_inputs={
        "attention_bias": "an additive bias on the attention logits, which SparseBlockAttention does not add",
        "head_sink": "per-head attention sinks added to the softmax denominator, which SparseBlockAttention "
                     "does not model",
        "k_scale": _QUANTIZED,
        "v_scale": _QUANTIZED,
        "q_norm_weight": _NORM,
        "k_norm_weight": _NORM,
        "query_seqlens": "per-row query lengths of right-padded chunks; the Quest model takes them from "
                         "total_lens, and this rule does not map one onto the other",
    },
    refused_outputs={"output_qk": "the QK matrix, which the Quest ops do not output"},
    attributes={
        "num_heads": (None, MODELLED),  # compared with the model's geometry by the rule
        "kv_num_heads": (None, MODELLED),
        "scale": (None, finite_at_least(0.0, "SparseBlockAttention's scale must be finite and >= 0 (0 means "
                                             "1/sqrt(head_size), as here)")),
        "softcap": (None, finite_at_least(0.0, "SparseBlockAttention's softcap must be finite and >= 0")),
        "do_rotary": (0, only(0, 1, why="expected 0 or 1")),
        "rotary_interleaved": (0, only(0, 1, why="expected 0 or 1")),
        "local_window_size": (-1, only(-1, why="sliding-window attention: a Quest query attends to every "
                                              "block it selects, not to a window")),
        "sliding_window_cache": (0, only(0, why="a window-sized cache that evicts old tokens; the Quest "
                                               "caches keep every token")),
        "smooth_softmax": (-1, only(-1, 0, why="smooth softmax adds one to the softmax denominator (an "
                                              "attention sink), which SparseBlockAttention does not")),
        "causal": (1, only(1, why="bidirectional attention; the Quest ops are causal")),
        "qk_output": (0, only(0, why="the op would output its QK matrix, which the Quest ops do not")),
        "k_quant_type": ("NONE", only("NONE", why=_QUANTIZED)),
        "v_quant_type": ("NONE", only("NONE", why=_QUANTIZED)),
        "kv_cache_bit_width": (None, absent(_QUANTIZED)),
        # Used only with q_norm_weight / k_norm_weight, which are refused.
        "qk_norm_epsilon": (1e-6, MODELLED),
        "q_norm_epsilon": (None, MODELLED),
        "k_norm_epsilon": (None, MODELLED),
    },
)


def _ints(op, *values):
    return op.Constant(value=ir.tensor(np.asarray(values, dtype=np.int64)))


class GenaiGroupQueryAttention(pattern.RewriteRuleClassBase):
    def __init__(self, context):
        super().__init__("GenaiGroupQueryAttention", remove_nodes=False)
        self.context = context

    def pattern(self, op, query):
        return op.GroupQueryAttention(query, _domain="com.microsoft", _allow_other_inputs=True,
                                      _allow_other_attributes=True, _outputs=["output", "present_key", "present_value"])[0]

    def check(self, op, query, output, **_):
        result = pattern.MatchResult()
        node = output.producer()
        layer = self.context.layer_of(node.inputs[3] if len(node.inputs) > 3 else None)
        if layer is None:
            return result.fail("the past key is not one of the model's cache inputs")
        problem = self._problem(node)
        if problem:
            return result.fail(self.context.fail(layer, problem))
        self._node, self._layer = node, layer
        self._inputs = list(node.inputs) + [None] * (len(CONTRACT.inputs) - len(node.inputs))
        scale = CONTRACT.value(node, "scale") or 0.0
        self._scale = scale if scale else 1.0 / math.sqrt(self.context.geometry.head_dim)
        self._softcap = CONTRACT.value(node, "softcap") or 0.0
        self._rotary = bool(CONTRACT.value(node, "do_rotary"))
        self._interleaved = bool(CONTRACT.value(node, "rotary_interleaved"))
        return result

    def _problem(self, node) -> str | None:
        """Why this node is refused: the contract, then what the contract marks modelled but only
        under conditions (head counts, lengths, positions, rotary caches)."""
        problem = CONTRACT.problem(node)
        if problem:
            return problem
        where = f"GroupQueryAttention {node.name!r}"
        g, context = self.context.geometry, self.context
        for name, expected in (("num_heads", g.num_heads), ("kv_num_heads", g.kv_num_heads)):
            if CONTRACT.value(node, name) != expected:
                return f"{where}: attribute {name!r} = {CONTRACT.value(node, name)!r}, the model has {expected}"
        inputs = list(node.inputs) + [None] * (len(CONTRACT.inputs) - len(node.inputs))
        if (inputs[1] is None) != (inputs[2] is None):
            return f"{where}: input 'key' and 'value' must be both given or both packed into 'query'"
        if context.layer_of(inputs[4]) != context.layer_of(inputs[3]):
            return f"{where}: input 'past_value' ({getattr(inputs[4], 'name', None)!r}) is not this layer's cache"
        for index in (3, 4):
            dtype = inputs[index].dtype
            if dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
                return f"{where}: input {CONTRACT.inputs[index]!r} has element type {dtype}: {_QUANTIZED}"
        if inputs[5] is None or inputs[6] is None:
            return f"{where}: input 'seqlens_k' or 'total_sequence_length' is missing"
        probe = context.probe
        problem = probe.equals_problem(inputs[5], f"{where}: input 'seqlens_k' ({inputs[5].name!r})",
                                       lambda past, new: np.array([past + new - 1]), "total_lens - 1")
        problem = problem or probe.equals_problem(
            inputs[6], f"{where}: input 'total_sequence_length' ({inputs[6].name!r})",
            lambda past, new: np.array(past + new), "max(total_lens)")
        if problem:
            return problem
        if inputs[9] is not None and inputs[9] is not context.positions:
            problem = probe.equals_problem(inputs[9], f"{where}: input 'position_ids' ({inputs[9].name!r})",
                                           lambda past, new: past + np.arange(new)[None], "past_lens + i")
            if problem:
                return problem
        if CONTRACT.value(node, "do_rotary"):
            if inputs[7] is None or inputs[8] is None:
                return f"{where}: attribute 'do_rotary' = 1 without input 'cos_cache' and 'sin_cache'"
            for index in (7, 8):
                shape = inputs[index].shape
                if shape is None or shape.rank() != 2 or shape[1] != g.head_dim // 2 or g.head_dim % 2:
                    return (f"{where}: input {CONTRACT.inputs[index]!r} has shape {shape}; the rotary must "
                            f"cover the whole head, [max_positions, {g.head_dim // 2}] (partial rotary is refused)")
                # GQA reads the angles of positions up to the context; the rewrite gathers rows
                # past_lens + i, so every position the capacity holds needs its row.
                if not isinstance(shape[0], int) or shape[0] < probe.capacity:
                    return (f"{where}: input {CONTRACT.inputs[index]!r} holds the angles of {shape[0]} positions, "
                            f"fewer than the capacity of {probe.capacity} tokens (export with a capacity of at "
                            f"most {shape[0]})")
        return None

    def rewrite(self, op, query, **_):
        g = self.context.geometry
        H, N, D = g.num_heads, g.kv_num_heads, g.head_dim
        inputs = self._inputs
        if inputs[1] is None:  # packed q, k, v
            q, k, v = op.Split(query, _ints(op, H * D, N * D, N * D), axis=-1, _outputs=3)
        else:
            q, k, v = query, inputs[1], inputs[2]

        def heads(x, count):
            return op.Transpose(op.Reshape(x, _ints(op, 0, 0, count, D)), perm=[0, 2, 1, 3])

        q, k, v = heads(q, H), heads(k, N), heads(v, N)
        if self._rotary:
            positions = self.context.positions
            q = apply_rotary(op, q, inputs[7], inputs[8], positions, D, self._interleaved)
            k = apply_rotary(op, k, inputs[7], inputs[8], positions, D, self._interleaved)
        output, key_out, value_out = self.context.emit_layer(
            op, self._layer, self.name, q, k, v, inputs[3], inputs[4], self._scale, softcap=self._softcap)
        node = self._node
        self.context.replaced_presents[self._layer] = ((node.outputs[1], key_out), (node.outputs[2], value_out))
        # The new caches are graph outputs at once, not after the rewriter's pass: its dead-code
        # removal would drop the layer's new nodes where the attention output reaches no graph
        # output, yet the caches it writes are outputs all the same.
        outputs = self.context.graph.outputs
        for old, new in ((node.outputs[1], key_out), (node.outputs[2], value_out)):
            if old.is_graph_output():
                outputs[list(outputs).index(old)] = new
        return output
