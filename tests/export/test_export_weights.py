"""export-sparse --weights int8|int4: MatMul weights quantized into MatMulNBits by ONNX Runtime's quantizer after the rewrite.

The Qwen3 family's default model (random weights, seed 0) exported three ways through the command; the
quantized folders hold MatMulNBits nodes in place of every float projection weight, run in the
runtime, and stay within the documented drift (pipeline/validate.py WEIGHT_TOLERANCES) of the float
export. The tiny models of the other families (tied embeddings, a K that is no multiple of the
quantization block) and the GroupQueryAttention baseline quantize too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import pathlib
import re
import shutil

import numpy as np
import onnx
import pytest

from quest_ort.apps import export_cli as cli
from quest_ort.pipeline import validate
from quest_ort.pipeline import export_sparse
from quest_ort.pipeline.validate import WEIGHT_TOLERANCES, relative_logit_error
from quest_ort.export.quantize import BLOCK_SIZE
from quest_ort.export.rewrite import ExportError, SparseSettings
from quest_ort.model_folder.folder_check import float_weight_gathers, float_weight_matmuls
from quest_ort.model_folder.settings import WEIGHT_BITS
from quest_ort.model_folder.sidecar import Sidecar
from quest_ort.ops.schemas import DOMAIN
from quest_ort.runtime.generate import Generator, Sampling, greedy
from quest_ort.runtime.model import QuestModel
from support.export_models import TINY, tiny_model
from support.scratch import run_folder

GRAPH, SIDECAR = "model.quest.onnx", "quest_model.json"
QUANTIZED = tuple(WEIGHT_BITS)
_ROOT = run_folder("quest-weights-tests-")
# The default Qwen3 has 8 layers of 7 projections (q, k, v, o, gate, up, down) and an untied LM head.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@functools.cache
def default_export(weights: str) -> tuple[pathlib.Path, str]:
    """`export-sparse qwen3 --k 4 --weights <weights>` of the embedded default model: the folder and
    what the command printed (its progress lines on stderr, then its summary on stdout)."""
    output = _ROOT / f"qwen3-{weights}"
    printed, progress = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(progress):
        status = cli.main(["qwen3", "--k", "4", "--capacity", "512", "--weights", weights, "-o", str(output)])
    assert status == 0, progress.getvalue() + printed.getvalue()
    return output, progress.getvalue() + printed.getvalue()


def _model(folder: pathlib.Path) -> onnx.ModelProto:
    return onnx.load(str(folder / GRAPH), load_external_data=False)


def _nbits(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if (n.domain, n.op_type) == ("com.microsoft", "MatMulNBits")]


def _attribute(node: onnx.NodeProto, name: str):
    return next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name)


@pytest.mark.parametrize("weights", QUANTIZED)
def test_every_projection_and_the_lm_head_become_matmulnbits_and_no_float_copy_stays(weights):
    float_model, model = _model(default_export("float")[0]), _model(default_export(weights)[0])
    float_matmuls = float_weight_matmuls(float_model.graph)
    names = {node.name for node in float_matmuls}
    assert names == {f"/model/layers.{layer}/{part}/{proj}/MatMul" for layer in range(8)
                     for part, projs in (("self_attn", PROJECTIONS[:4]), ("mlp", PROJECTIONS[4:])) for proj in projs} \
        | {"/lm_head/MatMul"}
    quantized = _nbits(model)
    assert sorted(node.output[0] for node in quantized) == sorted(node.output[0] for node in float_matmuls)
    for node in quantized:
        assert (_attribute(node, "bits"), _attribute(node, "block_size"), _attribute(node, "accuracy_level")) == (
            WEIGHT_BITS[weights], BLOCK_SIZE, 4), node.name
        assert len(node.input) == 3, f"{node.name}: symmetric blocks carry no zero points"
    assert float_weight_matmuls(model.graph) == [], "a MatMul still multiplies by a float weight"
    float_weights = {node.input[1] for node in float_matmuls}
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    assert not float_weights & set(initializers), "the float weights are still stored"
    float_embeddings = float_weight_gathers(float_model.graph)
    assert len(float_embeddings) == 1, "the float export looks up one float embedding"
    if weights == "int4":  # the embedding too, into GatherBlockQuantized (the quantizer packs Gathers in 4 bits only)
        assert float_weight_gathers(model.graph) == [] and float_embeddings[0].input[0] not in initializers
        (lookup,) = [n for n in model.graph.node if (n.domain, n.op_type) == ("com.microsoft", "GatherBlockQuantized")]
        assert _attribute(lookup, "block_size") == BLOCK_SIZE and not any(a.name == "bits" and a.i != 4 for a in lookup.attribute)
        assert lookup.output[0] == float_embeddings[0].output[0]
    else:
        assert [n.name for n in float_weight_gathers(model.graph)] == [float_embeddings[0].name], "the embedding stays float"
    quest_ops = [node.op_type for node in model.graph.node if node.domain == DOMAIN]  # the rewrite kept: 2 dense layers
    assert quest_ops.count("SparseBlockAttention") == 8 and quest_ops.count("SparseBlockSelect") == 6


def test_the_data_file_shrinks_with_the_bits():
    sizes = {weights: (default_export(weights)[0] / (GRAPH + ".data")).stat().st_size for weights in ("float",) + QUANTIZED}
    # float32 projections become 1 or 0.5 byte per weight plus a float32 scale per block of 32
    assert sizes["int4"] < sizes["int8"] < 0.45 * sizes["float"], sizes


@pytest.mark.parametrize("weights", QUANTIZED)
def test_the_sidecar_records_the_weight_type(weights):
    folder = default_export(weights)[0]
    text = (folder / SIDECAR).read_text()
    keys = list(json.loads(text))
    assert json.loads(text)["weights"] == weights and keys.index("weights") == keys.index("bounds_dtype") + 1
    model = QuestModel(folder, threads=1)
    assert model.sidecar.settings.weights == weights
    assert model.sidecar.to_json() + "\n" == text, "read and written again, the sidecar is not the same bytes"
    assert "weights" not in json.loads((default_export("float")[0] / SIDECAR).read_text()), \
        "a float export writes format 1's fields only"


@pytest.mark.parametrize("weights", QUANTIZED)
def test_the_command_reports_the_drift_it_validated(weights):
    printed = default_export(weights)[1]
    found = re.search(rf"validation of the {weights} weights: relative logit error vs the float source = ([0-9.]+) "
                      rf"\(tolerance ([0-9.]+)\)", printed)
    assert found, printed
    assert 0 < float(found[1]) <= float(found[2]) == WEIGHT_TOLERANCES[weights]
    assert re.search(rf"\[\d+/7\] quantizing the MatMul weights to {weights}", printed), printed


def _teacher_forced_logits(model: QuestModel, prompt: list[int], forced: list[int]) -> np.ndarray:
    """The last-position logits of the prompt's exact prefill, then of each forced token (sparse decode)."""
    cache = model.new_cache(1)
    steps = [model.step(cache, np.array([prompt]), exact=True)[0, -1]]
    steps += [model.step(cache, np.array([[token]]))[0, -1] for token in forced]
    return np.stack(steps)


