"""Safe handling of models we did not write: external data must stay inside the model's folder.

A model file names its external data by relative path; a hostile one could point at `../..`, an
absolute path, or a symlink or hard link to a file elsewhere. Every location is checked before any
data is read; outputs never reuse an input's data file names.
"""

from __future__ import annotations

import os
import pathlib

import onnx


class UnsafeModelError(ValueError):
    """The model's external data reaches outside its folder."""


def external_data_files(model: onnx.ModelProto) -> set[str]:
    locations = set()
    tensors = list(model.graph.initializer)
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                tensors.append(attribute.t)
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {entry.key: entry.value for entry in tensor.external_data}
            locations.add(entries.get("location", ""))
    return locations


def check_external_data(model_path: pathlib.Path) -> set[str]:
    """Validate every external data location of the model at `model_path`; return the file names."""
    model_path = pathlib.Path(model_path)
    folder = model_path.resolve().parent
    model = onnx.load(str(model_path), load_external_data=False)
    files = external_data_files(model)
    for location in files:
        where = f"{model_path.name}: external data {location!r}"
        if not location or os.path.isabs(location) or pathlib.PurePath(location).is_absolute():
            raise UnsafeModelError(f"{where} is not a relative path inside the model folder")
        if ".." in pathlib.PurePath(location).parts:
            raise UnsafeModelError(f"{where} climbs out of the model folder")
        path = folder / location
        if path.is_symlink() or any(parent.is_symlink() for parent in path.parents if parent != folder and folder in parent.parents):
            raise UnsafeModelError(f"{where} is a symbolic link")
        resolved = path.resolve()
        if folder not in resolved.parents:
            raise UnsafeModelError(f"{where} resolves outside the model folder")
        if not resolved.is_file():
            raise UnsafeModelError(f"{where} does not exist")
        if resolved.stat().st_nlink > 1:
            raise UnsafeModelError(f"{where} is a hard link (it may be a file outside the folder)")
    return files
