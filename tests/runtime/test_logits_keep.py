"""logits_keep: a step computes the head for its last positions only, and those are the full step's."""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir
import pytest

from quest_ort.export.rewrite.logits import keep_last_logits
from quest_ort.runtime.generate import prefill
from quest_ort.runtime.inputs import InputTypeError
from quest_ort.runtime.model import QuestModel
from support.export_models import quest_export
from support.tolerances import assert_close

EXPORTS = {  # family, export settings: the Llama and Qwen2 heads, int8 caches, the dense baseline
    "qwen3": ("qwen3", dict(top_k=4)),
    "llama-int8": ("llama", dict(top_k=4, kv_dtype="int8")),
    "qwen2-gqa": ("qwen2", dict(top_k=4, attention="gqa")),
}


@functools.cache
def _model(name: str) -> QuestModel:
    family, settings = EXPORTS[name]
    return QuestModel(quest_export(family, **settings), threads=1)


@pytest.mark.parametrize("name", EXPORTS)
@pytest.mark.parametrize("kept", [1, 5, 40])
def test_the_kept_logits_are_the_full_steps_last_rows(name, kept):
    model = _model(name)
    assert "logits_keep" in model.sidecar.inputs
    ids = np.random.default_rng(kept).integers(0, model.vocab_size, (2, 40))
    valid = np.array([40, 23], np.int32)  # a padded row too
    full_cache, kept_cache = model.new_cache(2, 96), model.new_cache(2, 96)
    full = model.step(full_cache, ids, valid=valid, exact=True)
    part = model.step(kept_cache, ids, valid=valid, exact=True, last_logits=kept)
    assert part.shape == (2, kept, model.vocab_size)
    assert_close(part, full[:, 40 - kept :], np.float32, f"{name}: last {kept} of 40 positions")
    for full_buffer, kept_buffer in zip(full_cache.values.values(), kept_cache.values.values()):
        np.testing.assert_array_equal(kept_buffer, full_buffer)  # the head's slice changes no cache
    token = ids[:, :1]
    assert_close(model.step(kept_cache, token, last_logits=1), model.step(full_cache, token), np.float32,
                 f"{name}: a decode step")


@pytest.mark.parametrize("chunk", [7, 16, 64])
def test_prefill_returns_each_prompts_last_logits_whichever_chunk_it_ends_in(chunk):
    # rows ending in the same chunk at different positions, in different chunks, on a chunk's edge
    model = _model("qwen3")
    rng = np.random.default_rng(chunk)
    prompts = [rng.integers(0, model.vocab_size, n).tolist() for n in (1, 16, 30, 33)]
    got = prefill(model, model.new_cache(len(prompts), 96), prompts, chunk=chunk)
    for row, prompt in enumerate(prompts):
        alone = model.step(model.new_cache(1, 96), np.array([prompt]), exact=True)[0, -1]
        assert_close(got[row], alone, np.float32, f"prompt {row} ({len(prompt)} tokens) in chunks of {chunk}")


@pytest.mark.parametrize("last_logits, error", [(0, ValueError), (4, ValueError), (-1, ValueError),
                                                (1.0, InputTypeError), (True, InputTypeError)])
def test_a_bad_last_logits_is_refused_naming_it_and_nothing_is_written(last_logits, error):
    model = _model("qwen3")
    cache = model.new_cache(1, 32)
    with pytest.raises(error, match="last_logits"):
        model.step(cache, np.array([[1, 2, 3]]), exact=True, last_logits=last_logits)
    assert cache.lengths.tolist() == [0]


