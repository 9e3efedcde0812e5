"""Opening a model folder we did not write: the sidecar is read strictly and checked against the graph,
and a broken file is a one-line error naming it, before any session or cache exists."""

from __future__ import annotations

import functools
import json
import math
import pathlib
import shutil
import tempfile

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from export_models import quest_export, tiny_model
from quest_ort.export.safety import UnsafeModelError, check_external_data
from quest_ort.runtime.generate import Generator, Sampling
from quest_ort.runtime.model import QuestModel

SIDECAR = "quest_model.json"
GRAPH = "model.quest.onnx"
# The folders the tests copy and break: a sparse export with block importance (every kind of cache),
# its dense GroupQueryAttention baseline, and a portable one (Quest ops written as standard ops).
QUEST = dict(top_k=4, importance_fraction=0.5)
GQA = dict(top_k=4, attention="gqa")


@functools.cache
def _portable_export() -> pathlib.Path:
    from quest_ort.export.pipeline import export_sparse
    from quest_ort.export.rewrite import SparseSettings

    output = pathlib.Path(tempfile.mkdtemp(prefix="quest-portable-")) / "model"
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


# --- the sidecar alone ------------------------------------------------------------------------

BAD_SIDECARS = [
    ("block_size 0", lambda d: d.update(block_size=0), ["block_size", "0", ">= 1"]),
    ("block_size negative", lambda d: d.update(block_size=-16), ["block_size", "-16", ">= 1"]),
    ("block_size a string", lambda d: d.update(block_size="16"), ["block_size", "'16'", "integer"]),
    ("block_size a float", lambda d: d.update(block_size=16.5), ["block_size", "16.5", "integer"]),
    ("top_k 0", lambda d: d.update(top_k=0), ["top_k", "0"]),
    ("kv_num_heads 0", lambda d: d.update(kv_num_heads=0), ["kv_num_heads", "0"]),
    ("heads not a multiple", lambda d: d.update(num_heads=5), ["num_heads", "5", "kv_num_heads", "2"]),
    ("capacity 0", lambda d: d.update(capacity=0), ["capacity", "0"]),
    ("importance_fraction NaN", lambda d: d.update(importance_fraction=math.nan), ["importance_fraction", "nan"]),
    ("group_reduce unknown", lambda d: d.update(group_reduce="median"), ["group_reduce", "'median'"]),
    ("kv_dtype unknown", lambda d: d.update(kv_dtype="int8"), ["kv_dtype", "'int8'"]),
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
