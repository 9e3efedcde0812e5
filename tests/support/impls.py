"""Run an op through any of its three implementations: NumPy reference, native kernel, function body."""

from __future__ import annotations

import pytest

from quest_ort.ops.reference import REFERENCES
from quest_ort.ops.schemas import OPS_BY_NAME
from quest_ort.runtime.single_op import run_op

IMPLEMENTATIONS = ("reference", "kernel", "body")
EACH_IMPLEMENTATION = pytest.mark.parametrize("impl", IMPLEMENTATIONS)


def run(impl: str, op_name: str, inputs: dict, attributes: dict, outputs: tuple[str, ...] | None = None) -> dict:
    """Outputs by name. The reference returns every output; the ORT paths return those asked for."""
    if impl == "reference":
        result = REFERENCES[op_name](**{k: v for k, v in inputs.items() if v is not None}, **attributes)
        result = result if isinstance(result, tuple) else (result,)
        return {t.name: r for t, r in zip(OPS_BY_NAME[op_name].outputs, result)}
    return run_op(op_name, inputs, attributes, outputs=outputs, native=impl == "kernel")
