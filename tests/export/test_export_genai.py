"""Models written by onnxruntime-genai's model builder through `export-sparse onnx`: builder-style
graphs made here (int4 MatMulNBits, SimplifiedLayerNormalization, GroupQueryAttention with internal
rotary, a symbolic kv_cache_dim, genai_config.json; every `make test`), and the builder's own output
(`make test-genai`: the builder runs in a venv of its own, tests/export/genai_builder_model.py)."""

from __future__ import annotations

import json
import os
import pathlib
import re

import numpy as np
import onnx
import pytest
from onnx import helper

from quest_ort.apps.export_cli import main as export_cli
from quest_ort.pipeline import rewrite_onnx
from quest_ort.pipeline.validate import INT8_ACTIVATION_TOLERANCE, SourceRunner
from quest_ort.export.rewrite import ExportError, SparseSettings, geometry_from_graph
from quest_ort.export.steps import MODEL_FILE, check_model_path
from quest_ort.runtime.generate import greedy
from quest_ort.runtime.model import QuestModel
from support.attention_graphs import (HEAD_DIM, HEADS, KV_HEADS, LAYERS, MAX_POSITIONS, VOCAB, genai_gqa_model,
                                      run_original, weights)
from support.tolerances import TOLERANCES

QUIET = dict(log=lambda *a, **k: None)


def builder_style(packed: bool, interleaved: bool = False, accuracy_level: int = 0,
                  hide_query_width: bool = False) -> onnx.ModelProto:
    """support.attention_graphs' GQA graph dressed as the builder writes it:

    ```
    input_ids -Gather-SimplifiedLayerNormalization--> x0 (ONNX Runtime's op in the default domain)
    every MatMul -> MatMulNBits (4 bits, blocks of 16, onnxruntime's own quantizer, `accuracy_level`)
    past/present [batch, N, length, kv_cache_dim]; GQA rotary_interleaved as asked
    [hide_query_width] MatMulNBits -Identity--> GQA query: no shape states the head size
    ```
    """
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = genai_gqa_model(packed, weights())
    graph = model.graph
    embedding = next(node for node in graph.node if node.op_type == "Gather" and node.input[1] == "input_ids")
    embedding.output[0] = "embedded"
    norm_weight = np.random.default_rng(3).uniform(0.8, 1.2, graph.initializer[0].dims[1]).astype(np.float32)
    graph.initializer.append(onnx.numpy_helper.from_array(norm_weight, "norm_weight"))
    graph.node.insert(list(graph.node).index(embedding) + 1, helper.make_node(
        "SimplifiedLayerNormalization", ["embedded", "norm_weight"], ["x0"], epsilon=1e-6, axis=-1, stash_type=1))
    for node in graph.node:
        if node.op_type == "GroupQueryAttention":
            node.attribute.append(helper.make_attribute("rotary_interleaved", int(interleaved)))
    for value in list(graph.input) + list(graph.output):
        if value.name.startswith(("past_key_values.", "present.")):
            dim = value.type.tensor_type.shape.dim[3]
            dim.Clear()
            dim.dim_param = "kv_cache_dim"
    quantizer = MatMulNBitsQuantizer(model, block_size=16, is_symmetric=True, accuracy_level=accuracy_level)
    quantizer.process()
    model = quantizer.model.model
    if hide_query_width:
        for node in list(model.graph.node):
            if node.op_type == "GroupQueryAttention":
                hidden = node.input[0] + "_hidden"
                model.graph.node.insert(list(model.graph.node).index(node),
                                        helper.make_node("Identity", [node.input[0]], [hidden]))
                node.input[0] = hidden
    return model


def genai_config(head_size: int = HEAD_DIM, context_length: int = MAX_POSITIONS) -> dict:
    """What the builder writes that the export reads (its other fields are ignored)."""
    return {"model": {"context_length": context_length, "eos_token_id": [3, 5], "type": "llama",
                      "decoder": {"head_size": head_size, "num_attention_heads": HEADS,
                                  "num_key_value_heads": KV_HEADS, "num_hidden_layers": LAYERS,
                                  "filename": "model.onnx"}}}


