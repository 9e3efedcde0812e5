"""Opening a model folder we did not write: the sidecar is read strictly and checked against the graph,
and a broken file is a one-line error naming it, before any session or cache exists."""

from __future__ import annotations

import functools
import json
import math
import pathlib
import shutil
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quest_ort.model_folder.safety import UnsafeModelError, check_external_data
from quest_ort.runtime.generate import Generator, Sampling
from quest_ort.runtime.model import OlderExportWarning, QuestModel
from support.export_models import quest_export, tiny_model
from support.scratch import run_folder

SIDECAR = "quest_model.json"
GRAPH = "model.quest.onnx"
# The folders the tests copy and break: a sparse export with block importance (every kind of cache),
# its dense GroupQueryAttention baseline, and a portable one (Quest ops written as standard ops).
QUEST = dict(top_k=4, importance_fraction=0.5, superblock_size=0)  # flat: format 1's JSON, bytes and all
HIERARCHICAL = dict(top_k=4, importance_fraction=0.5)  # the default superblocks (docs/ops.md, hierarchical selection)
GQA = dict(top_k=4, attention="gqa")


@functools.cache
def _portable_export() -> pathlib.Path:
    from quest_ort.pipeline import export_sparse
    from quest_ort.export.rewrite import SparseSettings

    output = run_folder("quest-portable-") / "model"
    settings = SparseSettings(top_k=4, block_size=16, dense_layers=(0,), kv_dtype="float32", portable=True,
                              importance_fraction=0.5)
    export_sparse("qwen3", output=output, settings=settings, model=str(tiny_model("qwen3").checkpoint), capacity=512,
                  log=lambda *a, **k: None)
    return output


def _copy(tmp_path, source) -> pathlib.Path:
    folder = tmp_path / "model"
    shutil.copytree(source, folder)
    return folder


def _folder(tmp_path, **export) -> pathlib.Path:
    return _copy(tmp_path, quest_export("qwen3", **(export or QUEST)))


def _edit_sidecar(folder: pathlib.Path, edit) -> None:
    data = json.loads((folder / SIDECAR).read_text())
    edit(data)
    (folder / SIDECAR).write_text(json.dumps(data))


def _edit_graph(folder: pathlib.Path, edit) -> None:
    model = onnx.load(str(folder / GRAPH), load_external_data=False)
    edit(model)
    onnx.save(model, str(folder / GRAPH))  # the weights stay in the folder's data file


