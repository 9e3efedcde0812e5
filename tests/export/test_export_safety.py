"""Model safety: external data that escapes the model folder is refused before anything is read."""

from __future__ import annotations

import os
import pathlib
import subprocess

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quest_ort.export.families import FAMILIES
from quest_ort.model_folder.safety import UnsafeModelError, check_external_data


def _model_with_external(folder: pathlib.Path, location: str) -> pathlib.Path:
    weight = numpy_helper.from_array(np.ones(4, np.float32), "w")
    weight.data_location = onnx.TensorProto.EXTERNAL
    weight.ClearField("raw_data")
    entry = weight.external_data.add()
    entry.key, entry.value = "location", location
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])], initializer=[weight])
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_inside_the_folder_is_accepted(tmp_path):
    (tmp_path / "weights.bin").write_bytes(np.ones(4, np.float32).tobytes())
    assert check_external_data(_model_with_external(tmp_path, "weights.bin")) == {"weights.bin"}


@pytest.mark.parametrize("location, words", [
    ("../outside.bin", "climbs out"),
    ("/etc/passwd", "not a relative path"),
    ("sub/../../outside.bin", "climbs out"),
    ("missing.bin", "does not exist"),
])
def test_escaping_locations_are_refused(tmp_path, location, words):
    inner = tmp_path / "model"
    inner.mkdir()
    (tmp_path / "outside.bin").write_bytes(b"\0" * 16)
    with pytest.raises(UnsafeModelError, match=words):
        check_external_data(_model_with_external(inner, location))


def test_symlinks_and_hard_links_are_refused(tmp_path):
    inner = tmp_path / "model"
    inner.mkdir()
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 16)
    os.symlink(secret, inner / "link.bin")
    with pytest.raises(UnsafeModelError, match="symbolic link"):
        check_external_data(_model_with_external(inner, "link.bin"))
    os.link(secret, inner / "hard.bin")
    with pytest.raises(UnsafeModelError, match="hard link"):
        check_external_data(_model_with_external(inner, "hard.bin"))


def test_cli_help_explains_every_option():
    import shutil
    import sys

    script = pathlib.Path(sys.executable).with_name("export-sparse")
    assert script.is_file() or shutil.which("export-sparse")
    text = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True).stdout
    for option in ("--model", "--k", "--block-size", "--sink", "--recent", "--group-reduce",
                   "--importance-fraction", "--dense-layers", "--capacity", "--kv-dtype", "--output"):
        assert option in text, option
    assert all(name in text for name in FAMILIES), text


def test_the_output_may_not_be_the_input_folder_and_nothing_is_written(tmp_path):
    from support.export_models import tiny_model
    from quest_ort.pipeline import export_sparse
    from quest_ort.export.rewrite import ExportError
    from quest_ort.export.rewrite import SparseSettings

    checkpoint = tiny_model("qwen3").checkpoint
    before = {p: p.stat().st_mtime_ns for p in checkpoint.rglob("*")}
    for output in (checkpoint, checkpoint / "inside"):
        with pytest.raises(ExportError, match="may not contain or be inside the input's folder"):
            export_sparse("qwen3", output=output, settings=SparseSettings(top_k=4), model=str(checkpoint),
                          overwrite=True, log=lambda *a, **k: None)
    assert {p: p.stat().st_mtime_ns for p in checkpoint.rglob("*")} == before


def _exported_copy(tmp_path) -> pathlib.Path:
    import shutil

    from support.export_models import quest_export

    folder = tmp_path / "model"
    shutil.copytree(quest_export("qwen3", top_k=4), folder)
    return folder


@pytest.mark.parametrize("field, value, words", [
    ("library_path", "/tmp/evil.so", "unknown fields"),
    ("model_file", "../elsewhere.onnx", "relative path inside the model folder"),
    ("model_file", "/etc/model.onnx", "relative path inside the model folder"),
    ("tokenizer", "../../tok", "relative path inside the model folder"),
])
def test_a_sidecar_cannot_point_outside_its_folder_or_name_a_library(tmp_path, field, value, words):
    import json

    from quest_ort.runtime.model import QuestModel

    folder = _exported_copy(tmp_path)
    sidecar = json.loads((folder / "quest_model.json").read_text())
    sidecar[field] = value
    (folder / "quest_model.json").write_text(json.dumps(sidecar))
    with pytest.raises(ValueError, match=words):
        QuestModel(folder)


def test_the_runtime_refuses_a_model_whose_data_escapes_its_folder(tmp_path):
    from quest_ort.runtime.model import QuestModel

    folder = _exported_copy(tmp_path)
    data = folder / "model.quest.onnx.data"
    outside = tmp_path / "outside.data"
    data.rename(outside)
    os.symlink(outside, data)
    with pytest.raises(UnsafeModelError, match="symbolic link"):
        QuestModel(folder)