def save_source(model: onnx.ModelProto, folder: pathlib.Path, config: dict | None = None) -> pathlib.Path:
    folder.mkdir()
    stored = onnx.ModelProto()
    stored.CopyFrom(model)  # saving with external data rewrites the proto it is given
    onnx.save(stored, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    if config is not None:
        (folder / "genai_config.json").write_text(json.dumps(config))
    return folder / "model.onnx"


def op_count(path: pathlib.Path, op_type: str) -> int:
    return sum(node.op_type == op_type for node in onnx.load(str(path), load_external_data=False).graph.node)


VARIANTS = {"packed": (True, False), "packed, interleaved rotary": (True, True),
            "separate": (False, False), "separate, interleaved rotary": (False, True)}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_builder_style_graph_matches_the_original(variant, tmp_path):
    packed, interleaved = VARIANTS[variant]
    model = builder_style(packed, interleaved)
    source = save_source(model, tmp_path / "source", genai_config())
    report = rewrite_onnx(source, output=tmp_path / "quest", settings=SparseSettings(top_k=64, block_size=8,
                                                                                     dense_layers=(0,)), **QUIET)
    # float32 math in every MatMulNBits (accuracy_level 0): the Quest graph equals the source up to
    # summation order (the normalized activations make logits of magnitude ~100 here), float32's
    # tolerance. ONNX Runtime's own kernels sum in an order of their CPU's: measured 1.24e-5 on an
    # AVX2 machine (the same with the Quest ops' scalar kernels), under 1e-5 on AVX-512.
    assert greedy_against_source(report.output, model, 9, seed=11) <= TOLERANCES[np.dtype(np.float32)].rtol
    quest = QuestModel(report.output, threads=1)
    assert (quest.sidecar.geometry.head_dim, quest.sidecar.capacity, quest.sidecar.eos_token_ids) == (HEAD_DIM,
                                                                                                       MAX_POSITIONS, [3, 5])
    saved = report.output / MODEL_FILE
    assert op_count(saved, "MatMulNBits") == op_count(source, "MatMulNBits") == 2 * LAYERS + 1 + (0 if packed else 2 * LAYERS)
    assert op_count(saved, "SimplifiedLayerNormalization") == 1 and op_count(saved, "GroupQueryAttention") == 0


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half rotary", "interleaved rotary"])
def test_int8_caches_smooth_the_keys_of_a_gqa_source(interleaved, tmp_path):
    """--kv-dtype int8 on a builder-style graph: the key ranges are measured by running the source
    on onnxruntime-genai's shared buffers, the smoothed export passes both parts of the validation
    (interleaved rotary pairs channels 2i and 2i+1, not c and c + D/2: the factors are then less
    apt, never wrong), and it decodes."""
    from quest_ort.pipeline import validate

    source = save_source(builder_style(True, interleaved), tmp_path / "source", genai_config())
    report = rewrite_onnx(source, output=tmp_path / "quest", settings=SparseSettings(
        top_k=64, block_size=8, dense_layers=(0,), kv_dtype="int8"), **QUIET)
    assert report.validation_max_abs_diff is not None and report.cache_drift.what == "int8 caches"
    assert report.cache_drift.relative_error <= validate.CACHE_TOLERANCES["int8"]
    quest = QuestModel(report.output, threads=1)  # its folder check: every attention's q and k scaled
    assert quest.sidecar.settings.key_smoothing
    assert len(greedy(quest, [list(range(5, 25))], 4)[0]) == 4


def test_int4_weights_stay_int4(tmp_path):
    """The saved graph holds the source's packed 4-bit weights and scales, byte for byte: no float detour."""
    source = save_source(builder_style(True), tmp_path / "source", genai_config())
    report = rewrite_onnx(source, output=tmp_path / "quest", settings=SparseSettings(top_k=4, block_size=8, dense_layers=(0,)),
                          validate=False, **QUIET)

    def nbits_weights(path):
        model = onnx.load(str(path))
        initializers = {init.name: onnx.numpy_helper.to_array(init) for init in model.graph.initializer}
        return {node.input[1]: [initializers[name] for name in node.input[1:3]]
                for node in model.graph.node if node.op_type == "MatMulNBits"}

    before, after = nbits_weights(source), nbits_weights(report.output / MODEL_FILE)
    assert before.keys() == after.keys() and before
    for name, (weight, scales) in before.items():
        assert weight.dtype == np.uint8 and after[name][0].dtype == np.uint8
        assert np.array_equal(weight, after[name][0]) and np.array_equal(scales, after[name][1])


def test_int8_activations_keep_the_greedy_tokens(tmp_path):
    """accuracy_level 4, as the builder writes int4 models: each MatMulNBits rounds its input rows to
    int8, so the logits move by whole rounding steps (validated within INT8_ACTIVATION_TOLERANCE of
    their scale), while the greedy tokens stay the source's."""
    model = builder_style(True, accuracy_level=4)
    source = save_source(model, tmp_path / "source", genai_config())
    report = rewrite_onnx(source, output=tmp_path / "quest", settings=SparseSettings(top_k=64, block_size=8,
                                                                                     dense_layers=(0,)), **QUIET)
    assert greedy_against_source(report.output, model, 12, seed=12) <= INT8_ACTIVATION_TOLERANCE


def greedy_against_source(folder: pathlib.Path, model: onnx.ModelProto, steps: int, seed: int) -> float:
    """Greedy decoding of the Quest folder from a random 29-token prompt; asserts that the source
    graph picks the same token at every step; returns the largest logit difference relative to the
    logits' scale (their largest magnitude, at least 1), as pipeline/validate.py measures it."""
    quest = QuestModel(folder, threads=1)
    prompt = np.random.default_rng(seed).integers(0, VOCAB, 29).tolist()
    tokens, logits = greedy(quest, [prompt], steps, return_logits=True)
    expected = run_original(model, prompt, tokens[0][:-1])
    assert tokens[0] == [int(np.argmax(x)) for x in expected]
    return max(float(np.abs(got[0] - want).max() / max(np.abs(want).max(), 1)) for got, want in zip(logits, expected))


def test_source_runner_drives_gqa_on_shared_buffers(tmp_path):
    """The validator runs a GQA source as onnxruntime-genai does: caches of C rows fed back whole,
    the attention mask telling the valid length; its logits are those of the concatenating run."""
    model = builder_style(False)
    source = save_source(model, tmp_path / "source")
    runner = SourceRunner(source, geometry_from_graph(onnx_ir_load(source)))
    runner.reset(20)
    prompt, forced = [4, 8, 15, 16, 23, 42], [7, 9]
    logits = [runner.step(np.array([ids], np.int64))[0, -1] for ids in [prompt] + [[t] for t in forced]]
    assert all(past.shape == (1, KV_HEADS, 20, HEAD_DIM) for past in runner.past.values())
    for got, want in zip(logits, run_original(model, prompt, forced)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def onnx_ir_load(path):
    import onnx_ir as ir

    return ir.load(path)


# model edits -> (genai_config.json or None, the geometry's head size, or the ExportError's words)
GEOMETRY = {
    "packed query width": (dict(packed=True), None, HEAD_DIM),
    "separate query width": (dict(packed=False), None, HEAD_DIM),
    "genai_config.json alone": (dict(packed=False, hide_query_width=True), genai_config(), HEAD_DIM),
    "genai_config.json disagrees": (dict(packed=True), genai_config(head_size=8),
                                    "head_dim is 16 by GroupQueryAttention '/model/layers.0/attn/GroupQueryAttention'"
                                    "'s query width but 8 by genai_config.json's head_size"),
    "nothing states the head size": (dict(packed=False, hide_query_width=True), None,
                                     "cannot tell the model's head_dim"),
}


@pytest.mark.parametrize("case", list(GEOMETRY))
def test_geometry_where_the_cache_dims_are_symbolic(case, tmp_path):
    edits, config, expected = GEOMETRY[case]
    source = save_source(builder_style(**edits), tmp_path / "source", config)
    if isinstance(expected, str):
        with pytest.raises(ExportError, match=re.escape(expected)):
            geometry_from_graph(onnx_ir_load(source), folder=source.parent)
        return
    geometry = geometry_from_graph(onnx_ir_load(source), folder=source.parent)
    assert (geometry.num_layers, geometry.num_heads, geometry.kv_num_heads, geometry.head_dim) == (
        LAYERS, HEADS, KV_HEADS, expected)


def test_capacity_past_the_rotary_cache_is_refused(tmp_path):
    source = save_source(builder_style(True), tmp_path / "source")
    with pytest.raises(ExportError, match=r"layer 0: .*input 'cos_cache' holds the angles of 512 positions, fewer "
                                          r"than the capacity of 1024 tokens \(export with a capacity of at most 512\)"):
        rewrite_onnx(source, output=tmp_path / "quest", settings=SparseSettings(top_k=4), capacity=1024, **QUIET)


def test_default_capacity_is_the_builder_context(tmp_path):
    source = save_source(builder_style(True), tmp_path / "source", genai_config(context_length=300))
    report = rewrite_onnx(source, output=tmp_path / "quest", settings=SparseSettings(top_k=4, block_size=8, dense_layers=(0,)),
                          validate=False, **QUIET)
    assert QuestModel(report.output, threads=1).sidecar.capacity == 300


def _drop_attribute(op_type, name):
    def edit(model):
        node = next(n for n in model.graph.node if n.op_type == op_type)
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend(kept)
    return edit


def _add_attribute(op_type, name, value):
    def edit(model):
        next(n for n in model.graph.node if n.op_type == op_type).attribute.append(helper.make_attribute(name, value))
    return edit


def _drop_input(op_type, index):
    def edit(model):
        node = next(n for n in model.graph.node if n.op_type == op_type)
        node.input[index] = ""
    return edit


# an edit of the saved Quest graph -> what the checker says
BROKEN = {
    "MatMulNBits without its required K": (_drop_attribute("MatMulNBits", "K"), "Required attribute 'K'"),
    "MatMulNBits without its scales": (_drop_input("MatMulNBits", 2), "input 2 is marked single"),
    "SimplifiedLayerNormalization with an unknown attribute": (
        _add_attribute("SimplifiedLayerNormalization", "flavour", 1), "Unrecognized attribute: flavour"),
    "SparseBlockSelect with an unknown attribute": (_add_attribute("SparseBlockSelect", "flavour", 1),
                                                   "Unrecognized attribute: flavour"),
    "SparseBlockAttention without num_heads": (_drop_attribute("SparseBlockAttention", "num_heads"),
                                              "Required attribute 'num_heads'"),
}


def test_checker_passes_the_contrib_ops_it_knows(tmp_path):
    source = save_source(builder_style(True), tmp_path / "source", genai_config())
    report = rewrite_onnx(source, output=tmp_path / "quest", settings=SparseSettings(top_k=4, block_size=8, dense_layers=(0,)),
                          validate=False, **QUIET)
    check_model_path(report.output / MODEL_FILE)


@pytest.mark.parametrize("case", list(BROKEN))
def test_checker_refuses_broken_contrib_and_quest_nodes(case, tmp_path):
    """ONNX Runtime's contrib ops are checked against its own schemas, the Quest ops against theirs."""
    edit, words = BROKEN[case]
    source = save_source(builder_style(True), tmp_path / "source", genai_config())
    report = rewrite_onnx(source, output=tmp_path / "quest", settings=SparseSettings(top_k=4, block_size=8, dense_layers=(0,)),
                          validate=False, **QUIET)
    model = onnx.load(str(report.output / MODEL_FILE), load_external_data=False)
    edit(model)
    broken = report.output / "broken.onnx"  # beside the data file its tensors point to
    onnx.save(model, str(broken))
    with pytest.raises(Exception, match=re.escape(words)):
        check_model_path(broken)


# --- make test-genai: the builder's own models ---------------------------------------------------

GENAI_FAMILIES = ("llama", "qwen2", "qwen3")  # what `make test-genai` builds (tests/export/genai_builder_model.py)
PROMPT_TOKENS, NEW_TOKENS = 100, 32  # 132 tokens: inside --k 32's 1024-token budget (the sparse path exact)


def genai_generator_greedy(folder: pathlib.Path, prompt: list[int], steps: int) -> list[int]:
    """The builder model's greedy tokens by onnxruntime-genai's own Generator, run in the builder's
    venv (QUEST_ORT_GENAI_PYTHON, set by the make targets; tests/export/genai_og_greedy.py)."""
    import subprocess

    python = os.environ.get("QUEST_ORT_GENAI_PYTHON")
    if not python:
        pytest.fail("QUEST_ORT_GENAI_PYTHON is not set: run these tests with `make test-genai`")
    script = pathlib.Path(__file__).with_name("genai_og_greedy.py")
    done = subprocess.run([python, str(script), str(folder), str(steps), json.dumps(prompt)], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def builder_model(name: str) -> pathlib.Path:
    root = os.environ.get("QUEST_ORT_GENAI_MODELS")
    if not root:
        pytest.fail("QUEST_ORT_GENAI_MODELS is not set: run these tests with `make test-genai`, which builds the models")
    path = pathlib.Path(root) / name / "onnx" / "model.onnx"
    assert path.is_file(), f"{path} is missing: `make test-genai` builds it"
    return path


class GenaiRunner:
    """A builder model in plain ONNX Runtime, fed as onnxruntime-genai feeds it (its
    past_present_share_buffer: caches of max_length rows given back whole at each step, the
    attention mask as long as the tokens so far), with the names its genai_config.json gives."""

    def __init__(self, path: pathlib.Path, rows: int):
        import onnxruntime as ort

        self.decoder = json.loads((path.parent / "genai_config.json").read_text())["model"]["decoder"]
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.session.get_outputs()]
        shape = (1, self.decoder["num_key_value_heads"], rows, self.decoder["head_size"])
        self.past = {self._name("inputs", "past", kind, layer): np.zeros(shape, np.float32)
                     for layer in range(self.decoder["num_hidden_layers"]) for kind in ("key", "value")}
        self.length = 0

    def _name(self, side: str, role: str, kind: str, layer: int) -> str:
        return self.decoder[side][f"{role}_{kind}_names"] % layer

    def step(self, ids: list[int]) -> np.ndarray:
        """The logits of the last of `ids`, appended to the cache."""
        self.length += len(ids)
        values = dict(zip(self.outputs, self.session.run(None, {
            "input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, self.length), np.int64), **self.past})))
        for layer in range(self.decoder["num_hidden_layers"]):
            for kind in ("key", "value"):
                self.past[self._name("inputs", "past", kind, layer)] = values[self._name("outputs", "present", kind, layer)]
        return values["logits"][0, -1]


def _export_builder_model(name: str, folder: pathlib.Path, capsys) -> tuple[pathlib.Path, QuestModel]:
    """`export-sparse onnx --model model.onnx --k 32`, as a user runs it; checks what it printed and
    that the int4 MatMulNBits are still there."""
    source = builder_model(name)
    assert export_cli(["onnx", "--model", str(source), "--k", "32", "-o", str(folder)]) == 0
    printed = capsys.readouterr().out
    assert "validation: max |logit difference| vs the input graph" in printed, printed
    saved = folder / MODEL_FILE
    assert op_count(saved, "MatMulNBits") == op_count(source, "MatMulNBits") > 0
    assert op_count(saved, "GroupQueryAttention") == 0
    quest = QuestModel(folder, threads=1)
    assert quest.sidecar.sparse_layers  # --k 32 with the default dense layers 0 and 1
    return source, quest


@pytest.mark.genai
@pytest.mark.parametrize("family", GENAI_FAMILIES)
def test_builder_model_keeps_its_greedy_tokens(family, tmp_path, capsys):
    """Float activations: the Quest model's greedy tokens are the builder model's, token for token,
    as plain ONNX Runtime runs it and as onnxruntime-genai's Generator does."""
    source, quest = _export_builder_model(family + "-accuracy1", tmp_path / "quest", capsys)
    prompt = np.random.default_rng(5).integers(3, quest.sidecar.vocab_size, PROMPT_TOKENS).tolist()
    runner = GenaiRunner(source, PROMPT_TOKENS + NEW_TOKENS)
    expected, chunk = [], prompt
    for _ in range(NEW_TOKENS):
        expected.append(int(runner.step(chunk).argmax()))
        chunk = [expected[-1]]
    assert genai_generator_greedy(source.parent, prompt, NEW_TOKENS) == expected
    assert greedy(quest, [prompt], NEW_TOKENS)[0] == expected


@pytest.mark.genai
@pytest.mark.parametrize("family", GENAI_FAMILIES)
def test_builder_default_model_within_the_int8_activation_tolerance(family, tmp_path, capsys):
    """The builder's CPU default (int8 activations): on the Quest model's greedy tokens, every
    step's logits stay within INT8_ACTIVATION_TOLERANCE of the builder model's (the validation's
    bound). Greedy tokens may part where the builder model's top two logits are closer than that
    rounding (the llama build here: 0.023 apart at step 19), so they are compared on the
    accuracy1 builds."""
    source, quest = _export_builder_model(family, tmp_path / "quest", capsys)
    prompt = np.random.default_rng(5).integers(3, quest.sidecar.vocab_size, PROMPT_TOKENS).tolist()
    tokens, logits = greedy(quest, [prompt], NEW_TOKENS, return_logits=True)
    runner = GenaiRunner(source, PROMPT_TOKENS + NEW_TOKENS)
    chunks = [prompt] + [[token] for token in tokens[0][:-1]]
    for step, (chunk, got) in enumerate(zip(chunks, logits)):
        want = runner.step(chunk)
        difference = float(np.abs(got[0] - want).max())
        assert difference <= INT8_ACTIVATION_TOLERANCE * max(float(np.abs(want).max()), 1.0), step


@pytest.mark.genai
def test_builder_int8_kv_cache_is_refused(tmp_path):
    """The builder's quantized KV cache (GroupQueryAttention k_quant_type, k_scale / v_scale) is not
    the Quest ops' int8 cache (one scale per token and head): refused by name, nothing written. Its int8
    cache inputs are refused first, where the geometry is read (before any rule: the GQA rule's own
    refusal of k_scale is tested on builder-style graphs in `make test`)."""
    source = builder_model("llama-int8kv")
    with pytest.raises(ExportError, match=r"cache input 'past_key_values\.0\.key' holds int8; the Quest ops take "
                                          r"float32 or float16"):
        rewrite_onnx(source, output=tmp_path / "quest", settings=SparseSettings(top_k=32), **QUIET)
    assert not (tmp_path / "quest").exists()


# --- make test-genai-smollm2: real weights ----------------------------------------------------------

SMOLLM2_QUESTIONS = {"What is the capital of France?": "Paris",
                     "Write a Python function that reverses a string.": "def reverse_string"}
SMOLLM2_TOKENS = 48


def _chat_prompt(folder: pathlib.Path, question: str):
    """The builder folder's tokenizer and the question as a chat prompt. The builder saves them with
    transformers 5 (tokenizer_class "TokenizersBackend", which this venv's 4.57 does not know), so
    they are read from their files: tokenizer.json and chat_template.jinja."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    tokenizer.chat_template = (folder / "chat_template.jinja").read_text()
    return tokenizer, tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)


@pytest.mark.genai
def test_smollm2_builder_model_keeps_its_greedy_tokens(tmp_path, capsys):
    """SmolLM2-135M-Instruct through the builder (int4, float activations): the Quest model answers
    each question with the builder model's greedy tokens, and the answers hold what real weights say."""
    source, quest = _export_builder_model("smollm2-accuracy1", tmp_path / "quest", capsys)
    for question, answer in SMOLLM2_QUESTIONS.items():
        tokenizer, prompt = _chat_prompt(source.parent, question)
        runner = GenaiRunner(source, len(prompt) + SMOLLM2_TOKENS)
        expected, chunk = [], prompt
        for _ in range(SMOLLM2_TOKENS):
            expected.append(int(runner.step(chunk).argmax()))
            chunk = [expected[-1]]
        got = greedy(quest, [prompt], SMOLLM2_TOKENS)[0]
        assert genai_generator_greedy(source.parent, prompt, SMOLLM2_TOKENS) == expected
        assert got == expected, (tokenizer.decode(got), tokenizer.decode(expected))
        assert answer in tokenizer.decode(got)


@pytest.mark.genai
def test_smollm2_builder_default_model_within_the_int8_activation_tolerance(tmp_path, capsys):
    """The builder's CPU default on real weights: each step's logits within the validation's bound
    on the Quest model's greedy tokens (measured 0.042 of the scale), the answers still right."""
    source, quest = _export_builder_model("smollm2", tmp_path / "quest", capsys)
    for question, answer in SMOLLM2_QUESTIONS.items():
        tokenizer, prompt = _chat_prompt(source.parent, question)
        tokens, logits = greedy(quest, [prompt], SMOLLM2_TOKENS, return_logits=True)
        runner = GenaiRunner(source, len(prompt) + SMOLLM2_TOKENS)
        for step, (chunk, got) in enumerate(zip([prompt] + [[t] for t in tokens[0][:-1]], logits)):
            want = runner.step(chunk)
            assert float(np.abs(got[0] - want).max()) <= INT8_ACTIVATION_TOLERANCE * max(float(np.abs(want).max()), 1.0), step
        assert answer in tokenizer.decode(tokens[0])


def test_a_source_with_int8_caches_is_refused_by_name(tmp_path):
    """int8 is a Quest cache type, not an activation type: a source whose caches are int8 (no
    activation to take the geometry's dtype from) is refused, naming the cache input."""
    model = builder_style(True)
    for value in model.graph.input:
        if value.name.startswith("past_key_values."):
            value.type.tensor_type.elem_type = onnx.TensorProto.INT8
    source = save_source(model, tmp_path / "source")
    with pytest.raises(ExportError, match=r"cache input 'past_key_values\.0\.key' holds int8; the Quest ops take "
                                          r"float32 or float16"):
        geometry_from_graph(onnx_ir_load(source), folder=source.parent)
