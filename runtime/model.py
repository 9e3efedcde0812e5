"""Run an exported Quest model: one session, caches allocated once at capacity and updated in place.

```python
model = QuestModel("out/qwen3-quest")
cache = model.new_cache(batch=2)
logits = model.step(cache, input_ids, valid=np.array([5, 3]), exact=True)  # prompt, rows right-padded
logits = model.step(cache, next_ids[:, None])                                # one decode token per row
```
A step feeds `past_lens` (tokens already cached per row), `total_lens` (valid after the step),
`exact_lens` (its tokens attend exactly when `exact`), `chunk_lens` (else, when `chunked`, they
select their blocks per chunk of queries: a sparse prefill; otherwise each its own, as decode does)
and `logits_keep` (the head runs for the step's last `last_logits` positions only), and binds every
present output to its past input's buffer: the ops write only the new tokens. A cache's buffers
are bound on its first step (KVCache.plans); a step binds only its own feeds and logits.
"""

from __future__ import annotations

import dataclasses
import pathlib
import warnings

import numpy as np
import onnxruntime as ort

from ..model_folder.cache import LayerCaches, cache_layout
from ..model_folder.folder_check import check_sidecar_against_graph, unread_optional_outputs
from ..model_folder.safety import check_external_data, load_model_file
from ..model_folder.sidecar import SIDECAR_NAME, Sidecar
from .binding import InPlaceStep
from .buffers import cache_buffer
from .inputs import InputTypeError, integer, step_arguments
from .sessions import NUMPY_TYPES, make_session


_LOGITS_TYPES = ("tensor(float)", "tensor(float16)")


class OlderExportWarning(UserWarning):
    """The folder's graph computes an output nothing reads: its results are right, its steps slower
    than the same export written by this version."""


def _warn_unread_outputs(model, model_path: pathlib.Path, family: str) -> None:
    unread = unread_optional_outputs(model.graph)
    if unread:
        node, name = unread[0]
        warnings.warn(f"{model_path}: {len(unread)} optional output(s) of Quest nodes are computed in every step "
                      f"and read by nothing (first: {node.op_type} {node.name!r} output {name!r}); an older "
                      f"exporter wrote this graph. Export it again (export-sparse {family} with the same options): "
                      "the same results, faster steps.", OlderExportWarning, stacklevel=3)


class CapacityError(ValueError):
    """A step would write past the cache capacity; nothing was run or written."""


