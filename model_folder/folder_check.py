"""A model folder's sidecar checked against its graph when the runtime opens it, before any session or cache.

The runtime allocates and binds caches from the sidecar alone (`quest_model.json`): a cache name
paired with the wrong layer or role binds two caches crosswise, a wrong block size or dtype builds
caches the graph reads differently. Here every field that describes the graph is compared with
the graph: the names the runtime feeds and reads, which past input each present output updates
(per layer and role), the caches' element types and static dims, and the Quest attributes of the
graph's SparseBlockAttention / SparseBlockSelect / QuestMetadata (or GroupQueryAttention) nodes,
and quantized weights: MatMulNBits nodes of the recorded bits, no float MatMul weight (and with int4
no float embedding table) left.
The first disagreement raises ModelFolderError, one line naming both files, the field and both
values.

A portable graph writes its Quest ops as standard ops: its attributes are constants inside the
bodies and are not compared; which past each present updates is traced through the ops that carry
a cache (Concat, ScatterElements, Slice, Cast, Where, ...).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from .settings import CHUNK_SETTINGS, SUPERBLOCK_SETTINGS, WEIGHT_BITS
from .sidecar import LayerIO, ModelFolderError, Sidecar
from ..ops.schemas import DOMAIN, OPS_BY_NAME

_GQA = ("com.microsoft", "GroupQueryAttention")
# Per input role: the element type and rank the runtime feeds it with.
_ROLES = {"input_ids": ("int64", 2), "past_lens": ("int32", 1), "total_lens": ("int32", 1), "exact_lens": ("int32", 1),
          "chunk_lens": ("int32", 1), "logits_keep": ("int64", 1)}


def _slot(op_name: str, kind: str, name: str) -> int:
    """The index of the schema's input or output `name` of `op_name` (ops/schemas.py)."""
    op = OPS_BY_NAME[op_name]
    return [t.name for t in (op.inputs if kind == "input" else op.outputs)].index(name)


# The graph's description of a layer's caches, by slot: (LayerIO field, node input or output index),
# from the op schemas. GroupQueryAttention keeps its past and present caches at the same indices.
_ATTENTION_SLOTS = {field: (kind, _slot("SparseBlockAttention", kind, name)) for field, kind, name in (
    ("past_key", "input", "key_cache"), ("past_value", "input", "value_cache"),
    ("present_key", "output", "key_cache_out"), ("present_value", "output", "value_cache_out"),
    ("past_key_scale", "input", "key_scale"), ("past_value_scale", "input", "value_scale"),
    ("present_key_scale", "output", "key_scale_out"), ("present_value_scale", "output", "value_scale_out"))}
_METADATA_SLOTS = {field: (kind, _slot("QuestMetadata", kind, name)) for field, kind, name in (
    ("past_block_max", "input", "block_max"), ("past_block_min", "input", "block_min"),
    ("present_block_max", "output", "block_max_out"), ("present_block_min", "output", "block_min_out"),
    ("past_block_exponent", "input", "block_exponent"), ("present_block_exponent", "output", "block_exponent_out"))}
# The hierarchical selection's QuestMetadata (block size P * U), whose outputs feed SparseBlockSelect's
# super_max / super_min (and super_exponent).
_SUPER_METADATA_SLOTS = {field.replace("block", "super"): slot for field, slot in _METADATA_SLOTS.items()}
_SUPER_MAX_INPUT = _slot("SparseBlockSelect", "input", "super_max")
_BLOCK_MAX_INPUT = _slot("SparseBlockSelect", "input", "block_max")
_IMPORTANCE_INPUT = _slot("SparseBlockSelect", "input", "block_importance")
# SparseBlockAttention's block_importance output: the present importance is past + this.
_ATTENTION_MASS_OUTPUT = _slot("SparseBlockAttention", "output", "block_importance")
# Variants of an export (QuestModel(model_file=...)) may select differently; these stay the sidecar's
# because the runtime builds the caches from them.
_CACHE_SHAPING = ("num_heads", "kv_num_heads", "block_size")
# Standard ops that carry a cache from a past input to a present output in a portable graph, and
# which of their inputs carry it.
_CARRIERS = {"Identity": (0,), "Cast": (0,), "CastLike": (0,), "Slice": (0,), "ScatterElements": (0,),
             "ScatterND": (0,), "Reshape": (0,), "Unsqueeze": (0,), "Squeeze": (0,), "Expand": (0,),
             "Where": (1, 2), "Concat": None, "Add": None, "Max": None, "Min": None}  # None: every input