def _refused(folder, *words, error=ValueError) -> str:
    """Opening `folder` fails with a one-line `error` holding every word; returns the message."""
    with pytest.raises(error) as info:
        QuestModel(folder, threads=1)
    message = str(info.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    return message


def _swap(data, first, second):
    data[first[0]][first[1]], data[second[0]][second[1]] = data[second[0]][second[1]], data[first[0]][first[1]]


def _layers(data):
    return data["layers"]


# --- the sidecar against the graph --------------------------------------------------------------

def test_every_export_kind_opens(tmp_path):
    """The checks accept what export-sparse writes: sparse with importance, probe scores, float16
    caches, int8 caches with their scales, per-head selection, all-dense, the GroupQueryAttention
    baseline, portable."""
    for export in (QUEST, dict(top_k=4, score="probe"), dict(top_k=4, kv_dtype="float16", group_reduce="none"),
                   dict(top_k=4, kv_dtype="int8", group_reduce="none"), dict(top_k=4, dense_layers=(0, 1, 2)), GQA):
        QuestModel(quest_export("qwen3", **export), threads=1)
    QuestModel(_portable_export(), threads=1)


# (label, edit of the sidecar's JSON, words the error must hold: the field and both values)
SIDECAR_DISAGREEMENTS = [
    ("past key and value swapped in a layer", lambda d: _swap(_layers(d), (1, "past_key"), (1, "past_value")),
     ["layers[1].past_key", "'past_value.1'", "'past_key.1'"]),
    ("present key and value swapped in a layer",
     lambda d: _swap(_layers(d), (2, "present_key"), (2, "present_value")),
     ["layers[2].present_key", "'present_value.2'", "'present_key.2'"]),
    ("past keys swapped between layers", lambda d: _swap(_layers(d), (1, "past_key"), (2, "past_key")),
     ["layers[1].past_key", "'past_key.2'", "'past_key.1'"]),
    ("whole layers swapped", lambda d: _swap(d, ("layers", 1), ("layers", 2)),
     ["layers[1].past_key", "'past_key.2'", "'past_key.1'"]),
    ("block max and min swapped", lambda d: _swap(_layers(d), (1, "past_block_max"), (1, "past_block_min")),
     ["layers[1].past_block_max", "'past_block_min.1'", "'past_block_max.1'"]),
    ("importance swapped between layers",
     lambda d: _swap(_layers(d), (1, "present_block_importance"), (2, "present_block_importance")),
     ["layers[1].present_block_importance", "'present_block_importance.2'", "'present_block_importance.1'"]),
    ("block_size", lambda d: d.update(block_size=8), ["block_size", "8", "16"]),
    ("top_k", lambda d: d.update(top_k=3), ["top_k", "3", "4"]),
    ("sink_blocks", lambda d: d.update(sink_blocks=2), ["sink_blocks", "2", "1"]),
    ("recent_blocks", lambda d: d.update(recent_blocks=0), ["recent_blocks", "0", "1"]),
    ("group_reduce", lambda d: d.update(group_reduce="max"), ["group_reduce", "'max'", "'mean'"]),
    ("importance_fraction", lambda d: d.update(importance_fraction=0.25), ["importance_fraction", "0.25", "0.5"]),
    ("score", lambda d: d.update(score="probe"), ["score", "'probe'", "'bound'"]),
    ("num_probes", lambda d: d.update(num_probes=4), ["num_probes", "4", "8"]),
    ("num_heads", lambda d: d.update(num_heads=2), ["num_heads", "2", "4"]),
    ("kv_num_heads", lambda d: d.update(kv_num_heads=1), ["kv_num_heads", "1", "2"]),
    ("head_dim", lambda d: d.update(head_dim=8), ["head_dim", "8", "16"]),
    ("vocab_size", lambda d: d.update(vocab_size=128), ["vocab_size", "128", "256"]),
    ("kv_dtype", lambda d: d.update(kv_dtype="float16"), ["kv_dtype", "float16", "float32"]),
    ("bounds_dtype", lambda d: d.update(bounds_dtype="float32"), ["bounds_dtype", "float32", "float16"]),
    ("activation_dtype", lambda d: d.update(activation_dtype="float16"), ["activation_dtype", "float16", "float32"]),
    ("num_layers", lambda d: (d.update(num_layers=2, sparse_layers=[1]), d["layers"].pop()),
     ["num_layers", "2", "3"]),
    ("a sparse layer declared dense",
     lambda d: (d.update(sparse_layers=[2], dense_layers=[0, 1]),
                d["layers"][1].update({k: None for k in d["layers"][1] if "block" in k})),
     ["sparse_layers", "[2]", "[1, 2]"]),
    ("an input renamed", lambda d: d["inputs"].update(input_ids="tokens"), ["inputs", "'tokens'"]),
    ("an input the graph needs left out", lambda d: d["inputs"].pop("exact_lens"), ["'exact_lens'"]),
    ("the chunk queries' lengths left out", lambda d: d["inputs"].pop("chunk_lens"), ["'chunk_lens'"]),
    ("chunk_share", lambda d: d.update(chunk_share=0.5), ["chunk_share", "0.5", "0.0625"]),
    ("chunk_window", lambda d: d.update(chunk_window=4), ["chunk_window", "4", "64"]),
    ("chunk_floor", lambda d: d.update(chunk_floor=0), ["chunk_floor", "0", "64"]),
    ("chunk_size", lambda d: d.update(chunk_size=32), ["chunk_size", "32", "64"]),
    ("the logits' row count left out", lambda d: d["inputs"].pop("logits_keep"), ["'logits_keep'"]),
    ("the logits renamed", lambda d: d["outputs"].update(logits="scores"), ["outputs", "'scores'"]),
    ("the GroupQueryAttention baseline", lambda d: d.update(attention="gqa"), ["attention", "'gqa'"]),
    ("portable", lambda d: d.update(portable=True), ["portable", "True"]),
]


@pytest.mark.parametrize("label, edit, words", SIDECAR_DISAGREEMENTS, ids=[case[0] for case in SIDECAR_DISAGREEMENTS])
def test_a_sidecar_that_disagrees_with_the_graph_is_refused_naming_the_field(tmp_path, label, edit, words):
    folder = _folder(tmp_path)
    _edit_sidecar(folder, edit)
    _refused(folder, SIDECAR, GRAPH, *words)


# A hierarchical export's sidecar edited (the default superblocks: 16 blocks of 16 here).
HIERARCHICAL_DISAGREEMENTS = [
    ("superblock_size", lambda d: d.update(superblock_size=8), ["superblock_size", "8", "256"]),
    ("candidate_factor", lambda d: d.update(candidate_factor=4), ["candidate_factor", "4", "16"]),
    ("superblock max and min swapped", lambda d: _swap(_layers(d), (1, "past_super_max"), (1, "past_super_min")),
     ["layers[1].past_super_max", "'past_super_min.1'", "'past_super_max.1'"]),
    ("superblock bounds swapped between layers",
     lambda d: _swap(_layers(d), (1, "present_super_max"), (2, "present_super_max")),
     ["layers[1].present_super_max", "'present_super_max.2'", "'present_super_max.1'"]),
]


@pytest.mark.parametrize("label, edit, words", HIERARCHICAL_DISAGREEMENTS,
                         ids=[case[0] for case in HIERARCHICAL_DISAGREEMENTS])
def test_a_hierarchical_sidecar_that_disagrees_with_the_graph_is_refused_naming_the_field(tmp_path, label, edit,
                                                                                         words):
    folder = _folder(tmp_path, **HIERARCHICAL)
    _edit_sidecar(folder, edit)
    _refused(folder, SIDECAR, GRAPH, *words)


@pytest.mark.parametrize("label, edit, words", [
    ("superblocks named in a flat folder", lambda d: d.update(superblock_size=0), ["superblock_size", "layers[1]"]),
    ("superblocks with probe scores", lambda d: d.update(score="probe"), ["superblock_size", "'probe'"]),
    ("a negative superblock size", lambda d: d.update(superblock_size=-1), ["superblock_size", "-1"]),
], ids=lambda value: value if isinstance(value, str) else "")
def test_a_hierarchical_sidecar_that_contradicts_itself_is_refused(tmp_path, label, edit, words):
    folder = _folder(tmp_path, **HIERARCHICAL)
    _edit_sidecar(folder, edit)
    _refused(folder, SIDECAR, *words)


def _attribute(model, op_type, name, value, *, only_first=False):
    for node in model.graph.node:
        if node.op_type == op_type:
            kept = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend(kept + [helper.make_attribute(name, value)])
            if only_first:
                return


def _extra_input(model):
    model.graph.input.append(helper.make_tensor_value_info("position_ids", onnx.TensorProto.INT64, ["b", "s"]))


def _retype_past_key(model):
    model.graph.input[[i.name for i in model.graph.input].index("past_key.1")].type.tensor_type.elem_type = (
        onnx.TensorProto.FLOAT16)


def _reshape_past_value(model):
    dims = model.graph.input[[i.name for i in model.graph.input].index("past_value.2")].type.tensor_type.shape.dim
    dims[3].dim_value = 8


GRAPH_DISAGREEMENTS = [
    ("QuestMetadata block_size", lambda m: _attribute(m, "QuestMetadata", "block_size", 8, only_first=True),
     ["block_size", "16", "8", "QuestMetadata"]),
    ("SparseBlockSelect top_k", lambda m: _attribute(m, "SparseBlockSelect", "top_k", 5), ["top_k", "4", "5"]),
    ("SparseBlockSelect chunk_pool", lambda m: _attribute(m, "SparseBlockSelect", "chunk_pool", 4),
     ["chunk_pool", "16", "4"]),
    ("SparseBlockAttention chunk_size", lambda m: _attribute(m, "SparseBlockAttention", "chunk_size", 16, only_first=True),
     ["chunk_size", "64", "16", "SparseBlockAttention"]),
    ("SparseBlockAttention num_heads", lambda m: _attribute(m, "SparseBlockAttention", "num_heads", 2),
     ["num_heads", "4", "2"]),
    ("an input the sidecar does not describe", _extra_input, ["'position_ids'"]),
    ("a cache's element type", _retype_past_key, ["past_key.1", "float32", "float16"]),
    ("a cache's head dim", _reshape_past_value, ["past_value.2", "16", "8"]),
]


@pytest.mark.parametrize("label, edit, words", GRAPH_DISAGREEMENTS, ids=[case[0] for case in GRAPH_DISAGREEMENTS])
def test_a_graph_that_disagrees_with_the_sidecar_is_refused_naming_the_field(tmp_path, label, edit, words):
    folder = _folder(tmp_path)
    _edit_graph(folder, edit)
    _refused(folder, SIDECAR, GRAPH, *words)


@pytest.mark.parametrize("kind", ["gqa", "portable"])
def test_crosswise_caches_are_refused_in_baseline_and_portable_graphs(tmp_path, kind):
    """The GroupQueryAttention baseline pairs its caches through com.microsoft nodes, a portable graph
    through standard ops: the pairing is read from either."""
    folder = _copy(tmp_path, quest_export("qwen3", **GQA) if kind == "gqa" else _portable_export())
    QuestModel(folder, threads=1)  # as exported: accepted
    _edit_sidecar(folder, lambda d: _swap(_layers(d), (1, "past_key"), (1, "past_value")))
    _refused(folder, SIDECAR, GRAPH, "layers[1].past_key", "'past_value.1'", "'past_key.1'")


INT8 = dict(top_k=4, kv_dtype="int8")
INT8_DISAGREEMENTS = [
    ("key and value scales swapped", lambda d: _swap(_layers(d), (1, "past_key_scale"), (1, "past_value_scale")),
     ["layers[1].past_key_scale", "'past_value_scale.1'", "'past_key_scale.1'"]),
    ("scales swapped between layers", lambda d: _swap(_layers(d), (0, "present_key_scale"), (2, "present_key_scale")),
     ["layers[0].present_key_scale", "'present_key_scale.2'", "'present_key_scale.0'"]),
    ("float16 declared", lambda d: (d.pop("key_smoothing"), d.update(kv_dtype="float16")),
     ["layers[0]", "scale", "'float16'"]),
    ("a scale left out", lambda d: _layers(d)[2].pop("past_value_scale"), ["layers[2]", "scale", "'int8'"]),
    # int8 caches come with int8 block bounds, whose per-block exponents are caches too
    ("exponents swapped between layers",
     lambda d: _swap(_layers(d), (1, "past_block_exponent"), (2, "past_block_exponent")),
     ["layers[1].past_block_exponent", "'past_block_exponent.2'", "'past_block_exponent.1'"]),
    ("an exponent left out", lambda d: _layers(d)[2].pop("present_block_exponent"), ["layers[2]", "exponent", "int8"]),
    ("float16 bounds declared", lambda d: d.update(bounds_dtype="float16"), ["layers[1]", "exponent", "'float16'"]),
]


@pytest.mark.parametrize("label, edit, words", INT8_DISAGREEMENTS, ids=[case[0] for case in INT8_DISAGREEMENTS])
def test_an_int8_folder_whose_scales_disagree_is_refused(tmp_path, label, edit, words):
    """An int8 cache's row scales are caches too: named by role, in place, checked like the rest."""
    folder = _folder(tmp_path, **INT8)
    QuestModel(folder, threads=1)  # as exported: accepted
    _edit_sidecar(folder, edit)
    _refused(folder, SIDECAR, *words)


def test_int8_caches_bounded_as_float_keys_are_refused(tmp_path):
    """QuestMetadata of an int8 folder must bound the keys as the int8 caches hold them: a node
    left at key_cache_type 'float' would let the bounds miss what the attention reads."""
    folder = _folder(tmp_path, **INT8)
    _edit_graph(folder, lambda m: _attribute(m, "QuestMetadata", "key_cache_type", "float", only_first=True))
    _refused(folder, SIDECAR, GRAPH, "kv_dtype", "'int8'", "key_cache_type = 'float'", "QuestMetadata")


def test_a_portable_graph_declared_native_is_refused(tmp_path):
    """Bound in place, a portable graph's standard ops may read a cache after writing it."""
    folder = _copy(tmp_path, _portable_export())
    _edit_sidecar(folder, lambda d: d.update(portable=False))
    _refused(folder, SIDECAR, GRAPH, "portable", "False")


def test_a_refused_folder_opens_once_repaired(tmp_path):
    """The check refuses the folder, not the model: swapped back, it generates the export's tokens."""
    prompt = np.random.default_rng(5).integers(0, 256, 40).tolist()
    want = Generator(QuestModel(quest_export("qwen3", **QUEST), threads=1)).generate([prompt], Sampling(12))
    folder = _folder(tmp_path)
    _edit_sidecar(folder, lambda d: _swap(_layers(d), (1, "past_key"), (1, "past_value")))
    with pytest.raises(ValueError, match="layers"):
        QuestModel(folder, threads=1)
    _edit_sidecar(folder, lambda d: _swap(_layers(d), (1, "past_key"), (1, "past_value")))
    assert Generator(QuestModel(folder, threads=1)).generate([prompt], Sampling(12)) == want


def test_a_variant_graph_may_change_the_selection_but_not_the_caches(tmp_path):
    """`model_file=` picks a variant with the same I/O (the evaluation's other budgets): its selection
    attributes are its own, but its caches and block size must still be the sidecar's."""
    folder = _folder(tmp_path)
    model = onnx.load(str(folder / GRAPH), load_external_data=False)
    _attribute(model, "SparseBlockSelect", "top_k", 2)
    onnx.save(model, str(folder / "model.k2.onnx"))
    assert QuestModel(folder, threads=1, model_file="model.k2.onnx").sidecar.settings.top_k == 4
    _attribute(model, "QuestMetadata", "block_size", 8)
    onnx.save(model, str(folder / "model.p8.onnx"))
    with pytest.raises(ValueError, match="block_size"):
        QuestModel(folder, threads=1, model_file="model.p8.onnx")


def _name_int8_importance(model):
    """What exporters before 2026-12-04 wrote: each int8 SparseBlockAttention's block importance
    output named although nothing reads it (outputs after it, the new rows' scales, are read)."""
    for index, node in enumerate(n for n in model.graph.node if n.op_type == "SparseBlockAttention"):
        assert node.output[3] == ""
        node.output[3] = f"unread_importance_{index}"


def test_a_graph_that_computes_an_unread_output_opens_with_a_warning_naming_it(tmp_path):
    """An older export's int8 graph names an optional output nothing reads: the same logits, slower
    steps. The runtime opens it and says so once, naming the node, the output and the remedy; what
    the exporter writes today opens without a word."""
    export = dict(top_k=4, kv_dtype="int8", group_reduce="none")
    prompt = np.random.default_rng(3).integers(0, 256, 40).tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error", OlderExportWarning)
        want = Generator(QuestModel(quest_export("qwen3", **export), threads=1)).generate([prompt], Sampling(8))
    folder = _folder(tmp_path, **export)
    _edit_graph(folder, _name_int8_importance)
    with pytest.warns(OlderExportWarning) as caught:
        model = QuestModel(folder, threads=1)
    message = str(caught[0].message)
    for word in (GRAPH, "SparseBlockAttention", "'unread_importance_0'", "export-sparse qwen3", "read by nothing"):
        assert word in message, f"{word!r} not in {message!r}"
    assert Generator(model).generate([prompt], Sampling(8)) == want


# --- the sidecar alone ------------------------------------------------------------------------

BAD_SIDECARS = [
    ("block_size 0", lambda d: d.update(block_size=0), ["block_size", "0", "[1, 2147483647]"]),
    ("block_size negative", lambda d: d.update(block_size=-16), ["block_size", "-16", "[1, 2147483647]"]),
    ("top_k past int32", lambda d: d.update(top_k=2**31), ["top_k", "2147483648", "2147483647]"]),
    ("block_size a string", lambda d: d.update(block_size="16"), ["block_size", "'16'", "integer"]),
    ("block_size a float", lambda d: d.update(block_size=16.5), ["block_size", "16.5", "integer"]),
    ("top_k 0", lambda d: d.update(top_k=0), ["top_k", "0"]),
    ("chunk_share past 1", lambda d: d.update(chunk_share=2.0), ["chunk_share", "2.0"]),
    ("chunk_floor negative", lambda d: d.update(chunk_floor=-1), ["chunk_floor", "-1"]),
    ("chunk_top_k below a chunk's forced blocks", lambda d: d.update(chunk_top_k=40),
     ["chunk_top_k", "40", "forced blocks: up to 85"]),
    ("kv_num_heads 0", lambda d: d.update(kv_num_heads=0), ["kv_num_heads", "0"]),
    ("heads not a multiple", lambda d: d.update(num_heads=5), ["num_heads", "5", "kv_num_heads", "2"]),
    ("capacity 0", lambda d: d.update(capacity=0), ["capacity", "0"]),
    ("importance_fraction NaN", lambda d: d.update(importance_fraction=math.nan), ["importance_fraction", "nan"]),
    ("group_reduce unknown", lambda d: d.update(group_reduce="median"), ["group_reduce", "'median'"]),
    ("kv_dtype unknown", lambda d: d.update(kv_dtype="int8"), ["kv_dtype", "'int8'"]),
    ("key_smoothing not a bool", lambda d: d.update(key_smoothing="yes"), ["key_smoothing", "'yes'", "true or false"]),
    ("key_smoothing with float caches", lambda d: d.update(key_smoothing=True),
     ["key_smoothing", "kv_dtype", "'float32'"]),
    ("a field missing", lambda d: d.pop("head_dim"), ["missing", "head_dim"]),
    ("a cache named twice", lambda d: d["layers"][2].update(past_key="past_key.1"), ["past_key.1", "twice"]),
    ("a layer field unknown", lambda d: d["layers"][0].update(past_query="q"), ["layers[0]", "past_query"]),
    ("layers not a list", lambda d: d.update(layers={}), ["layers", "list"]),
    ("a sparse layer out of range", lambda d: d.update(sparse_layers=[1, 2, 7]), ["sparse_layers", "7"]),
]


@pytest.mark.parametrize("label, edit, words", BAD_SIDECARS, ids=[case[0] for case in BAD_SIDECARS])
def test_a_malformed_sidecar_is_a_one_line_error_naming_the_field(tmp_path, label, edit, words):
    folder = _folder(tmp_path)
    _edit_sidecar(folder, edit)
    _refused(folder, SIDECAR, *words)


@pytest.mark.parametrize("text, words", [
    ("{\"format\": \"quest_ort.model/1\",", ["not valid JSON", "line 1"]),
    ("model_file: model.quest.onnx\n", ["not valid JSON"]),
    ("[1, 2, 3]", ["JSON object", "list"]),
    ("", ["not valid JSON"]),
    ("\xff\xfe{}", ["not valid JSON"]),
], ids=["cut short", "YAML", "a list", "empty", "not UTF-8"])
def test_a_sidecar_that_is_not_json_is_a_one_line_error(tmp_path, text, words):
    folder = _folder(tmp_path)
    (folder / SIDECAR).write_bytes(text.encode("latin-1"))
    _refused(folder, SIDECAR, *words)


# --- the model file -----------------------------------------------------------------------------

@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 0.9, 0.999])
def test_a_truncated_model_file_is_a_one_line_error_naming_it(tmp_path, keep):
    folder = _folder(tmp_path)
    data = (folder / GRAPH).read_bytes()
    (folder / GRAPH).write_bytes(data[: int(len(data) * keep)])
    _refused(folder, GRAPH)


