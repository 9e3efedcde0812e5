"""Register the Quest schemas with `onnx.defs`, so the checker and shape inference understand them.

Type and shape inference follows the schema's dim symbols: a symbol bound by several inputs must
agree (a conflict between known dims raises), attribute-bound symbols come from the node, and
output dims are the symbols' values (or unknown when an input dim is symbolic).
"""

from __future__ import annotations

import functools

import onnx
from onnx import defs, helper

from .schemas import ALL_OPS, DOMAIN, TYPE_VARS, VERSION, OpSpec

_ONNX_TYPES = {"float32": "tensor(float)", "float16": "tensor(float16)", "int32": "tensor(int32)", "int8": "tensor(int8)"}
_ELEM_ENUM = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16, "int32": onnx.TensorProto.INT32,
              "int8": onnx.TensorProto.INT8}
_ATTR_TYPES = {"int": defs.OpSchema.AttrType.INT, "float": defs.OpSchema.AttrType.FLOAT, "string": defs.OpSchema.AttrType.STRING}


def _type_str(elem: str) -> str:
    return elem if elem in TYPE_VARS else _ONNX_TYPES[elem]


def _formal(tensor) -> defs.OpSchema.FormalParameter:
    option = defs.OpSchema.FormalParameterOption.Optional if tensor.optional else defs.OpSchema.FormalParameterOption.Single
    return defs.OpSchema.FormalParameter(tensor.name, _type_str(tensor.elem), tensor.doc, param_option=option)


def _attribute(attr) -> defs.OpSchema.Attribute:
    if attr.required:
        return defs.OpSchema.Attribute(attr.name, _ATTR_TYPES[attr.kind], attr.doc, required=True)
    return defs.OpSchema.Attribute(attr.name, helper.make_attribute(attr.name, attr.default), attr.doc)


def _attribute_value(ctx, attr):
    proto = ctx.get_attribute(attr.name)
    return attr.default if proto is None else helper.get_attribute_value(proto)