@pytest.mark.parametrize("weights", QUANTIZED)
def test_the_quantized_folder_generates_within_the_tolerance_of_the_float_export(weights):
    """Greedy decoding past the 32-token budget (sparse selection on), the quantized model fed the
    float model's tokens: its logits stay within the tolerance; both generate through Generator."""
    reference, quantized = (QuestModel(default_export(w)[0], threads=1) for w in ("float", weights))
    prompt = np.random.default_rng(7).integers(0, reference.vocab_size, 60).tolist()
    tokens = greedy(reference, [prompt], 12)[0]
    error = relative_logit_error(_teacher_forced_logits(quantized, prompt, tokens[:-1]),
                                 _teacher_forced_logits(reference, prompt, tokens[:-1]))
    assert 0 < error <= WEIGHT_TOLERANCES[weights], error
    generated = Generator(quantized).generate([prompt, prompt[:20]], Sampling(max_new_tokens=12))
    assert [len(row) for row in generated] == [12, 12]
    assert all(0 <= token < quantized.vocab_size for row in generated for token in row)


@pytest.mark.parametrize("family, attention", [(family, "quest") for family in TINY] + [("llama", "gqa")])
def test_tiny_families_and_the_baseline_quantize_to_int4_and_validate(family, attention, tmp_path):
    """Llama and Qwen2 tie their embeddings (the LM head keeps its own transposed copy); Qwen2's
    hidden size 112 is no multiple of the 32-weight blocks; the GroupQueryAttention baseline."""
    settings = SparseSettings(top_k=2, block_size=16, dense_layers=(0,), attention=attention, weights="int4")
    report = export_sparse(family, output=tmp_path / "out", settings=settings, model=str(tiny_model(family).checkpoint),
                           capacity=256, log=lambda *a, **k: None)
    model = _model(tmp_path / "out")
    assert len(_nbits(model)) == len(report.quantized.matmuls) == 7 * TINY[family]["num_hidden_layers"] + 1
    assert float_weight_matmuls(model.graph) == []
    assert report.weight_drift.relative_error <= WEIGHT_TOLERANCES["int4"]
    tokens = greedy(QuestModel(tmp_path / "out", threads=1), [list(range(3, 40))], 6)[0]
    assert len(tokens) == 6