def test_a_model_file_that_is_not_onnx_is_a_one_line_error(tmp_path):
    folder = _folder(tmp_path)
    (folder / GRAPH).write_text(json.dumps({"graph": "no"}))
    _refused(folder, GRAPH)


# --- external data inside subgraphs ---------------------------------------------------------------

def _external(name: str, location: str) -> onnx.TensorProto:
    tensor = numpy_helper.from_array(np.ones(4, np.float32), name)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    return tensor


def _out(name):
    return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [4])


def _body(location: str, *, as_constant=False, inputs=(), outputs=("y",), extra_outputs=()) -> onnx.GraphProto:
    """A subgraph whose output reads a tensor stored at `location` (an initializer or a Constant)."""
    if as_constant:
        nodes = [helper.make_node("Constant", [], ["w"], value=_external("c", location))]
        initializers = []
    else:
        nodes, initializers = [], [_external("w", location)]
    nodes.append(helper.make_node("Identity", ["w"], [outputs[0]]))
    nodes += [helper.make_node("Identity", [source], [target]) for source, target in extra_outputs]
    return helper.make_graph(nodes, "body", list(inputs), [_out(o) for o in outputs], initializer=initializers)


def _if_model(location, **kwargs) -> onnx.ModelProto:
    cond = numpy_helper.from_array(np.array(True), "cond")
    branch = _body(location, **kwargs)
    node = helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)
    return helper.make_model(helper.make_graph([node], "g", [], [_out("y")], initializer=[cond]))


