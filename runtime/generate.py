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
One loop runs every prompt and decode step of the package: runtime/slots.py's `Slots.run_round`.
A Generator runs its prompts as slots, one cache row per prompt: each prompt prefilled on its own
row, then every row's decode step in one batch. `prefill` and `greedy` are Generators, as are
TextGenerator, Chat and `quest-ort serve` (runtime/chat.py, over slots that outlive a request).
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
from .sampling import Sampling
from .slots import PREFILL_MODES, SPARSE_PREFILL_EXACT_TAIL, Reply, Slots, prefill_segments  # noqa: F401 (re-exported)

PREFILL_CHUNK = 512
ProgressCallback = Callable[[int, int], None]  # (prompt positions prefilled, of how many)


class StepModel(Protocol):
    """What prefill, decoding and Generator need of a model: QuestModel (runtime/model.py) and
    OptimumModel (runtime/dense.py) are such models. Its caches have `batch`, `capacity`, `lengths`
    [B] and `row(b)`/`rows(start, stop)` views (runtime/slots.py runs a row per prompt)."""

    @property
    def vocab_size(self) -> int | None:
        """Token ids must lie below it (None: unknown, ids are not checked)."""

    @property
    def capacity(self) -> int | None:
        """The cache capacity a Generator allocates by default (None: what each request needs)."""

    @property
    def block_size(self) -> int:
        """truncate keeps whole blocks of this many positions."""

    @property
    def chunk_size(self) -> int:
        """A sparse prefill's chunk of queries."""

    def new_cache(self, batch: int, capacity: int | None = None) -> Any: ...

    def truncate(self, cache: Any, length: int) -> int:
        """Forget every row's tokens from `length` on (back to a block); returns the tokens kept."""

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


def _admit(slots: Slots, replies: list[Reply], on_prefill: ProgressCallback | None) -> None:
    """Reply r into row r; `on_prefill(done, total)` over every row's prompt positions."""
    if on_prefill is not None:
        done, total = [0] * len(replies), sum(len(reply.prompt) for reply in replies)

        def progress(row: int, fed: int) -> None:
            done[row] = fed
            on_prefill(sum(done), total)

        for row, reply in enumerate(replies):
            reply.on_prefill = lambda fed, _, row=row: progress(row, fed)
    for row, reply in enumerate(replies):
        slots.take(reply, row)


