"""Never silently wrong: every rewrite rule carries over what it models (scale, softcap) and refuses
every other input, attribute or mask of the attention it replaces, naming the layer, the input or
attribute and its value; what a rule misses, the validation against the source graph catches."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from quest_ort.pipeline import rewrite_onnx
from quest_ort.export.rewrite import ExportError, SparseSettings
from support.attention_graphs import (HEADS, HEAD_DIM, KV_HEADS, attention23_model, genai_gqa_model,
                                      greedy_against_original, weights)

CAPACITY = 256


def _edit(model: onnx.ModelProto, op: str, attributes=None, inputs=None, initializers=None, nodes=None,
          graph_inputs=(), outputs=None) -> onnx.ModelProto:
    """`model` with every `op` node given `attributes` (replacing its own), `inputs` {index: name} and
    `outputs` {index: name} (also graph outputs, so that they are read), plus new initializers, nodes
    (placed first) and graph inputs."""
    for node in model.graph.node:
        if node.op_type != op:
            continue
        for name, value in (attributes or {}).items():
            kept = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend(kept + [helper.make_attribute(name, value)])
        for index, name in (inputs or {}).items():
            while len(node.input) <= index:
                node.input.append("")
            node.input[index] = name
        for index, name in (outputs or {}).items():
            while len(node.output) <= index:
                node.output.append("")
            node.output[index] = name + node.name  # one per layer
            model.graph.output.append(helper.make_empty_tensor_value_info(node.output[index]))
    for name, array in (initializers or {}).items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(array), name))
    if nodes:
        existing = list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(list(nodes) + existing)
    model.graph.input.extend(graph_inputs)
    return model


def _rewrite(model: onnx.ModelProto, tmp_path, top_k: int = 64):
    source = tmp_path / "source"
    source.mkdir()
    stored = onnx.ModelProto()
    stored.CopyFrom(model)  # saving with external data rewrites the proto it is given
    onnx.save(stored, str(source / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    settings = SparseSettings(top_k=top_k, block_size=8, dense_layers=(0,))
    return rewrite_onnx(source / "model.onnx", output=tmp_path / "quest", settings=settings, capacity=CAPACITY,
                        log=lambda *a, **k: None)


def _refused(model, tmp_path, words: str):
    with pytest.raises(ExportError, match=r"layer 0: .*" + re.escape(words)):
        _rewrite(model, tmp_path)
    assert not (tmp_path / "quest").exists()


def _gqa(**edits) -> onnx.ModelProto:
    return _edit(genai_gqa_model(False, weights()), "GroupQueryAttention", **edits)


_POSITION_IDS = helper.make_tensor_value_info("position_ids", TP.INT64, ["batch_size", "sequence_length"])
_ONE = {"one_i64": np.array(1, np.int64)}

GQA_REFUSED = {
    "smooth_softmax": (dict(attributes={"smooth_softmax": 1}), "attribute 'smooth_softmax' = 1"),
    "head_sink": (dict(inputs={11: "sink"}, initializers={"sink": np.zeros(HEADS, np.float32)}),
                  "input 11 'head_sink' is given ('sink')"),
    "attention_bias": (dict(inputs={10: "bias"}, initializers={"bias": np.zeros((1, 1, 1, 1), np.float32)}),
                       "input 10 'attention_bias' is given ('bias')"),
    "position_ids off by one": (dict(inputs={9: "shifted"}, initializers=_ONE, graph_inputs=[_POSITION_IDS],
                                     nodes=[helper.make_node("Add", ["position_ids", "one_i64"], ["shifted"])]),
                                "input 'position_ids' ('shifted') is [[1, 2, 3, 4, 5, 6]]"),
    "local_window_size": (dict(attributes={"local_window_size": 4}), "attribute 'local_window_size' = 4"),
    "sliding_window_cache": (dict(attributes={"sliding_window_cache": 1}), "attribute 'sliding_window_cache' = 1"),
    "causal": (dict(attributes={"causal": 0}), "attribute 'causal' = 0"),
    "qk_output": (dict(attributes={"qk_output": 1}), "attribute 'qk_output' = 1"),
    "output_qk read": (dict(outputs={3: "qk"}), "output 3 'output_qk' is read"),
    "k_quant_type": (dict(attributes={"k_quant_type": "PER_TENSOR"}), "attribute 'k_quant_type' = 'PER_TENSOR'"),
    "v_quant_type": (dict(attributes={"v_quant_type": "PER_CHANNEL"}), "attribute 'v_quant_type' = 'PER_CHANNEL'"),
    "kv_cache_bit_width": (dict(attributes={"kv_cache_bit_width": 8}), "attribute 'kv_cache_bit_width' = 8"),
    "k_scale": (dict(inputs={12: "k_scale"}, initializers={"k_scale": np.ones(1, np.float32)}),
                "input 12 'k_scale' is given"),
    "q_norm_weight": (dict(inputs={14: "q_norm", 15: "k_norm"},
                           initializers={"q_norm": np.ones(HEAD_DIM, np.float32), "k_norm": np.ones(HEAD_DIM, np.float32)}),
                      "input 14 'q_norm_weight' is given"),
    "query_seqlens": (dict(inputs={16: "q_lens"}, initializers={"q_lens": np.ones(1, np.int32)}),
                      "input 16 'query_seqlens' is given"),
    "an input past the spec": (dict(inputs={17: "extra"}, initializers={"extra": np.ones(1, np.float32)}),
                               "input 17 ('extra') is past the 17 inputs"),
    "an attribute outside the spec": (dict(attributes={"window_flavour": 2}), "attribute 'window_flavour' = 2 is not in"),
    "negative softcap": (dict(attributes={"softcap": -1.0}), "attribute 'softcap' = -1.0"),
    "seqlens_k not from the mask": (dict(inputs={5: "fixed_lens"}, initializers={"fixed_lens": np.array([5], np.int32)}),
                                    "input 'seqlens_k' ('fixed_lens') is [5] for 5 cached and 3 new tokens"),
    "partial rotary": (dict(inputs={7: "cos_half", 8: "sin_half"},
                            initializers={"cos_half": weights().cos[:, :4], "sin_half": weights().sin[:, :4]}),
                       "input 'cos_cache' has shape"),
}


@pytest.mark.parametrize("case", list(GQA_REFUSED))
def test_group_query_attention_refuses_what_it_does_not_model(case, tmp_path):
    edits, words = GQA_REFUSED[case]
    _refused(_gqa(**edits), tmp_path, words)


def _mask_nodes(model: onnx.ModelProto, replaced: str, nodes, initializers=None) -> onnx.ModelProto:
    """The opset-23 graph with the mask's node producing `replaced` swapped for `nodes` (in its place)."""
    order = list(model.graph.node)
    at = next(i for i, n in enumerate(order) if replaced in n.output)
    del model.graph.node[:]
    model.graph.node.extend(order[:at] + list(nodes) + order[at + 1:])
    for name, array in (initializers or {}).items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(array), name))
    return model