def _loop_model(location) -> onnx.ModelProto:
    scalar = lambda name, t: helper.make_tensor_value_info(name, t, [])  # noqa: E731
    body = _body(location, inputs=[scalar("i", onnx.TensorProto.INT64), scalar("c", onnx.TensorProto.BOOL)],
                 outputs=("y", "c_out"), extra_outputs=[("c", "c_out")])
    body.output[1].type.tensor_type.elem_type = onnx.TensorProto.BOOL
    body.output[1].type.tensor_type.ClearField("shape")
    body.output.insert(0, body.output.pop())  # Loop bodies return the condition first
    trip = numpy_helper.from_array(np.array(1, np.int64), "n")
    node = helper.make_node("Loop", ["n", ""], ["y"], body=body)
    return helper.make_model(helper.make_graph([node], "g", [], [_out("y")], initializer=[trip]))


def _scan_model(location) -> onnx.ModelProto:
    body = _body(location, inputs=[helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [])],
                 outputs=("y",))
    body.output[0].type.tensor_type.shape.Clear()
    xs = numpy_helper.from_array(np.ones(2, np.float32), "xs")
    node = helper.make_node("Scan", ["xs"], ["y"], body=body, num_scan_inputs=1)
    return helper.make_model(helper.make_graph([node], "g", [], [_out("y")], initializer=[xs]))


