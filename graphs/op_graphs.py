"""Single-node models of the Quest ops, as the conformance tests, the demo and benchmarks run them."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper

from ..ops.schemas import DOMAIN, OPS_BY_NAME, VERSION

OPSET = 18  # the standard opset of our graphs and function bodies (optimum exports at 18)
IR_VERSION = 9

def elem_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def op_model(
    op_name: str,
    inputs: Mapping[str, np.ndarray | None],
    attributes: Mapping[str, object],
    *,
    outputs: tuple[str, ...] | None = None,
    symbolic_dims: bool = True,
) -> onnx.ModelProto:
    """A model with one `op_name` node whose graph inputs are the given (non-None) arrays.

    Graph inputs and outputs carry the op's own names. `outputs` picks which outputs to produce
    (default: every required one). With `symbolic_dims` the input dims are the schema's symbols,
    so one session serves any shape.
    """
    spec = OPS_BY_NAME[op_name]
    unknown = set(inputs) - {t.name for t in spec.inputs}
    if unknown:
        raise ValueError(f"{op_name} has no inputs {sorted(unknown)}")
    node_inputs, graph_inputs, type_vars = [], [], {}
    for tensor in spec.inputs:
        array = inputs.get(tensor.name)
        if array is None:
            node_inputs.append("")
            continue
        node_inputs.append(tensor.name)
        dtype = np.dtype(array.dtype)
        type_vars.setdefault(tensor.elem, dtype)
        shape = list(tensor.dims) if symbolic_dims else list(array.shape)
        graph_inputs.append(helper.make_tensor_value_info(tensor.name, elem_type(dtype), shape))
    while node_inputs and node_inputs[-1] == "":
        node_inputs.pop()
    given = {name for name, array in inputs.items() if array is not None}
    wanted = outputs if outputs is not None else tuple(
        t.name for t in spec.outputs if not t.optional or t.name.removesuffix("_out") in given)
    node_outputs, graph_outputs = [], []
    for tensor in spec.outputs:
        if tensor.name not in wanted:
            node_outputs.append("")
            continue
        node_outputs.append(tensor.name)
        dtype = type_vars.get(tensor.elem, np.dtype(tensor.elem) if tensor.elem in ("int32", "int8", "float32", "float16") else None)
        graph_outputs.append(helper.make_tensor_value_info(tensor.name, elem_type(dtype), list(tensor.dims)))
    while node_outputs and node_outputs[-1] == "":
        node_outputs.pop()
    node = helper.make_node(op_name, node_inputs, node_outputs, domain=DOMAIN, name=op_name, **dict(attributes))
    graph = helper.make_graph([node], f"{op_name}_graph", graph_inputs, graph_outputs)
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, VERSION)],
        ir_version=IR_VERSION,
        producer_name="quest_ort",
    )
