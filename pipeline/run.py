"""The export pipeline: a Hugging Face model or an ONNX file in, a checked, validated model folder out.

Both entry points run one skeleton; only how the source graph is obtained differs:
```
export_sparse: build or load the checkpoint -> optimum export --.
rewrite_onnx:  check and load the .onnx file -------------------+-> [measure the key ranges] -> rewrite
      attention -> save (checked) -> validate against the source
      [-> quantize the weights -> validate their drift] -> place
```
(the bracketed steps: with int8 caches, the key channels' ranges measured on the source graph
(pipeline/calibrate.py); with `settings.weights` int8 or int4, a float folder is validated exactly,
then quantized into the output's folder, and only the quantized files reach the output)
The settings are resolved once, by the rewrite (RewriteResult.settings: the cache and bound types,
the dense layers...); the output folder's sidecar is built from them once and written once.
Each long step is announced; nothing is written to the output folder unless every step succeeds
(the work happens in a temporary folder next to it and is moved into place at the end).
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import tempfile
import time
from typing import Callable

from ..export.families import FAMILIES, build_default_model, load_checkpoint, read_config
from ..export.quantize import BLOCK_SIZE, QUANTIZED_OPS, QuantizedWeights, quantize_model
from ..export.rewrite import ExportError, RewriteResult, SparseSettings, geometry_from_graph, rewrite_attention
from ..export.genai_variant import genai_refusal, write_genai_files
from ..export.rewrite.genai_config import read_genai_config
from ..export.steps import (MODEL_FILE, copy_tokenizer, eos_ids, fit_dense_layers, folder_sidecar, geometry_from_config,
                            optimum_export, place, prepare_output, save_folder, tokenizer_files)
from ..model_folder.safety import check_external_data
from ..model_folder.settings import Geometry
from ..ops import get_library_path
from .calibrate import CALIBRATION_TOKENS, calibrate_key_factors
from .progress import Progress
from .validate import Drift, SourceLogits, narrow_cache, validate_drift, validate_export


@dataclasses.dataclass
class ExportReport:
    output: pathlib.Path
    rewrite: RewriteResult
    validation_max_abs_diff: float | None
    seconds: float
    quantized: QuantizedWeights | None = None  # with --weights int8 or int4
    weight_drift: Drift | None = None  # their validation (with narrow caches, of both)
    cache_drift: Drift | None = None  # caches narrower than the activations: their validation
    genai: list[str] | str | None = None  # the onnxruntime-genai files written, or why there are none


@dataclasses.dataclass
class _Source:
    """The graph to rewrite and what the folder records of where it came from."""

    model: object  # onnx_ir.Model, loaded
    path: pathlib.Path  # its file: what the export is validated against
    geometry: Geometry
    settings: SparseSettings  # the settings, fitted to the geometry (fit_dense_layers)
    family: str
    description: str
    capacity: int
    vocab: int | None  # None: read from the rewritten graph's logits
    folder: pathlib.Path  # holds its generation config and tokenizer files
    eos: list[int] | None = None  # None: from the folder's generation_config.json


def export_sparse(
    family: str,
    *,
    output: pathlib.Path,
    settings: SparseSettings,
    model: str | None = None,
    capacity: int | None = None,
    overwrite: bool = False,
    validate: bool = True,
    log=None,
) -> ExportReport:
    """Export `family` (the embedded default, or `model`) with its attention rewritten to Quest ops.
    `log`: called with each finished step's line (default: the quest_ort logger, with a bar on a terminal)."""
    if family not in FAMILIES:
        raise ExportError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")

    def source(work: pathlib.Path, progress: Progress) -> _Source:
        import onnx_ir as ir

        fam = FAMILIES[family]
        if model is None:
            progress.step(f"building the default {family} model (random weights, seed 0)")
            checkpoint = work / "checkpoint"
            build_default_model(fam, checkpoint)
            description = f"default {family} (random weights)"
        else:
            progress.step(f"loading {model}")
            checkpoint = load_checkpoint(model, work)
            description = str(model)
        config = read_config(checkpoint)
        if config.get("model_type") != fam.model_type:
            raise ExportError(f"{description} is a {config.get('model_type')!r} model, not {fam.model_type!r} "
                              f"(family {family})")
        geometry = geometry_from_config(config)
        fitted = fit_dense_layers(settings, geometry)  # a wrong layer list fails before optimum's minutes
        progress.step("exporting with optimum (TorchScript, opset 18)")
        optimum_path = optimum_export(checkpoint, work / "optimum")
        check_external_data(optimum_path)
        return _Source(ir.load(optimum_path), optimum_path, geometry, fitted, family, description,
                       int(capacity or min(config.get("max_position_embeddings", 8192), 8192)),
                       int(config["vocab_size"]), checkpoint)

    inputs = [pathlib.Path(model)] if model and pathlib.Path(model).exists() else []
    return _export(source, 2, "the optimum model", output, inputs, overwrite, validate, settings, log)


