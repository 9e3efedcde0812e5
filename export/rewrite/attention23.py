"""Rule: ONNX Attention (opset 23, torch.onnx dynamo export) with repeated K/V -> the Quest ops.

```
past_key (input) -Concat(axis=2)--> present_key (output) -[Unsqueeze, Expand, Reshape]--> K (H heads)
k_rot -----------'
Q [B,H,S,D] -Attention(K, V, mask)-Transpose(0,2,1,3)-Reshape--> o_proj input
```
becomes the layer's Quest nodes fed with Q, k_rot and v (the un-repeated new tokens); Quest's
output [B,S,H*D] replaces the Reshape. The mask becomes dead code once the probe has shown it is
the causal mask. Every other input and attribute of Attention (ONNX opset 23; opset 24's
nonpad_kv_seqlen too) is carried over (scale, softcap) or refused: `CONTRACT`.
"""

from __future__ import annotations

import math

from onnxscript.rewriter import pattern

from .contract import NodeContract, absent, finite_at_least, only
from .layers import _concat_of_past, repeat_kv_problem

_OWN_CACHE = "the node's own KV cache; this rule rewrites caches concatenated in the graph (Concat(past, new))"

CONTRACT = NodeContract(
    op="Attention",
    spec="ONNX Attention (opset 23, and 24's nonpad_kv_seqlen)",
    inputs=("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"),
    outputs=("Y", "present_key", "present_value", "qk_matmul_output"),
    refused_inputs={
        "past_key": _OWN_CACHE,
        "past_value": _OWN_CACHE,
        "nonpad_kv_seqlen": "per-row valid key counts; the Quest model takes them from total_lens, and this rule "
                            "does not map one onto the other",
    },
    refused_outputs={
        "present_key": _OWN_CACHE,
        "present_value": _OWN_CACHE,
        "qk_matmul_output": "the QK matrix, which the Quest ops do not output",
    },
    attributes={
        # With the cache concatenated outside the node the op sees no past, so is_causal=1 aligns to
        # the top left: a decode step's query would attend to the first key only.
        "is_causal": (0, only(0, why="causal masking without the node's own past aligns to the top left (a "
                                     "decode step's query sees only the first key); the rule takes causal "
                                     "attention from attn_mask")),
        "scale": (None, finite_at_least(0.0, "must be finite and > 0 (ONNX Runtime refuses 0)", exclusive=True)),
        "softcap": (0.0, finite_at_least(0.0, "SparseBlockAttention's softcap must be finite and >= 0")),
        "qk_matmul_output_mode": (0, only(0, why="a qk_matmul_output mode, which the Quest ops do not output")),
        "softmax_precision": (None, only(None, 1, why="the Quest ops compute the softmax in float32 "
                                                      "(softmax_precision 1)")),
        # The spec has them "used with 3D inputs" (heads packed in the hidden size); the rule takes
        # 4-D heads, whose count the shapes give.
        "q_num_heads": (None, absent("head counts of 3-D inputs; this rule takes 4-D [B, heads, S, D] inputs")),
        "kv_num_heads": (None, absent("head counts of 3-D inputs; this rule takes 4-D [B, heads, S, D] inputs")),
    },
)


class OnnxAttention(pattern.RewriteRuleClassBase):
    def __init__(self, context):
        super().__init__("OnnxAttention23", remove_nodes=False)
        self.context = context

    def pattern(self, op, q, keys, values):
        attended = op.Attention(q, keys, values, _allow_other_inputs=True, _allow_other_attributes=True,
                                _outputs=["attended"])
        return op.Reshape(op.Transpose(attended, perm=[0, 2, 1, 3]), _allow_other_inputs=True)

    def check(self, op, q, keys, values, attended, **_):
        result = pattern.MatchResult()
        node = attended.producer()
        key_pair, value_pair = _concat_of_past(keys), _concat_of_past(values)
        if key_pair is None or value_pair is None:
            return result.fail("Attention's K/V are not (repeated) Concat(past, new)")
        layer = self.context.layer_of(key_pair[0])
        if layer is None:
            return result.fail("the past key is not one of the model's cache inputs")
        problem = self._problem(node, q, keys, values, key_pair, value_pair)
        if problem:
            return result.fail(self.context.fail(layer, problem))
        g = self.context.geometry
        scale = CONTRACT.value(node, "scale")
        self._scale = scale if scale is not None else 1.0 / math.sqrt(g.head_dim)
        self._softcap = CONTRACT.value(node, "softcap")
        key_concat, value_concat = key_pair[1].producer(), value_pair[1].producer()
        self._layer = layer
        self._operands = (key_concat.inputs[1], value_concat.inputs[1], key_pair[0], value_pair[0],
                          key_pair[1], value_pair[1])
        return result

    def _problem(self, node, q, keys, values, key_pair, value_pair) -> str | None:
        """Why this node is refused: the contract, then the conditions on what it models (4-D heads,
        this layer's value cache, the repeat of K/V, a causal attn_mask)."""
        problem = CONTRACT.problem(node)
        if problem:
            return problem
        where = f"Attention {node.name!r}"
        context = self.context
        # The pattern's Transpose(perm=[0, 2, 1, 3]) of the output already needs 4-D heads.
        if q.shape is not None and q.shape.rank() != 4:
            return f"{where}: input 'Q' has shape {q.shape}; the rule takes 4-D [B, H, S, D] heads (3-D packed heads are refused)"
        if context.layer_of(value_pair[0]) != context.layer_of(key_pair[0]):
            return f"{where}: input 'V' reads {value_pair[0].name!r}, not this layer's value cache"
        for role, value, pair in (("K", keys, key_pair), ("V", values, value_pair)):
            problem = repeat_kv_problem(value, pair[1])
            if problem:
                return f"{where}: input {role!r}: {problem}"
        mask = node.inputs[3] if len(node.inputs) > 3 else None
        if mask is None:
            return f"{where}: no input 'attn_mask' and attribute 'is_causal' = 0: every query would see every key"
        return context.probe.mask_problem(mask, f"{where}: input 'attn_mask' ({mask.name!r})")

    def rewrite(self, op, q, **_):
        k, v, past_key, past_value, present_key, present_value = self._operands
        output, key_out, value_out = self.context.emit_layer(
            op, self._layer, self.name, q, k, v, past_key, past_value, self._scale, softcap=self._softcap)
        self.context.replaced_presents[self._layer] = ((present_key, key_out), (present_value, value_out))
        return output