def test_a_folder_without_logits_keep_slices_the_full_logits():
    # an export from before the input (or a head the rule does not take): the same rows, computed in full
    model = QuestModel(quest_export("qwen3", top_k=4), threads=1)
    ids = np.random.default_rng(3).integers(0, model.vocab_size, (1, 12))
    expected = model.step(model.new_cache(1, 32), ids, exact=True)[:, -2:]
    del model.sidecar.inputs["logits_keep"]
    run = model._step.run  # the graph of such a folder computes every row
    model._step.run = lambda feeds, into=None, plan=None: run({**feeds, "logits_keep": np.array([0], np.int64)}, into,
                                                             plan)
    got = model.step(model.new_cache(1, 32), ids, exact=True, last_logits=2)
    np.testing.assert_array_equal(got, expected)


def _head_graph(head: str, logits_rank: int = 3) -> ir.Graph:
    """hidden [B, S, 8] -> head -> (Cast) -> logits: the rule's pattern and its near misses."""
    hidden = ir.Value(name="hidden", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["B", "S", 8]))
    weight = ir.Value(name="weight", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([8, 16]),
                      const_value=ir.tensor(np.ones((8, 16), np.float32)))
    nodes = []
    if head in ("MatMul", "MatMul+Cast"):
        nodes.append(ir.node("MatMul", [hidden, weight]))
        if head == "MatMul+Cast":
            nodes.append(ir.node("Cast", [nodes[-1].outputs[0]], attributes={"to": ir.DataType.FLOAT16}))
    elif head == "MatMulNBits":
        nodes.append(ir.node("MatMulNBits", [hidden, weight], domain="com.microsoft"))
    elif head == "MatMul of a 3-D weight":
        batched = ir.Value(name="batched", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 8, 16]))
        nodes.append(ir.node("MatMul", [hidden, batched]))
    elif head == "Softmax after the head":
        nodes.append(ir.node("MatMul", [hidden, weight]))
        nodes.append(ir.node("Softmax", [nodes[-1].outputs[0]]))
    elif head in ("the head's output read elsewhere", "the logits read elsewhere"):
        nodes.append(ir.node("MatMul", [hidden, weight]))
        nodes.append(ir.node("Cast", [nodes[-1].outputs[0]], attributes={"to": ir.DataType.FLOAT}))
        read = nodes[-2 if head == "the head's output read elsewhere" else -1].outputs[0]
        nodes.insert(0, ir.node("ReduceMax", [read]))  # e.g. a graph output of the whole step's maximum
    logits = nodes[-1].outputs[0]
    logits.name = "logits"
    logits.shape = ir.Shape(["B", "S", 16][3 - logits_rank:])
    outputs = [logits] + [node.outputs[0] for node in nodes if node.op_type == "ReduceMax"]
    return ir.Graph([hidden], outputs, nodes=nodes, initializers=[weight], opset_imports={"": 18})


@pytest.mark.parametrize("head", ["MatMul", "MatMul+Cast", "MatMulNBits"])
def test_the_rule_slices_the_heads_input(head):
    graph = _head_graph(head)
    first = next(iter(graph))
    keep, reason = keep_last_logits(graph)
    assert keep is not None and reason == ""
    assert keep.name == "logits_keep" and list(keep.shape) == [1] and keep.type.dtype == ir.DataType.INT64
    sliced = first.inputs[0].producer()
    assert sliced.op_type == "Slice" and sliced.inputs[0].name == "hidden"
    assert graph.outputs[0].shape[1] == "logits_length"


@pytest.mark.parametrize("head, logits_rank, words", [
    ("Softmax after the head", 3, ["Softmax"]),
    ("MatMul of a 3-D weight", 3, ["[1,8,16]", "expected [H, V]"]),
    ("MatMul", 2, ["expected [B, S, vocab]"]),
    ("the head's output read elsewhere", 3, ["other readers"]),
    ("the logits read elsewhere", 3, ["also feed nodes"]),
])
def test_the_rule_leaves_a_head_it_does_not_model_and_says_why(head, logits_rank, words):
    graph = _head_graph(head, logits_rank)
    before = [node.op_type for node in graph]
    keep, reason = keep_last_logits(graph)
    assert keep is None and [node.op_type for node in graph] == before
    for word in words:
        assert word.replace(" ", "") in reason.replace(" ", ""), reason
