"""The function bodies as a model carries them: runnable in a plain ONNX Runtime without the library."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from quest_ort.graphs import op_model
from quest_ort.graphs.functions import attach_function_bodies, expand_quest_ops
from quest_ort.ops.reference import sparse_block_attention, sparse_block_select
from quest_ort.runtime import make_session
from quest_ort.ops.reference import quest_metadata
from support.cases import CASES, attention_args, make_data, metadata_args, select_args
from support.driver_cases import SCALE_OUTPUTS, outputs_of
from support.tolerances import assert_close, assert_equal

CASE = next(c for c in CASES if c.ranks_blocks() and c.batch == 3)


def _feeds(inputs):
    return {k: v for k, v in inputs.items() if v is not None}


@pytest.mark.parametrize("register_library", [False, True], ids=["plain-ort", "with-library"])
def test_model_carrying_function_bodies_runs(register_library):
    inputs, attributes = select_args(make_data(CASE))
    model = attach_function_bodies(op_model("SparseBlockSelect", inputs, attributes))
    assert any(f.name == "SparseBlockSelect" for f in model.functions)
    onnx.checker.check_model(model)
    session = make_session(model, register_library=register_library)
    got = session.run(None, _feeds(inputs))[0]
    assert_equal(got, sparse_block_select(**inputs, **attributes), "block_indices")


def test_expanded_model_has_only_standard_ops():
    inputs, attributes = attention_args(make_data(CASE))
    model = expand_quest_ops(op_model("SparseBlockAttention", inputs, attributes,
                                      outputs=("output", "key_cache_out", "value_cache_out")))
    assert {node.domain for node in model.graph.node} <= {""}
    assert all(o.domain != "quest" for o in model.opset_import)
    onnx.checker.check_model(model, full_check=True)
    got = make_session(model, register_library=False).run(None, _feeds(inputs))
    expected = sparse_block_attention(**inputs, **attributes)
    assert_close(got[0], expected[0], np.dtype(CASE.dtypes[0]), "output")


def test_attaching_refuses_nodes_that_differ():
    inputs, attributes = select_args(make_data(CASE))
    model = op_model("SparseBlockSelect", inputs, attributes)
    twin = onnx.helper.make_node("SparseBlockSelect", list(model.graph.node[0].input), ["other"], domain="quest",
                                 **{**attributes, "top_k": attributes["top_k"] + 1})
    model.graph.node.append(twin)
    with pytest.raises(ValueError, match="expand_quest_ops"):
        attach_function_bodies(model)


def test_registered_library_takes_precedence_over_a_carried_body():
    """With the library registered ORT runs the kernel (which copies an unbound cache), else the body."""
    from quest_ort.ops import native_copied_bytes

    inputs, attributes = attention_args(make_data(CASE), sparse=False)
    model = attach_function_bodies(op_model("SparseBlockAttention", inputs, attributes))
    for register_library, copies in ((True, True), (False, False)):
        session = make_session(model, register_library=register_library)
        before = native_copied_bytes()
        session.run(None, _feeds(inputs))
        assert (native_copied_bytes() > before) == copies


INT8_CASE = next(c for c in CASES if c.int8)
INT8_OUTPUTS = ("output", "key_cache_out", "value_cache_out", *SCALE_OUTPUTS)  # block_importance left out


@pytest.mark.parametrize("form", ["function", "expanded"])
def test_int8_attention_without_importance_runs_in_plain_onnx_runtime(form):
    """An int8 node that leaves block_importance out: its scale outputs come after it, so the carried
    function computes the importance in its place (a function's outputs have no gaps); expanded, the
    graph keeps no node that feeds no output (ONNX Runtime would run it)."""
    inputs, attributes = attention_args(make_data(INT8_CASE))
    model = op_model("SparseBlockAttention", inputs, attributes, outputs=INT8_OUTPUTS)
    model = attach_function_bodies(model) if form == "function" else expand_quest_ops(model)
    onnx.checker.check_model(model, full_check=form == "expanded")
    if form == "expanded":
        used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
        dead = [node.op_type for node in model.graph.node if not any(name in used for name in node.output)]
        assert not dead, f"nodes that feed no output: {dead}"
    got = dict(zip(INT8_OUTPUTS, make_session(model, register_library=False).run(list(INT8_OUTPUTS), _feeds(inputs))))
    expected = dict(zip(("output", "key_cache_out", "value_cache_out", "block_importance", *SCALE_OUTPUTS),
                        sparse_block_attention(**inputs, **attributes)))
    assert_close(got["output"], expected["output"], np.dtype(INT8_CASE.dtypes[0]), "output")
    for name in INT8_OUTPUTS[1:]:
        assert_equal(got[name], expected[name], name)


INT8_BOUNDS_CASE = next(c for c in CASES if c.int8_bounds)


@pytest.mark.parametrize("form", ["function", "expanded"])
@pytest.mark.parametrize("op_name", ["QuestMetadata", "SparseBlockSelect"])
def test_int8_bounds_run_in_plain_onnx_runtime(op_name, form):
    """A carried function cannot see its inputs' types: the present block_exponent alone makes it take
    the int8 bounds' path (the expanded node could check the type too)."""
    arguments = metadata_args if op_name == "QuestMetadata" else select_args
    inputs, attributes = arguments(make_data(INT8_BOUNDS_CASE))
    outputs = outputs_of(op_name, inputs) if op_name == "QuestMetadata" else ("block_indices",)
    model = op_model(op_name, inputs, attributes, outputs=outputs)
    model = attach_function_bodies(model) if form == "function" else expand_quest_ops(model)
    onnx.checker.check_model(model, full_check=form == "expanded")
    got = make_session(model, register_library=False).run(list(outputs), _feeds(inputs))
    reference = quest_metadata if op_name == "QuestMetadata" else sparse_block_select
    expected = reference(**inputs, **attributes)
    for name, value, want in zip(outputs, got, expected if isinstance(expected, tuple) else (expected,), strict=True):
        assert_equal(value, want, name)  # every block: untouched ones keep their input bits


@pytest.mark.parametrize("bounds", ["float32 with block_exponent", "int8 without block_exponent"])
def test_an_expanded_node_refuses_exponents_that_do_not_match_the_bounds(bounds):
    inputs, attributes = metadata_args(make_data(INT8_BOUNDS_CASE))
    if bounds.startswith("float32"):
        inputs.update({name: inputs[name].astype(np.float32) for name in ("block_max", "block_min")})
    else:
        inputs["block_exponent"] = None
    model = op_model("QuestMetadata", inputs, attributes, outputs=("block_max_out", "block_min_out"))
    with pytest.raises(ValueError, match="QuestMetadata: input 'block_exponent'"):
        expand_quest_ops(model)
