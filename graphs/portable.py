"""Portable Quest models: every Quest node replaced by its standard-op body (functions.py), for
runtimes without the op library, above all ONNX Runtime's CANN execution provider in graph mode
(docs/cann.md; `export-sparse --portable` writes them).

CANN's graph mode compiles a graph through CANN's graph engine and claims only nodes of the
standard domain whose op type is on its list (`CANN_GRAPH_OPS`); any other node splits the graph
and runs on the CPU. The function bodies avoid IsNaN/IsInf for that reason; this module turns the
bodies' dtype-generic CastLike into Cast once the types are known, and reports what is left
outside the list.
"""

from __future__ import annotations

import pathlib
import tempfile

import onnx

# The op types ONNX Runtime's CANN execution provider hands to CANN's graph engine
# (onnxruntime/core/providers/cann/cann_graph.cc, `cann_supported_ops`, ORT 1.2x).
CANN_GRAPH_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization BitShift Cast Ceil
Celu Clip Compress Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum DepthToSpace Det Div
Dropout Elu Equal Erf Exp Expand EyeLike Flatten Floor Gather GatherElements GatherND Gemm GlobalAveragePool
GlobalLpPool GlobalMaxPool Greater GreaterOrEqual Hardmax HardSigmoid HardSwish Identity InstanceNormalization
LeakyRelu Less LessOrEqual Log LogSoftmax LpNormalization LpPool LRN LSTM MatMul Max MaxPool MaxRoiPool
MaxUnpool Mean MeanVarianceNormalization Min Mod Mul Multinomial Neg NonMaxSuppression NonZero Not OneHot Or
Pad Pow PRelu RandomNormalLike RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum
ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize
ReverseSequence RoiAlign Round Scatter ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size
Slice Softmax SoftmaxCrossEntropyLoss Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tanh
TfIdfVectorizer ThresholdedRelu Tile TopK Transpose Unsqueeze Where Xor
""".split())


def value_types(model_path: pathlib.Path) -> dict[str, int]:
    """Element type of every typed value of the model at `model_path` (shape inference by path, so
    models with external data of any size work)."""
    with tempfile.TemporaryDirectory() as scratch:
        inferred = pathlib.Path(scratch) / "inferred.onnx"
        onnx.shape_inference.infer_shapes_path(str(model_path), str(inferred))
        model = onnx.load(str(inferred), load_external_data=False)
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    types.update({t.name: t.data_type for t in graph.initializer})
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    types[node.output[0]] = attribute.t.data_type
    return {name: elem for name, elem in types.items() if elem}


def resolve_cast_like(model: onnx.ModelProto, types: dict[str, int]) -> int:
    """Replace each CastLike(x, like) by Cast(x, to=type of like), in place; returns how many.

    Raises ValueError naming a CastLike whose target type is unknown.
    """
    replaced = 0
    for node in model.graph.node:
        if node.op_type != "CastLike" or node.domain not in ("", "ai.onnx"):
            continue
        like = node.input[1]
        if like not in types:
            raise ValueError(f"CastLike node {node.name or node.output[0]!r}: the type of {like!r} is unknown")
        source = node.input[0]
        node.op_type = "Cast"
        del node.input[:]
        node.input.append(source)
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("to", types[like]))
        replaced += 1
    return replaced


def ops_outside_cann_graph_mode(model: onnx.ModelProto) -> list[str]:
    """Sorted `domain::op_type` of the nodes CANN's graph mode would leave to the CPU."""
    outside = set()
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in CANN_GRAPH_OPS:
            outside.add(f"{node.domain or 'ai.onnx'}::{node.op_type}")
    return sorted(outside)
