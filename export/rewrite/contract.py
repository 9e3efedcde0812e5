"""What a rule does with every input, output and attribute of the node it replaces: carried over into
the Quest ops, or refused with a message naming the node, the input or attribute and its value.

Each rule lists the replaced op's whole spec (inputs in order, outputs, every attribute with its
default), so an input, output or attribute that the spec grows later, or that a graph sets outside
the spec, is refused rather than dropped.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import onnx_ir as ir

# An attribute's rule: its value (the default when absent) -> why it is refused, or None.
AttributeRule = Callable[[object], "str | None"]


def only(*allowed, why: str) -> AttributeRule:
    """Accept exactly the `allowed` values."""
    return lambda value: None if value in allowed else why


def absent(why: str) -> AttributeRule:
    """Accept the attribute only when the node does not set it."""
    return lambda value: None if value is None else why


def finite_at_least(minimum: float, why: str, exclusive: bool = False) -> AttributeRule:
    """Accept an unset attribute, or a finite value >= minimum (> with `exclusive`)."""
    def rule(value):
        if value is None:
            return None
        if not math.isfinite(value) or value < minimum or (exclusive and value == minimum):
            return why
        return None
    return rule


MODELLED = None  # an attribute carried over (or irrelevant) whatever its value


@dataclasses.dataclass(frozen=True)
class NodeContract:
    op: str
    spec: str  # which spec the lists follow, for the messages
    inputs: tuple[str, ...]  # every input of the spec, in order
    outputs: tuple[str, ...]
    refused_inputs: dict[str, str]  # input name -> why a graph that gives it is refused
    refused_outputs: dict[str, str]  # output name -> why a graph that reads it is refused
    attributes: dict[str, tuple[object, AttributeRule | None]]  # every attribute -> (default, rule)

    def value(self, node: ir.Node, name: str):
        attribute = node.attributes.get(name)
        return self.attributes[name][0] if attribute is None else attribute.value

    def problem(self, node: ir.Node) -> str | None:
        """Why `node` is refused, naming the input, output or attribute and its value; None if accepted."""
        where = f"{node.op_type} {node.name!r}"
        for index, value in enumerate(node.inputs):
            if value is None:
                continue
            if index >= len(self.inputs):
                return (f"{where}: input {index} ({value.name!r}) is past the {len(self.inputs)} inputs of "
                        f"{self.spec}")
            name = self.inputs[index]
            if name in self.refused_inputs:
                return f"{where}: input {index} {name!r} is given ({value.name!r}): {self.refused_inputs[name]}"
        for index, value in enumerate(node.outputs):
            read = bool(value.uses()) or value.is_graph_output()
            if not read:
                continue
            if index >= len(self.outputs):
                return f"{where}: output {index} ({value.name!r}) is past the {len(self.outputs)} outputs of {self.spec}"
            name = self.outputs[index]
            if name in self.refused_outputs:
                return f"{where}: output {index} {name!r} is read ({value.name!r}): {self.refused_outputs[name]}"
        for name, attribute in node.attributes.items():
            if name not in self.attributes:
                return f"{where}: attribute {name!r} = {attribute.value!r} is not in {self.spec}"
        for name, (default, rule) in self.attributes.items():
            if rule is None:
                continue
            value = self.value(node, name)
            why = rule(value)
            if why:
                shown = "unset" if value is None else repr(value)
                return f"{where}: attribute {name!r} = {shown}: {why}"
        return None