def _opset(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    model.opset_import[0].version = version
    return model


def _attention23(**edits) -> onnx.ModelProto:
    return _edit(attention23_model(weights()), "Attention", **edits)


def _sliding_window(window: int) -> onnx.ModelProto:
    """Key t visible to the query at position p iff p - window < t <= p (and the key is valid)."""
    return _mask_nodes(attention23_model(weights()), "visible", [
        helper.make_node("And", ["causal", "mask_b1t"], ["causal_valid"]),
        helper.make_node("Sub", ["query_positions", "window"], ["window_start"]),
        helper.make_node("Greater", ["key_positions", "window_start"], ["in_window"]),
        helper.make_node("And", ["causal_valid", "in_window"], ["visible"]),
    ], {"window": np.array(window, np.int64)})


def _bidirectional() -> onnx.ModelProto:
    return _mask_nodes(attention23_model(weights()), "visible", [helper.make_node("Identity", ["mask_b1t"], ["visible"])])


def _position_bias() -> onnx.ModelProto:
    """Visible keys get a logit bias growing with their position (ALiBi-like), instead of 0."""
    return _mask_nodes(attention23_model(weights()), "mask_bst", [
        helper.make_node("Cast", ["key_positions"], ["key_float"], to=TP.FLOAT),
        helper.make_node("Mul", ["key_float", "slope"], ["bias"]),
        helper.make_node("Where", ["visible", "bias", "f_ninf"], ["mask_bst"]),
    ], {"slope": np.array(0.25, np.float32)})


def _interleaved_repeat() -> onnx.ModelProto:
    """K/V repeated with the new axis at 1: query head h reads KV head h % N, not h // G."""
    model = attention23_model(weights())
    for initializer in model.graph.initializer:
        if initializer.name == "rep_axis":
            initializer.CopyFrom(numpy_helper.from_array(np.array([1], np.int64), "rep_axis"))
        if initializer.name == "rep_shape":
            initializer.CopyFrom(numpy_helper.from_array(np.array([1, HEADS // KV_HEADS, 1, 1, 1], np.int64), "rep_shape"))
    return model


ATTENTION23_REFUSED = {
    "sliding-window attn_mask": (lambda: _sliding_window(32),
                                 f"input 'attn_mask' ('attn_mask') hides key 0 from the query at position {CAPACITY - 1}"),
    "bidirectional attn_mask": (_bidirectional, "lets the query at position 0 see the later key 1"),
    "a bias in attn_mask": (_position_bias, "adds 0.25 to the logit of key 1"),
    "is_causal=1": (lambda: _attention23(attributes={"is_causal": 1}), "attribute 'is_causal' = 1"),
    "is_causal=0 without a mask": (lambda: _attention23(inputs={3: ""}), "no input 'attn_mask' and attribute 'is_causal' = 0"),
    "qk_matmul_output_mode": (lambda: _attention23(attributes={"qk_matmul_output_mode": 1}),
                              "attribute 'qk_matmul_output_mode' = 1"),
    "qk_matmul_output read": (lambda: _attention23(outputs={3: "qk"}), "output 3 'qk_matmul_output' is read"),
    "scale 0": (lambda: _attention23(attributes={"scale": 0.0}), "attribute 'scale' = 0.0"),
    "softmax_precision": (lambda: _attention23(attributes={"softmax_precision": TP.FLOAT16}),
                          "attribute 'softmax_precision' = 10"),
    "q_num_heads": (lambda: _attention23(attributes={"q_num_heads": HEADS + 1}), f"attribute 'q_num_heads' = {HEADS + 1}"),
    "its own past": (lambda: _attention23(inputs={4: "past_key_values.0.key", 5: "past_key_values.0.value"}),
                     "input 4 'past_key' is given"),
    "nonpad_kv_seqlen": (lambda: _opset(_attention23(inputs={6: "lens"}, initializers={"lens": np.array([1], np.int64)}), 24),
                         "input 6 'nonpad_kv_seqlen' is given ('lens')"),
    "heads repeated interleaved": (_interleaved_repeat, "inserts the repeat axis at [1]"),
}


@pytest.mark.parametrize("case", list(ATTENTION23_REFUSED))
def test_onnx_attention_refuses_what_it_does_not_model(case, tmp_path):
    build, words = ATTENTION23_REFUSED[case]
    _refused(build(), tmp_path, words)


CARRIED = {
    "gqa softcap": lambda: _gqa(attributes={"softcap": 1.5}),
    "gqa scale": lambda: _gqa(attributes={"scale": 0.2}),
    "gqa softcap and scale, packed": lambda: _edit(genai_gqa_model(True, weights()), "GroupQueryAttention",
                                                   attributes={"softcap": 2.0, "scale": 0.4}),
    "gqa position_ids input": lambda: _gqa(inputs={9: "position_ids"}, graph_inputs=[_POSITION_IDS]),
    "attention23 softcap": lambda: _attention23(attributes={"softcap": 1.5}),
    "attention23 scale": lambda: _attention23(attributes={"scale": 0.2}),
    "attention23 window past the capacity": lambda: _sliding_window(CAPACITY),
}


@pytest.mark.parametrize("case", list(CARRIED))
def test_what_a_rule_models_is_carried_over_exactly(case, tmp_path):
    model = CARRIED[case]()
    report = _rewrite(model, tmp_path)
    assert report.validation_max_abs_diff is not None
    greedy_against_original(report.output, model, 6, case, seed=3)


def test_the_softcap_and_scale_are_the_ops_attributes(tmp_path):
    report = _rewrite(_gqa(attributes={"softcap": 1.5, "scale": 0.2}), tmp_path)
    graph = onnx.load(str(report.output / "model.quest.onnx"), load_external_data=False).graph
    for node in (n for n in graph.node if n.op_type == "SparseBlockAttention"):
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attributes["softcap"] == pytest.approx(1.5) and attributes["scale"] == pytest.approx(0.2)


def test_rewrite_onnx_validation_catches_what_a_rule_misses(tmp_path, monkeypatch):
    """A rule that forgot smooth_softmax (its contract entry made 'modelled') exports a graph that
    differs from its source: the validation refuses it before anything is placed."""
    import dataclasses

    from quest_ort.export.rewrite import genai_gqa

    contract = getattr(genai_gqa, "CONTRACT", None)
    if contract is not None:
        attributes = {**contract.attributes, "smooth_softmax": (-1, None)}
        monkeypatch.setattr(genai_gqa, "CONTRACT", dataclasses.replace(contract, attributes=attributes))
    with pytest.raises(ExportError, match="validation failed: the Quest graph's logits differ"):
        _rewrite(_gqa(attributes={"smooth_softmax": 1}), tmp_path)
    assert not (tmp_path / "quest").exists()


def _optimum_attention(edit) -> None:
    """The tiny Qwen3's optimum graph with `edit(graph, add, scores_mul)` applied to every layer's
    Add(scores, mask) (and the Mul scaling its query), rewritten: raises what rewrite_attention raises."""
    import onnx_ir as ir

    from support.export_models import TINY, tiny_model
    from quest_ort.export.rewrite import Geometry, rewrite_attention

    model = ir.load(tiny_model("qwen3").optimum)
    for softmax in [n for n in model.graph if n.op_type == "Softmax"]:
        add = softmax.inputs[0].producer()
        scores = add.inputs[0].producer()
        edit(model.graph, add, scores.inputs[0].producer())
    config = TINY["qwen3"]
    geometry = Geometry(config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"],
                        config["head_dim"], "float32")
    rewrite_attention(model, SparseSettings(top_k=4, dense_layers=(0,)), geometry)


def _zero_mask(graph, add, _):
    """Every key visible to every query: a zero mask of the causal mask's shape."""
    import onnx_ir as ir

    shape = ir.node("Shape", [add.inputs[1]])
    zeros = ir.node("ConstantOfShape", [shape.outputs[0]], attributes={"value": ir.tensor(np.zeros(1, np.float32))})
    graph.insert_before(add, [shape, zeros])
    add.replace_input_with(1, zeros.outputs[0])


def _negative_scale(graph, _, query_mul):
    import onnx_ir as ir

    scale = query_mul.inputs[1]
    negative = ir.Value(name=f"{scale.name}_negative",
                        const_value=ir.tensor(-ir.convenience.get_const_tensor(scale).numpy()))
    graph.register_initializer(negative)
    query_mul.replace_input_with(1, negative)


@pytest.mark.parametrize("edit, pattern", [
    (_zero_mask, r"the attention mask \('\w+'\) lets the query at position 0 see the later key 1: not causal"),
    (_negative_scale, r"the logit scale s1 \* s2 = -[\d.]+ \* [\d.]+ is not a finite positive number"),
])
def test_optimum_attention_refuses_masks_and_scales_it_does_not_model(edit, pattern):
    with pytest.raises(ExportError, match="layer 0: " + pattern):
        _optimum_attention(edit)


def test_optimum_attention_refuses_a_sliding_window(tmp_path):
    """Qwen2 with sliding-window layers (window 32, past every prompt the old validation used): the
    windowed layers are refused, named, before anything is written."""
    from support.export_models import TINY
    from quest_ort.export.families import FAMILIES, build_default_model
    from quest_ort.pipeline import export_sparse

    build_default_model(FAMILIES["qwen2"], tmp_path / "checkpoint", **TINY["qwen2"], use_sliding_window=True,
                        sliding_window=32, max_window_layers=1)
    with pytest.raises(ExportError, match=r"attention not rewritten in layer 1: the attention mask \(.*\) hides key 0 "
                                          rf"from the query at position {CAPACITY - 1}: a sliding window.*; layer 2: "):
        export_sparse("qwen2", output=tmp_path / "quest", settings=SparseSettings(top_k=4, dense_layers=(0,)),
                      model=str(tmp_path / "checkpoint"), capacity=CAPACITY, log=lambda *a, **k: None)
    assert not (tmp_path / "quest").exists()


def test_dense_layers_that_do_not_exist_are_refused(tmp_path):
    """A dense layer the user lists must exist (the defaults, layers 0 and 1, fit the model)."""
    source = tmp_path / "source"
    source.mkdir()
    onnx.save(genai_gqa_model(False, weights()), str(source / "model.onnx"), save_as_external_data=True,
              location="model.onnx.data")
    settings = SparseSettings(top_k=64, block_size=8, dense_layers=(0, 40))
    with pytest.raises(ExportError, match=r"dense layers \[40\] do not exist: the model has \d+ layers"):
        rewrite_onnx(source / "model.onnx", output=tmp_path / "quest", settings=settings, capacity=CAPACITY,
                     log=lambda *a, **k: None)
    assert not (tmp_path / "quest").exists()
