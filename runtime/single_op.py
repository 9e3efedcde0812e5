"""Run one Quest op in ONNX Runtime, natively or through its standard-op function body."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..graphs.op_graphs import op_model
from .sessions import make_session


def run_op(op_name: str, inputs: Mapping[str, np.ndarray | None], attributes: Mapping[str, object], *,
           native: bool = True, threads: int | None = 1, **graph_options) -> dict[str, np.ndarray]:
    """Outputs of one `op_name` node by name: the native kernel, or the function body when not native.

    `graph_options` are op_model's (graphs/op_graphs.py): `outputs` to produce, and
    `symbolic_dims=False` for graph inputs of the arrays' own shapes, so that a wrongly shaped
    input reaches the op itself instead of being stopped by ONNX Runtime's input check.
    """
    model = op_model(op_name, inputs, attributes, **graph_options)
    if not native:
        from ..graphs.functions import expand_quest_ops

        model = expand_quest_ops(model)
    session = make_session(model, threads=threads, register_library=native)
    feeds = {name: array for name, array in inputs.items() if array is not None}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))
