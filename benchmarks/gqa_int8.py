"""ONNX Runtime's GroupQueryAttention over its own int8 KV cache: the second baseline of bench_e2e.

A `--attention gqa` export's graph with every GroupQueryAttention node switched to ONNX Runtime's
int8 cache (`k_quant_type` / `v_quant_type` PER_CHANNEL, `kv_cache_bit_width` 8, static `k_scale` /
`v_scale` [N, 1, D] at inputs 12 and 13) and its past/present caches typed int8, written next to the
export's own graph (`model.gqa-int8.onnx`, the same weights file). The exporter does not write it:
ONNX Runtime's scales are static, calibrated by whoever deploys it, and this project has no
calibration; the benchmark's caches hold random codes, for which any scale costs the same time.
`Int8CacheGqa` runs it with the runtime's in-place binding (the runtime's folder check would refuse
the graph: its sidecar describes float16 caches).
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx

from quest_ort.model_folder.cache import LayerCaches
from quest_ort.model_folder.sidecar import Sidecar
from quest_ort.runtime.binding import InPlaceStep
from quest_ort.runtime.model import KVCache
from quest_ort.runtime.sessions import make_session

MODEL_FILE = "model.gqa-int8.onnx"
SCALE = 0.05  # every channel's static scale (a random N(0, 1) key or value quantizes into +-127 by it)
K_SCALE_INPUT, V_SCALE_INPUT = 12, 13  # GroupQueryAttention's input indices (ONNX Runtime 1.32)
_GQA = ("com.microsoft", "GroupQueryAttention")


def write_int8_variant(folder: pathlib.Path) -> pathlib.Path:
    """Write folder/MODEL_FILE from the gqa export in `folder` (float caches); returns its path."""
    sidecar = Sidecar.read(folder)
    if sidecar.settings.attention != "gqa":
        raise ValueError(f"{folder}: not a GroupQueryAttention baseline export (attention {sidecar.settings.attention!r})")
    model = onnx.load(str(folder / sidecar.model_file), load_external_data=False)  # the weights stay in their file
    graph, g = model.graph, sidecar.geometry
    caches = {name for layer in sidecar.layers for pair in layer.present_to_past().items() for name in pair}
    for value in list(graph.input) + list(graph.output):
        if value.name in caches:
            value.type.tensor_type.elem_type = onnx.TensorProto.INT8
    scale = np.full((g.kv_num_heads, 1, g.head_dim), SCALE, np.float32)
    graph.initializer.extend([onnx.numpy_helper.from_array(scale, "gqa_int8.k_scale"),
                              onnx.numpy_helper.from_array(scale, "gqa_int8.v_scale")])
    nodes = [node for node in graph.node if (node.domain, node.op_type) == _GQA]
    if len(nodes) != g.num_layers:
        raise ValueError(f"{folder}: {len(nodes)} GroupQueryAttention nodes for {g.num_layers} layers")
    for node in nodes:
        if len(node.input) > K_SCALE_INPUT:
            raise ValueError(f"{folder}: GroupQueryAttention {node.name!r} has inputs past index {K_SCALE_INPUT - 1}")
        node.input.extend([""] * (K_SCALE_INPUT - len(node.input)) + ["gqa_int8.k_scale", "gqa_int8.v_scale"])
        node.attribute.extend([onnx.helper.make_attribute("k_quant_type", "PER_CHANNEL"),
                               onnx.helper.make_attribute("v_quant_type", "PER_CHANNEL"),
                               onnx.helper.make_attribute("kv_cache_bit_width", 8)])
    path = folder / MODEL_FILE
    onnx.save(model, str(path))
    return path


class Int8CacheGqa:
    """Decode steps of the int8-cache variant, in place like QuestModel.step (caches [B,N,C,D] int8)."""

    def __init__(self, folder: pathlib.Path, threads: int | None = None):
        self.sidecar = Sidecar.read(folder)
        path = folder / MODEL_FILE
        if not path.is_file():
            path = write_int8_variant(folder)
        self.session = make_session(str(path), threads=threads, register_library=False)
        aliases = {present: past for layer in self.sidecar.layers for present, past in layer.present_to_past().items()}
        self._step = InPlaceStep(self.session, aliases)

    block_size = chunk_size = 1  # no metadata blocks, no chunks of queries (the units runtime/slots.py reads)

    def check_prefill(self, mode: str) -> None:
        """GroupQueryAttention prefills exactly in every mode."""

    @property
    def vocab_size(self) -> int:
        return self.sidecar.vocab_size

    def prefill_chunk(self, batch: int, preferred: int) -> int:
        """As QuestModel's: GroupQueryAttention continues a prompt of one row only."""
        return preferred if batch == 1 else 2**31 - 1

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        g = self.sidecar.geometry
        shape = (batch, g.kv_num_heads, capacity, g.head_dim)
        layers = [LayerCaches(np.zeros(shape, np.int8), np.zeros(shape, np.int8)) for _ in self.sidecar.layers]
        names = [LayerCaches(io.past_key, io.past_value) for io in self.sidecar.layers]
        return KVCache.of(capacity, np.zeros(batch, np.int32), layers, names)

    def step(self, cache: KVCache, input_ids: np.ndarray, valid: np.ndarray | None = None, *, exact: bool = True,
             chunked: bool = False, last_logits: int | None = None) -> np.ndarray:
        """As QuestModel.step (GroupQueryAttention always attends exactly: `exact` and `chunked` are
        accepted for the common interface; `valid`: each row's real tokens, default all;
        `last_logits`: the step's last positions only)."""
        names = self.sidecar.inputs
        total = cache.lengths + (input_ids.shape[1] if valid is None else np.asarray(valid, np.int32))
        feeds = {names["input_ids"]: input_ids.astype(np.int64), names["past_lens"]: cache.lengths.copy(),
                 names["total_lens"]: total.astype(np.int32), **cache.values}
        if "logits_keep" in names:
            feeds[names["logits_keep"]] = np.array([last_logits or 0], np.int64)
        logits = self._step.run(feeds)[self.sidecar.outputs["logits"]]
        cache.lengths[:] = total
        return logits if "logits_keep" in names or not last_logits else logits[:, -last_logits:]