def _nested_model(location) -> onnx.ModelProto:
    inner = _if_model(location).graph
    inner.ClearField("input")
    return _if_model_with_branch(helper.make_graph(list(inner.node), "inner", [], [_out("y")],
                                                   initializer=list(inner.initializer)))


def _if_model_with_branch(branch) -> onnx.ModelProto:
    cond = numpy_helper.from_array(np.array(True), "cond2")
    node = helper.make_node("If", ["cond2"], ["y"], then_branch=branch, else_branch=branch)
    return helper.make_model(helper.make_graph([node], "g", [], [_out("y")], initializer=[cond]))


def _function_model(location) -> onnx.ModelProto:
    function = helper.make_function("local", "Weights", [], ["y"],
                                    [helper.make_node("Constant", [], ["y"], value=_external("c", location))],
                                    [helper.make_opsetid("", 18)])
    graph = helper.make_graph([helper.make_node("Weights", [], ["y"], domain="local")], "g", [], [_out("y")])
    return helper.make_model(graph, functions=[function],
                             opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)])


SUBGRAPHS = {
    "If initializer": lambda location: _if_model(location),
    "If Constant": lambda location: _if_model(location, as_constant=True),
    "Loop body": _loop_model,
    "Scan body": _scan_model,
    "If inside If": _nested_model,
    "local function": _function_model,
}