def rewrite_onnx(
    model_path: pathlib.Path,
    *,
    output: pathlib.Path,
    settings: SparseSettings,
    capacity: int | None = None,
    overwrite: bool = False,
    validate: bool = True,
    log=None,
) -> ExportReport:
    """Rewrite an already exported ONNX model (GroupQueryAttention or opset-23 Attention graphs, or
    an optimum export) into a Quest model folder, validated against the input graph as export_sparse
    validates against optimum's; the input's files are only read. A genai_config.json next to the
    model (onnxruntime-genai's builder) gives the geometry the graph leaves symbolic, the EOS ids and
    the default capacity (its context length, at most 8192; else 8192)."""
    model_path = pathlib.Path(model_path)
    if not model_path.is_file():
        raise FileNotFoundError(f"--model {model_path}: no such ONNX file")

    def source(work: pathlib.Path, progress: Progress) -> _Source:
        import onnx_ir as ir

        progress.step(f"checking and loading {model_path.name}")
        check_external_data(model_path)
        onnx_model = ir.load(model_path)
        packed = next((n.name for n in onnx_model.graph.all_nodes() if n.op_type == "MatMulNBits"), None)
        if settings.weights != "float" and packed is not None:
            raise ExportError(f"--weights {settings.weights}: {model_path.name} holds quantized weights already "
                              f"(MatMulNBits node {packed!r}); export it with its own weights (--weights float)")
        geometry = geometry_from_graph(onnx_model, folder=model_path.parent)
        genai = read_genai_config(model_path.parent)
        default_capacity = min(genai.context_length or 8192, 8192) if genai is not None else 8192
        return _Source(onnx_model, model_path, geometry, fit_dense_layers(settings, geometry), "onnx",
                       str(model_path), capacity or default_capacity, None, model_path.parent,
                       eos=genai.eos_token_ids if genai is not None else None)

    return _export(source, 1, model_path.name, output, [model_path], overwrite, validate, settings, log)


