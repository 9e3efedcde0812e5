"""Determinism through ONNX Runtime: repeated runs and different thread counts give identical bits.

(Across instruction sets the kernel driver test compares every variant with the scalar kernel.)
"""

from __future__ import annotations

import pytest

from cases import CASES, OP_ARGUMENTS, make_data
from quest_ort.runtime.single_op import run_op
from tolerances import assert_equal

# The cases with the most (batch, KV head) work items, where threads split the work differently.
BUSY = sorted(CASES, key=lambda c: -c.batch * c.heads[1] * c.new_tokens)[:4]
OUTPUTS = {
    "QuestMetadata": None,
    "SparseBlockSelect": None,
    "SparseBlockAttention": ("output", "key_cache_out", "value_cache_out", "block_importance"),
}


@pytest.mark.parametrize("op_name", list(OUTPUTS))
@pytest.mark.parametrize("case", BUSY, ids=lambda case: case.id)
def test_same_bits_for_any_thread_count_and_run(case, op_name):
    inputs, attributes = OP_ARGUMENTS[op_name](make_data(case))
    first = run_op(op_name, inputs, attributes, outputs=OUTPUTS[op_name], threads=1)
    for threads in (1, 2, 3):
        again = run_op(op_name, inputs, attributes, outputs=OUTPUTS[op_name], threads=threads)
        for name, value in first.items():
            assert_equal(again[name], value, f"{name} with {threads} threads")