@pytest.mark.parametrize("kind", list(SUBGRAPHS))
@pytest.mark.parametrize("location, words", [("../outside.bin", "climbs out"), ("/etc/passwd", "not a relative path")])
def test_external_data_inside_subgraphs_is_checked_like_the_main_graphs(tmp_path, kind, location, words):
    inner = tmp_path / "model"
    inner.mkdir()
    (tmp_path / "outside.bin").write_bytes(np.ones(4, np.float32).tobytes())
    path = inner / "model.onnx"
    onnx.save(SUBGRAPHS[kind](location), str(path))
    with pytest.raises(UnsafeModelError, match=words):
        check_external_data(path)
    (inner / "inside.bin").write_bytes(np.ones(4, np.float32).tobytes())
    onnx.save(SUBGRAPHS[kind]("inside.bin"), str(path))
    assert check_external_data(path) == {"inside.bin"}


# The keys of format quest_ort.model/1's JSON, in the order it writes them: a change here is a new
# format (bump FORMAT).
FORMAT_1_KEYS = (
    "model_file", "family", "source", "num_layers", "num_heads", "kv_num_heads", "head_dim", "vocab_size",
    "activation_dtype", "kv_dtype", "capacity", "block_size", "top_k", "sink_blocks", "recent_blocks", "group_reduce",
    "importance_fraction", "sparse_layers", "dense_layers", "layers", "inputs", "outputs", "eos_token_ids", "tokenizer",
    "attention", "score", "num_probes", "portable", "bounds_dtype", "exporter", "format")


