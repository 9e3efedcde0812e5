"""ONNX Runtime's own operator schemas (its contrib ops) registered with onnx, so that onnx's checker
checks a graph that uses them instead of stopping at the first one.

onnxruntime-genai's builder writes `MatMulNBits`, `GroupQueryAttention`,
`SkipSimplifiedLayerNormalization` (com.microsoft) and `SimplifiedLayerNormalization` (registered
by ONNX Runtime in the default ONNX domain, where onnx's checker rejects any op it does not know).
ONNX Runtime publishes its schemas (`get_all_operator_schema`): each one onnx does not have is
converted (inputs, outputs, type constraints, attributes and their defaults) and registered. The
checker then checks those nodes' arity, attributes and types against ONNX Runtime's definition; their
outputs' shapes stay unknown (a converted schema has no shape inference), so the full check's
strict shape inference still covers every standard and Quest node but no contrib node's shapes.
The Quest schemas are the project's own (ops/registry.py) and are checked as strictly as before.
"""

from __future__ import annotations

import functools

# Contrib ops live in com.microsoft, and a few in the default domain; the other domains ONNX Runtime
# registers (its internal layouts, training) never appear in a model users hand to the exporter.
DOMAINS = ("", "com.microsoft")


@functools.cache
def register_onnxruntime_schemas() -> int:
    """Register every ONNX Runtime schema of DOMAINS that onnx lacks; returns how many (once per process)."""
    import onnx
    import onnx.defs as defs
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    options = {0: defs.OpSchema.FormalParameterOption.Single, 1: defs.OpSchema.FormalParameterOption.Optional,
               2: defs.OpSchema.FormalParameterOption.Variadic}

    def parameter(p):
        return defs.OpSchema.FormalParameter(p.name, p.typeStr, param_option=options[int(p.option)],
                                             is_homogeneous=p.isHomogeneous)

    def attribute(a):
        # ONNX Runtime keeps a default as a serialized AttributeProto (empty when there is none)
        if a._default_value:
            return defs.OpSchema.Attribute(a.name, onnx.AttributeProto.FromString(a._default_value))
        return defs.OpSchema.Attribute(a.name, defs.OpSchema.AttrType(int(a.type)), required=a.required)

    known = {(s.name, s.domain) for s in defs.get_all_schemas_with_history()}  # onnx's own, and the Quest ops
    count = 0
    # Ascending versions: onnx requires a schema's versions to be registered in order.
    for schema in sorted(ort_c.get_all_operator_schema(), key=lambda s: (s.domain, s.name, s.since_version)):
        if schema.domain not in DOMAINS or (schema.name, schema.domain) in known:
            continue
        defs.register_schema(defs.OpSchema(
            schema.name, schema.domain, schema.since_version,
            inputs=[parameter(p) for p in schema.inputs], outputs=[parameter(p) for p in schema.outputs],
            type_constraints=[(t.type_param_str, list(t.allowed_type_strs), "") for t in schema.type_constraints],
            attributes=[attribute(a) for a in schema.attributes.values()]))
        count += 1
    return count