# The element types a cache may have (lengths and token ids are integers of other widths).
_CACHE_ELEMS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE,
                onnx.TensorProto.INT8)
# The element types of a float weight, which `export-sparse --weights int8|int4` quantizes.
_FLOAT_ELEMS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
_MATMUL_NBITS = ("com.microsoft", "MatMulNBits")


def float_weight_matmuls(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The standard MatMul nodes of `graph` whose weight (input B) is a float initializer: what
    `export-sparse --weights int8|int4` quantizes, and what a folder it quantized may not hold."""
    types = {tensor.name: tensor.data_type for tensor in graph.initializer}
    return [node for node in graph.node
            if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and types.get(node.input[1]) in _FLOAT_ELEMS]


def float_weight_gathers(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The standard Gather nodes of `graph` that look up rows of a float matrix initializer (the
    token embedding): what `export-sparse --weights int4` quantizes, and what a folder it quantized
    may not hold."""
    matrices = {tensor.name for tensor in graph.initializer if tensor.data_type in _FLOAT_ELEMS and len(tensor.dims) == 2}
    return [node for node in graph.node
            if node.op_type == "Gather" and node.domain in ("", "ai.onnx") and node.input[0] in matrices]


def _names_read(graph: onnx.GraphProto) -> set[str]:
    """Every value name a node of `graph` (or of a subgraph inside it) reads, and its outputs."""
    read = {value.name for value in graph.output}
    for node in graph.node:
        read.update(node.input)
        for attribute in node.attribute:
            for body in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                read |= _names_read(body)
    return read


def unread_optional_outputs(graph: onnx.GraphProto) -> list[tuple[onnx.NodeProto, str]]:
    """(node, output name) for each optional output of a Quest node that is named but read by no
    node and is no graph output: the op computes it in every step for nothing. Exporters before
    2026-12-04 wrote such graphs (an int8 cache's SparseBlockAttention computed its block importance)."""
    read = _names_read(graph)
    return [(node, name) for node in graph.node if node.domain == DOMAIN
            for name, tensor in zip(node.output, OPS_BY_NAME[node.op_type].outputs, strict=False)
            if tensor.optional and name and name not in read]


@dataclasses.dataclass
class _Value:
    dtype: str
    elem: int
    dims: list | None  # int for a static dim, None for a symbolic one; None when the shape is unknown


@dataclasses.dataclass
class _Layer:
    """One attention layer as the graph wires it: its cache names by LayerIO field, and its Quest nodes."""

    names: dict
    nodes: list


def _dtype(elem: int) -> str:
    # An element type NumPy has no dtype for takes ONNX's own name. Only the lookup's own errors mean
    # that: an import failing on the way (numpy's, say) is a fault of its own and propagates, rather
    # than turn into a type mismatch the folder does not have.
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem).name
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem).lower()


def _value(info: onnx.ValueInfoProto) -> _Value:
    tensor = info.type.tensor_type
    dims = None
    if tensor.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    return _Value(_dtype(tensor.elem_type), tensor.elem_type, dims)


def _attribute(node: onnx.NodeProto, name: str, default):
    for attribute in node.attribute:
        if attribute.name == name:
            value = onnx.helper.get_attribute_value(attribute)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _same(expected, found) -> bool:
    if isinstance(expected, float) or isinstance(found, float):  # float attributes are stored as float32
        return np.float32(expected) == np.float32(found)
    return expected == found


