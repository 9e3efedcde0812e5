"""Rule: ONNX Runtime GenAI's com.microsoft.GroupQueryAttention -> the Quest operators.

```
query [B,S,H*D] (or packed [B,S,(H+2N)*D]) --Split--> q, k, v
q, k -Reshape[B,S,heads,D]-Transpose--> [B,heads,S,D] -rotary(cos/sin caches at past_lens + i)-->
v    -Reshape-Transpose--> [B,N,S,D]
   --> the layer's Quest nodes (RewriteContext.emit_layer) --> output [B,S,H*D]
```
The GQA's past/present key/value become the in-place caches; seqlens_k and the total length,
computed from the attention mask, become dead code.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from .rope import apply_rotary


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
        layer = self.context.layer_of(node.inputs[3])
        if layer is None:
            return result.fail("the past key is not one of the model's cache inputs")
        attributes = node.attributes
        g = self.context.geometry
        if attributes.get_int("num_heads", 0) != g.num_heads or attributes.get_int("kv_num_heads", 0) != g.kv_num_heads:
            return result.fail(self.context.fail(layer, "num_heads/kv_num_heads differ from the model's"))
        if attributes.get_int("local_window_size", -1) != -1:
            return result.fail(self.context.fail(layer, "sliding-window attention (local_window_size) is not supported"))
        inputs = list(node.inputs) + [None] * (9 - len(node.inputs))
        self._rotary = bool(attributes.get_int("do_rotary", 0))
        if self._rotary and (inputs[7] is None or inputs[8] is None):
            return result.fail(self.context.fail(layer, "do_rotary=1 without cos/sin caches"))
        if self._rotary:
            shape = inputs[7].shape
            if shape is not None and shape.rank() == 2 and isinstance(shape[1], int) and shape[1] * 2 != g.head_dim:
                return result.fail(self.context.fail(layer, "partial rotary (rotary dim < head dim) is not supported"))
        self._node, self._layer, self._inputs = node, layer, inputs
        scale = attributes.get_float("scale", 0.0)
        self._scale = scale if scale else 1.0 / math.sqrt(g.head_dim)
        self._softcap = attributes.get_float("softcap", 0.0)
        self._interleaved = bool(attributes.get_int("rotary_interleaved", 0))
        return result

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
        return output
