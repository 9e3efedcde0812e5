"""The whole op library inside an aarch64 ONNX Runtime, under qemu-aarch64 (`make test-arm64`).

The host computes every conformance case's reference outputs natively; an emulated AArch64 Python
(Debian's arm64 python3.11, the aarch64 onnxruntime and numpy wheels, quest_ort with its op library
cross-compiled; built by tests/kernels/arm64/setup_env.sh) runs each op through ONNX Runtime with the
NEON kernels; selections and cache writes must match bit for bit, attention within tolerance.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

from quest_ort.ops.reference import REFERENCES
from quest_ort.ops.schemas import OPS_BY_NAME
from support.cases import CALLS, CASES
from support.driver_cases import case_data, outputs_of, total_lens
from support.tolerances import assert_close, assert_equal, assert_used_blocks_equal

pytestmark = pytest.mark.arm64

REPO = pathlib.Path(__file__).resolve().parents[2]
WORLD = REPO / "build" / "arm64"
EXACT = {"block_indices", "key_cache_out", "value_cache_out", "key_scale_out", "value_scale_out"}


def _reference(op_name, inputs, attributes):
    result = REFERENCES[op_name](**{k: v for k, v in inputs.items() if v is not None}, **attributes)
    result = result if isinstance(result, tuple) else (result,)
    return {t.name: r for t, r in zip(OPS_BY_NAME[op_name].outputs, result)}


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """Writes every call, runs them all in one emulated process, returns (expected, got, report)."""
    for path in (WORLD / "root" / "usr" / "bin" / "python3.11", WORLD / "pkg" / "quest_ort"):
        if not path.exists():
            pytest.fail(f"{path} is missing: `make test-arm64` builds the AArch64 world first")
    folder = tmp_path_factory.mktemp("arm64-calls")
    expected = {}
    for number, case in enumerate(CASES):
        data = case_data(case)
        for call, (op_name, arguments) in CALLS.items():
            inputs, attributes = arguments(data)
            name = f"{number:02d}-{call}"
            meta = dict(op=op_name, attributes=attributes, outputs=outputs_of(op_name, inputs), threads=1 + number % 2,
                        case=case.id)
            np.savez(folder / f"{name}.in.npz", __meta__=json.dumps(meta),
                     **{k: v for k, v in inputs.items() if v is not None})
            expected[name] = (case, op_name, inputs, _reference(op_name, inputs, attributes))
    env = {**os.environ, "PYTHONPATH": f"{WORLD / 'pkg'}:{WORLD / 'site'}", "PYTHONNOUSERSITE": "1"}
    env.pop("QUEST_ORT_ISA", None)
    command = ["qemu-aarch64", "-L", str(WORLD / "root"), str(WORLD / "root" / "usr" / "bin" / "python3.11"),
               str(pathlib.Path(__file__).resolve().with_name("arm64") / "emulated_runner.py"), str(folder)]
    process = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if process.returncode != 0:
        pytest.fail(f"the emulated runner failed (exit {process.returncode}):\n{process.stdout[-2000:]}\n"
                    f"{process.stderr[-4000:]}")
    got = {name: dict(np.load(folder / f"{name}.out.npz")) for name in expected}
    return expected, got, json.loads((folder / "report.json").read_text())


def test_the_emulated_world_is_aarch64_with_neon(emulated):
    _, _, report = emulated
    assert report["machine"] == "aarch64"
    assert report["isa"] == "neon", report
    assert report["calls"] == len(CASES) * len(CALLS)


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("number", range(len(CASES)), ids=[case.id for case in CASES])
def test_aarch64_onnxruntime_matches_the_reference(emulated, number, call):
    expected, got, _ = emulated
    name = f"{number:02d}-{call}"
    case, op_name, inputs, reference = expected[name]
    outputs = got[name]
    if op_name == "QuestMetadata":  # blocks that hold no valid token are unspecified
        for output in outputs_of(op_name, inputs):
            assert_used_blocks_equal(outputs[output], reference[output], total_lens(inputs, case), case.block_size,
                                     output)
        return
    for output in outputs_of(op_name, inputs):
        if output in EXACT:
            assert_equal(outputs[output], reference[output], f"{name} {output}")
        else:
            dtype = np.float32 if output == "block_importance" else np.dtype(case.dtypes[0])
            assert_close(outputs[output], reference[output], dtype, f"{name} {output}")