def test_a_hierarchical_sidecar_adds_its_superblock_size_to_format_1s_json():
    from quest_ort.model_folder.sidecar import Sidecar

    folder = quest_export("qwen3", **HIERARCHICAL)
    text = (folder / SIDECAR).read_text()
    written = json.loads(text)
    assert tuple(written) == FORMAT_1_KEYS[:-2] + ("superblock_size", "exporter", "format")
    assert written["superblock_size"] == 16 and all("past_super_max" in layer for layer in written["layers"][1:])
    sidecar = Sidecar.read(folder)
    assert sidecar.to_json() + "\n" == text and sidecar.settings.superblocks == 16


@pytest.mark.parametrize("settings", [QUEST, GQA], ids=["quest", "gqa"])
def test_the_sidecar_is_its_geometry_and_settings_and_keeps_format_1s_json(settings):
    from quest_ort.model_folder.settings import Geometry, SparseSettings
    from quest_ort.model_folder.sidecar import Sidecar

    folder = quest_export("qwen3", **settings)
    text = (folder / SIDECAR).read_text()
    written = json.loads(text)
    assert tuple(written) == FORMAT_1_KEYS
    sidecar = Sidecar.read(folder)
    assert sidecar.to_json() + "\n" == text, "read and written again, the sidecar is not the same bytes"
    assert sidecar.settings.importance == (settings.get("importance_fraction", 0) > 0
                                          and settings.get("attention") != "gqa")
    assert sidecar.geometry == Geometry(**{name: written[name] for name in
                                           ("num_layers", "num_heads", "kv_num_heads", "head_dim", "activation_dtype")})
    assert isinstance(sidecar.settings, SparseSettings) and sidecar.settings.top_k == settings["top_k"]
    assert sidecar.settings.attention == settings.get("attention", "quest")