@pytest.mark.parametrize("kind", ["constant", "unrelated"])
def test_logits_that_carry_no_information_are_refused_whatever_the_tolerance(kind, monkeypatch):
    """Logits near-constant over the vocabulary drift by a relative error of about 1, inside int4's
    1.2: the spread and correlation checks refuse them (and unrelated logits of the same spread)."""
    rng = np.random.default_rng(3)
    expected = rng.standard_normal((4, 256)) * 3.0
    got = {"constant": expected.mean(-1, keepdims=True) + 0.01 * rng.standard_normal((4, 256)),
           "unrelated": rng.standard_normal((4, 256)) * 3.0}[kind]
    total = validate.LogitErrorSum()
    total.add(got, expected)
    assert (total.value < WEIGHT_TOLERANCES["int4"]) == (kind == "constant")  # the tolerance alone lets it pass
    monkeypatch.setitem(validate.WEIGHT_TOLERANCES, "int4", 10.0)  # whatever the tolerance says
    monkeypatch.setattr(validate, "_comparisons", lambda source, quest: iter([("a step", got, expected)]))
    with pytest.raises(ExportError, match="carry little of the source's information"):
        validate.validate_drift(None, default_export("int4")[0])


def test_a_drift_beyond_the_tolerance_fails_the_export_naming_it(tmp_path, monkeypatch):
    """Never silently wrong: an int4 export measured above its bound stops with the measure, the
    bound and where it is set, and writes nothing."""
    monkeypatch.setitem(validate.WEIGHT_TOLERANCES, "int4", 1e-3)
    settings = SparseSettings(top_k=2, block_size=16, dense_layers=(0,), weights="int4")
    with pytest.raises(ExportError, match=r"int4 weights move the logits by a relative error of [0-9.]+ from the "
                                          r"float source graph's, above the tolerance 0.001 \(pipeline/validate.py "
                                          r"WEIGHT_TOLERANCES\)"):
        export_sparse("qwen3", output=tmp_path / "out", settings=settings, model=str(tiny_model("qwen3").checkpoint),
                      capacity=256, log=lambda *a, **k: None)
    assert not (tmp_path / "out").exists()


def test_without_validation_the_folder_is_still_quantized(tmp_path):
    settings = SparseSettings(top_k=2, block_size=16, dense_layers=(0,), weights="int8")
    report = export_sparse("qwen3", output=tmp_path / "out", settings=settings, model=str(tiny_model("qwen3").checkpoint),
                           capacity=256, validate=False, log=lambda *a, **k: None)
    assert report.weight_drift is None and report.validation_max_abs_diff is None
    assert {_attribute(node, "bits") for node in _nbits(_model(tmp_path / "out"))} == {8}
    QuestModel(tmp_path / "out", threads=1)


