"""The onnxruntime-genai files the exporter writes (export/genai_variant.py), checked without genai:
the config names what the graph has, and the variant run as genai runs it (lengths from an
attention mask, every past/present pair one buffer, the block max folded to rank 3) gives the
logits of the exported graph; folders genai cannot carry get no files and a reason.
(`make test-genai` runs the folder in genai itself: test_genai_runs_the_export.py.)"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quest_ort.pipeline import export_sparse
from quest_ort.export.genai_variant import GENAI_CONFIG_FILE, GENAI_MODEL_FILE, LIBRARY_FILE
from quest_ort.export.rewrite import SparseSettings
from quest_ort.runtime.binding import InPlaceStep
from quest_ort.runtime.model import QuestModel
from quest_ort.runtime.sessions import NUMPY_TYPES, make_session
from support.export_models import TEXT_VOCAB, text_export, tiny_model


def test_the_config_names_the_variants_inputs_outputs_and_sizes():
    folder = text_export()
    sidecar = QuestModel(folder).sidecar
    config = json.loads((folder / GENAI_CONFIG_FILE).read_text())["model"]
    decoder = config["decoder"]
    graph = onnx.load(str(folder / GENAI_MODEL_FILE), load_external_data=False).graph
    inputs = {value.name: [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]
              for value in graph.input}
    assert decoder["session_options"]["custom_ops_library"] == LIBRARY_FILE and (folder / LIBRARY_FILE).is_file()
    assert (config["context_length"], config["vocab_size"], decoder["num_key_value_heads"], decoder["head_size"]) == (
        sidecar.capacity, sidecar.vocab_size, sidecar.geometry.kv_num_heads, sidecar.geometry.head_dim)
    assert set(inputs) == {"input_ids", "attention_mask"} | {
        pattern % layer for layer in range(sidecar.geometry.num_layers) for pattern in ("past_key.%d", "past_value.%d")
    } | {pattern % layer for layer in sidecar.sparse_layers for pattern in ("past_block_max.%d", "past_block_min.%d")}
    blocks, heads, size = -(-sidecar.capacity // 8), sidecar.geometry.kv_num_heads, sidecar.geometry.head_dim
    layer = sidecar.sparse_layers[0]
    assert inputs[f"past_key.{layer}"][1:] == [heads, sidecar.capacity, size]
    assert inputs[f"past_block_max.{layer}"][1:] == [heads * blocks, size]  # genai's rank-3 state
    assert inputs[f"past_block_min.{layer}"][1:] == [heads, blocks, size]   # and its rank-4 one
    # the weights are the folder's: the variant names the same data file and adds none
    assert {entry.value for init in graph.initializer for entry in init.external_data if entry.key == "location"} == {
        sidecar.model_file + ".data"}


def test_the_variant_run_as_genai_runs_it_gives_the_exported_graphs_logits():
    folder = text_export()
    model = QuestModel(folder, threads=1)
    session = make_session(str(folder / GENAI_MODEL_FILE), threads=1)
    # genai's buffers: every past input at its fixed shape (batch 1), zeroed, bound as its present too
    states = {value.name: np.zeros([d if isinstance(d, int) else 1 for d in value.shape], NUMPY_TYPES[value.type])
              for value in session.get_inputs() if value.name.startswith("past_")}
    state_values = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in states.items()}
    step = InPlaceStep(session, {name.replace("past_", "present_", 1): name for name in states})
    cache = model.new_cache(1)
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, TEXT_VOCAB, 90)  # then decode past the 32-token budget
    tokens, total = [prompt], 0
    for step_index in range(12):
        ids = tokens[-1][None].astype(np.int64)
        total += ids.shape[1]
        genai = step.run({"input_ids": ids, "attention_mask": np.ones((1, total), np.int64), **state_values})["logits"]
        ours = model.step(cache, ids, exact=step_index == 0)
        np.testing.assert_array_equal(genai, ours, err_msg=f"step {step_index}")
        tokens.append(ours[0, -1].argmax()[None])


@pytest.mark.parametrize("settings, reason", [
    (dict(kv_dtype="int8"), "int8 caches"),
    (dict(bounds_dtype="int8"), "int8 block bounds"),
    (dict(importance_fraction=0.25), "block importance"),
])
def test_folders_genai_cannot_carry_get_no_files_and_a_reason(settings, reason, tmp_path):
    report = export_sparse("qwen3", output=tmp_path / "out", settings=SparseSettings(top_k=4, **settings),
                           model=str(tiny_model("qwen3").checkpoint), capacity=128, validate=False,
                           log=lambda *a, **k: None)
    assert reason in report.genai and not (tmp_path / "out" / GENAI_CONFIG_FILE).exists()
