"""Determinism through ONNX Runtime: repeated runs, thread counts and kernel variants (QUEST_ORT_ISA,
one process per variant) give identical bits, ties and zero-filled caches included.

(The kernel driver test also compares every variant, NEON under qemu, with the scalar kernel.)
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from quest_ort.ops import native_supported_isas
from quest_ort.runtime.single_op import run_op
from support.cases import CALLS, CASES, make_data
from support.driver_cases import outputs_of
from support.tolerances import assert_equal

# The cases with the most (batch, KV head) work items, where threads split the work differently,
# and the busiest with int8 caches (whose scales are written and read per row).
_BY_WORK = sorted(CASES, key=lambda c: -c.batch * c.heads[1] * c.new_tokens)
BUSY = list(dict.fromkeys(_BY_WORK[:4] + [next(c for c in _BY_WORK if c.int8)]))


FILLS = ("random", "zeros")


def case_data(case, fill: str):
    """The case's data, or the same with every key zero: all blocks score 0 and tie."""
    data = make_data(case)
    if fill == "zeros":
        zero = {name: np.zeros_like(getattr(data, name)) for name in ("key", "key_cache", "block_max", "block_min")}
        data = dataclasses.replace(data, **zero)
    return data


def all_outputs(threads: int) -> dict[str, np.ndarray]:
    """Every op's outputs on the busy cases and both fills, by a flat name."""
    results = {}
    for case in BUSY:
        for fill in FILLS:
            for call, (op_name, arguments) in CALLS.items():
                inputs, attributes = arguments(case_data(case, fill))
                for name, value in run_op(op_name, inputs, attributes, outputs=outputs_of(op_name, inputs),
                                          threads=threads).items():
                    results[f"{case.id}/{fill}/{call}/{name}"] = value
    return results


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("case", BUSY, ids=lambda case: case.id)
def test_same_bits_for_any_thread_count_and_run(case, call, fill):
    op_name, arguments = CALLS[call]
    inputs, attributes = arguments(case_data(case, fill))
    outputs = outputs_of(op_name, inputs)
    first = run_op(op_name, inputs, attributes, outputs=outputs, threads=1)
    for threads in (1, 2, 3):
        again = run_op(op_name, inputs, attributes, outputs=outputs, threads=threads)
        for name, value in first.items():
            assert_equal(again[name], value, f"{name} with {threads} threads")


@pytest.mark.parametrize("isa", [isa for isa in native_supported_isas() if isa != "scalar"])
def test_same_bits_for_every_kernel_variant(isa, tmp_path):
    """Each SIMD variant, forced by QUEST_ORT_ISA in its own process, against the scalar kernel."""
    outputs = {}
    for variant in ("scalar", isa):
        path = tmp_path / f"{variant}.npz"
        here = pathlib.Path(__file__).resolve().parent  # the child imports this module, which imports support.*
        script = (f"import sys; sys.path[:0] = {[str(here), str(here.parent)]!r}; import numpy as np; "
                  f"import test_determinism as t; from quest_ort.ops import native_kernel_isa; "
                  f"assert native_kernel_isa() == {variant!r}, native_kernel_isa(); "
                  f"np.savez({str(path)!r}, **t.all_outputs(threads=2))")
        subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "QUEST_ORT_ISA": variant},
                       cwd=tmp_path)
        outputs[variant] = dict(np.load(path))
    assert outputs["scalar"].keys() == outputs[isa].keys()
    for name, value in outputs["scalar"].items():
        assert_equal(outputs[isa][name], value, f"{isa} vs scalar: {name}")


PREFILLS = [c for c in CASES if c.new_tokens == 64]


@pytest.mark.parametrize("call", ["SparseBlockAttention", "SparseBlockAttention-dense"])
@pytest.mark.parametrize("case", list(dict.fromkeys(PREFILLS[:3] + [c for c in PREFILLS if c.int8][:1])),
                         ids=lambda case: case.id)
def test_same_bits_whether_an_items_queries_are_split_or_not(case, call):
    """Without the block_importance output the adapter splits each item's queries into units of an
    exact query tile (threads then share a prefill of few KV heads); with it, an item is one unit.
    The outputs are the same bits either way."""
    op_name, arguments = CALLS[call]
    inputs, attributes = arguments(case_data(case, "random"))
    outputs = outputs_of(op_name, inputs)
    whole = run_op(op_name, inputs, attributes, outputs=outputs, threads=2)
    split = run_op(op_name, inputs, attributes, outputs=tuple(name for name in outputs if name != "block_importance"),
                   threads=2)
    for name, value in split.items():
        assert_equal(value, whole[name], f"{name}, queries split into units vs whole items")
