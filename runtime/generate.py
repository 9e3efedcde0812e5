"""Token generation over a model folder's runtime: batched prompts of different lengths, greedy or
seeded sampling (runtime/sampling.py: temperature, top-k, top-p, min-p, penalties), stop tokens, a streaming iterator.

Prompts are prefilled exactly by default (every prompt token attends to all before it, as Quest
does) and sparse selection starts with the first generated token. `prefill="sparse"` prefills in
chunks of queries that each attend their own positions, a window before them, the sink and the
blocks they select from the block bounds (docs/ops.md, chunk queries): a long prompt's first token
comes several times sooner (docs/quality.md says what it keeps); `prefill="per-token"` makes every
prompt token select its blocks as a decode step does (for measurements: it loses pass keys).

```python
generator = Generator(QuestModel("qwen3-quest"))
for step in generator.stream([[1, 2, 3], [4, 5]], Sampling(max_new_tokens=32, temperature=0.7, seed=1)):
    print(step)                     # one new token per row, None once a row has stopped
tokens = generator.generate(prompts, Sampling(max_new_tokens=64))  # greedy
```
A Generator owns one cache, allocated at the first request and reused by the next ones (capacity
and batch permitting). One cache serves one stream: while a stream is open, another request to the
same Generator raises GeneratorBusyError (it would reset the cache under the open stream); a
stream frees the cache when it ends, fails, is closed or is garbage-collected. Two requests at once
take two Generators, which may share one QuestModel (one session, one copy of the weights), as may
threads: a Generator belongs to one thread at a time.
Every argument is checked before anything runs (runtime/inputs.py): float or string token ids, an
empty prompt, a NaN temperature are ValueErrors naming the argument, and the cache is untouched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from . import inputs
from .model import CapacityError, KVCache
from .sampling import Sampling, TokenHistory, choose

PREFILL_CHUNK = 512
PREFILL_MODES = ("exact", "sparse", "per-token")
# A sparse prefill's last tokens, prefilled exactly (prefill_segments): one chunk of queries.
SPARSE_PREFILL_EXACT_TAIL = 64
ProgressCallback = Callable[[int, int], None]  # (prompt positions prefilled, of how many)


class StepModel(Protocol):
    """What prefill, decoding and Generator need of a model: QuestModel (runtime/model.py) and
    OptimumModel (runtime/dense.py) are such models."""

    @property
    def vocab_size(self) -> int | None:
        """Token ids must lie below it (None: unknown, ids are not checked)."""

    @property
    def capacity(self) -> int | None:
        """The cache capacity a Generator allocates by default (None: what each request needs)."""

    def new_cache(self, batch: int, capacity: int | None = None) -> Any: ...

    def step(self, cache: Any, input_ids: np.ndarray, valid: np.ndarray | None = None, *,
             exact: bool = False, chunked: bool = False, last_logits: int | None = None) -> np.ndarray: ...

    def prefill_chunk(self, batch: int, preferred: int) -> int:
        """Positions per prefill step, given the `preferred` chunk."""

    def check_prefill(self, mode: str) -> None:
        """Raises ValueError, saying why, when the model cannot prefill in `mode` (PREFILL_MODES)."""


def check_prefill_mode(mode) -> str:
    """`mode` when it is one of PREFILL_MODES, else a ValueError naming them."""
    if not isinstance(mode, str) or mode not in PREFILL_MODES:
        raise ValueError(f"prefill must be one of {', '.join(map(repr, PREFILL_MODES))}, got {mode!r}")
    return mode


def check_progress(callback) -> ProgressCallback | None:
    if callback is not None and not callable(callback):
        raise inputs.InputTypeError(f"on_prefill must be callable (done, total), got {type(callback).__name__}")
    return callback


def prefill_segments(length: int, mode: str) -> list[tuple[int, str]]:
    """How a prompt of `length` new tokens is prefilled: (end position, step mode) segments in order,
    the step modes "exact", "sparse" (chunks select their blocks) or "per-token". A sparse prefill
    reads its last SPARSE_PREFILL_EXACT_TAIL tokens exactly: the prompt's end, which a reply answers,
    attends to every position (it costs a 64th of one 4K-position step per 4K of prompt)."""
    if mode != "sparse":
        return [(length, mode)]
    return [(max(0, length - SPARSE_PREFILL_EXACT_TAIL), "sparse"), (length, "exact")]


def prefill(model: StepModel, cache: KVCache, prompts: Sequence[Sequence[int]], chunk: int = PREFILL_CHUNK,
            mode: str = "exact", on_prefill: ProgressCallback | None = None) -> np.ndarray:
    """Feed the prompts into an empty cache, at most `chunk` positions per step; returns the logits of
    each prompt's last token [B, V]. `mode`: "exact" (every prompt token attends to every position
    before it), "sparse" (each chunk of prompt tokens to its own blocks, a window and the blocks it
    selects; the prompt's last SPARSE_PREFILL_EXACT_TAIL tokens exactly: prefill_segments) or
    "per-token" (each selects its blocks, as decode does). Rows advance together through each
    segment (right-padded where shorter). `on_prefill(done, total)` is called after each step with
    the positions of the longest prompt fed so far."""
    mode = check_prefill_mode(mode)
    model.check_prefill(mode)
    on_prefill = check_progress(on_prefill)
    prompts = inputs.prompts(prompts, model.vocab_size)
    chunk = inputs.integer(chunk, "chunk", 1)
    if len(prompts) != cache.batch:
        raise ValueError(f"{len(prompts)} prompts for a cache of batch {cache.batch}")
    lengths = np.array([len(p) for p in prompts], np.int32)
    if (lengths > cache.capacity).any():
        raise CapacityError(f"a prompt of {int(lengths.max())} tokens does not fit the cache capacity "
                            f"{cache.capacity}; nothing was written")
    width = int(lengths.max())
    chunk = model.prefill_chunk(len(prompts), chunk)
    ids = np.zeros((len(prompts), width + min(chunk, width)), np.int64)  # room for a step's padding past a row's end
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
    schedules = [prefill_segments(int(length), mode) for length in lengths]
    fed = np.zeros(len(prompts), np.int64)  # positions each row holds
    last = None
    for phase in range(len(schedules[0])):
        # the rows' ends of this phase, and its step mode (every row's schedule has the same modes)
        ends = np.array([schedule[phase][0] for schedule in schedules], np.int64)
        step_mode = schedules[0][phase][1]
        while (fed < ends).any():
            # every row places the step's positions, padding included: none past the capacity
            positions = int(min(chunk, (ends - fed).max(), (cache.capacity - fed).min()))
            if positions < 1:
                raise CapacityError(f"a full row leaves no room for the other rows' prompt steps (capacity "
                                    f"{cache.capacity}); nothing more was written")
            valid = np.clip(ends - fed, 0, positions).astype(np.int32)
            step_ids = np.stack([ids[row, start : start + positions] for row, start in enumerate(fed)])
            ending = np.flatnonzero((valid > 0) & (fed + valid == lengths))  # rows whose prompt ends here
            # only the positions from the earliest prompt end on need logits (the head runs for them alone)
            kept = positions - int((valid[ending] - 1).min()) if len(ending) else 1
            logits = model.step(cache, step_ids, valid=valid, exact=step_mode == "exact",
                                chunked=step_mode == "sparse", last_logits=kept)
            if last is None:
                last = np.zeros((len(prompts), logits.shape[-1]), np.float32)
            for row in ending:
                last[row] = logits[row, valid[row] - 1 - (positions - kept)]
            del logits  # before the next step makes its own
            fed += valid
            if on_prefill is not None:
                on_prefill(int(fed.max()), width)
    return last


class GeneratorBusyError(RuntimeError):
    """A request to a Generator while one of its streams is open; that stream is unaffected."""


class Stream:
    """The steps of one request (Generator.stream): an iterator over each step's new tokens.

    While it is open its Generator refuses other requests. It releases the Generator when it ends
    or fails, and when it is closed (`close()`, a `with` block) or garbage-collected, so an
    abandoned stream does not lock its Generator for good.
    """

    def __init__(self, steps: Iterator[list[int | None]], release):
        self._steps, self._release = steps, release

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> list[int | None]:
        if self._steps is None:
            raise StopIteration
        try:
            return next(self._steps)
        except BaseException:  # the end (StopIteration), a failed step or an interrupt: release
            self.close()
            raise

    def close(self) -> None:
        """Stop generating and release the Generator (the cache keeps what was generated so far)."""
        steps, self._steps = self._steps, None
        if steps is not None:
            steps.close()
            self._release()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class Generator:
    def __init__(self, model: StepModel, capacity: int | None = None, prefill: str = "exact"):
        """`prefill`: "exact" (the default, Quest's split: the prompt attends exactly, generated
        tokens select their blocks), "sparse" (each chunk of prompt tokens attends its own blocks, a
        window and the blocks it selects: docs/ops.md, chunk queries) or "per-token" (every prompt
        token selects its blocks as decode does)."""
        self.model = model
        self.capacity = None if capacity is None else inputs.integer(capacity, "capacity", 1)
        if self.capacity is not None and model.capacity is not None and self.capacity > model.capacity:
            raise CapacityError(f"capacity {self.capacity} is past the model's {model.capacity} tokens (what its "
                                "folder was exported and validated for)")
        self.prefill = check_prefill_mode(prefill)
        model.check_prefill(self.prefill)
        self.cache: KVCache | None = None
        # Held by the open stream. A lock rather than a flag: two threads asking at once cannot both
        # get the cache. Streams hold its release, not the Generator, so dropping one frees it at once.
        self._busy = threading.Lock()

    def _cache_for(self, batch: int, needed: int) -> KVCache:
        capacity = self.capacity or self.model.capacity or needed
        if needed > capacity:
            raise CapacityError(f"the request needs {needed} tokens per row, past the cache capacity {capacity}; "
                                "nothing was written")
        if self.cache is None or self.cache.batch != batch or self.cache.capacity != capacity:
            self.cache = self.model.new_cache(batch, capacity)
        else:
            self.cache.reset()
        return self.cache

    def _check_request(self, prompts, sampling) -> list[np.ndarray]:
        """The prompts as token id arrays, once every argument is known good."""
        if not isinstance(sampling, Sampling):
            raise inputs.InputTypeError(f"sampling must be a Sampling, got {type(sampling).__name__} {sampling!r:.60}")
        vocab = self.model.vocab_size
        rows = inputs.prompts(prompts, vocab)
        outside = [token for token in sampling.stop_tokens if vocab is not None and token >= vocab]
        if outside:
            raise ValueError(f"stop_tokens must lie in [0, {vocab}), got {outside[0]}")
        return rows

    def stream(self, prompts: Sequence[Sequence[int]], sampling: Sampling = Sampling(), *,
               on_prefill: ProgressCallback | None = None) -> Stream:
        """A Stream yielding, per step, each row's new token (None for rows that already stopped).
        `on_prefill(done, total)`: called after each prefill step with the prompt positions fed so
        far (a long prompt's progress).

        The arguments are checked, and the cache prepared, when stream is called: a bad argument, a
        request past the capacity, or GeneratorBusyError while another stream of this Generator is
        open, raises there, with the cache untouched."""
        prompts = self._check_request(prompts, sampling)
        on_prefill = check_progress(on_prefill)
        if not self._busy.acquire(blocking=False):
            raise GeneratorBusyError(
                "a stream of this Generator is open and its cache is in use: exhaust or close() that stream "
                "first, or use another Generator (Generators may share one QuestModel)")
        try:
            cache = self._cache_for(len(prompts), max(len(p) for p in prompts) + sampling.max_new_tokens)
        except BaseException:
            self._busy.release()
            raise
        return Stream(self._steps(cache, prompts, sampling, on_prefill), self._busy.release)

    def _steps(self, cache: KVCache, prompts: list[np.ndarray], sampling: Sampling,
               on_prefill: ProgressCallback | None) -> Iterator[list[int | None]]:
        rng = np.random.default_rng(sampling.seed)
        if sampling.max_new_tokens == 0:
            return
        logits = prefill(self.model, cache, prompts, mode=self.prefill, on_prefill=on_prefill)
        history = TokenHistory(prompts, logits.shape[-1]) if sampling.penalised else None
        done = np.zeros(len(prompts), bool)
        for step in range(sampling.max_new_tokens):
            tokens = choose(logits, sampling, rng, history)
            new = [None if done[row] else int(tokens[row]) for row in range(len(prompts))]
            if history is not None:
                history.add(new)
            yield new
            done |= np.isin(tokens, sampling.stop_tokens)
            if done.all() or step + 1 == sampling.max_new_tokens:
                return
            # Finished rows keep stepping with a masked token (valid = 0) so the batch stays aligned.
            valid = (~done).astype(np.int32)
            logits = self.model.step(cache, tokens[:, None].astype(np.int64), valid=valid)[:, 0]

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling = Sampling(), *,
                 on_prefill: ProgressCallback | None = None) -> list[list[int]]:
        """The new tokens of each row (stop tokens included, nothing after them)."""
        with self.stream(prompts, sampling, on_prefill=on_prefill) as steps:
            rows: list[list[int]] = [[] for _ in prompts]
            for step in steps:
                for row, token in enumerate(step):
                    if token is not None:
                        rows[row].append(token)
        return rows


def greedy(model: StepModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, capacity: int | None = None,
           return_logits: bool = False, prefill_mode: str = "exact"):
    """Greedy continuation of each prompt (and, if asked, the logits of every step), for tests and
    comparisons where the logits matter."""
    prompts = inputs.prompts(prompts, model.vocab_size)
    max_new_tokens = inputs.integer(max_new_tokens, "max_new_tokens", 0)
    cache = model.new_cache(len(prompts), capacity)
    last = prefill(model, cache, prompts, mode=prefill_mode)
    steps, tokens = [last], [[] for _ in prompts]
    for step in range(max_new_tokens):
        chosen = last.argmax(-1)
        for row, token in enumerate(chosen):
            tokens[row].append(int(token))
        if step + 1 == max_new_tokens:
            break
        last = model.step(cache, chosen[:, None].astype(np.int64))[:, 0]
        steps.append(last)
    return (tokens, steps) if return_logits else tokens