def _export(source: Callable[[pathlib.Path, Progress], _Source], source_steps: int, reference: str,
            output: pathlib.Path, inputs: list[pathlib.Path], overwrite: bool, validate: bool,
            settings: SparseSettings, log) -> ExportReport:
    """The skeleton both entry points share: `source` announces its `source_steps` steps and returns
    the graph; `reference` names that graph in the validation and calibration steps."""
    output = prepare_output(output, overwrite, inputs)
    begin = time.perf_counter()
    weights = settings.weights
    quantize = weights != "float"
    smoothing = settings.kv_dtype == "int8" and settings.key_smoothing
    progress = Progress(source_steps + 2 + smoothing + bool(validate) + quantize * (1 + bool(validate)), log)
    with tempfile.TemporaryDirectory(prefix=".quest-export-", dir=output.parent) as work_name:
        work = pathlib.Path(work_name)
        graph = source(work, progress)
        vocab = graph.vocab if graph.vocab is not None else _logits_vocab(graph.model)
        # the source graph's logits on the validation's tokens, computed once for every folder compared
        reference_logits = SourceLogits(graph.path, graph.geometry)
        key_factors = None
        if smoothing:
            progress.step(f"measuring the key channels' ranges for the int8 cache ({CALIBRATION_TOKENS} random "
                          f"tokens through {reference})")
            key_factors = calibrate_key_factors(reference_logits.runner, vocab)
            reference_logits.release()  # its session is not held through the rewrite and the save
        progress.step(f"rewriting {graph.geometry.num_layers} attention layers into Quest ops")
        rewrite = rewrite_attention(graph.model, graph.settings, graph.geometry, capacity=graph.capacity,
                                   key_factors=key_factors)
        progress.step("checking and saving")
        eos = eos_ids(graph.folder) if graph.eos is None else graph.eos
        # The folder's one description, its settings the rewrite's (every default resolved, once).
        sidecar = folder_sidecar(graph.model, rewrite, graph.geometry, graph.family, graph.description,
                                 graph.capacity, vocab, eos, tokenizer=bool(tokenizer_files(graph.folder)))
        # Saved float first (the rewrite is validated exactly); quantized weights go into a folder of
        # their own below, whose sidecar is this one, written there once.
        staged = work / ("float" if quantize else "out")
        float_sidecar = dataclasses.replace(sidecar, settings=dataclasses.replace(sidecar.settings, weights="float"))
        save_folder(graph.model, staged, float_sidecar if quantize else sidecar, tokenizer_from=graph.folder)
        difference = quantized = drift = cache_drift = None
        activation = graph.geometry.activation_dtype
        kv = sidecar.settings.kv_dtype
        if validate and narrow_cache(kv, activation):
            progress.step(f"validating against {reference}: the rewrite with {activation} caches, then the logit "
                          f"drift of the {kv} caches")
            twin = _activation_cache_twin(graph, work / "twin", vocab)
            difference = validate_export(reference_logits, twin)
            shutil.rmtree(twin)
            cache_drift = validate_drift(reference_logits, staged)
        elif validate:
            progress.step(f"validating against {reference}")
            difference = validate_export(reference_logits, staged)
        reference_logits.release()  # the weights' drift below reads the logits kept, not the source
        if quantize:
            embedding = ", the embedding into GatherBlockQuantized" if "Gather" in QUANTIZED_OPS[weights] else ""
            progress.step(f"quantizing the MatMul weights to {weights} (ONNX Runtime's MatMulNBits{embedding}, "
                          f"blocks of {BLOCK_SIZE})")
            float_folder, staged = staged, work / "out"
            staged.mkdir()
            quantized = quantize_model(float_folder / MODEL_FILE, staged / MODEL_FILE, weights)
            if sidecar.tokenizer is not None:
                copy_tokenizer(float_folder / sidecar.tokenizer, staged)
            sidecar.write(staged)
            shutil.rmtree(float_folder)
            if validate:
                progress.step(f"measuring the logit drift of the {weights} weights against {reference}")
                drift = validate_drift(reference_logits, staged)
        genai_files = genai_refusal(sidecar)
        if genai_files is None:  # the genai variant reads the final graph: written last
            genai_files = write_genai_files(staged, sidecar, get_library_path())
        progress.done()
        place(staged, output)
    return ExportReport(output, rewrite, difference, time.perf_counter() - begin, quantized, drift, cache_drift,
                        genai_files)


def _activation_cache_twin(graph: _Source, work: pathlib.Path, vocab: int) -> pathlib.Path:
    """The source rewritten again with caches of its activation type (no key smoothing), saved under
    `work`: validate_export checks this rewrite exactly where narrow caches could only drift."""
    import onnx_ir as ir

    settings = dataclasses.replace(graph.settings, kv_dtype=None, key_smoothing=False, weights="float")
    model = ir.load(graph.path)
    rewrite = rewrite_attention(model, settings, graph.geometry, capacity=graph.capacity)
    sidecar = folder_sidecar(model, rewrite, graph.geometry, graph.family, graph.description, graph.capacity, vocab,
                             eos=[], tokenizer=False)
    save_folder(model, work, sidecar, tokenizer_from=None)
    return work


def _logits_vocab(onnx_model) -> int:
    logits = next((v for v in onnx_model.graph.outputs if v.name == "logits"), None)
    vocab = logits.shape[-1] if logits is not None and logits.shape is not None else None
    if not isinstance(vocab, int):
        raise ExportError("the model has no logits output with a known vocabulary size")
    return vocab