class _Checker:
    def __init__(self, sidecar: Sidecar, model: onnx.ModelProto, sidecar_path, model_path, variant: bool):
        self.s, self.variant = sidecar, variant
        self.sidecar_name, self.graph_name = str(sidecar_path), getattr(model_path, "name", str(model_path))
        graph = model.graph
        initializers = {t.name for t in graph.initializer}
        self.inputs = {i.name: _value(i) for i in graph.input if i.name not in initializers}
        self.outputs = {o.name: _value(o) for o in graph.output}
        self.nodes = list(graph.node)
        self.graph = graph
        self.producer = {name: node for node in self.nodes for name in node.output if name}
        self.layers: list[_Layer] = []  # the graph's layers, when its attention is op nodes
        self.super_metadata: set[int] = set()  # ids of the superblocks' QuestMetadata nodes (graph_layers)

    def fail(self, text: str):
        raise ModelFolderError(f"{self.sidecar_name}: {text}")

    def disagree(self, field: str, expected, found: str):
        self.fail(f"{field} is {expected!r}, but in {self.graph_name} {found}")

    # -- which graph: Quest ops, the GroupQueryAttention baseline, or a portable graph ------------

    def check(self) -> None:
        quest = [n for n in self.nodes if n.domain == DOMAIN]
        gqa = [n for n in self.nodes if (n.domain, n.op_type) == _GQA]
        s = self.s
        if s.settings.portable and quest:
            self.disagree("portable", True, f"the Quest ops are nodes ({quest[0].op_type} {quest[0].name!r}), not "
                          "standard-op bodies")
        if s.settings.attention == "gqa" and (quest or not gqa):
            self.disagree("attention", "gqa", "the attention is " + (
                f"Quest ops ({quest[0].op_type} {quest[0].name!r})" if quest else "no GroupQueryAttention node"))
        if s.settings.attention == "quest" and not s.settings.portable and not quest:
            self.disagree("portable", False, "there is no Quest op node" + (
                f" (the attention is GroupQueryAttention {gqa[0].name!r}: attention should be 'gqa')" if gqa
                else " (the Quest ops are written as standard ops)"))
        if quest or gqa:
            self.check_layers(quest if quest else gqa)
        else:
            self.check_pairs()
        self.check_io()
        self.check_attributes(quest + gqa)
        self.check_key_smoothing(quest)
        self.check_weights()

    # -- layers: names by role, read from the nodes' slots -----------------------------------------

    def graph_layers(self, nodes: list) -> list[_Layer]:
        """The graph's layers in graph order (topological: each layer feeds the next)."""
        attention = [n for n in nodes if n.op_type in ("SparseBlockAttention", _GQA[1])]
        consumers = {}
        for node in self.nodes:
            for name in node.input:
                consumers.setdefault(name, []).append(node)
        layers = []
        for node in attention:
            names = dict.fromkeys(f.name for f in dataclasses.fields(LayerIO))
            layer = _Layer(names, [node])
            self.read_slots(node, _ATTENTION_SLOTS, names)
            # Its metadata: the QuestMetadata nodes fed the same new keys; its selection reads their
            # bounds, the blocks' as block_max and, selecting hierarchically, the superblocks' as super_max.
            metadata = [n for n in nodes if n.op_type == "QuestMetadata" and n.input[0] == node.input[1]]
            selects = [n for m in metadata for n in consumers.get(m.output[0], []) if n.op_type == "SparseBlockSelect"]
            select = selects[0] if selects else None
            for meta in metadata:
                feeds = select.input if select is not None else ()
                if len(feeds) > _SUPER_MAX_INPUT and feeds[_SUPER_MAX_INPUT] == meta.output[0]:
                    self.read_slots(meta, _SUPER_METADATA_SLOTS, names)
                    self.super_metadata.add(id(meta))
                elif select is None or feeds[_BLOCK_MAX_INPUT] == meta.output[0]:
                    self.read_slots(meta, _METADATA_SLOTS, names)
                layer.nodes.append(meta)
            if select is not None:
                layer.nodes.append(select)
                if len(select.input) > _IMPORTANCE_INPUT and select.input[_IMPORTANCE_INPUT]:
                    names["past_block_importance"] = select.input[_IMPORTANCE_INPUT]
            mass = node.output[_ATTENTION_MASS_OUTPUT] if len(node.output) > _ATTENTION_MASS_OUTPUT else ""
            adds = [n for n in consumers.get(mass, []) if n.op_type == "Add"] if mass else []
            if adds:
                names["present_block_importance"] = adds[0].output[0]
                accumulated = [name for name in adds[0].input if name != mass]
                if names["past_block_importance"] not in accumulated:
                    raise ModelFolderError(f"{self.graph_name}: layer {len(layers)} selects with block importance "
                                           f"{names['past_block_importance']!r} but accumulates {accumulated}")
            layers.append(layer)
        return layers

    @staticmethod
    def read_slots(node: onnx.NodeProto, slots: dict, names: dict) -> None:
        for field, (side, index) in slots.items():
            values = node.input if side == "input" else node.output
            names[field] = values[index] if len(values) > index and values[index] else None

    def check_layers(self, nodes: list) -> None:
        s = self.s
        self.layers = layers = self.graph_layers(nodes)
        if len(layers) != s.geometry.num_layers:
            self.disagree("num_layers", s.geometry.num_layers, f"there are {len(layers)} attention layers")
        sparse = [index for index, layer in enumerate(layers) if layer.names["past_block_max"]]
        if sparse != sorted(s.sparse_layers):
            self.disagree("sparse_layers", s.sparse_layers, f"the layers with block bounds (QuestMetadata) are {sparse}")
        for index, (described, layer) in enumerate(zip(s.layers, layers)):
            for field, found in layer.names.items():
                expected = getattr(described, field)
                if expected != found:
                    self.disagree(f"layers[{index}].{field}", expected,
                                  f"layer {index}'s {field.replace('_', ' ')} is {found!r}")

    # -- portable graphs: which past each present updates, traced through standard ops ------------

    def reached_caches(self, name: str) -> set[str]:
        """The cache graph inputs whose data reaches `name` through cache-carrying ops."""
        reached, stack, seen = set(), [name], set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in self.inputs:
                if self.inputs[name].elem in _CACHE_ELEMS:
                    reached.add(name)
                continue
            node = self.producer.get(name)
            if node is None or node.domain not in ("", "ai.onnx") or node.op_type not in _CARRIERS:
                continue
            indices = _CARRIERS[node.op_type]
            stack += [node.input[i] for i in (range(len(node.input)) if indices is None else indices)
                      if i < len(node.input) and node.input[i]]
        return reached

    def check_pairs(self) -> None:
        for index, layer in enumerate(self.s.layers):
            for field in (f.name for f in dataclasses.fields(LayerIO) if f.name.startswith("past_")):
                past, present_field = getattr(layer, field), field.replace("past_", "present_", 1)
                present = getattr(layer, present_field)
                if past is None or present not in self.outputs:
                    continue  # an output the graph lacks is named by check_io
                updated = sorted(self.reached_caches(present))
                if updated != [past]:
                    found = f"updates {updated[0]!r}" if len(updated) == 1 else f"carries {updated or 'no past input'}"
                    self.disagree(f"layers[{index}].{field}", past,
                                  f"layers[{index}].{present_field} {present!r} {found}")

    # -- the inputs and outputs: names, element types, static dims --------------------------------

    def expected_io(self):
        """(input or output, name, the field naming it, dtype field, dtype, [(dim label, value) or None])."""
        s = self.s
        blocks = -(-s.capacity // s.settings.block_size)
        heads = ("kv_num_heads", s.geometry.kv_num_heads)
        cache = [None, heads, ("capacity", s.capacity), ("head_dim", s.geometry.head_dim)]
        bounds = [None, heads, ("ceil(capacity / block_size)", blocks), ("head_dim", s.geometry.head_dim)]
        supers = [None, heads, ("ceil(ceil(capacity / block_size) / superblock_size)",
                                s.settings.superblock_count(blocks)), ("head_dim", s.geometry.head_dim)]
        kinds = {"key": ("kv_dtype", s.settings.kv_dtype, cache), "value": ("kv_dtype", s.settings.kv_dtype, cache),
                 "block_max": ("bounds_dtype", s.bounds_dtype, bounds),
                 "block_min": ("bounds_dtype", s.bounds_dtype, bounds),
                 "block_importance": ("the block importance type", "float32", bounds[:3]),
                 "key_scale": ("the int8 caches' scale type", "float16", cache[:3]),
                 "value_scale": ("the int8 caches' scale type", "float16", cache[:3]),
                 "block_exponent": ("the int8 bounds' exponent type", "int8", bounds[:3]),
                 "super_max": ("bounds_dtype", s.bounds_dtype, supers),
                 "super_min": ("bounds_dtype", s.bounds_dtype, supers),
                 "super_exponent": ("the int8 bounds' exponent type", "int8", supers[:3])}
        for role, name in s.inputs.items():
            dtype, rank = _ROLES[role]
            yield "input", name, f"inputs.{role}", f"the element type of inputs.{role}", dtype, [None] * rank
        yield ("output", s.outputs["logits"], "outputs.logits", "activation_dtype", s.geometry.activation_dtype,
               [None, None, ("vocab_size", s.vocab_size)])
        for index, layer in enumerate(s.layers):
            for kind, (dtype_field, dtype, dims) in kinds.items():
                for side in ("past", "present"):
                    name = getattr(layer, f"{side}_{kind}")
                    if name is not None:
                        yield ("input" if side == "past" else "output", name, f"layers[{index}].{side}_{kind}",
                               dtype_field, dtype, dims)

    def check_io(self) -> None:
        expected = {"input": {}, "output": {}}
        for side, name, field, dtype_field, dtype, dims in self.expected_io():
            expected[side][name] = field
            found = (self.inputs if side == "input" else self.outputs).get(name)
            if found is None:
                self.disagree(field, name, f"there is no {side} {name!r}")
            if found.dtype != dtype:
                self.disagree(dtype_field, dtype, f"{side} {name!r} is {found.dtype}")
            if found.dims is None:
                continue
            if len(found.dims) != len(dims):
                self.disagree(field, name, f"{side} {name!r} has rank {len(found.dims)}, the runtime uses {len(dims)}")
            for axis, (want, got) in enumerate(zip(dims, found.dims)):
                if want is not None and got is not None and got != want[1]:
                    self.disagree(want[0], want[1], f"{side} {name!r} has dim {axis} = {got}")
        for side, present in (("input", self.inputs), ("output", self.outputs)):
            extra = sorted(set(present) - set(expected[side]))
            # A variant may return more (the evaluation's analysis graphs); every input must be fed.
            if extra and (side == "input" or not self.variant):
                self.fail(f"does not describe the {side} {extra[0]!r} of {self.graph_name}"
                          + (" (the runtime would not feed it)" if side == "input" else ""))

    # -- Quest attributes ----------------------------------------------------------------------------

    def check_attributes(self, nodes: list) -> None:
        layer_of = {id(node): index for index, layer in enumerate(self.layers) for node in layer.nodes}
        described = self.s.to_dict()  # the sidecar's fields by name, as its JSON holds them
        # (the chunk settings also where the JSON leaves them out: they hold their defaults there)
        described.update({name: getattr(self.s.settings, name) for name in CHUNK_SETTINGS})
        # (the hierarchical selection's where it selects so: a flat select's node leaves them at their defaults)
        if self.s.settings.superblocks:
            described.update({name: getattr(self.s.settings, name) for name in SUPERBLOCK_SETTINGS})
        else:
            for name in SUPERBLOCK_SETTINGS:
                described.pop(name, None)
        # QuestMetadata must bound the keys as the caches hold them: int8 caches, int8 keys.
        described["key_cache_type"] = "int8" if self.s.settings.kv_dtype == "int8" else "float"
        for node in nodes:
            spec = OPS_BY_NAME.get(node.op_type) if node.domain == DOMAIN else None
            defaults = spec.defaults() if spec else {}
            names = [a.name for a in spec.attributes] if spec else [a.name for a in node.attribute]
            for name in names:
                if name not in described or (self.variant and name not in _CACHE_SHAPING):
                    continue
                found = _attribute(node, name, defaults.get(name))
                expected = described[name]
                if id(node) in self.super_metadata and name == "block_size":  # the superblocks' metadata
                    size = self.s.settings.superblocks
                    if found != expected * size:
                        self.disagree("superblock_size", size, f"{node.op_type} node {node.name!r} of the superblock "
                                      f"bounds has block_size = {found!r} (block_size x superblock_size = "
                                      f"{expected * size})")
                    continue
                if not _same(expected, found):
                    where = f" (layer {layer_of[id(node)]})" if id(node) in layer_of else ""
                    field = "kv_dtype" if name == "key_cache_type" else name
                    self.disagree(field, described[field],
                                  f"{node.op_type} node {node.name!r}{where} has {name} = {found!r}")

    # -- int8 caches' key smoothing -------------------------------------------------------------------

    def check_key_smoothing(self, quest: list) -> None:
        """key_smoothing: every attention node's query and new keys come out of a Mul by a constant
        (pipeline/calibrate.py's factors)."""
        if not self.s.settings.key_smoothing:
            return
        constants = {t.name for t in self.graph.initializer}
        constants |= {o for n in self.nodes if n.op_type == "Constant" for o in n.output}
        for node in (n for n in quest if n.op_type == "SparseBlockAttention"):
            for role, name in (("query", node.input[0]), ("key", node.input[1])):
                producer = self.producer.get(name)
                if producer is None or producer.op_type != "Mul" or not any(i in constants for i in producer.input):
                    self.disagree("key_smoothing", True, f"SparseBlockAttention node {node.name!r} takes its {role} "
                                  f"{name!r} unscaled (not from a Mul by a constant)")

    # -- quantized weights -----------------------------------------------------------------------------

    def check_weights(self) -> None:
        """A folder quantized by the exporter holds MatMulNBits nodes of its bits and no MatMul whose
        weight is a float initializer (the quantizer replaces each). "float" says nothing more: the
        weights are as the source had them, which may be quantized already."""
        weights = self.s.settings.weights
        if weights not in WEIGHT_BITS:
            return
        # MatMulNBits' bits: 4 where the attribute is left out (its schema's default)
        bits = {n.name: _attribute(n, "bits", 4) for n in self.nodes if (n.domain, n.op_type) == _MATMUL_NBITS}
        if not bits:
            self.disagree("weights", weights, "there is no MatMulNBits node")
        other = next((name for name, found in bits.items() if found != WEIGHT_BITS[weights]), None)
        if other is not None:
            self.disagree("weights", weights, f"MatMulNBits node {other!r} has bits = {bits[other]}")
        left = float_weight_matmuls(self.graph)
        if left:
            self.disagree("weights", weights, f"MatMul node {left[0].name!r} multiplies by the float initializer "
                          f"{left[0].input[1]!r}")
        gathers = float_weight_gathers(self.graph) if weights == "int4" else []
        if gathers:
            self.disagree("weights", weights, f"Gather node {gathers[0].name!r} looks up rows of the float "
                          f"initializer {gathers[0].input[0]!r}")


def check_sidecar_against_graph(sidecar: Sidecar, model: onnx.ModelProto, sidecar_path, model_path, *,
                                variant: bool = False) -> None:
    """Raise ModelFolderError at the first field of `sidecar` that disagrees with `model` (loaded
    without its external data). `variant`: the graph is another file of the folder (same I/O and
    caches, its own selection settings, possibly extra outputs)."""
    _Checker(sidecar, model, sidecar_path, model_path, variant).check()