def _string(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _elem_name(elem: int) -> str:
    return onnx.helper.tensor_dtype_to_np_dtype(elem).name


def _check_attributes(spec: OpSpec, ctx) -> None:
    """The attribute rules the native adapter applies, so the checker names a bad attribute first."""
    for attr in spec.attributes:
        value = _attribute_value(ctx, attr)
        if value is None:
            continue  # a missing required attribute is the checker's own error
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        if attr.choices and value not in attr.choices:
            raise onnx.shape_inference.InferenceError(
                f"{spec.name}: attribute '{attr.name}' is {value!r}; expected one of {', '.join(attr.choices)}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value != value:
                raise onnx.shape_inference.InferenceError(f"{spec.name}: attribute '{attr.name}' is NaN")
            if attr.kind == "int" and not -(2**31) <= value < 2**31:
                raise onnx.shape_inference.InferenceError(
                    f"{spec.name}: attribute '{attr.name}' = {value} does not fit in int32")
            if attr.minimum is not None and value < attr.minimum:
                raise onnx.shape_inference.InferenceError(
                    f"{spec.name}: attribute '{attr.name}' must be >= {attr.minimum:g}, got {value}")
            if attr.maximum is not None and value > attr.maximum:
                raise onnx.shape_inference.InferenceError(
                    f"{spec.name}: attribute '{attr.name}' must be <= {attr.maximum:g}, got {value}")


def _infer(spec: OpSpec, ctx) -> None:
    _check_attributes(spec, ctx)
    dims: dict[str, int | str | None] = {}
    for symbol, attr_name in spec.symbol_attrs.items():
        dims[symbol] = _attribute_value(ctx, spec.attribute(attr_name))
    elem_types: dict[str, int] = {"int32": onnx.TensorProto.INT32, "float32": onnx.TensorProto.FLOAT,
                                  "float16": onnx.TensorProto.FLOAT16, "int8": onnx.TensorProto.INT8}
    type_vars = spec.type_vars()
    type_origin: dict[str, str] = {}
    for index, tensor in enumerate(spec.inputs):
        if index >= ctx.get_num_inputs() or not ctx.has_input(index):
            continue
        type_proto = ctx.get_input_type(index)
        if type_proto is None or not type_proto.HasField("tensor_type"):
            continue
        elem = type_proto.tensor_type.elem_type
        if tensor.elem in type_vars and _elem_name(elem) not in type_vars[tensor.elem]:
            raise onnx.shape_inference.InferenceError(
                f"{spec.name}: input '{tensor.name}' has element type {_elem_name(elem)}; "
                f"expected one of {', '.join(type_vars[tensor.elem])}"
            )
        if tensor.elem in TYPE_VARS and elem_types.setdefault(tensor.elem, elem) != elem:
            raise onnx.shape_inference.InferenceError(
                f"{spec.name}: input '{tensor.name}' has element type {_elem_name(elem)}, but input "
                f"'{type_origin[tensor.elem]}' has {_elem_name(elem_types[tensor.elem])} (both are type {tensor.elem})"
            )
        type_origin.setdefault(tensor.elem, tensor.name)
        if not type_proto.tensor_type.HasField("shape"):
            continue
        shape = type_proto.tensor_type.shape.dim
        if len(shape) != len(tensor.dims):
            raise onnx.shape_inference.InferenceError(
                f"{spec.name}: input '{tensor.name}' must have rank {len(tensor.dims)} {list(tensor.dims)}, got {len(shape)}"
            )
        for axis, (symbol, dim) in enumerate(zip(tensor.dims, shape)):
            value = dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
            known = dims.get(symbol)
            if isinstance(value, int) and isinstance(known, int) and value != known:
                raise onnx.shape_inference.InferenceError(
                    f"{spec.name}: input '{tensor.name}' dim {axis} ({symbol}) is {value}, expected {known}"
                )
            if known is None or (isinstance(value, int) and not isinstance(known, int)):
                dims[symbol] = value
    attributes = {a.name: _string(_attribute_value(ctx, a)) for a in spec.attributes if a.kind == "string"}
    for derived in spec.derived:
        value = derived.value(dims, attributes)
        if value is not None:
            dims[derived.name] = value
    for index, tensor in enumerate(spec.outputs):
        if index >= ctx.get_num_outputs() or not ctx.has_output(index):
            continue
        elem = elem_types.get(tensor.elem)
        if elem is None:
            continue
        shape = [dims.get(symbol) for symbol in tensor.dims]
        ctx.set_output_type(index, helper.make_tensor_type_proto(elem, shape))


def _schema(spec: OpSpec) -> defs.OpSchema:
    schema = defs.OpSchema(
        spec.name,
        DOMAIN,
        VERSION,
        spec.doc,
        inputs=[_formal(t) for t in spec.inputs],
        outputs=[_formal(t) for t in spec.outputs],
        type_constraints=[(var, [_ONNX_TYPES[t] for t in types], f"{var} element type") for var, types in spec.type_vars().items()],
        attributes=[_attribute(a) for a in spec.attributes],
    )
    schema.set_type_and_shape_inference_function(functools.partial(_infer, spec))
    return schema


def check_model(model: onnx.ModelProto) -> None:
    """onnx.checker's full check (strict type and shape inference) with the Quest schemas known.

    Raises onnx.checker.ValidationError or onnx.shape_inference.InferenceError naming the input at
    fault; models over 2 GB must be checked by path with onnx.checker directly.
    """
    register_schemas()
    onnx.checker.check_model(model, full_check=True)


@functools.cache
def register_schemas() -> None:
    """Register every Quest op with onnx.defs (idempotent)."""
    for spec in ALL_OPS:
        if not defs.has(spec.name, DOMAIN):
            defs.register_schema(_schema(spec))
