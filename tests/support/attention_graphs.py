"""Small exported-style models built in code: ONNX Runtime GenAI GroupQueryAttention graphs (packed
or separate q/k/v, internal rotary) and torch-dynamo-style opset-23 Attention graphs (RotaryEmbedding,
K/V repeated to the query heads). Each comes with a runner for the original graph."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, MAX_POSITIONS = 64, 48, 6, 2, 16, 2, 512


@dataclasses.dataclass
class Weights:
    embedding: np.ndarray
    layers: list[dict]
    lm_head: np.ndarray
    cos: np.ndarray
    sin: np.ndarray


def weights(seed: int = 0) -> Weights:
    rng = np.random.default_rng(seed)
    w = lambda *shape: (rng.standard_normal(shape) * 0.3).astype(np.float32)  # noqa: E731
    layers = [dict(q=w(HIDDEN, HEADS * HEAD_DIM), k=w(HIDDEN, KV_HEADS * HEAD_DIM), v=w(HIDDEN, KV_HEADS * HEAD_DIM),
                   o=w(HEADS * HEAD_DIM, HIDDEN)) for _ in range(LAYERS)]
    inverse = 1.0 / (10000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM))
    angles = np.arange(MAX_POSITIONS)[:, None] * inverse[None]
    return Weights(w(VOCAB, HIDDEN), layers, w(HIDDEN, VOCAB), np.cos(angles).astype(np.float32),
                   np.sin(angles).astype(np.float32))


def _io(kind_inputs):
    inputs = [helper.make_tensor_value_info("input_ids", TP.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TP.INT64, ["batch_size", "total_length"])]
    inputs += kind_inputs
    outputs = [helper.make_tensor_value_info("logits", TP.FLOAT, ["batch_size", "sequence_length", VOCAB])]
    for layer in range(LAYERS):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{layer}.{kind}", TP.FLOAT,
                                                        ["batch_size", KV_HEADS, "past_length", HEAD_DIM]))
            outputs.append(helper.make_tensor_value_info(f"present.{layer}.{kind}", TP.FLOAT,
                                                         ["batch_size", KV_HEADS, "total_length", HEAD_DIM]))
    return inputs, outputs


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def genai_gqa_model(packed: bool, w: Weights) -> onnx.ModelProto:
    """GenAI-builder style: GroupQueryAttention with do_rotary=1 and cos/sin caches."""
    inputs, outputs = _io([])
    inits = [_const("embedding", w.embedding), _const("lm_head", w.lm_head), _const("cos_cache", w.cos),
             _const("sin_cache", w.sin), _const("one", np.array([1], np.int64)), _const("axis1", np.array([1], np.int64)),
             _const("two", np.array([2], np.int64))]
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["x0"]),
        helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["mask_sum"], keepdims=0),
        helper.make_node("Sub", ["mask_sum", "one"], ["seqlens_64"]),
        helper.make_node("Cast", ["seqlens_64"], ["seqlens_k"], to=TP.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Slice", ["mask_shape", "one", "two"], ["total_1d"]),
        helper.make_node("Squeeze", ["total_1d"], ["total_64"]),
        helper.make_node("Cast", ["total_64"], ["total_sequence_length"], to=TP.INT32),
    ]
    x = "x0"
    for layer, p in enumerate(w.layers):
        prefix = f"l{layer}_"
        past = [f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"]
        present = [f"present.{layer}.key", f"present.{layer}.value"]
        if packed:
            inits.append(_const(prefix + "qkv", np.concatenate([p["q"], p["k"], p["v"]], axis=1)))
            nodes.append(helper.make_node("MatMul", [x, prefix + "qkv"], [prefix + "qkv_out"]))
            gqa_inputs = [prefix + "qkv_out", "", ""]
        else:
            for name in ("q", "k", "v"):
                inits.append(_const(prefix + name, p[name]))
                nodes.append(helper.make_node("MatMul", [x, prefix + name], [prefix + name + "_out"]))
            gqa_inputs = [prefix + "q_out", prefix + "k_out", prefix + "v_out"]
        nodes.append(helper.make_node(
            "GroupQueryAttention", gqa_inputs + past + ["seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"],
            [prefix + "attn"] + present, domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
            do_rotary=1, name=f"/model/layers.{layer}/attn/GroupQueryAttention"))
        inits.append(_const(prefix + "o", p["o"]))
        nodes.append(helper.make_node("MatMul", [prefix + "attn", prefix + "o"], [prefix + "o_out"]))
        nodes.append(helper.make_node("Add", [x, prefix + "o_out"], [prefix + "x"]))
        x = prefix + "x"
    nodes.append(helper.make_node("MatMul", [x, "lm_head"], ["logits"]))
    graph = helper.make_graph(nodes, "genai_gqa", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=9)


def attention23_model(w: Weights) -> onnx.ModelProto:
    """Dynamo-style opset 23: RotaryEmbedding, Concat(past, new), K/V repeated, Attention(mask)."""
    inputs, outputs = _io([helper.make_tensor_value_info("position_ids", TP.INT64, ["batch_size", "sequence_length"])])
    G = HEADS // KV_HEADS
    inits = [_const("embedding", w.embedding), _const("lm_head", w.lm_head), _const("cos_cache", w.cos),
             _const("sin_cache", w.sin), _const("q_shape", np.array([0, 0, HEADS, HEAD_DIM], np.int64)),
             _const("kv_shape", np.array([0, 0, KV_HEADS, HEAD_DIM], np.int64)),
             _const("rep_axis", np.array([2], np.int64)), _const("rep_shape", np.array([1, 1, G, 1, 1], np.int64)),
             _const("heads_shape", np.array([0, HEADS, -1, HEAD_DIM], np.int64)),
             _const("out_shape", np.array([0, 0, HEADS * HEAD_DIM], np.int64)), _const("zero", np.array(0, np.int64)),
             _const("step", np.array(1, np.int64)), _const("last", np.array([2], np.int64)),
             _const("mid", np.array([1], np.int64)), _const("f_zero", np.array(0.0, np.float32)),
             _const("f_ninf", np.array(-np.inf, np.float32)), _const("m_one", np.array([-1], np.int64))]
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["x0"]),
        # causal mask [B, 1, S, T]: key t visible to the query at position p iff t <= p and mask[b, t]
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "step"], ["total"], axis=0),
        helper.make_node("Range", ["zero", "total", "step"], ["key_positions"]),
        helper.make_node("Unsqueeze", ["position_ids", "m_one"], ["query_positions"]),
        helper.make_node("LessOrEqual", ["key_positions", "query_positions"], ["causal"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_bool"], to=TP.BOOL),
        helper.make_node("Unsqueeze", ["mask_bool", "mid"], ["mask_b1t"]),
        helper.make_node("And", ["causal", "mask_b1t"], ["visible"]),
        helper.make_node("Where", ["visible", "f_zero", "f_ninf"], ["mask_bst"]),
        helper.make_node("Unsqueeze", ["mask_bst", "mid"], ["attn_mask"]),
    ]
    x = "x0"
    for layer, p in enumerate(w.layers):
        f = f"l{layer}_"
        for name in ("q", "k", "v", "o"):
            inits.append(_const(f + name, p[name]))
        nodes += [
            helper.make_node("MatMul", [x, f + "q"], [f + "q2"]),
            helper.make_node("Reshape", [f + "q2", "q_shape"], [f + "q3"]),
            helper.make_node("Transpose", [f + "q3"], [f + "q4"], perm=[0, 2, 1, 3]),
            helper.make_node("RotaryEmbedding", [f + "q4", "cos_cache", "sin_cache", "position_ids"], [f + "q_rot"]),
            helper.make_node("MatMul", [x, f + "k"], [f + "k2"]),
            helper.make_node("Reshape", [f + "k2", "kv_shape"], [f + "k3"]),
            helper.make_node("Transpose", [f + "k3"], [f + "k4"], perm=[0, 2, 1, 3]),
            helper.make_node("RotaryEmbedding", [f + "k4", "cos_cache", "sin_cache", "position_ids"], [f + "k_rot"]),
            helper.make_node("MatMul", [x, f + "v"], [f + "v2"]),
            helper.make_node("Reshape", [f + "v2", "kv_shape"], [f + "v3"]),
            helper.make_node("Transpose", [f + "v3"], [f + "v4"], perm=[0, 2, 1, 3]),
            helper.make_node("Concat", [f"past_key_values.{layer}.key", f + "k_rot"], [f"present.{layer}.key"], axis=2),
            helper.make_node("Concat", [f"past_key_values.{layer}.value", f + "v4"], [f"present.{layer}.value"], axis=2),
        ]
        for kind, short in (("key", "K"), ("value", "V")):
            nodes += [
                helper.make_node("Unsqueeze", [f"present.{layer}.{kind}", "rep_axis"], [f + short + "u"]),
                helper.make_node("Expand", [f + short + "u", "rep_shape"], [f + short + "e"]),
                helper.make_node("Reshape", [f + short + "e", "heads_shape"], [f + short]),
            ]
        nodes += [
            helper.make_node("Attention", [f + "q_rot", f + "K", f + "V", "attn_mask"], [f + "y"],
                             name=f"/model/layers.{layer}/attn/Attention"),
            helper.make_node("Transpose", [f + "y"], [f + "yt"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f + "yt", "out_shape"], [f + "y3"]),
            helper.make_node("MatMul", [f + "y3", f + "o"], [f + "o_out"]),
            helper.make_node("Add", [x, f + "o_out"], [f + "x"]),
        ]
        x = f + "x"
    nodes.append(helper.make_node("MatMul", [x, "lm_head"], ["logits"]))
    graph = helper.make_graph(nodes, "attention23", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


def run_original(model: onnx.ModelProto, prompt: list[int], forced: list[int]) -> list[np.ndarray]:
    """Logits at the prompt's last position, then for each forced next token (batch 1)."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    past = {f"past_key_values.{l}.{k}": np.zeros((1, KV_HEADS, 0, HEAD_DIM), np.float32)
            for l in range(LAYERS) for k in ("key", "value")}
    position, results = 0, []
    for chunk in [prompt] + [[t] for t in forced]:
        feeds = {"input_ids": np.array([chunk], np.int64),
                 "attention_mask": np.ones((1, position + len(chunk)), np.int64),
                 "position_ids": np.arange(position, position + len(chunk))[None], **past}
        values = dict(zip(outputs, session.run(None, {k: v for k, v in feeds.items() if k in names})))
        results.append(values["logits"][0, -1])
        for l in range(LAYERS):
            for k in ("key", "value"):
                past[f"past_key_values.{l}.{k}"] = values[f"present.{l}.{k}"]
        position += len(chunk)
    return results


def greedy_against_original(folder, model: onnx.ModelProto, steps: int, label: str, seed: int) -> list[int]:
    """Greedy decoding of the exported folder from a random 29-token prompt, each step's logits
    against the original graph's on the same tokens; returns the generated tokens."""
    from quest_ort.runtime.generate import greedy
    from quest_ort.runtime.model import QuestModel
    from .tolerances import assert_close

    quest = QuestModel(folder, threads=1)
    prompt = np.random.default_rng(seed).integers(0, VOCAB, 29).tolist()
    tokens, logits = greedy(quest, [prompt], steps, return_logits=True)
    expected = run_original(model, prompt, tokens[0][:-1])
    for step, (got, want) in enumerate(zip(logits, expected)):
        assert_close(got[0], want, np.float32, f"{label} step {step}")
    assert tokens[0] == [int(np.argmax(x)) for x in expected]
    return tokens[0]
