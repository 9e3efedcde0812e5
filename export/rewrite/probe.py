"""Evaluate values of the source graph (attention masks, sequence lengths, positions) on probe inputs,
so that a rule accepts them only where they equal what the Quest model computes by itself: causal
attention over the cache, lengths from past_lens/total_lens, RoPE positions past_lens + i.

A mask is a subgraph of whatever the exporter wrote (transformers' mask functions, sliding windows,
chunked attention...); matching it structurally would accept only the shapes we have seen, and
ignoring it is how a sliding window became plain causal attention. Evaluating it is exact on the
probes: a prefill from an empty cache, a prefill after a past, and one decode step at the end of the
capacity, where any window shorter than the capacity hides the first key.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


class ProbeError(Exception):
    """The value cannot be evaluated on the probes; the message says why."""


class SourceProbe:
    def __init__(self, model: ir.Model, slots, capacity: int, geometry=None):
        """`slots`: the layers' LayerSlots (their caches are fed, and their presents' shapes known);
        `geometry` gives the caches' KV heads and head size where their shapes leave them symbolic
        (onnxruntime-genai's builder writes `kv_cache_dim`)."""
        # The rewrite changes the graph in place (position_ids become past_lens + i before any rule
        # runs): probe a copy of the graph as the source computes it. Tensors are shared, not copied.
        self._model = model.clone()
        self._values = ir.convenience.create_value_mapping(self._model.graph)
        # cache input and present output names -> (KV heads, head dim, element type)
        self._caches, self._presents = {}, {}
        for slot in slots:
            for past, present in ((slot.past_key, slot.present_key), (slot.past_value, slot.present_value)):
                dims = list(past.shape) if past.shape is not None else []
                heads, head_dim = (dims[1], dims[3]) if len(dims) == 4 else (None, None)
                if geometry is not None:
                    heads, head_dim = geometry.kv_num_heads, geometry.head_dim
                kind = (heads if isinstance(heads, int) else None, head_dim if isinstance(head_dim, int) else None,
                        past.dtype.numpy() if past.dtype is not None else None)
                self._caches[past.name] = self._presents[present.name] = kind
        self.capacity = capacity
        self._results: dict[str, list | ProbeError] = {}

    def points(self) -> list[tuple[int, int]]:
        """(cached tokens, new tokens) per probe."""
        return [(0, 6), (5, 3), (max(self.capacity - 1, 0), 1)]

    def evaluate(self, value: ir.Value) -> list[tuple[int, int, np.ndarray]]:
        """(past, new, the value's array) at each probe point; raises ProbeError."""
        name = value.name
        if not name or name not in self._values:
            raise ProbeError("is not a value of the source graph, so it cannot be evaluated")
        if name not in self._results:
            try:
                self._results[name] = self._run(self._values[name])
            except ProbeError as error:
                self._results[name] = error
        result = self._results[name]
        if isinstance(result, ProbeError):
            raise result
        return result

    def _run(self, value: ir.Value) -> list[tuple[int, int, np.ndarray]]:
        import onnxruntime as ort

        constant = ir.convenience.get_const_tensor(value)
        if constant is not None:
            return [(past, new, constant.numpy()) for past, new in self.points()]
        inputs = self._subgraph_inputs(value)
        graph = ir.convenience.extract(self._model.graph, inputs, [value])
        for initializer in graph.initializers.values():  # the subgraph runs from memory, not next to its data files
            if not isinstance(initializer.const_value, ir.Tensor):
                initializer.const_value = ir.tensor(initializer.const_value.numpy(), name=initializer.name)
        originals = {v.name: v for v in inputs}
        for cut in graph.inputs:  # a value fed in place of what computes it: its type from what the probe knows
            if cut.type is None:
                cut.type = ir.TensorType(ir.DataType.from_numpy(self._feed(originals[cut.name], 0, 1).dtype))
        proto = ir.to_proto(ir.Model(graph, ir_version=self._model.ir_version))
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # Without ORT's arena the decode probe's caches (capacity rows each) are freed with the session;
        # with it, every layer's probe stayed resident: 7.5 GB per 32K of capacity for Qwen3-0.6B's 28
        # layers, so an export for 128K ran out of memory.
        options.enable_cpu_mem_arena = False
        try:
            session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
            return [(past, new, session.run(None, {v.name: self._feed(v, past, new) for v in inputs})[0])
                    for past, new in self.points()]
        except ProbeError:
            raise
        except Exception as error:  # onnxruntime's errors have no common type
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ProbeError(f"could not be evaluated on probe inputs: {first_line}") from error

    def _subgraph_inputs(self, value: ir.Value) -> list[ir.Value]:
        """The graph inputs `value` is computed from, and the values it needs only for their shape where
        the probe knows that shape (the layers' present caches, the token embedding): fed as zeros,
        they keep a mask that slices itself to the key length (Shape of the repeated keys) from
        computing the whole model above it."""
        mode: dict[int, str] = {}  # id(value) -> "value" (its elements are read) or "shape" (only its shape)
        cut: dict[int, ir.Value] = {}
        stack = [(value, "value")]
        while stack:
            current, needed = stack.pop()
            if mode.get(id(current)) in ("value", needed):
                continue
            mode[id(current)] = needed
            cut.pop(id(current), None)
            node = current.producer()
            if node is None or current.is_graph_input():
                continue
            if needed == "shape" and self._shape_of(current) is not None:
                cut[id(current)] = current
                continue
            if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
                raise ProbeError(f"is computed through control flow ({node.op_type} {node.name!r}), which the probe "
                                 "does not evaluate")
            stack.extend((x, _input_needed(node, index, needed)) for index, x in enumerate(node.inputs) if x is not None)
        graph_inputs = [v for v in self._model.graph.inputs if id(v) in mode and v.const_value is None]
        return graph_inputs + list(cut.values())

    def _shape_of(self, value: ir.Value):
        """(past, new) -> (shape, element type) of `value` at a probe, when the probe knows it; else None."""
        if value.name in self._presents:
            heads, head_dim, dtype = self._presents[value.name]
            if heads is None or head_dim is None or dtype is None:
                return None
            return lambda past, new: ((1, heads, past + new, head_dim), dtype)
        node = value.producer()
        if node is not None and node.op_type == "Gather" and node.attributes.get_int("axis", 0) == 0 \
                and node.inputs[0].const_value is not None and node.inputs[1].name == "input_ids" \
                and node.inputs[1].is_graph_input():
            table = node.inputs[0].const_value
            rows = tuple(int(d) for d in table.shape[1:])
            return lambda past, new: ((1, new) + rows, table.dtype.numpy())
        return None

    def _feed(self, value: ir.Value, past: int, new: int) -> np.ndarray:
        if not value.is_graph_input():
            shape, dtype = self._shape_of(value)(past, new)
            return np.zeros(shape, dtype)
        dtype = value.dtype.numpy() if value.dtype is not None else np.int64
        if value.name == "input_ids":
            return np.zeros((1, new), dtype)
        if value.name == "attention_mask":
            return np.ones((1, past + new), dtype)
        if value.name == "position_ids":
            return (past + np.arange(new))[None].astype(dtype)
        if value.name in self._caches:
            heads, head_dim, _ = self._caches[value.name]
            if heads is None or head_dim is None:
                raise ProbeError(f"depends on the cache input {value.name!r}, whose KV heads and head size are unknown")
            return np.zeros((1, heads, past, head_dim), dtype)
        raise ProbeError(f"depends on the input {value.name!r}, which the Quest model does not have")

    def mask_problem(self, value: ir.Value, what: str) -> str | None:
        """None when `value` is the causal mask (bool, or 0 / -inf additive) at every probe, else why not."""
        try:
            results = self.evaluate(value)
        except ProbeError as error:
            return f"{what} {error}"
        for past, new, mask in results:
            problem = _causal_problem(np.asarray(mask), past, new)
            if problem:
                return f"{what} {problem} ({past} cached tokens, {new} new)"
        return None

    def equals_problem(self, value: ir.Value, what: str, expected, modelled_as: str) -> str | None:
        """None when `value` equals `expected(past, new)` (same elements, same count) at every probe."""
        try:
            results = self.evaluate(value)
        except ProbeError as error:
            return f"{what} {error}"
        for past, new, got in results:
            want = np.asarray(expected(past, new))
            got = np.asarray(got)
            if got.size != want.size or not np.array_equal(got.reshape(-1), want.reshape(-1)):
                return (f"{what} is {got.tolist()} for {past} cached and {new} new tokens, where the Quest ops "
                        f"use {modelled_as} = {want.tolist()}")
        return None


# Ops whose output shape follows from their inputs' shapes alone (for the listed inputs): when only the
# output's shape is needed, so are only those inputs' shapes. Every other input, or op, is read.
_SHAPE_FROM_SHAPES = {
    "Reshape": (0,), "Expand": (0,), "Unsqueeze": (0,), "Squeeze": (0,), "Slice": (0,), "Transpose": None,
    "Concat": None, "Add": None, "Sub": None, "Mul": None, "Div": None, "Neg": None, "Cast": None, "CastLike": None,
    "Where": None, "Softmax": None, "Identity": None, "MatMul": None, "Shape": None,
}


def _input_needed(node: ir.Node, index: int, needed: str) -> str:
    """What of input `index` of `node` is needed when `needed` ("value" or "shape") of its output is."""
    if needed == "value":
        return "shape" if node.op_type == "Shape" else "value"
    if node.op_type in _SHAPE_FROM_SHAPES and node.domain == "":
        inputs = _SHAPE_FROM_SHAPES[node.op_type]
        return "shape" if inputs is None or index in inputs else "value"
    return "value"


def _causal_problem(mask: np.ndarray, past: int, new: int) -> str | None:
    """What keeps `mask` from being the causal mask of `new` queries after `past` cached keys."""
    total = past + new
    if mask.ndim < 2 or mask.shape[-1] != total:
        return f"has shape {list(mask.shape)} for {new} queries over {total} keys"
    try:
        full = np.broadcast_to(mask, np.broadcast_shapes(mask.shape, (new, total))).reshape(-1, new, total)
    except ValueError:
        return f"has shape {list(mask.shape)}, which does not broadcast to {new} queries over {total} keys"
    if mask.dtype == np.bool_:
        visible = full
    elif np.issubdtype(mask.dtype, np.floating):
        # Added to the logits: 0 keeps a key, -inf or transformers' finfo.min drops it. Anything else
        # moves the logits (an attention bias, ALiBi...), which the Quest ops do not add.
        hidden = np.isneginf(full) | (full <= np.finfo(mask.dtype).min / 2)
        moved = ~hidden & (full != 0)
        if moved.any():
            head, i, j = (int(x) for x in np.argwhere(moved)[0])
            return (f"adds {float(full[head, i, j]):g} to the logit of key {j} for the query at position {past + i}: "
                    "an attention bias, not a mask")
        visible = ~hidden
    else:
        return f"has element type {mask.dtype}; expected bool or an additive float mask"
    expected = np.arange(total)[None, :] <= past + np.arange(new)[:, None]
    wrong = visible != expected[None]
    if not wrong.any():
        return None
    head, i, j = (int(x) for x in np.argwhere(wrong)[0])
    if visible[head, i, j]:
        return f"lets the query at position {past + i} see the later key {j}: not causal"
    return (f"hides key {j} from the query at position {past + i}: a sliding window or another mask the Quest ops "
            "do not apply")
