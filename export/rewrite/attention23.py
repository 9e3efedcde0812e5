"""Rule: ONNX Attention (opset 23, torch.onnx dynamo export) with repeated K/V -> the Quest ops.

```
past_key (input) -Concat(axis=2)--> present_key (output) -[Unsqueeze, Expand, Reshape]--> K (H heads)
k_rot -----------'
Q [B,H,S,D] -Attention(K, V, mask)-Transpose(0,2,1,3)-Reshape--> o_proj input
```
becomes the layer's Quest nodes fed with Q, k_rot and v (the un-repeated new tokens); Quest's
output [B,S,H*D] replaces the Reshape. The mask (causal from positions) becomes dead code.
"""

from __future__ import annotations

import math

from onnxscript.rewriter import pattern

from .layers import _concat_of_past


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
        if len(node.inputs) > 4 and any(x is not None for x in node.inputs[4:]):
            return result.fail(self.context.fail(layer, "Attention with its own past_key/past_value inputs"))
        if q.shape is not None and q.shape.rank() != 4:
            return result.fail(self.context.fail(layer, "Attention with 3-D (packed-head) inputs"))
        g = self.context.geometry
        scale = node.attributes.get_float("scale", 0.0)
        self._scale = scale if scale else 1.0 / math.sqrt(g.head_dim)
        self._softcap = node.attributes.get_float("softcap", 0.0)
        key_concat, value_concat = key_pair[1].producer(), value_pair[1].producer()
        self._layer = layer
        self._operands = (key_concat.inputs[1], value_concat.inputs[1], key_pair[0], value_pair[0],
                          key_pair[1], value_pair[1])
        return result

    def rewrite(self, op, q, **_):
        k, v, past_key, past_value, present_key, present_value = self._operands
        output, key_out, value_out = self.context.emit_layer(
            op, self._layer, self.name, q, k, v, past_key, past_value, self._scale, softcap=self._softcap)
        self.context.replaced_presents[self._layer] = ((present_key, key_out), (present_value, value_out))
        return output
