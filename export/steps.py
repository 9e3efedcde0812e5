"""The steps of an export that write a model folder; pipeline/run.py runs them in order.

A checkpoint's geometry, optimum's ONNX export, and the checked, saved model folder (graph,
sidecar, tokenizer files) moved into place.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

from ..model_folder.settings import Geometry, SparseSettings
from ..model_folder.sidecar import Sidecar
from .rewrite import ExportError, RewriteResult

MODEL_FILE = "model.quest.onnx"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "generation_config.json", "chat_template.jinja")


def fit_dense_layers(settings: SparseSettings, geometry: Geometry) -> SparseSettings:
    """The settings with the default dense layers that the model has (a one-layer model keeps
    layer 0 only); dense layers a user listed must all exist."""
    missing = [layer for layer in settings.dense_layers if layer >= geometry.num_layers]
    default = next(field.default for field in dataclasses.fields(SparseSettings) if field.name == "dense_layers")
    if missing and settings.dense_layers != default:
        raise ExportError(f"dense layers {missing} do not exist: the model has {geometry.num_layers} layers "
                          f"(0 to {geometry.num_layers - 1})")
    kept = tuple(layer for layer in settings.dense_layers if layer < geometry.num_layers)
    return dataclasses.replace(settings, dense_layers=kept)


def geometry_from_config(config: dict) -> Geometry:
    heads = config["num_attention_heads"]
    return Geometry(
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        kv_num_heads=config.get("num_key_value_heads", heads),
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        activation_dtype="float32",  # optimum exports float32 graphs
    )


def optimum_export(checkpoint: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """optimum's TorchScript export (opset 18, with past key values) of a local checkpoint."""
    import contextlib
    import io
    import logging
    import warnings

    import transformers
    from optimum.exporters.onnx import main_export

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    quiet = logging.getLogger("optimum")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            # no_post_process: optimum's weight de-duplication serialises the whole model in one
            # protobuf, which fails past 2 GB (and may merge equal norm weights); nothing else needs it.
            main_export(str(checkpoint), output=str(out), task="text-generation-with-past", opset=18,
                        do_validation=False, device="cpu", no_post_process=True)
    finally:
        transformers.logging.set_verbosity(verbosity)
        quiet.setLevel(level)
    return out / "model.onnx"


def folder_sidecar(onnx_model, rewrite: RewriteResult, geometry: Geometry, family: str, source: str, capacity: int,
                   vocab: int, eos: list[int], tokenizer: bool) -> Sidecar:
    """What the folder of this rewrite records: its settings as exported (rewrite.settings, the one
    value), its layers' and graph's I/O names, where it came from. Written once, into the folder
    that holds the final graph (save_folder; the quantized folder's by the pipeline)."""
    import onnx

    settings = rewrite.settings
    graph_bounds = _bounds_dtype(onnx_model)
    if graph_bounds != settings.bounds_dtype:
        raise ExportError(f"the rewritten graph's block bounds are {graph_bounds}, its settings say "
                          f"{settings.bounds_dtype}")
    layers = [Sidecar.layer_io(layer, layer in rewrite.sparse_layers, settings.importance,
                               int8=settings.kv_dtype == "int8", int8_bounds=settings.bounds_dtype == "int8",
                               superblocks=settings.superblocks > 0)
              for layer in range(geometry.num_layers)]
    return Sidecar(
        model_file=MODEL_FILE, family=family, source=source, geometry=geometry, settings=settings,
        vocab_size=vocab, capacity=capacity, sparse_layers=rewrite.sparse_layers, layers=layers,
        eos_token_ids=eos,
        inputs={name: name for name in ("input_ids", "past_lens", "total_lens", "exact_lens", "chunk_lens", "logits_keep")
                if any(value.name == name for value in onnx_model.graph.inputs)},
        exporter={"tool": "quest_ort export-sparse", "onnx": onnx.__version__, "input_kind": rewrite.kind,
                  "rules": sorted(set(rewrite.layers.values()))},
        tokenizer="tokenizer" if tokenizer else None,
    )


