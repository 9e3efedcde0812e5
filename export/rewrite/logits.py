"""The `logits_keep` input: a step computes the language-model head for its last positions only.

A prompt step of S tokens needs one row of logits per prompt, yet the source graph computes all S:
at S = 512 and a 151936-word vocabulary that is 311 MB of logits and a head MatMul of 80 G
multiply-adds that nobody reads. The rewrite slices the head's input to the step's last
`logits_keep` positions (0: every position, the source's behaviour, as Hugging Face's
`logits_to_keep`); each row of the head's output depends on its own input row only, so the kept
logits are the full logits' last rows.

pattern: the graph output `logits` [B, S, V] <- Cast* <- MatMul(hidden [B, S, H], W [H, V])
                                                    or MatMulNBits(hidden, ...) (com.microsoft)
check:   the output is rank 3, the chain holds nothing but Casts, nothing else reads the head's
         output or the chain's values (they would see only the kept rows), the head's weight is 2-D
rewrite: hidden -Slice(starts = -logits_keep, ends = max, axes = [1])- head -> logits [B, n, V]
         (logits_keep [1] int64: a 1-D input, as Slice takes its starts)
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .context import input_value

INT64_MAX = np.iinfo(np.int64).max


def _head_of_logits(graph: ir.Graph) -> tuple[ir.Node | None, str]:
    """The node whose input rows become the logits' rows (pattern and check), or None and why not."""
    logits = next((v for v in graph.outputs if v.name == "logits"), None)
    if logits is None:
        return None, "the graph has no logits output"
    if logits.shape is None or len(logits.shape) != 3:
        return None, f"the logits output has shape {logits.shape}, expected [B, S, vocab]"
    if logits.uses():
        return None, "the logits also feed nodes of the graph, which would see only the kept rows"
    value = logits
    while True:
        node = value.producer()
        if node is None:
            return None, "the logits are a graph input or an initializer"
        if value is not logits and (len(value.uses()) != 1 or value.is_graph_output()):
            return None, f"{value.name!r} between the head and the logits has other readers"
        if node.op_type == "Cast" and node.domain == "":
            value = node.inputs[0]
            continue
        if node.op_type == "MatMul" and node.domain == "":
            weight = node.inputs[1]
            if weight.shape is None or len(weight.shape) != 2:
                return None, f"the head MatMul {node.name!r} has a weight of shape {weight.shape}, expected [H, V]"
            return node, ""
        if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
            return node, ""  # rank of Y = rank of A; B is always its [N, blocks, bytes] weights
        return None, f"the logits come from {node.op_type} {node.name!r}, not from the head's MatMul (through Casts)"


def keep_last_logits(graph: ir.Graph) -> tuple[ir.Value | None, str]:
    """Add the slice before the language-model head; returns the new `logits_keep` input (not yet
    among the graph's inputs) or None and the reason the graph does not take it.

    ```
    logits_keep [1] -Neg--------.
    hidden ----------------Slice(., starts, [INT64_MAX], axes [1])- head -Cast*- logits [B, n, V]
    ```
    """
    head, reason = _head_of_logits(graph)
    if head is None:
        return None, reason
    keep = input_value("logits_keep", ir.DataType.INT64, [1])
    nodes: list[ir.Node] = []

    def add(op_type, inputs, **attributes):
        nodes.append(ir.node(op_type, inputs, attributes=attributes))
        return nodes[-1].outputs[0]

    def const(values):
        return add("Constant", [], value=ir.tensor(np.asarray(values, np.int64)))

    starts = add("Neg", [keep])
    hidden = head.inputs[0]
    kept = add("Slice", [hidden, starts, const([INT64_MAX]), const([1])])
    kept.name = "quest_logits_rows"
    graph.extend(nodes)
    head.replace_input_with(0, kept)
    logits = next(v for v in graph.outputs if v.name == "logits")
    logits.shape = ir.Shape([logits.shape[0], "logits_length", logits.shape[2]])
    return keep, ""
