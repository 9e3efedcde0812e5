"""The export pipeline: Hugging Face model -> optimum ONNX -> Quest rewrite -> checked, saved model.

Each long step is announced; nothing is written to the output folder unless every step succeeds
(the work happens in a temporary folder next to it and is moved into place at the end).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import tempfile
import time

from .families import FAMILIES, build_default_model, load_checkpoint, read_config
from .rewrite import ExportError, Geometry, SparseSettings, rewrite_attention
from ..model_folder.sidecar import SIDECAR_NAME, Sidecar
from .validate import validate_export

MODEL_FILE = "model.quest.onnx"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "generation_config.json", "chat_template.jinja")


@dataclasses.dataclass
class ExportReport:
    output: pathlib.Path
    counts: dict
    validation_max_abs_diff: float | None
    seconds: float


class Progress:
    """Numbered step messages with their durations."""

    def __init__(self, total: int, log=print):
        self.total, self.index, self.log, self.started = total, 0, log, None

    def step(self, message: str) -> None:
        self.done()
        self.index += 1
        self.started = time.perf_counter()
        self.log(f"[{self.index}/{self.total}] {message} ...", end="", flush=True)

    def done(self) -> None:
        if self.started is not None:
            self.log(f" {time.perf_counter() - self.started:.1f}s", flush=True)
            self.started = None



def _fit_dense_layers(settings: SparseSettings, geometry: Geometry) -> SparseSettings:
    """The settings with the default dense layers that the model has (a one-layer model keeps
    layer 0 only); dense layers a user listed must all exist."""
    missing = [layer for layer in settings.dense_layers if layer >= geometry.num_layers]
    default = next(field.default for field in dataclasses.fields(SparseSettings) if field.name == "dense_layers")
    if missing and settings.dense_layers != default:
        raise ExportError(f"dense layers {missing} do not exist: the model has {geometry.num_layers} layers "
                          f"(0 to {geometry.num_layers - 1})")
    kept = tuple(layer for layer in settings.dense_layers if layer < geometry.num_layers)
    return dataclasses.replace(settings, dense_layers=kept)

def _geometry(config: dict) -> Geometry:
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


def export_sparse(
    family: str,
    *,
    output: pathlib.Path,
    settings: SparseSettings,
    model: str | None = None,
    capacity: int | None = None,
    overwrite: bool = False,
    validate: bool = True,
    log=print,
) -> ExportReport:
    """Export `family` (the embedded default, or `model`) with its attention rewritten to Quest ops."""
    import onnx_ir as ir

    from ..model_folder.safety import check_external_data

    if family not in FAMILIES:
        raise ExportError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    output = _prepare_output(output, overwrite, [pathlib.Path(model)] if model and pathlib.Path(model).exists() else [])
    begin = time.perf_counter()
    progress = Progress(5 if validate else 4, log)
    with tempfile.TemporaryDirectory(prefix=".quest-export-", dir=output.parent) as work_name:
        work = pathlib.Path(work_name)
        fam = FAMILIES[family]
        if model is None:
            progress.step(f"building the default {family} model (random weights, seed 0)")
            checkpoint = work / "checkpoint"
            build_default_model(fam, checkpoint)
            source = f"default {family} (random weights)"
        else:
            progress.step(f"loading {model}")
            checkpoint = load_checkpoint(model, work)
            source = str(model)
        config = read_config(checkpoint)
        if config.get("model_type") != fam.model_type:
            raise ExportError(f"{source} is a {config.get('model_type')!r} model, not {fam.model_type!r} "
                              f"(family {family})")
        geometry = _geometry(config)
        settings = _fit_dense_layers(settings, geometry)
        progress.step("exporting with optimum (TorchScript, opset 18)")
        optimum_path = optimum_export(checkpoint, work / "optimum")
        check_external_data(optimum_path)
        progress.step(f"rewriting {geometry.num_layers} attention layers into Quest ops")
        onnx_model = ir.load(optimum_path)
        capacity = int(capacity or min(config.get("max_position_embeddings", 8192), 8192))
        counts = rewrite_attention(onnx_model, settings, geometry, capacity=capacity)
        progress.step("checking and saving")
        staged, _ = _save(onnx_model, work, counts, geometry, settings, family, source, capacity,
                                int(config["vocab_size"]), eos=_eos_ids(checkpoint), tokenizer_from=checkpoint)
        difference = None
        if validate:
            progress.step("validating against the optimum model")
            difference = validate_export(optimum_path, staged)
        progress.done()
        _place(staged, output)
    return ExportReport(output, counts, difference, time.perf_counter() - begin)


def _save(onnx_model, work: pathlib.Path, counts: dict, geometry: Geometry, settings: SparseSettings, family: str,
          source: str, capacity: int, vocab: int, eos: list[int], tokenizer_from: pathlib.Path | None):
    """Save the rewritten model under fresh file names with its sidecar (and tokenizer files)."""
    import onnx
    import onnx_ir as ir

    from ..graphs.functions import expand_quest_nodes
    from ..graphs.portable import resolve_cast_like, value_types

    staged = work / "out"
    staged.mkdir()
    _load_external_constants(onnx_model)
    if settings.portable:  # every Quest node as its standard-op body: no op library needed to run it
        expand_quest_nodes(onnx_model)
    ir.save(onnx_model, staged / MODEL_FILE, external_data=MODEL_FILE + ".data")
    if settings.portable:  # the bodies' dtype-generic CastLike becomes Cast (CANN's graph mode has no CastLike)
        graph_only = onnx.load(str(staged / MODEL_FILE), load_external_data=False)
        resolve_cast_like(graph_only, value_types(staged / MODEL_FILE))
        onnx.save(graph_only, str(staged / MODEL_FILE))  # the data file stays as written
    check_model_path(staged / MODEL_FILE)
    bounds = _bounds_dtype(onnx_model)
    sidecar = Sidecar(
        model_file=MODEL_FILE, family=family, source=source, geometry=geometry,
        # as exported: the cache and bound dtypes resolved, the dense layers those the model has
        settings=dataclasses.replace(settings, kv_dtype=settings.kv_dtype or geometry.activation_dtype,
                                     bounds_dtype=bounds, dense_layers=tuple(counts["dense_layers"]),
                                     track_importance=None),
        vocab_size=vocab, capacity=capacity, sparse_layers=counts["sparse_layers"],
        layers=[Sidecar.layer_io(layer, layer in counts["sparse_layers"], settings.importance)
                for layer in range(geometry.num_layers)],
        eos_token_ids=eos,
        inputs={name: name for name in ("input_ids", "past_lens", "total_lens", "exact_lens")
                if any(value.name == name for value in onnx_model.graph.inputs)},
        exporter={"tool": "quest_ort export-sparse", "onnx": onnx.__version__, "input_kind": counts["kind"],
                  "rules": sorted(set(counts["layers"].values()))},
    )
    copied = [name for name in TOKENIZER_FILES if tokenizer_from and (tokenizer_from / name).is_file()]
    if copied:
        (staged / "tokenizer").mkdir()
        for name in copied:
            shutil.copy2(tokenizer_from / name, staged / "tokenizer" / name)
        sidecar.tokenizer = "tokenizer"
    sidecar.write(staged)
    return staged, sidecar


def _bounds_dtype(onnx_model) -> str | None:
    """The dtype of the graph's block bounds (None without sparse layers)."""
    import onnx_ir as ir

    bounds = next((v for v in onnx_model.graph.inputs if (v.name or "").startswith("past_block_max.")), None)
    return None if bounds is None else {ir.DataType.FLOAT: "float32", ir.DataType.FLOAT16: "float16"}[bounds.type.dtype]