def prefill(model: StepModel, cache: KVCache, prompts: Sequence[Sequence[int]], chunk: int = PREFILL_CHUNK,
            mode: str = "exact", on_prefill: ProgressCallback | None = None) -> np.ndarray:
    """Feed the prompts into an empty cache, prompt b into row b, at most `chunk` positions per step;
    returns the logits of each prompt's last token [B, V]. The rows are prefilled one at a time
    (runtime/slots.py: a row's prompt steps are those of a batch of one). `mode`: "exact" (every
    prompt token attends to every position before it), "sparse" (each chunk of prompt tokens to its
    own blocks, a window and the blocks it selects; the prompt's last SPARSE_PREFILL_EXACT_TAIL
    tokens exactly: prefill_segments) or "per-token" (each selects its blocks, as decode does).
    `on_prefill(done, total)` is called after each step with the positions fed over every row."""
    mode = check_prefill_mode(mode)
    model.check_prefill(mode)
    on_prefill = check_progress(on_prefill)
    prompts = inputs.prompts(prompts, model.vocab_size)
    chunk = inputs.integer(chunk, "chunk", 1)
    if len(prompts) != cache.batch:
        raise ValueError(f"{len(prompts)} prompts for a cache of batch {cache.batch}")
    if cache.lengths.any():
        raise ValueError("prefill needs an empty cache (reset() it, or take a new one)")
    longest = max(len(prompt) for prompt in prompts)
    if cache.capacity is not None and longest > cache.capacity:
        raise CapacityError(f"a prompt of {longest} tokens does not fit the cache capacity {cache.capacity}; "
                            "nothing was written")
    slots = Slots(model, cache.batch, cache.capacity, mode, chunk, cache=cache)
    replies = [Reply(prompt.tolist(), Sampling(max_new_tokens=0)) for prompt in prompts]
    _admit(slots, replies, on_prefill)
    while not all(reply.ended for reply in replies):
        slots.run_round()
    return np.stack([reply.logits for reply in replies]).astype(np.float32, copy=False)


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
        self.logits: list[list[np.ndarray]] | None = None  # per row, when kept (Generator.stream keep_logits)

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
        self._slots: Slots | None = None
        # Held by the open stream. A lock rather than a flag: two threads asking at once cannot both
        # get the cache. Streams hold its release, not the Generator, so dropping one frees it at once.
        self._busy = threading.Lock()

    @property
    def cache(self) -> KVCache | None:
        """The cache of the last request (a row per prompt), None before the first."""
        return None if self._slots is None else self._slots.cache

    def _slots_for(self, batch: int, needed: int) -> Slots:
        capacity = self.capacity or self.model.capacity or needed
        if needed > capacity:
            raise CapacityError(f"the request needs {needed} tokens per row, past the cache capacity {capacity}; "
                                "nothing was written")
        if self._slots is None or self._slots.cache.batch != batch or self._slots.cache.capacity != capacity:
            self._slots = Slots(self.model, batch, capacity, self.prefill, PREFILL_CHUNK)
        else:
            self._slots.clear()
        return self._slots

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
               on_prefill: ProgressCallback | None = None, keep_logits: bool = False) -> Stream:
        """A Stream yielding, per step, each row's new token (None for rows that already stopped).
        Each row runs in its own row of the cache as a slot of runtime/slots.py does: its prompt
        prefilled alone, its decode steps batched with the other rows'; row 0 samples from a
        generator seeded with `sampling.seed`, row r from one seeded with (seed, r): rows differ
        even with the same prompt, and a row's tokens do not depend on what the other rows hold.
        `on_prefill(done, total)`: called after each prefill step with the prompt positions fed so
        far over every row (a long prompt's progress). `keep_logits`: the stream's `logits[row]`
        holds the logits each of that row's tokens was chosen from.

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
            slots = self._slots_for(len(prompts), max(len(p) for p in prompts) + sampling.max_new_tokens)
        except BaseException:
            self._busy.release()
            raise
        replies = [Reply(prompt.tolist(), sampling, keep_logits=keep_logits, sample=row)
                   for row, prompt in enumerate(prompts)]
        stream = Stream(self._steps(slots, replies, on_prefill), self._busy.release)
        stream.logits = [reply.step_logits for reply in replies] if keep_logits else None
        return stream

    @staticmethod
    def _steps(slots: Slots, replies: list[Reply], on_prefill: ProgressCallback | None) -> Iterator[list[int | None]]:
        """Rounds of the slots until every row has its next token (or has stopped), then that step."""
        if replies[0].sampling.max_new_tokens == 0:
            return
        _admit(slots, replies, on_prefill)
        # Every prompt first, then the rows decode in one batch per step (a row running ahead of the
        # others would yield nothing sooner: a step waits for every row's token).
        while any(reply.logits is None and not reply.ended for reply in replies):
            slots.run_round(decode=False)
        for step in range(replies[0].sampling.max_new_tokens):
            while not all(reply.ended or len(reply.tokens) > step for reply in replies):
                slots.run_round()
            if all(len(reply.tokens) <= step for reply in replies):
                return
            yield [reply.tokens[step] if len(reply.tokens) > step else None for reply in replies]

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
    """Greedy continuation of each prompt by a Generator (and, if asked, the logits of every step
    [B, V], the first the prompt's), for tests and comparisons where the logits matter."""
    max_new_tokens = inputs.integer(max_new_tokens, "max_new_tokens", 0)
    generator = Generator(model, capacity, prefill=prefill_mode)
    with generator.stream(prompts, Sampling(max_new_tokens=max_new_tokens), keep_logits=return_logits) as stream:
        steps = list(stream)
    tokens = [[step[row] for step in steps] for row in range(len(prompts))]
    if not return_logits:
        return tokens
    return tokens, [np.stack([row[step] for row in stream.logits]) for step in range(len(steps))]
