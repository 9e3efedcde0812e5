"""Safe handling of models we did not write: external data must stay inside the model's folder.

A model file names its external data by relative path; a hostile one could point at `../..`, an
absolute path, or a symlink or hard link to a file elsewhere. Every location is checked before any
data is read, in the main graph and in every subgraph and function; outputs never reuse an input's
data file names.
"""

from __future__ import annotations

import os
import pathlib

import onnx
from google.protobuf.message import DecodeError

from .sidecar import ModelFolderError


class UnsafeModelError(ValueError):
    """The model's external data reaches outside its folder."""


def load_model_file(model_path: pathlib.Path) -> onnx.ModelProto:
    """The model at `model_path` without its external data. A file that is not a whole ONNX model
    (truncated, corrupt, another format) is a one-line ModelFolderError naming it."""
    model_path = pathlib.Path(model_path)
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except DecodeError as error:
        # from None: protobuf's traceback says less than this line
        raise ModelFolderError(f"{model_path}: not a readable ONNX model, truncated or corrupt ({error})") from None
    # Protobuf parses a file cut between two fields (even an empty one) as a model lacking the rest.
    for field in ("graph", "opset_import"):
        if not (model.HasField(field) if field == "graph" else len(model.opset_import)):
            raise ModelFolderError(f"{model_path}: not a whole ONNX model (no {field}: truncated or not ONNX)")
    return model


def _graph_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto):
    """Tensors held by a node's attributes, including every tensor of its subgraphs (If, Loop, Scan
    bodies, at any depth): ONNX Runtime reads their external data like the main graph's."""
    for attribute in node.attribute:
        if attribute.HasField("t"):
            yield attribute.t
        yield from attribute.tensors
        for sparse in ([attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []) + list(
                attribute.sparse_tensors):
            yield from (sparse.values, sparse.indices)
        if attribute.HasField("g"):
            yield from _graph_tensors(attribute.g)
        for graph in attribute.graphs:
            yield from _graph_tensors(graph)


def model_tensors(model: onnx.ModelProto):
    """Every tensor a model holds: the graph's, its subgraphs', its local functions' and its training
    graphs'."""
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)
    for info in model.training_info:
        yield from _graph_tensors(info.initialization)
        yield from _graph_tensors(info.algorithm)


def external_data_files(model: onnx.ModelProto) -> set[str]:
    locations = set()
    for tensor in model_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {entry.key: entry.value for entry in tensor.external_data}
            locations.add(entries.get("location", ""))
    return locations


def check_external_data(model_path: pathlib.Path, model: onnx.ModelProto | None = None) -> set[str]:
    """Validate every external data location of the model at `model_path` (`model`: that file,
    already loaded without its external data); return the file names."""
    model_path = pathlib.Path(model_path)
    folder = model_path.resolve().parent
    files = external_data_files(model if model is not None else load_model_file(model_path))
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