def _load_external_constants(onnx_model) -> None:
    """Constant nodes whose tensor the exporter stored as external data get it in memory, so that
    no tensor of the output keeps pointing at the input's data files (initializers are re-written
    into our own data file by ir.save)."""
    import onnx_ir as ir

    for node in ir.traversal.RecursiveGraphIterator(onnx_model.graph):
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.TENSOR and isinstance(attribute.value, ir.ExternalTensor):
                node.attributes[attribute.name] = ir.AttrTensor(attribute.name, ir.tensor(attribute.value.numpy()))


def _place(staged: pathlib.Path, output: pathlib.Path) -> None:
    if output.exists():
        shutil.rmtree(output)
    staged.rename(output)


def _prepare_output(output: pathlib.Path, overwrite: bool, inputs: list[pathlib.Path]) -> pathlib.Path:
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


def rewrite_onnx(
    model_path: pathlib.Path,
    *,
    output: pathlib.Path,
    settings: SparseSettings,
    capacity: int = 8192,
    overwrite: bool = False,
    validate: bool = True,
    log=print,
) -> ExportReport:
    """Rewrite an already exported ONNX model (GroupQueryAttention or opset-23 Attention graphs, or
    an optimum export) into a Quest model folder, validated against the input graph as export_sparse
    validates against optimum's; the input's files are only read."""
    import onnx_ir as ir

    from .rewrite import geometry_from_graph
    from ..model_folder.safety import check_external_data

    model_path = pathlib.Path(model_path)
    if not model_path.is_file():
        raise FileNotFoundError(f"--model {model_path}: no such ONNX file")
    output = _prepare_output(output, overwrite, [model_path])
    begin = time.perf_counter()
    progress = Progress(4 if validate else 3, log)
    with tempfile.TemporaryDirectory(prefix=".quest-export-", dir=output.parent) as work_name:
        work = pathlib.Path(work_name)
        progress.step(f"checking and loading {model_path.name}")
        check_external_data(model_path)
        onnx_model = ir.load(model_path)
        geometry = geometry_from_graph(onnx_model)
        settings = _fit_dense_layers(settings, geometry)
        progress.step(f"rewriting {geometry.num_layers} attention layers into Quest ops")
        counts = rewrite_attention(onnx_model, settings, geometry, capacity=capacity)
        logits = next((v for v in onnx_model.graph.outputs if v.name == "logits"), None)
        vocab = logits.shape[-1] if logits is not None and logits.shape is not None else None
        if not isinstance(vocab, int):
            raise ExportError("the model has no logits output with a known vocabulary size")
        progress.step("checking and saving")
        folder = model_path.parent
        staged, _ = _save(onnx_model, work, counts, geometry, settings, "onnx", str(model_path), capacity, vocab,
                          eos=_eos_ids(folder), tokenizer_from=folder)
        difference = None
        if validate:
            progress.step(f"validating against {model_path.name}")
            difference = validate_export(model_path, staged)
        progress.done()
        _place(staged, output)
    return ExportReport(output, counts, difference, time.perf_counter() - begin)


def check_model_path(path: pathlib.Path) -> None:
    """The full onnx checker (custom domain included) on the saved model, by path (any size)."""
    import onnx

    from ..ops.registry import register_schemas

    register_schemas()
    onnx.checker.check_model(str(path), full_check=True)


def _eos_ids(checkpoint: pathlib.Path) -> list[int]:
    path = checkpoint / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
