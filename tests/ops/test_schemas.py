"""Schemas: onnx.checker and shape inference understand the ops; every op is complete everywhere."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest

from quest_ort.graphs import op_model
from quest_ort.graphs.bodies import BODIES
from quest_ort.ops import ALL_OPS, native_op_names
from quest_ort.ops.reference import REFERENCES
from quest_ort.ops.registry import check_model, register_schemas
from support.cases import CALLS

REPO = pathlib.Path(__file__).resolve().parents[2]
F32, F16 = np.float32, np.float16


def _inputs(t=F32, tc=F32, with_optional=True):
    B, H, N, S, D, C, M, K = 2, 8, 2, 3, 64, 100, 7, 4
    z = np.zeros
    return {
        "QuestMetadata": dict(key=z((B, N, S, D), t), block_max=z((B, N, M, D), tc), block_min=z((B, N, M, D), tc),
                              past_lens=z(B, np.int32), total_lens=z(B, np.int32) if with_optional else None),
        "SparseBlockSelect": dict(query=z((B, H, S, D), t), block_max=z((B, N, M, D), tc), block_min=z((B, N, M, D), tc),
                                  past_lens=z(B, np.int32), total_lens=None,
                                  block_importance=z((B, N, M), F32) if with_optional else None),
        "SparseBlockAttention": dict(query=z((B, H, S, D), t), key=z((B, N, S, D), t), value=z((B, N, S, D), t),
                                     key_cache=z((B, N, C, D), tc), value_cache=z((B, N, C, D), tc),
                                     past_lens=z(B, np.int32), block_indices=None,
                                     total_lens=z(B, np.int32) if with_optional else None),
    }


ATTRIBUTES = {
    "QuestMetadata": dict(block_size=16),
    "SparseBlockSelect": dict(num_heads=8, kv_num_heads=2, block_size=16, top_k=4),
    "SparseBlockAttention": dict(num_heads=8, kv_num_heads=2, block_size=16),
}
EXPECTED_SHAPES = {
    "QuestMetadata": {"block_max_out": ([2, 2, 7, 64], "TC"), "block_min_out": ([2, 2, 7, 64], "TC")},
    "SparseBlockSelect": {"block_indices": ([2, 2, 3, 4], "int32")},
    "SparseBlockAttention": {"output": ([2, 3, 512], "T"), "key_cache_out": ([2, 2, 100, 64], "TC"),
                             "value_cache_out": ([2, 2, 100, 64], "TC"), "block_importance": ([2, 2, 7], "float32")},
}


@pytest.mark.parametrize("op_name", [op.name for op in ALL_OPS])
@pytest.mark.parametrize("t, tc", [(F32, F32), (F16, F16), (F32, F16)], ids=["f32", "f16", "f32-f16"])
@pytest.mark.parametrize("with_optional", [True, False])
def test_checker_and_shape_inference(op_name, t, tc, with_optional):
    register_schemas()
    outputs = tuple(EXPECTED_SHAPES[op_name])
    model = op_model(op_name, _inputs(t, tc, with_optional)[op_name], ATTRIBUTES[op_name], outputs=outputs,
                     symbolic_dims=False)
    model = _outputs_through_identity(model)
    check_model(model)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    types = {"T": np.dtype(t), "TC": np.dtype(tc), "int32": np.dtype(np.int32), "float32": np.dtype(F32)}
    values = {v.name: v for v in inferred.graph.value_info}
    for name, (shape, elem) in EXPECTED_SHAPES[op_name].items():
        tensor_type = values[f"{name}_op"].type.tensor_type
        assert [d.dim_value for d in tensor_type.shape.dim] == shape, name
        assert onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type) == types[elem], name


@pytest.mark.parametrize("t", [F32, F16], ids=["f32", "f16"])
def test_int8_caches_and_their_scales_check_and_infer(t):
    """int8 caches with float16 scales: the caches' outputs are int8, the scales' float16 [B, N, C]."""
    register_schemas()
    B, N, C, D = 2, 2, 100, 64
    inputs = {**_inputs(t)["SparseBlockAttention"], "key_cache": np.zeros((B, N, C, D), np.int8),
              "value_cache": np.zeros((B, N, C, D), np.int8), "key_scale": np.zeros((B, N, C), F16),
              "value_scale": np.zeros((B, N, C), F16)}
    expected = {"output": ([2, 3, 512], t), "key_cache_out": ([B, N, C, D], np.int8),
                "value_cache_out": ([B, N, C, D], np.int8), "key_scale_out": ([B, N, C], F16),
                "value_scale_out": ([B, N, C], F16)}
    model = op_model("SparseBlockAttention", inputs, ATTRIBUTES["SparseBlockAttention"], outputs=tuple(expected),
                     symbolic_dims=False)
    _assert_inferred(model, expected)


def _assert_inferred(model, expected: dict) -> None:
    """The checker accepts `model` and shape inference gives each output its expected (shape, dtype)."""
    model = _outputs_through_identity(model)
    check_model(model)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    values = {v.name: v for v in inferred.graph.value_info}
    for name, (shape, dtype) in expected.items():
        tensor_type = values[f"{name}_op"].type.tensor_type
        assert [d.dim_value for d in tensor_type.shape.dim] == shape, name
        assert onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type) == np.dtype(dtype), name


@pytest.mark.parametrize("op_name", ["QuestMetadata", "SparseBlockSelect"])
@pytest.mark.parametrize("t", [F32, F16], ids=["f32", "f16"])
def test_int8_bounds_and_their_exponents_check_and_infer(op_name, t):
    """int8 bounds with int8 exponents [B, N, M]: QuestMetadata's outputs are int8 codes and exponents."""
    register_schemas()
    inputs = _inputs(t)[op_name]
    B, N, M, _ = inputs["block_max"].shape
    inputs.update(block_max=inputs["block_max"].astype(np.int8), block_min=inputs["block_min"].astype(np.int8),
                  block_exponent=np.zeros((B, N, M), np.int8))
    expected = {"SparseBlockSelect": {"block_indices": ([2, 2, 3, 4], np.int32)},
                "QuestMetadata": {"block_max_out": ([2, 2, 7, 64], np.int8), "block_min_out": ([2, 2, 7, 64], np.int8),
                                  "block_exponent_out": ([2, 2, 7], np.int8)}}[op_name]
    model = op_model(op_name, inputs, ATTRIBUTES[op_name], outputs=tuple(expected), symbolic_dims=False)
    _assert_inferred(model, expected)