@dataclasses.dataclass
class KVCache:
    """The caches of one batch: per layer key/value [B,N,C,D] and, for sparse layers, block max/min
    (model_folder/cache.py). `cache.layers[l].key`, `.value`, `.block_max`, `.block_min`,
    `.block_importance` are layer l's arrays; `buffers` holds the same arrays by graph input name."""

    capacity: int
    lengths: np.ndarray  # [B] int32: tokens cached per row
    layers: tuple[LayerCaches[np.ndarray], ...]
    buffers: dict[str, np.ndarray]  # past input name -> its array (the OrtValue below wraps it)
    values: dict[str, ort.OrtValue]
    # per InPlaceStep (a model's session), an IOBinding with these values bound: a step binds them once
    plans: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, capacity: int, lengths: np.ndarray, layers, names, values: dict | None = None) -> KVCache:
        """The cache holding `layers` (LayerCaches of arrays) fed as `names` (LayerCaches of input
        names, layer by layer); `values`: OrtValues that already wrap some of the arrays."""
        buffers = {name: array for arrays, named in zip(layers, names)
                   for (_, array), (_, name) in zip(arrays.items(), named.items(), strict=True)}
        given = values or {}
        values = {name: given[name] if name in given else ort.OrtValue.ortvalue_from_numpy(array)
                  for name, array in buffers.items()}
        return cls(capacity, lengths, tuple(layers), buffers, values)

    @property
    def batch(self) -> int:
        return int(self.lengths.shape[0])

    def row(self, b: int) -> KVCache:
        """Row b as a cache of batch 1 over the same memory (rows(b, b + 1))."""
        b = integer(b, "row", 0, self.batch - 1)
        return self.rows(b, b + 1)

    def rows(self, start: int, stop: int) -> KVCache:
        """Rows [start, stop) as a cache of their own over the same memory (its arrays, lengths and
        OrtValues are views): a step on it reads and writes those rows alone, as a step of that batch
        would (a slot's prompt prefilled, or a few slots decoded, without running the other rows
        through the model)."""
        start = integer(start, "start", 0, self.batch - 1)
        stop = integer(stop, "stop", start + 1, self.batch)
        view = lambda array: array[start:stop]  # noqa: E731 (contiguous: the OrtValue wraps it, no copy)
        buffers = {name: view(array) for name, array in self.buffers.items()}
        return KVCache(self.capacity, view(self.lengths), tuple(layer.map(view) for layer in self.layers), buffers,
                       {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in buffers.items()})

    def reset(self) -> None:
        """Forget every row's tokens (the buffers stay allocated; stale content is never read,
        except the accumulated block importance, which starts again from zero)."""
        self.lengths[:] = 0
        for layer in self.layers:
            if layer.block_importance is not None:
                layer.block_importance.fill(0.0)


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
        _warn_unread_outputs(graph, model_path, self.sidecar.family)
        del graph  # the session reads the file itself
        self.session = make_session(str(model_path), threads=threads, providers=providers, initializers=initializers,
                                    register_library=not self.sidecar.settings.portable)
        self._initializers = initializers  # ONNX Runtime only borrows them: they must outlive the session
        aliases = {present: past for layer in self.sidecar.layers for present, past in layer.present_to_past().items()}
        # A portable graph's standard ops may read a cache after writing their output, so its presents
        # are not bound in place: they come back as arrays and are copied into the caches.
        self._copy_back = aliases if self.sidecar.settings.portable else {}
        self._step = InPlaceStep(self.session, {} if self.sidecar.settings.portable else aliases)
        self._cache_names = set(aliases.values())
        logits = next(o for o in self.session.get_outputs() if o.name == self.sidecar.outputs["logits"])
        if logits.type not in _LOGITS_TYPES:
            raise ValueError(f"{model_path}: logits of type {logits.type}; the runtime reads float or float16")
        self._logits_dtype = NUMPY_TYPES[logits.type]

    @property
    def vocab_size(self) -> int:
        return self.sidecar.vocab_size

    @property
    def capacity(self) -> int:
        """The capacity the folder was exported for (new_cache's default)."""
        return self.sidecar.capacity

    @property
    def block_size(self) -> int:
        """The metadata block, or with the hierarchical selection's superblocks the superblock:
        truncate keeps whole ones."""
        settings = self.sidecar.settings
        return settings.block_size * max(settings.superblocks, 1)

    @property
    def chunk_size(self) -> int:
        """A sparse prefill's chunk of queries (docs/ops.md, chunk queries)."""
        return self.sidecar.settings.chunk_size

    def prefill_chunk(self, batch: int, preferred: int) -> int:
        """Positions per prefill step: `preferred`, except for the GroupQueryAttention baseline,
        which cannot continue a prompt of several rows (ONNX Runtime needs batch 1 for that)."""
        if self.sidecar.settings.attention == "gqa" and batch > 1:
            return 2**31 - 1
        return preferred

    def new_cache(self, batch: int, capacity: int | None = None) -> KVCache:
        """Allocate every cache of a batch once, at `capacity` tokens (default: the sidecar's, also the
        most: the folder was exported and validated up to it, and its positions' tables end there)."""
        batch = integer(batch, "batch", 1)
        capacity = self.sidecar.capacity if capacity is None else integer(capacity, "capacity", 1)
        if capacity > self.sidecar.capacity:
            raise CapacityError(f"capacity {capacity} is past the {self.sidecar.capacity} tokens the folder was "
                                "exported and validated for")
        layout = cache_layout(self.sidecar, batch, capacity)
        layers = [layer.map(lambda spec: cache_buffer(spec.shape, spec.dtype)) for layer in layout]
        return KVCache.of(capacity, np.zeros(batch, np.int32), layers, [layer.map(lambda spec: spec.name)
                                                                          for layer in layout])

    def truncate(self, cache: KVCache, length: int) -> int:
        """Forget every row's tokens from position `length` on, rounded down to a metadata block, or
        a superblock where the folder has them (`block_size`: a block's bounds hold every key written
        into it, so a block is kept whole or not at all: the bounds then equal those of a cache that
        never held the forgotten tokens). A cache that
        accumulates block importance cannot take tokens back out of it and starts again from
        empty. Returns the tokens kept (of the shortest row)."""
        if not isinstance(cache, KVCache) or cache.buffers.keys() != self._cache_names:
            raise ValueError("cache must come from this model's new_cache")
        length = integer(length, "length", 0)
        cut = cache.lengths > length  # rows holding tokens to forget
        if cut.any():
            if any(layer.block_importance is not None for layer in cache.layers):
                cache.reset()
            else:
                block = self.block_size
                cache.lengths[cut] = length // block * block
        return int(cache.lengths.min())

    @property
    def selects_per_step(self) -> bool:
        """True when the graph takes exact_lens: each step says whether its tokens attend exactly."""
        return "exact_lens" in self.sidecar.inputs

    def check_prefill(self, mode: str) -> None:
        """Raises ValueError when this folder's graph cannot prefill in `mode` ("exact", "sparse",
        "per-token"): an export older than the input the mode feeds (Sidecar.prefill_problem)."""
        problem = self.sidecar.prefill_problem(mode)
        if problem is not None:
            raise ValueError(f"{self.directory} {problem}")

    @property
    def selects_per_chunk(self) -> bool:
        """True when the graph takes chunk_lens: a step's tokens may select per chunk (sparse prefill)."""
        return "chunk_lens" in self.sidecar.inputs

    def step(self, cache: KVCache, input_ids: np.ndarray, valid: np.ndarray | None = None, *,
             exact: bool = False, chunked: bool = False, last_logits: int | None = None) -> np.ndarray:
        """Run one prefill or decode step; returns logits [B, S, vocab] (or [B, last_logits, vocab]).

        `input_ids` [B, S]; row b holds `valid[b]` real tokens followed by padding (default: all S).
        `exact`: the step's tokens attend to every cached position (a prompt, as Quest prefills);
        `chunked`: each chunk of the step's tokens selects its blocks (a sparse prefill,
        docs/ops.md chunk queries); otherwise each token selects its own (sparse layers). A graph
        without sparse layers (the GroupQueryAttention baseline, an all-dense export) always
        attends exactly.
        `last_logits` (1..S): the logits of the step's last positions only, the head computed for
        them alone when the graph takes logits_keep (a prompt step needs one row: at 512 positions
        and Qwen3's vocabulary the rest are 311 MB); otherwise sliced from the full logits.
        Raises, before anything runs: ValueError for a bad argument (token ids that are not
        integers or lie outside the vocabulary, S = 0, ...), CapacityError when a row would pass the
        capacity.
        """
        if not isinstance(cache, KVCache) or cache.buffers.keys() != self._cache_names:  # no set built per step
            got = "the caches of another model" if isinstance(cache, KVCache) else f"a {type(cache).__name__}"
            raise ValueError(f"cache must come from this model's new_cache, got {got}")
        input_ids, valid = step_arguments(input_ids, valid, exact, cache.batch, self.sidecar.vocab_size)
        if not isinstance(chunked, bool):
            raise InputTypeError(f"chunked must be True or False, got {chunked!r}")
        if exact and chunked:
            raise ValueError("a step attends exactly (exact=True) or per chunk (chunked=True), not both")
        new_tokens = input_ids.shape[1]
        kept = new_tokens if last_logits is None else integer(last_logits, "last_logits", 1, new_tokens)
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
        if exact or chunked:
            self.check_prefill("exact" if exact else "sparse")
        feeds = {names["input_ids"]: input_ids, names["past_lens"]: cache.lengths.copy(),
                 names["total_lens"]: total.astype(np.int32)}
        if self.selects_per_step:
            feeds[names["exact_lens"]] = (total if exact else cache.lengths).astype(np.int32)
        if self.selects_per_chunk:
            feeds[names["chunk_lens"]] = (total if chunked else cache.lengths).astype(np.int32)
        slices_head = "logits_keep" in names
        if slices_head:  # 0: every position (the source graph's logits)
            feeds[names["logits_keep"]] = np.array([0 if kept == new_tokens else kept], np.int64)
        saved = self._accumulated_state(cache)
        # The logits are written straight into a fresh array: a copy out of ONNX Runtime's own
        # would hold them twice (a 512-token prefill step of a 151936-word vocabulary: 311 MB each).
        logits_name = self.sidecar.outputs["logits"]
        logits_shape = (cache.batch, kept if slices_head else new_tokens, self.sidecar.vocab_size)
        try:
            outputs = self._step.run(feeds, into={logits_name: np.empty(logits_shape, self._logits_dtype)},
                                     plan=self._plan(cache))
        except BaseException:
            self._restore(saved)
            raise
        for present, past in self._copy_back.items():
            cache.buffers[past][...] = outputs[present]
        cache.lengths[:] = total
        return outputs[logits_name] if slices_head or kept == new_tokens else outputs[logits_name][:, -kept:]

    def _plan(self, cache: KVCache):
        """The cache's binding for this model's session: its buffers bound on its first step only."""
        plan = cache.plans.get(self._step)
        if plan is None:
            plan = cache.plans[self._step] = self._step.plan(cache.values)
        return plan

    def _accumulated_state(self, cache: KVCache) -> list:
        """What a step changes that earlier steps built on, as (array, index, saved values): each
        row's partly filled metadata block (the step folds its keys into it) and the accumulated
        block importance. Key and value slots past `lengths` hold nothing valid, so a failed step
        leaves them harmless."""
        settings = self.sidecar.settings
        block = cache.lengths // settings.block_size
        superblock = block // max(settings.superblocks, 1)
        saved = []
        for layer in cache.layers:
            for bounds, partial in ((layer.block_max, block), (layer.block_min, block), (layer.block_exponent, block),
                                    (layer.super_max, superblock), (layer.super_min, superblock),
                                    (layer.super_exponent, superblock)):
                if bounds is not None:
                    index = (np.arange(cache.batch), slice(None), np.minimum(partial, bounds.shape[2] - 1))
                    saved.append((bounds, index, bounds[index].copy()))
            if layer.block_importance is not None:
                saved.append((layer.block_importance, ..., layer.block_importance.copy()))
        return saved

    @staticmethod
    def _restore(saved: list) -> None:
        for array, index, values in saved:
            array[index] = values
