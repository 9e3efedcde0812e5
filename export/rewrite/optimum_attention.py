"""Rule: optimum's decomposed attention (TorchScript export, opset 18) -> the Quest operators.

Matched per layer, from the rotated query and the present key/value to the o_proj input (the
Concat(past, new) producing each present output is checked, not matched: it is a graph output):
```
past_key_values.l.key ---Concat(axis=-2)--> present.l.key --[Unsqueeze, Expand, Reshape]--> K'
k_rot ------------------'                                     (repeat_kv, absent when G = 1)
past_key_values.l.value -Concat(axis=-2)--> present.l.value --[Unsqueeze, Expand, Reshape]--> V'
q_rot -Mul(s1)--.
K' -Transpose(0,1,3,2)-Mul(s2)-MatMul-Add(mask)-Softmax-Where(IsNaN, 0, .)-MatMul(V')
   -Transpose(0,2,1,3)-Reshape--> o_proj input
```
becomes the layer's Quest nodes with scale s1 * s2 (RewriteContext.emit_layer), once the check has
shown that the mask is the causal mask (evaluated by the probe: a sliding window or a bias is
refused), that s1 * s2 is a positive scale and that the heads repeat as repeat_kv repeats them.

What produces q_rot, k_rot and v stays as exported and is read, not matched: the projections
with their biases (Qwen2's q/k/v Adds, before RoPE), Qwen3's q/k norms and the RoPE itself, so one
rule serves the Llama, Qwen2 and Qwen3 families.
"""

from __future__ import annotations

import numpy as np
from onnxscript.rewriter import pattern

from .layers import repeat_kv_problem


def _repeat_kv(op, x):
    expanded = op.Expand(op.Unsqueeze(x, _allow_other_inputs=True), _allow_other_inputs=True)
    return pattern.OrValue([op.Reshape(expanded, _allow_other_inputs=True), x])


def _scalar(value) -> float | None:
    if value is None or value.const_value is None:
        return None
    array = value.const_value.numpy()
    return float(array.reshape(-1)[0]) if array.size == 1 else None


class OptimumAttention(pattern.RewriteRuleClassBase):
    def __init__(self, context):
        # remove_nodes=False: the export's mask slicing reads shapes of intermediate values; the
        # replaced nodes become dead once the output is rewired and are removed afterwards.
        super().__init__("OptimumAttention", remove_nodes=False)
        self.context = context

    def pattern(self, op, q, present_key, present_value, mask, s1, s2, zero):
        keys = _repeat_kv(op, present_key)
        values = _repeat_kv(op, present_value)
        keys_t = op.Transpose(keys, perm=[0, 1, 3, 2], _outputs=["keys_t"])
        scores = op.MatMul(op.Mul(q, s1), op.Mul(keys_t, s2))
        probabilities = op.Softmax(op.Add(scores, mask), axis=-1)
        probabilities = op.Where(op.IsNaN(probabilities), zero, probabilities)
        attended = op.MatMul(probabilities, values, _outputs=["attended"])
        return op.Reshape(op.Transpose(attended, perm=[0, 2, 1, 3]), _allow_other_inputs=True)

    def check(self, op, q, present_key, present_value, mask, s1, s2, zero, keys_t, attended, **_):
        result = pattern.MatchResult()
        # The present key/value are graph outputs, so they stay outside the pattern: check that each
        # is Concat(past_key_values.l.<key|value>, new tokens, axis=-2).
        concats = [value.producer() for value in (present_key, present_value)]
        if any(node is None or node.op_type != "Concat" or len(node.inputs) != 2 for node in concats):
            return result.fail("the keys/values attended are not Concat(past, new) outputs")
        if any(node.attributes.get_int("axis", 0) not in (-2, 2) for node in concats):
            return result.fail("the past/new Concat is not along the sequence axis")
        (past_key, k), (past_value, v) = (node.inputs for node in concats)
        layer = self.context.layer_of(past_key)
        if layer is None:
            return result.fail(f"the key concat's past input {past_key.name!r} is not a cache input")
        if self.context.layer_of(past_value) != layer:
            return result.fail(self.context.fail(layer, f"the value concat reads {past_value.name!r}"))
        scales = _scalar(s1), _scalar(s2)
        if None in scales:
            return result.fail(self.context.fail(layer, "the logit scale factors are not scalar constants"))
        if _scalar(zero) != 0.0:
            return result.fail(self.context.fail(layer, "the NaN guard does not replace NaN with 0"))
        scale = float(np.float32(scales[0]) * np.float32(scales[1]))
        if not np.isfinite(scale) or scale <= 0:
            return result.fail(self.context.fail(
                layer, f"the logit scale s1 * s2 = {scales[0]:g} * {scales[1]:g} is not a finite positive number "
                "(SparseBlockAttention reads a scale of 0 as 1/sqrt(D))"))
        for role, repeated, present in (("keys", keys_t.producer().inputs[0], present_key),
                                        ("values", attended.producer().inputs[1], present_value)):
            problem = repeat_kv_problem(repeated, present)
            if problem:
                return result.fail(self.context.fail(layer, f"the attended {role}: {problem}"))
        problem = self.context.probe.mask_problem(mask, f"the attention mask ({mask.name!r})")
        if problem:
            return result.fail(self.context.fail(layer, problem))
        self._layer, self._scale = layer, scale
        self._operands = (k, v, past_key, past_value, present_key, present_value)
        return result

    def rewrite(self, op, q, **_):
        k, v, past_key, past_value, present_key, present_value = self._operands
        output, key_out, value_out = self.context.emit_layer(
            op, self._layer, self.name, q, k, v, past_key, past_value, self._scale)
        # The old present outputs (Concat) are replaced by the in-place caches in the I/O pass.
        self.context.replaced_presents[self._layer] = ((present_key, key_out), (present_value, value_out))
        return output