@pytest.mark.parametrize("settings", [QUEST, GQA], ids=["quest", "gqa"])
def test_the_cache_view_holds_each_layers_caches_as_the_layout_says(settings):
    """cache.layers[l].key, .value, .block_max, .block_min, .block_importance: the arrays bound to
    layer l's inputs, of the layout's shapes and types; None where the layer has no such cache."""
    from quest_ort.model_folder.cache import cache_bytes, cache_layout

    model = QuestModel(quest_export("qwen3", **settings), threads=1)
    cache = model.new_cache(2, capacity=40)
    layout = cache_layout(model.sidecar, 2, 40)
    assert len(cache.layers) == len(layout) == len(model.sidecar.layers)
    for io, layer, specs in zip(model.sidecar.layers, cache.layers, layout):
        assert [role for role, _ in layer.items()] == [role for role, _ in specs.items()]
        assert (layer.block_max is not None) == io.sparse == (io.past_block_max is not None)
        assert (layer.block_importance is not None) == (io.past_block_importance is not None)
        for (role, array), (_, spec) in zip(layer.items(), specs.items()):
            assert cache.buffers[spec.name] is array, role
            assert (array.shape, array.dtype) == (spec.shape, spec.dtype), role
    assert layout[-1].key.shape == (2, model.sidecar.geometry.kv_num_heads, 40, model.sidecar.geometry.head_dim)
    assert cache_bytes(model.sidecar, 2, 40) == sum(array.nbytes for array in cache.buffers.values())
