"""Model safety: external data that escapes the model folder is refused before anything is read."""

from __future__ import annotations

import os
import pathlib
import subprocess

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quest_ort.export.safety import UnsafeModelError, check_external_data


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
    assert "qwen3" in text and "llama" in text
