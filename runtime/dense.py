"""The dense reference runner: an optimum-exported graph (decomposed attention, caches that grow by
concatenation), behind the same new_cache/step interface as QuestModel, so generation and
comparisons take either."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from .inputs import integer, step_arguments
from .model import CapacityError
from .sessions import make_session


@dataclasses.dataclass
class GrowingCache:
    capacity: int
    lengths: np.ndarray  # [B] int32: valid tokens per row
    mask: np.ndarray  # [B, T] int64: which of the T cached slots are real tokens
    past: dict[str, np.ndarray]

    @property
    def batch(self) -> int:
        return int(self.lengths.shape[0])

    def reset(self) -> None:
        self.lengths[:] = 0
        self.mask = self.mask[:, :0]
        self.past = {name: value[:, :, :0] for name, value in self.past.items()}


class OptimumModel:
    def __init__(self, model_path, *, threads: int | None = None):
        self.session = make_session(str(pathlib.Path(model_path)), threads=threads, register_library=False)
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.past_inputs = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        self.outputs = [o.name for o in self.session.get_outputs()]
        logits = next(o for o in self.session.get_outputs() if o.name == "logits")
        self.vocab_size = logits.shape[-1] if isinstance(logits.shape[-1], int) else None
        self.capacity = None  # the caches grow: a Generator allocates what each request needs

    def prefill_chunk(self, batch: int, preferred: int) -> int:
        return preferred

    def check_prefill(self, mode: str) -> None:
        """Dense attention prefills exactly in every mode."""

    def new_cache(self, batch: int, capacity: int | None = None) -> GrowingCache:
        batch = integer(batch, "batch", 1)
        capacity = None if capacity is None else integer(capacity, "capacity", 1)
        past = {i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), np.float32) for i in self.past_inputs}
        return GrowingCache(int(capacity or 2**31 - 1), np.zeros(batch, np.int32), np.zeros((batch, 0), np.int64), past)

    def step(self, cache: GrowingCache, input_ids: np.ndarray, valid: np.ndarray | None = None, *,
             exact: bool = True, chunked: bool = False, last_logits: int | None = None) -> np.ndarray:
        """One step; dense attention is always exact (`exact` and `chunked` are accepted for the common
        interface).
        `last_logits`: the logits of the step's last positions only (sliced: the source graph
        computes them all)."""
        if not isinstance(cache, GrowingCache):
            raise ValueError(f"cache must come from this model's new_cache, got a {type(cache).__name__}")
        input_ids, valid = step_arguments(input_ids, valid, exact, cache.batch, self.vocab_size)
        new_tokens = input_ids.shape[1]
        kept = new_tokens if last_logits is None else integer(last_logits, "last_logits", 1, new_tokens)
        if (cache.lengths + valid > cache.capacity).any():
            raise CapacityError(f"a row would pass the capacity {cache.capacity}; nothing was written")
        fresh = (np.arange(new_tokens)[None, :] < valid[:, None]).astype(np.int64)
        mask = np.concatenate([cache.mask, fresh], axis=1)
        positions = cache.lengths[:, None].astype(np.int64) + np.arange(new_tokens)[None, :]
        feeds = {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions, **cache.past}
        values = dict(zip(self.outputs, self.session.run(None, {k: v for k, v in feeds.items() if k in self.input_names})))
        for name in cache.past:
            cache.past[name] = values[name.replace("past_key_values.", "present.")]
        cache.mask = mask
        cache.lengths += valid
        return values["logits"][:, new_tokens - kept:]
