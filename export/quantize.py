"""Quantized weights for a saved model folder: its MatMul weights into com.microsoft.MatMulNBits, by ONNX Runtime's own quantizer.

`export-sparse --weights int8|int4` runs this after the attention rewrite, on the saved float folder
that was validated exactly against the source: a rewrite error and the quantization's drift are
measured apart. (The rules would match a graph quantized first too: they start at the rotated
query, and what produces q, k and v is read, not matched. The attention's own MatMuls, Q.K^T and
P.V, multiply activations, so they are never quantized.)

Which weights: every MatMul whose weight is a constant float matrix. In the exported LLMs those are
the q/k/v/o projections, the MLP's gate/up/down and the LM head (which keeps its own transposed copy
of a tied embedding). With int4 also the token embedding, a Gather of a constant matrix, into
com.microsoft.GatherBlockQuantized (the quantizer packs Gathers in 4 bits only): a float32
embedding is most of an int4 folder (544 of Qwen2.5-Coder's 854 MB) and is resident all along.
How (measured in docs/export.md): round to nearest in blocks of 32 along K, symmetric (no zero points), with accuracy level 4
(MatMulNBits quantizes the activations to int8 per block and multiplies in integers): ONNX
Runtime's fast CPU path, where int8 weights decoded SmolLM2 about 20 times and int4 about twice as
fast as at level 0 (float activations). Asymmetric blocks lose far more on GGUF sources, whose
weights already lie on a 4-bit grid that a rounded zero point shifts; HQQ's float zero points keep
more but run on MatMulNBits' slow path, slower than float32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib

from ..model_folder.folder_check import float_weight_gathers, float_weight_matmuls
from ..model_folder.settings import WEIGHT_BITS
from .rewrite import ExportError

BLOCK_SIZE = 32  # weights per scale along K (MatMulNBits' block_size; 16 and up, a power of 2)
# The ops each weight type quantizes: Gathers (the embedding) only in 4 bits, as the quantizer packs them.
QUANTIZED_OPS = {"int8": ("MatMul",), "int4": ("MatMul", "Gather")}
ACCURACY_LEVEL = 4  # MatMulNBits' accuracy_level: int8 activations, integer products


@dataclasses.dataclass(frozen=True)
class QuantizedWeights:
    weights: str  # "int8" or "int4"
    matmuls: tuple[str, ...]  # the MatMul nodes whose weights became MatMulNBits
    gathers: tuple[str, ...] = ()  # the Gather nodes (the embedding) that became GatherBlockQuantized


@contextlib.contextmanager
def _quiet_quantizer():
    """ONNX Runtime's matmul_nbits_quantizer calls logging.basicConfig(level=INFO) on import (a
    root handler that would print every library's INFO records from then on) and logs two lines per
    node: the root logger is put back as it was, and the quantizer's INFO lines are dropped."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quantizer_log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    quantizer_level = quantizer_log.level
    try:
        from onnxruntime.quantization import matmul_nbits_quantizer
    finally:
        for handler in set(root.handlers) - set(handlers):
            root.removeHandler(handler)
        root.setLevel(level)
    quantizer_log.setLevel(logging.WARNING)
    try:
        yield matmul_nbits_quantizer
    finally:
        quantizer_log.setLevel(quantizer_level)


INT4_OPSET, INT4_IR_VERSION = 21, 10  # the first ONNX opset and IR version with the int4 element type


def _int4_opset(model):
    """`model` at ONNX opset 21, converted by onnx's version converter (each op through its own
    adapter). A packed int4 lookup table (GatherBlockQuantized's data) needs opset 21's int4 type;
    ONNX Runtime's quantizer would otherwise only overwrite the opset number of an older graph (it
    warns that the result "may not be a valid model")."""
    import onnx
    from onnx import version_converter

    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)
    # The weights are set aside while the graph is converted: the converter serializes the model,
    # which protobuf caps at 2 GB (a 0.5B model's float weights are 2.5 GB); it reads no weight.
    # Meanwhile each stands as a graph input of its type and shape, so the graph stays whole.
    weights = list(model.graph.initializer)
    inputs = len(model.graph.input)
    model.graph.ClearField("initializer")
    listed = {value.name for value in model.graph.input}  # (an initializer may be a graph input already)
    model.graph.input.extend(onnx.helper.make_tensor_value_info(w.name, w.data_type, w.dims) for w in weights
                             if w.name not in listed)
    if opset is not None and opset < INT4_OPSET:
        model = version_converter.convert_version(model, INT4_OPSET)
    model.ir_version = max(model.ir_version, INT4_IR_VERSION)
    onnx.checker.check_model(model)  # what the converter wrote, before anything is packed into it
    del model.graph.input[inputs:]
    model.graph.initializer.extend(weights)
    return model


def quantize_model(source: pathlib.Path, target: pathlib.Path, weights: str) -> QuantizedWeights:
    """Quantize the MatMul weights of the float model file `source` to `weights` ("int8" or "int4"),
    writing the graph, holding MatMulNBits nodes, to `target` and its data to target + ".data"
    (`target` may be `source`: its files are then replaced). The folder's sidecar is its writer's
    business (pipeline/run.py writes the quantized folder's once)."""
    import onnx
    import onnx_ir as ir

    from .steps import check_model_path

    if weights not in WEIGHT_BITS:
        raise ExportError(f"weights must be one of {list(WEIGHT_BITS)} to quantize, got {weights!r}")
    path = pathlib.Path(source)
    model = onnx.load(str(path))  # its external data too: the files are rewritten below
    matmuls = tuple(node.name for node in float_weight_matmuls(model.graph))
    gathers = tuple(node.name for node in float_weight_gathers(model.graph)) if "Gather" in QUANTIZED_OPS[weights] else ()
    if not matmuls:
        raise ExportError(f"--weights {weights}: the graph has no MatMul with a float weight to quantize")
    if gathers:
        model = _int4_opset(model)
    with _quiet_quantizer() as quantizer_module:
        config = quantizer_module.DefaultWeightOnlyQuantConfig(
            block_size=BLOCK_SIZE, is_symmetric=True, bits=WEIGHT_BITS[weights], accuracy_level=ACCURACY_LEVEL,
            op_types_to_quantize=QUANTIZED_OPS[weights])
        quantizer = quantizer_module.MatMulNBitsQuantizer(model, algo_config=config)
        quantizer.process()
    quantized = quantizer.model.model
    left = float_weight_matmuls(quantized.graph)
    if left:  # the quantizer skips what it cannot pack (a batched weight); a float copy would stay
        raise ExportError(f"--weights {weights}: ONNX Runtime's quantizer left {len(left)} MatMul weights in float "
                          f"(first: node {left[0].name!r}, weight {left[0].input[1]!r})")
    left = float_weight_gathers(quantized.graph) if gathers else []
    if left:
        raise ExportError(f"--weights {weights}: ONNX Runtime's quantizer left {len(left)} Gather tables in float "
                          f"(first: node {left[0].name!r}, table {left[0].input[0]!r})")
    target = pathlib.Path(target)
    data = pathlib.Path(str(target) + ".data")
    for old in (target, data):
        old.unlink(missing_ok=True)
    ir.save(ir.serde.deserialize_model(quantized), target, external_data=data.name)
    check_model_path(target)
    return QuantizedWeights(weights, matmuls, gathers)