@pytest.mark.parametrize("op_name", ["QuestMetadata", "SparseBlockSelect"])
def test_the_checker_names_a_wrong_exponent(op_name):
    """The exponents are int8 [B, N, M], whatever the bounds."""
    register_schemas()
    inputs = _inputs()[op_name]
    B, N, M, _ = inputs["block_max"].shape
    for exponent, words in ((np.zeros((B, N, M), np.int32), ["block_exponent", "int32"]),
                            (np.zeros((B, N, M + 1), np.int8), ["'block_exponent' dim 2 (M)"])):
        model = op_model(op_name, {**inputs, "block_exponent": exponent}, ATTRIBUTES[op_name], symbolic_dims=False)
        with pytest.raises(Exception) as error:
            check_model(model)
        for word in words:
            assert word in str(error.value)


def _outputs_through_identity(model):
    """Route each op output through an Identity, so inference (not the graph) types the op's outputs."""
    node = model.graph.node[0]
    for index, name in enumerate(node.output):
        if name:
            node.output[index] = f"{name}_op"
            model.graph.node.append(onnx.helper.make_node("Identity", [f"{name}_op"], [name]))
    return model


def test_symbolic_dims_flow_to_outputs():
    register_schemas()
    model = op_model("SparseBlockAttention", _inputs()["SparseBlockAttention"], ATTRIBUTES["SparseBlockAttention"])
    inferred = onnx.shape_inference.infer_shapes(_outputs_through_identity(model), strict_mode=True)
    out = next(v for v in inferred.graph.value_info if v.name == "output_op")
    assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim][:2] == ["B", "S"]


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda x: {**x, "value": np.zeros((2, 2, 5, 64), F32)}, ["'value' dim 2 (S) is 5"]),
        (lambda x: {**x, "key": np.zeros((2, 2, 3, 64), F16)}, ["'key'", "float16", "'query'"]),
        (lambda x: {**x, "key_cache": np.zeros((2, 2, 100), F32)}, ["'key_cache'", "rank 4"]),
    ],
)
def test_checker_names_the_input_at_fault(change, words):
    register_schemas()
    model = op_model("SparseBlockAttention", change(_inputs()["SparseBlockAttention"]),
                     ATTRIBUTES["SparseBlockAttention"], symbolic_dims=False)
    with pytest.raises(Exception) as error:
        check_model(model)
    for word in words:
        assert word in str(error.value)


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


@pytest.mark.parametrize("op", ALL_OPS, ids=lambda op: op.name)
def test_every_op_has_reference_kernel_body_and_cases(op):
    """Walks the schemas: an op missing from any layer of the package fails here."""
    snake = _snake(op.name)
    assert op.name in REFERENCES, "no NumPy reference"
    assert (REPO / "ops" / "reference" / f"{snake}.py").is_file()
    assert op.name in BODIES, "no function body"
    assert (REPO / "graphs" / "bodies" / f"{snake}.py").is_file()
    assert op.name in native_op_names(), "the native library does not register it"
    assert (REPO / "ops" / "csrc" / "kernels" / f"{snake}.h").is_file()
    assert (REPO / "ops" / "csrc" / "kernels" / "scalar" / f"{snake}.cc").is_file()
    assert (REPO / "ops" / "csrc" / "ort" / f"{snake}_op.cc").is_file()
    assert op.name in {called for called, _ in CALLS.values()}, "no conformance cases"


def test_native_library_registers_exactly_the_schema_ops():
    assert sorted(native_op_names()) == sorted(op.name for op in ALL_OPS)
