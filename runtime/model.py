"""Run an exported Quest model: one session, caches allocated once at capacity and updated in place.

```python
model = QuestModel("out/qwen3-quest")
cache = model.new_cache(batch=2)
logits = model.step(cache, input_ids, valid=np.array([5, 3]), exact=True)  # prompt, rows right-padded
logits = model.step(cache, next_ids[:, None])                                # one decode token per row
```
A step feeds `past_lens` (tokens already cached per row), `total_lens` (valid after the step) and
`exact_lens` (its tokens attend exactly when `exact`, else each selects its blocks), and binds every
present output to its past input's buffer: the ops write only the new tokens.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import onnxruntime as ort

from ..export.safety import check_external_data, load_model_file
from ..export.sidecar import SIDECAR_NAME, Sidecar
from .binding import InPlaceStep
from .buffers import cache_buffer
from .folder_check import check_sidecar_against_graph
from .inputs import integer, step_arguments
from .sessions import make_session


_LOGITS_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class CapacityError(ValueError):
    """A step would write past the cache capacity; nothing was run or written."""


@dataclasses.dataclass
class KVCache:
    """The caches of one batch: per layer key/value [B,N,C,D] and, for sparse layers, block max/min."""

    capacity: int
    lengths: np.ndarray  # [B] int32: tokens cached per row
    buffers: dict[str, np.ndarray]  # past input name -> its array (the OrtValue below wraps it)
    values: dict[str, ort.OrtValue]

    @property
    def batch(self) -> int:
        return int(self.lengths.shape[0])

    def reset(self) -> None:
        """Forget every row's tokens (the buffers stay allocated; stale content is never read,
        except the accumulated block importance, which starts again from zero)."""
        self.lengths[:] = 0
        for name, array in self.buffers.items():
            if name.startswith("past_block_importance."):
                array.fill(0.0)


class QuestModel:
    def __init__(self, directory, *, threads: int | None = None, providers=None, model_file: str | None = None,
                 initializers: dict | None = None):
        """`model_file` picks another graph in the folder with the same I/O (a variant of the
        export); `initializers` (name -> OrtValue) share weights between several sessions."""
        if threads is not None:
            integer(threads, "threads", 0)  # 0: ONNX Runtime's default
        self.directory = pathlib.Path(directory)
        self.sidecar = Sidecar.read(self.directory)
        model_path = self.directory / (model_file or self.sidecar.model_file)
        graph = load_model_file(model_path)  # a truncated or foreign file: a one-line error naming it
        check_external_data(model_path, graph)  # a model folder we did not write may point anywhere
        # The caches are built and bound from the sidecar alone: it must describe this graph.
        check_sidecar_against_graph(self.sidecar, graph, self.directory / SIDECAR_NAME, model_path,
                                    variant=model_file not in (None, self.sidecar.model_file))
        del graph  # the session reads the file itself
        self.session = make_session(str(model_path), threads=threads, providers=providers, initializers=initializers,
                                    register_library=not self.sidecar.portable)
        self._initializers = initializers  # ONNX Runtime only borrows them: they must outlive the session
        aliases = {}
        for layer in self.sidecar.layers:
            aliases[layer.present_key] = layer.past_key
            aliases[layer.present_value] = layer.past_value
            if layer.sparse:
                aliases[layer.present_block_max] = layer.past_block_max
                aliases[layer.present_block_min] = layer.past_block_min
            if layer.past_block_importance:
                aliases[layer.present_block_importance] = layer.past_block_importance
        # A portable graph's standard ops may read a cache after writing their output, so its presents
        # are not bound in place: they come back as arrays and are copied into the caches.
        self._copy_back = aliases if self.sidecar.portable else {}
        self._step = InPlaceStep(self.session, {} if self.sidecar.portable else aliases)
        self._kv_dtype = np.dtype(self.sidecar.kv_dtype)
        self._bounds_dtype = np.dtype(self.sidecar.bounds_dtype or self.sidecar.kv_dtype)
        # What a failed step must put back (see _accumulated_state).
        self._metadata_names = [name for layer in self.sidecar.layers if layer.sparse
                                for name in (layer.past_block_max, layer.past_block_min)]
        self._importance_names = [layer.past_block_importance for layer in self.sidecar.layers
                                  if layer.past_block_importance]
        self._cache_names = set(aliases.values())
        logits = next(o for o in self.session.get_outputs() if o.name == self.sidecar.outputs["logits"])
        if logits.type not in _LOGITS_TYPES:
            raise ValueError(f"{model_path}: logits of type {logits.type}; the runtime reads float or float16")
        self._logits_dtype = _LOGITS_TYPES[logits.type]

    @property
    def vocab_size(self) -> int:
        return self.sidecar.vocab_size

    def prefill_chunk(self, batch: int, preferred: int) -> int:
        """Positions per prefill step: `preferred`, except for the GroupQueryAttention baseline,
        which cannot continue a prompt of several rows (ONNX Runtime needs batch 1 for that)."""
        if self.sidecar.attention == "gqa" and batch > 1:
            return 2**31 - 1
        return preferred

    def new_cache(self, batch: int, capacity: int | None = None) -> KVCache:
        """Allocate every cache of a batch once, at `capacity` tokens (default: the sidecar's)."""
        s = self.sidecar
        batch = integer(batch, "batch", 1)
        capacity = s.capacity if capacity is None else integer(capacity, "capacity", 1)
        blocks = -(-capacity // s.block_size)
        buffers = {}
        for layer in s.layers:
            for name in (layer.past_key, layer.past_value):
                buffers[name] = cache_buffer((batch, s.kv_num_heads, capacity, s.head_dim), self._kv_dtype)
            if layer.sparse:
                for name in (layer.past_block_max, layer.past_block_min):
                    buffers[name] = cache_buffer((batch, s.kv_num_heads, blocks, s.head_dim), self._bounds_dtype)
            if layer.past_block_importance:
                buffers[layer.past_block_importance] = cache_buffer((batch, s.kv_num_heads, blocks), np.float32)
        values = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in buffers.items()}
        return KVCache(capacity, np.zeros(batch, np.int32), buffers, values)

    @property
    def selects_per_step(self) -> bool:
        """True when the graph takes exact_lens: each step says whether its tokens attend exactly."""
        return "exact_lens" in self.sidecar.inputs

    def step(self, cache: KVCache, input_ids: np.ndarray, valid: np.ndarray | None = None, *,
             exact: bool = False) -> np.ndarray:
        """Run one prefill or decode step; returns logits [B, S, vocab].

        `input_ids` [B, S]; row b holds `valid[b]` real tokens followed by padding (default: all S).
        `exact`: the step's tokens attend to every cached position (a prompt, as Quest prefills);
        otherwise each selects its blocks (sparse layers). A graph without sparse layers (the
        GroupQueryAttention baseline, an all-dense export) always attends exactly.
        Raises, before anything runs: ValueError for a bad argument (token ids that are not
        integers or lie outside the vocabulary, S = 0, ...), CapacityError when a row would pass the
        capacity.
        """
        if not isinstance(cache, KVCache) or cache.buffers.keys() != self._cache_names:  # no set built per step
            got = "the caches of another model" if isinstance(cache, KVCache) else f"a {type(cache).__name__}"
            raise ValueError(f"cache must come from this model's new_cache, got {got}")
        input_ids, valid = step_arguments(input_ids, valid, exact, cache.batch, self.sidecar.vocab_size)
        new_tokens = input_ids.shape[1]
        total = cache.lengths + valid
        if (total > cache.capacity).any():
            row = int(np.argmax(total > cache.capacity))
            raise CapacityError(
                f"row {row} would hold {int(total[row])} tokens, past the cache capacity {cache.capacity}; "
                "nothing was written")
        if (cache.lengths + new_tokens > cache.capacity).any():  # the ops place all S positions, padding too
            row = int(np.argmax(cache.lengths + new_tokens > cache.capacity))
            raise CapacityError(
                f"row {row} holds {int(cache.lengths[row])} tokens and a step of {new_tokens} positions (padding "
                f"included) would pass the cache capacity {cache.capacity}; nothing was written")
        names = self.sidecar.inputs
        if exact and self.sidecar.attention == "quest" and self.sidecar.sparse_layers and not self.selects_per_step:
            raise ValueError(f"{self.directory} was exported before exact prefill (its graph has no exact_lens "
                             "input): export it again, or prefill sparsely (prefill='sparse')")
        feeds = {names["input_ids"]: input_ids, names["past_lens"]: cache.lengths.copy(),
                 names["total_lens"]: total.astype(np.int32), **cache.values}
        if self.selects_per_step:
            feeds[names["exact_lens"]] = (total if exact else cache.lengths).astype(np.int32)
        saved = self._accumulated_state(cache)
        # The logits are written straight into a fresh array: a copy out of ONNX Runtime's own
        # would hold them twice (a 512-token prefill step of a 151936-word vocabulary: 311 MB each).
        logits_name = self.sidecar.outputs["logits"]
        logits_shape = (cache.batch, new_tokens, self.sidecar.vocab_size)
        try:
            outputs = self._step.run(feeds, into={logits_name: np.empty(logits_shape, self._logits_dtype)})
        except BaseException:
            self._restore(cache, saved)
            raise
        for present, past in self._copy_back.items():
            cache.buffers[past][...] = outputs[present]
        cache.lengths[:] = total
        return outputs[logits_name]

    def _accumulated_state(self, cache: KVCache) -> dict:
        """What a step changes that earlier steps built on: each row's partly filled metadata block
        (the step folds its keys into it) and the accumulated block importance. Key and value slots
        past `lengths` hold nothing valid, so a failed step leaves them harmless."""
        block = cache.lengths // self.sidecar.block_size
        rows = np.arange(cache.batch)
        metadata = {name: cache.buffers[name][rows, :, np.minimum(block, cache.buffers[name].shape[2] - 1)].copy()
                    for name in self._metadata_names}
        importance = {name: cache.buffers[name].copy() for name in self._importance_names}
        return {"metadata": metadata, "importance": importance}

    def _restore(self, cache: KVCache, saved: dict) -> None:
        block = cache.lengths // self.sidecar.block_size
        rows = np.arange(cache.batch)
        for name, values in saved["metadata"].items():
            array = cache.buffers[name]
            array[rows, :, np.minimum(block, array.shape[2] - 1)] = values
        for name, values in saved["importance"].items():
            cache.buffers[name][...] = values
