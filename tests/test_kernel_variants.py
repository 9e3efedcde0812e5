"""Every kernel variant (scalar, AVX2, AVX-512, NEON under qemu-aarch64) on the conformance cases,
through the kernel-level driver: each SIMD variant must equal the scalar kernel bit for bit, and the
scalar kernel must meet the NumPy reference.

The drivers are built by `make test` (build/driver-native, build/driver-aarch64); the AArch64 one is
cross-compiled with Debian's g++-aarch64-linux-gnu and run with qemu-aarch64.
"""

from __future__ import annotations

import functools
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from cases import CASES, attention_args, make_data, metadata_args, select_args
from quest_ort.ops.reference import quest_metadata, sparse_block_attention, sparse_block_select
from tolerances import assert_close, assert_equal

REPO = pathlib.Path(__file__).resolve().parents[1]
# QUEST_ORT_NATIVE_DRIVER points at another native build (make test-sanitize: the ASan+UBSan one).
NATIVE_DRIVER = os.environ.get("QUEST_ORT_NATIVE_DRIVER", str(REPO / "build" / "driver-native" / "quest_kernel_driver"))
MACHINES = {
    "native": ([NATIVE_DRIVER], ("scalar",)),
    "aarch64": (["qemu-aarch64", str(REPO / "build" / "driver-aarch64" / "quest_kernel_driver")], ("neon", "scalar")),
}
OUTPUTS = {
    "QuestMetadata": ("block_max_out", "block_min_out"),
    "SparseBlockSelect": ("block_indices",),
    "SparseBlockAttention": ("output", "key_cache_out", "value_cache_out", "block_importance"),
}


def _command(machine):
    command, _ = MACHINES[machine]
    binary = pathlib.Path(command[-1])
    if not binary.is_file():
        pytest.fail(f"{binary} is missing: build it with `make drivers` (make test does)")
    if machine == "aarch64" and shutil.which("qemu-aarch64") is None:
        pytest.fail("qemu-aarch64 is missing: `make drivers` installs qemu-user")
    return command


def _write_case(directory: pathlib.Path, op_name, inputs, attributes, case, total_lens):
    H, N = case.heads
    fields = dict(op=op_name, T=case.dtypes[0], TC=case.dtypes[1], B=case.batch, H=H, N=N, S=case.new_tokens,
                  D=case.head_dim, M=case.num_blocks(), C=case.capacity(), P=case.block_size,
                  K=0 if inputs.get("block_indices") is None and op_name == "SparseBlockAttention" else case.k(),
                  sink_blocks=case.sink, recent_blocks=case.recent, group_reduce=case.reduce,
                  importance_fraction=attributes.get("importance_fraction", 0.0),
                  with_importance=int(inputs.get("block_importance") is not None), scale=0.0, softcap=0.0,
                  score=case.score, num_probes=case.num_probes)
    if op_name == "SparseBlockAttention":
        fields["scale"] = float(np.float32(1.0) / np.sqrt(np.float32(case.head_dim)))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "case.txt").write_text("".join(f"{k} {v}\n" for k, v in fields.items()))
    for name, array in {**inputs, "total_lens": total_lens}.items():
        if array is not None:
            np.ascontiguousarray(array).tofile(directory / f"{name}.bin")


def _read(directory, variant, name, like):
    return np.fromfile(directory / f"{variant}.{name}.bin", dtype=like.dtype).reshape(like.shape)


@functools.cache
def _data(case):
    return make_data(case)


def _expected(op_name, case):
    data = _data(case)
    if op_name == "QuestMetadata":
        inputs, attributes = metadata_args(data)
        return inputs, attributes, quest_metadata(**inputs, **attributes)
    if op_name == "SparseBlockSelect":
        inputs, attributes = select_args(data)
        return inputs, attributes, (sparse_block_select(**inputs, **attributes),)
    inputs, attributes = attention_args(data)
    return inputs, attributes, sparse_block_attention(**inputs, **attributes)


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("op_name", list(OUTPUTS))
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_variants_match_scalar_and_reference(case, op_name, machine, tmp_path):
    inputs, attributes, expected = _expected(op_name, case)
    total = inputs["total_lens"] if inputs.get("total_lens") is not None else inputs["past_lens"] + case.new_tokens
    _write_case(tmp_path, op_name, inputs, attributes, case, total.astype(np.int32))
    run = subprocess.run([*_command(machine), str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    variants = run.stdout.split()
    for required in MACHINES[machine][1]:
        assert required in variants, f"{required} did not run: {variants}"
    if machine == "native":
        from quest_ort.ops import native_supported_isas

        assert set(native_supported_isas()) <= set(variants)
    names = OUTPUTS[op_name]
    scalar = {name: _read(tmp_path, "scalar", name, like) for name, like in zip(names, expected)}
    for variant in variants:
        for name, like in zip(names, expected):
            assert_equal(_read(tmp_path, variant, name, like), scalar[name], f"{variant} {name} vs scalar")
    # The scalar kernel against the reference (unused metadata blocks are unspecified).
    if op_name == "QuestMetadata":
        used = np.arange(case.num_blocks())[None, :] * case.block_size < total[:, None]
        for name, want in zip(names, expected):
            assert_equal(np.moveaxis(scalar[name], 2, 1)[used], np.moveaxis(want, 2, 1)[used], name)
    elif op_name == "SparseBlockSelect":
        assert_equal(scalar["block_indices"], expected[0], "block_indices")
    else:
        assert_close(scalar["output"], expected[0], np.dtype(case.dtypes[0]), "output")
        assert_equal(scalar["key_cache_out"], expected[1], "key_cache_out")
        assert_equal(scalar["value_cache_out"], expected[2], "value_cache_out")
        assert_close(scalar["block_importance"], expected[3], np.float32, "block_importance")
