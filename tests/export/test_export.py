"""Graph-level conformance of export-sparse: the Quest graph against the optimum graph and PyTorch.

Tiny Qwen3, Llama and Qwen2 models with random weights (norm weights and biases randomised), built
in code.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from quest_ort.export.rewrite import ExportError, Geometry, SparseSettings, rewrite_attention
from quest_ort.ops.reference import sparse_block_select
from quest_ort.model_folder.folder_check import unread_optional_outputs
from quest_ort.runtime.generate import greedy
from quest_ort.runtime.model import CapacityError, QuestModel
from support.export_models import TINY, OptimumRunner, quest_export, tiny_model
from support.tolerances import assert_close, assert_equal

FAMILIES = tuple(TINY)
PROMPT = 40
DECODE = 9  # new tokens: 8 decode steps after the prompt


def _prompt(seed: int, length: int = PROMPT, vocab: int = 256) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, size=length).tolist()


def _decode_against_optimum(model, tiny, prompt, dtype, label):
    """Greedy-decodes `prompt` and checks every step's logits against the optimum graph fed the
    same tokens; returns (tokens, logits, optimum's logits)."""
    tokens, logits = greedy(model, [prompt], DECODE, return_logits=True)
    tokens = tokens[0]
    expected = OptimumRunner(tiny).run(prompt, tokens[:-1])
    for step, (got, want) in enumerate(zip(logits, expected)):
        assert_close(got[0], want, dtype, f"{label} logits of step {step} vs optimum")
    return tokens, logits, expected


@pytest.mark.parametrize("family", FAMILIES)
def test_budget_covering_the_context_matches_optimum_and_pytorch(family):
    import torch
    import transformers

    tiny = tiny_model(family)
    model = QuestModel(quest_export(family, top_k=64), threads=1)  # 64 blocks of 16: all of them
    prompt = _prompt(1)
    tokens, logits, expected = _decode_against_optimum(model, tiny, prompt, np.float32, "float32")
    assert tokens == [int(np.argmax(x)) for x in expected], "greedy tokens differ from the optimum graph's"
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny.checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = hf(torch.tensor([prompt + tokens[:-1]])).logits[0, PROMPT - 1 :].numpy()
    assert_close(np.stack([x[0] for x in logits]), reference, np.float32, "logits vs PyTorch")


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_of_different_lengths_match_single_rows(family):
    model = QuestModel(quest_export(family, top_k=2), threads=1)
    prompts = [_prompt(2, 37), _prompt(3, 18)]
    batched_tokens, batched_logits = greedy(model, prompts, 6, return_logits=True)
    for row, prompt in enumerate(prompts):
        tokens, logits = greedy(model, [prompt], 6, return_logits=True)
        assert batched_tokens[row] == tokens[0]
        for step in range(6):
            assert_close(batched_logits[step][row], logits[step][0], np.float32, f"row {row} step {step}")


def _with_select_outputs(path) -> onnx.ModelProto:
    """The exported model with each SparseBlockSelect's query and block_indices as extra outputs."""
    model = onnx.load(str(path / "model.quest.onnx"))
    for node in model.graph.node:
        if node.op_type == "SparseBlockSelect":
            for name in (node.input[0], node.output[0]):
                model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    return model


@pytest.mark.parametrize("family, group_reduce", [(family, "mean") for family in FAMILIES] + [("qwen3", "none")])
def test_small_budget_selects_what_the_reference_selects(family, group_reduce):
    from quest_ort.model_folder.sidecar import Sidecar
    from quest_ort.runtime.binding import InPlaceStep
    from quest_ort.runtime.sessions import make_session

    folder = quest_export(family, top_k=3, block_size=16, dense_layers=(0,), group_reduce=group_reduce)
    sidecar = Sidecar.read(folder)
    assert sidecar.settings.group_reduce == group_reduce
    model = QuestModel(folder, threads=1)
    probe = make_session(_with_select_outputs(folder), threads=1)
    model._step = InPlaceStep(probe, model._step.aliases)  # same I/O, extra outputs
    selects = [n for n in onnx.load(str(folder / "model.quest.onnx"), load_external_data=False).graph.node
               if n.op_type == "SparseBlockSelect"]
    assert len(selects) == len(sidecar.sparse_layers) == 2
    cache = model.new_cache(1, capacity=256)
    prompt = _prompt(4, 150)
    feeds_seen = []
    original_run = model._step.run

    def capture(feeds, into=None, plan=None):
        out = original_run(feeds, into, plan)
        # The metadata outputs are bound in place: after the step they are the cache buffers.
        out = {**out, **{name: array.copy() for io, layer in zip(sidecar.layers, cache.layers) if io.sparse
                         for name, array in ((io.present_block_max, layer.block_max),
                                             (io.present_block_min, layer.block_min))}}
        feeds_seen.append((dict(feeds), out))
        return out

    model._step.run = capture
    model.step(cache, np.array([prompt]))
    for token in (5, 9, 200):
        model.step(cache, np.array([[token]]))
    checked = 0
    for feeds, out in feeds_seen:
        for node, layer in zip(selects, sidecar.sparse_layers):
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            attributes = {k: v.decode() if isinstance(v, bytes) else v for k, v in attributes.items()}
            expected = sparse_block_select(out[node.input[0]], out[f"present_block_max.{layer}"],
                                           out[f"present_block_min.{layer}"], feeds["past_lens"],
                                           feeds["total_lens"], **attributes)
            assert_equal(out[node.output[0]], expected, f"layer {layer} block_indices")
            checked += 1
            assert (expected >= 0).sum() > 0
    assert checked == 8


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_prefill_matches_optimum_past_the_budget_and_decode_selects(family):
    """A 150-token prompt through a 32-token budget (K = 2 blocks of 16): prefilled exactly, every
    prompt position's logits are optimum's and no prompt token selects; the decode step after it
    selects K blocks per KV head. Prefilled sparsely, the prompt's logits are not optimum's."""
    from quest_ort.runtime.binding import InPlaceStep
    from quest_ort.runtime.sessions import make_session

    tiny = tiny_model(family)
    folder = quest_export(family, top_k=2, block_size=16, dense_layers=(0,))
    prompt = _prompt(7, 150)
    optimum = OptimumRunner(tiny).model
    expected = optimum.step(optimum.new_cache(1), np.array([prompt]))
    selected = [n.output[0] for n in _with_select_outputs(folder).graph.node if n.op_type == "SparseBlockSelect"]
    for exact in (True, False):
        model = QuestModel(folder, threads=1)
        model._step = InPlaceStep(make_session(_with_select_outputs(folder), threads=1), model._step.aliases)
        cache = model.new_cache(1, capacity=256)
        binding_run = model._step.run
        steps = []
        model._step.run = lambda feeds, into=None, plan=None: steps.append(binding_run(feeds, into, plan)) or steps[-1]
        logits = model.step(cache, np.array([prompt]), exact=exact)
        model.step(cache, np.array([[int(np.argmax(logits[0, -1]))]]))
        prompt_rows, decode_rows = ([out[name] for name in selected] for out in steps)
        assert len(prompt_rows) == len(model.sidecar.sparse_layers) == 2
        for rows in decode_rows:  # the decode token selects K = 2 blocks per KV head
            assert ((rows >= 0).sum(-1) == 2).all(), rows
        if exact:
            assert all((rows == -1).all() for rows in prompt_rows), "exact prompt tokens must not select"
            assert_close(logits, expected, np.float32, "exact prefill logits vs optimum", axes="(b, s) x vocab")
        else:
            assert any((rows >= 0).any() for rows in prompt_rows)
            assert not np.allclose(logits, expected, rtol=1e-3, atol=1e-3), "a sparse prefill should differ"


@pytest.mark.parametrize("kv_dtype", ["float16", "int8"])
@pytest.mark.parametrize("family", FAMILIES)
def test_narrow_kv_stays_close_to_float32(family, kv_dtype):
    """float16 and int8 caches (with their row scales) against the float32 optimum graph, on every
    step of a greedy decode, and the same greedy tokens."""
    tiny = tiny_model(family)
    model = QuestModel(quest_export(family, top_k=64, kv_dtype=kv_dtype), threads=1)
    assert model.sidecar.settings.kv_dtype == kv_dtype
    tokens, _, expected = _decode_against_optimum(model, tiny, _prompt(5), np.dtype(kv_dtype), f"{kv_dtype}-KV")
    assert tokens == [int(np.argmax(x)) for x in expected]
    cache = model.new_cache(1, capacity=64)
    model.step(cache, np.array([_prompt(5)]))
    for layer in cache.layers:
        assert (layer.key_scale is not None) == (kv_dtype == "int8")
        if kv_dtype == "int8":  # every written row has its scale, the rest still zero
            assert (layer.key_scale[0, :, :PROMPT] > 0).all() and (layer.value_scale[0, :, PROMPT:] == 0).all()


@pytest.mark.parametrize("bounds_dtype, expected", [(None, "int8"), ("float16", "float16")])
def test_int8_kv_keeps_int8_block_bounds_by_default(bounds_dtype, expected):
    """`--kv-dtype int8` bounds the blocks in int8 too (with a per-block exponent each sparse layer
    carries in place), unless --bounds-dtype says otherwise; the decode stays the float16 bounds' one
    here, where K covers every block."""
    model = QuestModel(quest_export("qwen3", top_k=64, kv_dtype="int8", bounds_dtype=bounds_dtype), threads=1)
    assert model.sidecar.bounds_dtype == expected
    for index, io in enumerate(model.sidecar.layers):
        assert (io.past_block_exponent is not None) == (io.sparse and expected == "int8"), index
    cache = model.new_cache(1, capacity=128)
    model.step(cache, np.array([_prompt(5, 40)]))
    for layer in cache.layers:
        assert layer.block_max is None or layer.block_max.dtype == np.dtype(expected)
        if layer.block_exponent is not None:  # the three blocks written (40 tokens of 16) have theirs
            assert (layer.block_exponent[0, :, :3] != 0).all() and (layer.block_exponent[0, :, 3:] == 0).all()


@pytest.mark.parametrize("kv_dtype, importance_fraction", [("float32", 0.0), ("int8", 0.0), ("int8", 0.25)])
def test_quest_nodes_name_only_the_optional_outputs_the_graph_reads(kv_dtype, importance_fraction):
    """An optional output of a Quest node has a name exactly when the graph reads it. An int8
    cache's SparseBlockAttention has outputs after its block importance (the new rows' scales), so
    the importance must be left unnamed (absent) without --importance-fraction: named, the op
    computes it in every step for nothing (it did, while the rewriter's renaming called it "v_3")."""
    folder = quest_export("qwen3", top_k=4, kv_dtype=kv_dtype, importance_fraction=importance_fraction)
    graph = onnx.load(str(folder / "model.quest.onnx"), load_external_data=False).graph
    assert [(node.name, name) for node, name in unread_optional_outputs(graph)] == []
    attention = [node for node in graph.node if node.op_type == "SparseBlockAttention"]
    assert attention, "the export has no SparseBlockAttention node to check"
    if kv_dtype == "int8":  # the new rows' scales after the importance are read: named
        assert all(len(node.output) == 6 and node.output[4] and node.output[5] for node in attention)
    importance = [node.output[3] if len(node.output) > 3 else "" for node in attention]
    assert [name != "" for name in importance] == [importance_fraction > 0 and i in _sparse(folder)
                                                   for i in range(len(attention))]


def _sparse(folder) -> list[int]:
    return QuestModel(folder, threads=1).sidecar.sparse_layers


def test_int8_kv_refuses_what_it_cannot_serve():
    """int8 caches are the Quest ops' format: the GroupQueryAttention baseline and the probe score
    (which reads a float key cache) refuse them by name, as settings, before any export work."""
    with pytest.raises(ValueError, match="'gqa'"):
        SparseSettings(top_k=4, kv_dtype="int8", attention="gqa")
    with pytest.raises(ValueError, match="probe"):
        SparseSettings(top_k=4, kv_dtype="int8", score="probe")


def test_capacity_is_checked_before_anything_runs():
    model = QuestModel(quest_export("qwen3", top_k=64), threads=1)
    cache = model.new_cache(1, capacity=32)
    model.step(cache, np.array([_prompt(6, 30)]))
    before = {name: array.copy() for name, array in cache.buffers.items()}
    with pytest.raises(CapacityError, match="capacity 32"):
        model.step(cache, np.array([[1, 2, 3]]))
    assert cache.lengths.tolist() == [30]
    for name, array in cache.buffers.items():
        np.testing.assert_array_equal(array, before[name])
    model.step(cache, np.array([[1, 2]]))  # still usable up to the capacity
    assert cache.lengths.tolist() == [32]


def test_a_layer_that_does_not_match_is_named():
    import onnx_ir as ir

    tiny = tiny_model("qwen3")
    model = ir.load(tiny.optimum)
    softmax = next(n for n in model.graph if n.op_type == "Softmax" and "layers.1/" in (n.name or ""))
    softmax.op_type = "LogSoftmax"  # layer 1's attention no longer has the expected structure
    geometry = Geometry(3, 4, 2, 16, "float32")
    with pytest.raises(ExportError, match="layer 1"):
        rewrite_attention(model, SparseSettings(top_k=4), geometry)


def test_wrong_family_is_refused_and_nothing_is_written(tmp_path):
    from quest_ort.pipeline import export_sparse

    output = tmp_path / "out"
    with pytest.raises(ExportError, match="llama"):
        export_sparse("qwen3", output=output, settings=SparseSettings(top_k=4),
                      model=str(tiny_model("llama").checkpoint), log=lambda *a, **k: None)
    assert not output.exists()
    assert not any(p.name.startswith(".quest-export-") for p in tmp_path.iterdir())


@pytest.mark.parametrize("score, importance_fraction, group_reduce",
                         [("probe", 0.0, "mean"), ("bound", 0.5, "mean"), ("probe", 0.5, "mean"), ("bound", 0.0, "none")])
def test_policy_exports_match_optimum_when_the_budget_covers(score, importance_fraction, group_reduce):
    tiny = tiny_model("qwen3")
    folder = quest_export("qwen3", top_k=64, score=score, importance_fraction=importance_fraction,
                          group_reduce=group_reduce)
    model = QuestModel(folder, threads=1)
    assert (model.sidecar.settings.score, model.sidecar.settings.importance_fraction) == (score, importance_fraction)
    _decode_against_optimum(model, tiny, _prompt(7), np.float32,
                            f"{score}/importance {importance_fraction}/{group_reduce}")


def test_importance_accumulates_the_attention_mass_of_every_query():
    """Each query row's softmax sums to 1: after T tokens a KV head holds G * T of mass, and a
    reset cache starts from zero again."""
    folder = quest_export("qwen3", top_k=2, importance_fraction=0.5)
    model = QuestModel(folder, threads=1)
    tracking = [index for index, io in enumerate(model.sidecar.layers) if io.past_block_importance]
    assert tracking == model.sidecar.sparse_layers
    group = 4 // 2  # tiny qwen3: 4 query heads over 2 KV heads
    cache = model.new_cache(2, capacity=256)
    model.step(cache, np.array([_prompt(8, 70), _prompt(9, 70)]))
    for token in (3, 4, 5):
        model.step(cache, np.array([[token], [token]]))
    assert [index for index, layer in enumerate(cache.layers) if layer.block_importance is not None] == tracking
    for layer in (cache.layers[index] for index in tracking):
        mass = layer.block_importance
        assert mass.shape == (2, 2, 256 // 16)
        np.testing.assert_allclose(mass.sum(axis=-1), np.full((2, 2), group * 73.0), rtol=1e-5)
        assert (mass[..., (73 + 15) // 16:] == 0).all(), "blocks past the cached tokens hold mass"
    cache.reset()
    for index in tracking:
        assert not cache.layers[index].block_importance.any()
