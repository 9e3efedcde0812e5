"""The dense reference runner: an optimum-exported graph (decomposed attention, past and present
caches), behind the same new_cache/step/truncate interface as QuestModel, so generation and
comparisons take either."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from .inputs import integer, step_arguments
from .model import CapacityError
from .sessions import make_session


@dataclasses.dataclass
class DenseCache:
    """Each layer's past keys and values, [B, heads, capacity, D] float32, row b's tokens in its first
    `lengths[b]` positions. Without a capacity (None) the buffers grow as the steps need them, and
    the cache has no row views."""

    capacity: int | None
    lengths: np.ndarray  # [B] int32: valid tokens per row
    past: dict[str, np.ndarray]

    @property
    def batch(self) -> int:
        return int(self.lengths.shape[0])

    def row(self, b: int) -> DenseCache:
        b = integer(b, "row", 0, self.batch - 1)
        return self.rows(b, b + 1)

    def rows(self, start: int, stop: int) -> DenseCache:
        """Rows [start, stop) over the same memory (a step on it writes those rows alone)."""
        if self.capacity is None:
            raise ValueError("a cache without a capacity grows and has no row views: give new_cache a capacity")
        start = integer(start, "start", 0, self.batch - 1)
        stop = integer(stop, "stop", start + 1, self.batch)
        return DenseCache(self.capacity, self.lengths[start:stop],
                          {name: array[start:stop] for name, array in self.past.items()})

    def reset(self) -> None:
        self.lengths[:] = 0

    def room(self, needed: int) -> None:
        """Buffers of at least `needed` positions (a growing cache doubles them; a cache with a
        capacity holds it already)."""
        held = next(iter(self.past.values())).shape[2] if self.past else needed
        if held < needed:
            size = max(needed, 2 * held)
            for name, array in self.past.items():
                grown = np.zeros(array.shape[:2] + (size,) + array.shape[3:], array.dtype)
                grown[:, :, :held] = array
                self.past[name] = grown


class OptimumModel:
    block_size = chunk_size = 1  # truncates anywhere; no chunks of queries (the units runtime/slots.py reads)

    def __init__(self, model_path, *, threads: int | None = None):
        self.session = make_session(str(pathlib.Path(model_path)), threads=threads, register_library=False)
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.past_inputs = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        self.outputs = [o.name for o in self.session.get_outputs()]
        logits = next(o for o in self.session.get_outputs() if o.name == "logits")
        self.vocab_size = logits.shape[-1] if isinstance(logits.shape[-1], int) else None
        self.capacity = None  # no exported capacity: a Generator allocates what each request needs

    def prefill_chunk(self, batch: int, preferred: int) -> int:
        return preferred

    def check_prefill(self, mode: str) -> None:
        """Dense attention prefills exactly in every mode."""

    def new_cache(self, batch: int, capacity: int | None = None) -> DenseCache:
        """Caches of `capacity` tokens per row, allocated now; None: caches that grow with the steps."""
        batch = integer(batch, "batch", 1)
        capacity = None if capacity is None else integer(capacity, "capacity", 1)
        past = {i.name: np.zeros((batch, i.shape[1], capacity or 0, i.shape[3]), np.float32) for i in self.past_inputs}
        return DenseCache(capacity, np.zeros(batch, np.int32), past)

    def truncate(self, cache: DenseCache, length: int) -> int:
        """Forget every row's tokens from position `length` on; returns the tokens kept (of the shortest row)."""
        self._check(cache)
        length = integer(length, "length", 0)
        np.minimum(cache.lengths, length, out=cache.lengths)
        return int(cache.lengths.min())

    def _check(self, cache) -> None:
        if not isinstance(cache, DenseCache) or cache.past.keys() != {i.name for i in self.past_inputs}:
            raise ValueError(f"cache must come from this model's new_cache, got a {type(cache).__name__}")

    def step(self, cache: DenseCache, input_ids: np.ndarray, valid: np.ndarray | None = None, *,
             exact: bool = True, chunked: bool = False, last_logits: int | None = None) -> np.ndarray:
        """One step; dense attention is always exact (`exact` and `chunked` are accepted for the common
        interface). The graph reads the rows' pasts up to the longest (the rest masked) and returns
        them with the new tokens appended; each row's new tokens are written after its own.
        `last_logits`: the logits of the step's last positions only (sliced: the source graph
        computes them all)."""
        self._check(cache)
        input_ids, valid = step_arguments(input_ids, valid, exact, cache.batch, self.vocab_size)
        new_tokens = input_ids.shape[1]
        kept = new_tokens if last_logits is None else integer(last_logits, "last_logits", 1, new_tokens)
        if cache.capacity is not None and (cache.lengths + valid > cache.capacity).any():
            raise CapacityError(f"a row would pass the capacity {cache.capacity}; nothing was written")
        width = int(cache.lengths.max())
        cache.room(int((cache.lengths + valid).max()))
        held = np.arange(width)[None, :] < cache.lengths[:, None]
        fresh = np.arange(new_tokens)[None, :] < valid[:, None]
        mask = np.concatenate([held, fresh], axis=1).astype(np.int64)
        positions = cache.lengths[:, None].astype(np.int64) + np.arange(new_tokens)[None, :]
        feeds = {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions,
                 **{name: array[:, :, :width] for name, array in cache.past.items()}}
        values = dict(zip(self.outputs, self.session.run(None, {k: v for k, v in feeds.items() if k in self.input_names})))
        for name, array in cache.past.items():
            present = values[name.replace("past_key_values.", "present.")]
            for row, (start, count) in enumerate(zip(cache.lengths, valid)):
                array[row, :, start : start + count] = present[row, :, width : width + count]
        cache.lengths += valid
        return values["logits"][:, new_tokens - kept:]
