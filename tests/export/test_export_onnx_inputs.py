"""Models that arrive already exported: GenAI GroupQueryAttention graphs and opset-23 Attention graphs,
rewritten by `export-sparse onnx`, against the original graphs in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from quest_ort.pipeline import rewrite_onnx
from quest_ort.pipeline.validate import WEIGHT_TOLERANCES
from quest_ort.export.rewrite import ExportError, SparseSettings
from quest_ort.runtime.generate import greedy
from quest_ort.runtime.model import QuestModel
from support.attention_graphs import VOCAB, attention23_model, genai_gqa_model, greedy_against_original, weights

GRAPHS = {
    "gqa-separate": lambda w: genai_gqa_model(False, w),
    "gqa-packed": lambda w: genai_gqa_model(True, w),
    "attention23": attention23_model,
}


def _export(kind, tmp_path, top_k, dense_layers=(0,), weight_type="float"):
    model = GRAPHS[kind](weights())
    onnx.checker.check_model(model)
    source = tmp_path / "source"
    source.mkdir()
    stored = onnx.ModelProto()
    stored.CopyFrom(model)  # saving with external data rewrites the proto it is given
    onnx.save(stored, str(source / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    settings = SparseSettings(top_k=top_k, block_size=8, dense_layers=dense_layers, weights=weight_type)
    report = rewrite_onnx(source / "model.onnx", output=tmp_path / "quest", settings=settings, capacity=256,
                          log=lambda *a, **k: None)
    return model, report


@pytest.mark.parametrize("kind", list(GRAPHS))
def test_rewritten_graph_matches_the_original(kind, tmp_path):
    model, report = _export(kind, tmp_path, top_k=64)  # 64 blocks of 8 cover the context: dense
    assert report.rewrite.kind == ("genai" if kind.startswith("gqa") else "attention23")
    greedy_against_original(report.output, model, 9, kind, seed=7)


@pytest.mark.parametrize("kind", list(GRAPHS))
def test_small_budget_runs_sparse(kind, tmp_path):
    _, report = _export(kind, tmp_path, top_k=2)
    quest = QuestModel(report.output, threads=1)
    assert quest.sidecar.sparse_layers == [1]
    prompt = np.random.default_rng(8).integers(0, VOCAB, 60).tolist()
    tokens = greedy(quest, [prompt, prompt[:33]], 4)
    assert len(tokens) == 2 and all(len(row) == 4 for row in tokens)


@pytest.mark.parametrize("kind", list(GRAPHS))
def test_exported_graphs_quantize_too(kind, tmp_path):
    """`export-sparse onnx --weights int8`: every MatMul weight of the input graph (projections, LM
    head) becomes MatMulNBits, and the drift from the input graph is validated."""
    model, report = _export(kind, tmp_path, top_k=2, weight_type="int8")
    initializers = {tensor.name for tensor in model.graph.initializer}
    weighted = [node.name for node in model.graph.node if node.op_type == "MatMul" and node.input[1] in initializers]
    assert len(report.quantized.matmuls) == len(weighted) > 0
    assert report.weight_drift.relative_error <= WEIGHT_TOLERANCES["int8"]
    assert QuestModel(report.output, threads=1).sidecar.settings.weights == "int8"


def test_output_next_to_the_input_is_refused(tmp_path):
    model = GRAPHS["gqa-packed"](weights())
    onnx.save(model, str(tmp_path / "model.onnx"))
    with pytest.raises(ExportError, match="may not contain or be inside"):
        rewrite_onnx(tmp_path / "model.onnx", output=tmp_path / "quest", settings=SparseSettings(top_k=4),
                     log=lambda *a, **k: None)