@pytest.mark.parametrize("value", ["int3", "fp16", "INT4", "4", ""])
def test_a_bad_weights_value_is_refused_before_any_work(value, tmp_path, capsys):
    argv = ["onnx", "--model", str(tmp_path / "missing.onnx"), "--k", "4", f"--weights={value}", "-o", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("export-sparse: error: argument --weights: invalid choice: ") and \
        "'float', 'int8', 'int4'" in message, message
    with pytest.raises(ValueError, match=r"weights must be one of \['float', 'int8', 'int4'\]"):
        SparseSettings(top_k=4, weights=value)
    assert not (tmp_path / "out").exists()


def _copy(source: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(source, tmp_path / "model"))


def _set_weights(folder: pathlib.Path, weights) -> None:
    data = json.loads((folder / SIDECAR).read_text())
    data["weights"] = weights
    (folder / SIDECAR).write_text(json.dumps(data))


@pytest.mark.parametrize("source, recorded, words", [
    ("float", "int4", ["weights is 'int4'", "there is no MatMulNBits node"]),
    ("int4", "int8", ["weights is 'int8'", "has bits = 4"]),
    ("int4", "int2", ["weights must be one of ['float', 'int8', 'int4'], got 'int2'"]),
])
def test_a_sidecar_whose_weights_disagree_with_the_graph_is_refused(source, recorded, words, tmp_path):
    folder = _copy(default_export(source)[0], tmp_path)
    _set_weights(folder, recorded)
    with pytest.raises(ValueError) as info:
        QuestModel(folder, threads=1)
    message = str(info.value)
    assert "\n" not in message and SIDECAR in message and all(word in message for word in words), message


def test_an_int4_folder_that_kept_a_float_embedding_is_refused(tmp_path, monkeypatch):
    """An int4 folder quantizes its embedding as well: one whose lookup table stayed float (written
    before, or by a quantizer that skipped it) is refused when opened, naming the Gather."""
    from quest_ort.export import quantize

    monkeypatch.setitem(quantize.QUANTIZED_OPS, "int4", ("MatMul",))
    folder = _copy(default_export("float")[0], tmp_path)
    model_file = folder / GRAPH
    assert quantize.quantize_model(model_file, model_file, "int4").gathers == ()
    sidecar = Sidecar.read(folder)
    sidecar.settings = dataclasses.replace(sidecar.settings, weights="int4")
    sidecar.write(folder)
    with pytest.raises(ValueError) as info:
        QuestModel(folder, threads=1)
    message = str(info.value)
    assert "weights is 'int4'" in message and "Gather node" in message and "float initializer" in message, message


def test_a_folder_without_the_field_reads_as_float(tmp_path):
    """Sidecars written before the field (and float exports) hold no `weights`: float."""
    folder = _copy(default_export("float")[0], tmp_path)
    data = json.loads((folder / SIDECAR).read_text())
    assert "weights" not in data
    assert QuestModel(folder, threads=1).sidecar.settings.weights == "float"
    _set_weights(folder, "float")  # written out explicitly: the same
    assert QuestModel(folder, threads=1).sidecar.settings.weights == "float"


@pytest.mark.parametrize("weights", QUANTIZED)
def test_a_source_with_quantized_weights_is_refused_before_any_work(weights, tmp_path):
    """Quantizing MatMulNBits again is not a thing ONNX Runtime's quantizer does, and a folder mixing
    bits would be refused when opened: a packed source is refused at once, naming the node."""
    from quest_ort.pipeline import rewrite_onnx

    folder, _ = default_export("int4")
    settings = SparseSettings(top_k=4, weights=weights)
    with pytest.raises(ExportError, match="quantized weights already .*MatMulNBits node"):
        rewrite_onnx(folder / GRAPH, output=tmp_path / "out", settings=settings, log=lambda *a, **k: None)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("weights", ["float", "int4"])
def test_each_folder_sidecar_is_written_once_from_the_rewrites_settings(weights, tmp_path, monkeypatch):
    """The settings are resolved once, by the rewrite, and the output's sidecar is those settings,
    written once (quantized weights: a float folder validated first, with its own sidecar, then the
    quantized folder's; the quantizer writes none)."""
    written, write = [], Sidecar.write
    monkeypatch.setattr(Sidecar, "write", lambda self, folder: written.append(
        (pathlib.Path(folder).name, self.settings.weights)) or write(self, folder))
    settings = SparseSettings(top_k=4, weights=weights)
    report = export_sparse("qwen3", output=tmp_path / "out", settings=settings, capacity=512, log=lambda *a, **k: None)
    assert written == ([("out", "float")] if weights == "float" else [("float", "float"), ("out", "int4")])
    recorded = Sidecar.read(tmp_path / "out").settings
    assert recorded == report.rewrite.settings and recorded.weights == weights
    assert recorded.kv_dtype == "float32" and recorded.bounds_dtype == "float16" and recorded.dense_layers == (0, 1)