def save_folder(onnx_model, folder: pathlib.Path, sidecar: Sidecar, tokenizer_from: pathlib.Path | None) -> None:
    """Save the rewritten model into the new `folder` under fresh file names, with `sidecar` (its
    tokenizer files, when it names them, copied from `tokenizer_from`)."""
    import onnx
    import onnx_ir as ir

    from ..graphs.functions import expand_quest_nodes
    from ..graphs.portable import resolve_cast_like, value_types
    from .rewrite.model_io import unname_unread_outputs

    staged = folder
    staged.mkdir()
    settings = sidecar.settings
    if settings.weights != "float":
        raise ExportError(f"save_folder writes the rewritten float graph; its sidecar says {settings.weights} weights")
    _load_external_constants(onnx_model)
    unname_unread_outputs(onnx_model.graph)
    if settings.portable:  # every Quest node as its standard-op body: no op library needed to run it
        expand_quest_nodes(onnx_model)
    ir.save(onnx_model, staged / MODEL_FILE, external_data=MODEL_FILE + ".data")
    if settings.portable:  # the bodies' dtype-generic CastLike becomes Cast (CANN's graph mode has no CastLike)
        graph_only = onnx.load(str(staged / MODEL_FILE), load_external_data=False)
        resolve_cast_like(graph_only, value_types(staged / MODEL_FILE))
        onnx.save(graph_only, str(staged / MODEL_FILE))  # the data file stays as written
    check_model_path(staged / MODEL_FILE)
    if sidecar.tokenizer is not None:
        copy_tokenizer(tokenizer_from, staged)
    sidecar.write(staged)


def tokenizer_files(folder: pathlib.Path | None) -> list[str]:
    """The tokenizer files `folder` (a checkpoint's, or a model folder's tokenizer/) holds."""
    return [name for name in TOKENIZER_FILES if folder is not None and (folder / name).is_file()]


def copy_tokenizer(source: pathlib.Path, folder: pathlib.Path) -> None:
    (folder / "tokenizer").mkdir()
    for name in tokenizer_files(source):
        shutil.copy2(source / name, folder / "tokenizer" / name)


def _bounds_dtype(onnx_model) -> str | None:
    """The dtype of the graph's block bounds (None without sparse layers)."""
    import onnx_ir as ir

    bounds = next((v for v in onnx_model.graph.inputs if (v.name or "").startswith("past_block_max.")), None)
    names = {ir.DataType.FLOAT: "float32", ir.DataType.FLOAT16: "float16", ir.DataType.INT8: "int8"}
    return None if bounds is None else names[bounds.type.dtype]


def _load_external_constants(onnx_model) -> None:
    """Constant nodes whose tensor the exporter stored as external data get it in memory, so that
    no tensor of the output keeps pointing at the input's data files (initializers are re-written
    into our own data file by ir.save)."""
    import onnx_ir as ir

    for node in ir.traversal.RecursiveGraphIterator(onnx_model.graph):
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.TENSOR and isinstance(attribute.value, ir.ExternalTensor):
                node.attributes[attribute.name] = ir.AttrTensor(attribute.name, ir.tensor(attribute.value.numpy()))


def place(staged: pathlib.Path, output: pathlib.Path) -> None:
    if output.exists():
        shutil.rmtree(output)
    staged.rename(output)


def prepare_output(output: pathlib.Path, overwrite: bool, inputs: list[pathlib.Path]) -> pathlib.Path:
    output = pathlib.Path(output).resolve()
    if output.exists() and any(output.iterdir()) and not overwrite:
        raise ExportError(f"{output} exists and is not empty (pass --overwrite to replace it)")
    for source in inputs:
        source = source.resolve()
        folder = source if source.is_dir() else source.parent
        if output == folder or folder in output.parents or output in folder.parents:
            raise ExportError(f"the output folder {output} may not contain or be inside the input's folder {folder}")
    output.parent.mkdir(parents=True, exist_ok=True)
    return output


def check_model_path(path: pathlib.Path) -> None:
    """The full onnx checker (custom domain included) on the saved model, by path (any size); ONNX
    Runtime's contrib ops (a builder model's MatMulNBits...) are checked against its own schemas."""
    import onnx

    from ..ops.registry import register_schemas
    from .ort_schemas import register_onnxruntime_schemas

    register_schemas()
    register_onnxruntime_schemas()
    onnx.checker.check_model(str(path), full_check=True)


def eos_ids(checkpoint: pathlib.Path) -> list[int]:
    path = checkpoint / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
