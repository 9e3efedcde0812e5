"""int8 caches' key smoothing: the per-channel factors (pipeline/calibrate.py) and their place in the graph."""

from __future__ import annotations

import functools
import pathlib
import shutil

import numpy as np
import onnx
import pytest

from quest_ort.pipeline.calibrate import SMALLEST_FACTOR, key_channel_factors
from quest_ort.pipeline import export_sparse
from quest_ort.export.rewrite import SparseSettings
from quest_ort.export.steps import optimum_export
from quest_ort.runtime.model import QuestModel
from support.export_models import tiny_model
from support.scratch import run_folder


def test_factors_are_powers_of_two_shared_by_rotary_pairs():
    rng = np.random.default_rng(0)
    magnitude = rng.uniform(1.0, 20.0, size=(3, 2, 16))
    magnitude[1, 0, 5] = 145.0  # an outlier channel: its RoPE partner (5 + 8) takes its factor
    factors = key_channel_factors(magnitude)
    assert factors.shape == magnitude.shape and factors.dtype == np.float32
    exponents = np.log2(factors)
    assert (exponents == np.round(exponents)).all(), "every factor is a power of two"
    assert (factors[..., :8] == factors[..., 8:]).all(), "channels c and c + D/2 share a factor"
    assert (factors.max(-1) == 1).all(), "a head's largest factor is 1: queries never grow"
    assert factors[1, 0, 5] == factors[1, 0, 13] == 1.0 and (factors[1, 0] <= 2 ** -2).sum() == 14
    pair = np.maximum(magnitude[..., :8], magnitude[..., 8:])
    ratio = np.concatenate([pair, pair], -1) / factors
    ratio /= ratio.min(-1, keepdims=True)
    assert (ratio <= 2).all(), "factors follow their pair's magnitude, rounded to powers of two"


def test_near_zero_channels_are_not_magnified_without_limit():
    magnitude = np.full(8, 64.0)
    magnitude[[1, 5]] = 1e-9
    factors = key_channel_factors(magnitude)
    assert factors[1] == factors[5] == SMALLEST_FACTOR and factors[0] == 1


@pytest.mark.parametrize("bad", [0.0, np.nan, np.inf])
def test_a_head_without_usable_keys_keeps_its_channels_as_they_are(bad):
    magnitude = np.array([[1.0, 4.0, 2.0, 8.0], [bad] * 4])
    if bad != 0.0:
        magnitude[1, 0] = 3.0  # one finite channel does not make a head with NaN or inf usable
    factors = key_channel_factors(magnitude)
    assert (factors[1] == 1.0).all()
    assert (factors[0] == [0.25, 1.0, 0.25, 1.0]).all()


# --- in the graph: a tiny Qwen2 whose k projection bias gives one key channel an outlier ------------

OUTLIER = 100.0  # the bias of one key channel; the others' keys stay around 1
QUERY_GAIN = 10.0  # larger queries: the attention is peaked, as a trained model's is, so key errors show


@functools.cache
def _outlier_checkpoint() -> pathlib.Path:
    """The tiny qwen2 of support.export_models with k_proj.bias[3] = OUTLIER in every layer (and its
    optimum export beside it)."""
    import torch
    import transformers

    folder = run_folder("quest-key-outlier-")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model("qwen2").checkpoint, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_proj.bias[3] = OUTLIER
            layer.self_attn.q_proj.weight *= QUERY_GAIN
    model.save_pretrained(folder / "checkpoint")
    optimum_export(folder / "checkpoint", folder / "optimum")
    return folder


@functools.cache
def _export(key_smoothing: bool) -> pathlib.Path:
    folder = _outlier_checkpoint()
    output = folder / f"int8-smoothing-{key_smoothing}"
    settings = SparseSettings(top_k=4, block_size=16, dense_layers=(0,), kv_dtype="int8", key_smoothing=key_smoothing)
    export_sparse("qwen2", output=output, settings=settings, model=str(folder / "checkpoint"), capacity=128,
                  validate=False, log=lambda *a, **k: None)
    return output


def _worst_relative_difference(folder: pathlib.Path) -> float:
    """The largest |logit difference| from the optimum graph over a 40-token prefill and 8 decode
    steps (the budget covers the context), relative to the logits' scale."""
    from quest_ort.runtime.dense import OptimumModel

    model = QuestModel(folder, threads=1)
    source = OptimumModel(_outlier_checkpoint() / "optimum" / "model.onnx", threads=1)
    ids = np.random.default_rng(7).integers(0, 256, size=(1, 48))
    cache, source_cache = model.new_cache(1, capacity=64), source.new_cache(1)
    worst = 0.0
    for piece in [ids[:, :40]] + [ids[:, t : t + 1] for t in range(40, 48)]:
        got, expected = model.step(cache, piece)[0], source.step(source_cache, piece)[0]
        worst = max(worst, float(np.abs(got - expected).max() / max(np.abs(expected).max(), 1.0)))
    return worst


def test_smoothing_rescales_the_outlier_channel_and_shrinks_the_int8_error():
    """The factors put the outlier channel (and its RoPE partner, 3 + 8) near 1 against the others,
    every attention node's query and keys pass through the Mul, the sidecar says so, and the
    logits' int8 error from the float optimum graph shrinks against the unsmoothed export's."""
    smoothed, plain = _export(True), _export(False)
    assert QuestModel(smoothed, threads=1).sidecar.settings.key_smoothing
    assert not QuestModel(plain, threads=1).sidecar.settings.key_smoothing
    graph = onnx.load(str(smoothed / "model.quest.onnx"))
    producers = {output: node for node in graph.graph.node for output in node.output}
    attention = [node for node in graph.graph.node if node.op_type == "SparseBlockAttention"]
    assert len(attention) == 3
    for node in attention:
        assert producers[node.input[0]].op_type == producers[node.input[1]].op_type == "Mul"
    with_smoothing, without = _worst_relative_difference(smoothed), _worst_relative_difference(plain)
    assert with_smoothing < without / 2, (with_smoothing, without)  # measured 0.034 against 0.094


def test_a_graph_that_skips_the_smoothing_is_refused(tmp_path):
    """A sidecar that says key_smoothing over a graph whose keys reach the attention unscaled (the
    Mul bypassed) is refused, naming the field and the node."""
    folder = tmp_path / "model"
    shutil.copytree(_export(True), folder)
    graph = onnx.load(str(folder / "model.quest.onnx"), load_external_data=False)
    producers = {output: node for node in graph.graph.node for output in node.output}
    attention = next(node for node in graph.graph.node if node.op_type == "SparseBlockAttention")
    attention.input[1] = producers[attention.input[1]].input[0]
    onnx.save(graph, str(folder / "model.quest.onnx"))
    with pytest.raises(ValueError, match=f"key_smoothing.*{attention.name}.*key"):
        QuestModel(folder, threads=1)
