"""Text in, text out over an exported folder: a chat that keeps its cache across turns, and one-shot
completions, streamed as text.

```python
chat = Chat("qwen3-quest")                       # a folder (or a QuestModel); its tokenizer and template
for delta in chat.send("Hello!", stream=True):   # text as it is generated
    print(delta, end="", flush=True)
print(chat.send("And in one word?"))             # prefills only this turn's new tokens
print(generate_text("qwen3-quest", "Once upon a time", max_new_tokens=32))
```
A reply stops at the model's end-of-turn ids (the sidecar's `eos_token_ids`), at a stop string, or
at `max_new_tokens` (default: as far as the cache capacity allows). One TextGenerator owns one cache
(batch 1) and remembers which tokens it holds: a request whose tokens begin with them prefills only
the rest; one that departs from them keeps the shared beginning, back to a metadata block boundary
(QuestModel.truncate). Only positions a fresh request would compute the same way are kept: those an
exact prefill wrote (with `prefill="sparse"`, the whole chunks of its sparse part; with "per-token",
none), never a reply's tokens, whose keys and values sparse decode steps computed. A later prompt
that holds a reply prefills it again, so a request gets the same tokens whatever ran before it.
The prompt is prefilled exactly by default and generated tokens select their blocks, as Generator does (runtime/generate.py); `prefill="sparse"` prefills in chunks that select
their blocks (a long prompt's first token sooner: docs/quality.md says what it keeps).
"""

from __future__ import annotations

import dataclasses
import pathlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from . import inputs
from .generate import PREFILL_CHUNK, GeneratorBusyError, Stream, check_prefill_mode, check_progress, prefill_segments
from .model import CapacityError, QuestModel
from .sampling import Sampling, TokenHistory, choose
from .text import FolderTokenizer, StopText, TextDeltas


def _model(model) -> QuestModel:
    """A folder opened as a QuestModel; a model object as given (a QuestModel, or one that behaves
    like it: a test's slowed-down model)."""
    if isinstance(model, (str, pathlib.Path)):
        return QuestModel(model)
    if not all(hasattr(model, name) for name in ("step", "truncate", "new_cache", "sidecar", "directory")):
        raise inputs.InputTypeError(f"model must be a QuestModel or a folder path, got {type(model).__name__}")
    return model


LOGPROBS_MAX = 20  # alternatives per token, as OpenAI's top_logprobs


@dataclasses.dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens the cache already held (not prefilled again)
    prefill_seconds: float = 0.0  # in the model's prefill steps
    decode_seconds: float = 0.0  # in the decode steps and the sampler


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model's distribution (the step's raw logits,
    before penalties, temperature and cuts, as vLLM reports them), and the `top` likeliest tokens'."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def token_logprobs(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    shifted = logits.astype(np.float64) - logits.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())
    best = np.argsort(-logprobs, kind="stable")[:top]
    return TokenLogprob(token, float(logprobs[token]), tuple((int(t), float(logprobs[t])) for t in best))


class TextStream(Stream):
    """The text of one request, delta by delta. Once it ends: `text` (the whole reply), `finish_reason`
    ('stop': an end-of-turn id or a stop string, 'length': max_new_tokens or the capacity,
    'cancelled': closed or cancelled first), `usage` and the generated `tokens`.

    `cancel()` may be called from any thread (a server whose client went away): the generation
    stops before its next step. As Generator's Stream, closing it (or a `with` block, or dropping
    it) releases its TextGenerator for the next request."""

    def __init__(self, usage: Usage, release: Callable[[], None], on_finish: Callable[[TextStream], None] | None):
        super().__init__(None, release)  # the steps come with start(): they need the stream itself
        self._on_finish = on_finish
        self.usage = usage
        self.text = ""
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] = []  # with complete(logprobs=...): per token of the reply
        self.finish_reason: str | None = None
        self._cancel = threading.Event()

    def start(self, steps: Iterator[str]) -> TextStream:
        self._steps = steps
        return self

    def __next__(self) -> str:
        delta = super().__next__()
        self.text += delta
        return delta

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def read(self) -> str:
        """The rest of the reply, generated to its end; the whole reply."""
        for _ in self:
            pass
        return self.text

    def close(self) -> None:
        if self._steps is None:
            return
        super().close()
        if self.finish_reason is None:
            self.finish_reason = "cancelled"
        if self._on_finish is not None:
            self._on_finish(self)


class TextGenerator:
    """Text completions of token prompts over one cache of batch 1 that remembers its tokens."""

    def __init__(self, model, *, tokenizer: FolderTokenizer | None = None, capacity: int | None = None,
                 prefill_chunk: int = PREFILL_CHUNK, prefill: str = "exact"):
        """`prefill`: how prompts are prefilled, as Generator's ("exact", "sparse" or "per-token")."""
        self.model = _model(model)
        self.prefill = check_prefill_mode(prefill)
        self.model.check_prefill(self.prefill)
        self.tokenizer = tokenizer or FolderTokenizer.from_folder(self.model.directory)
        self.capacity = self.model.capacity if capacity is None else inputs.integer(capacity, "capacity", 1)
        self.prefill_chunk = inputs.integer(prefill_chunk, "prefill_chunk", 1)
        self.stop_tokens = tuple(self.model.sidecar.eos_token_ids)
        if self.capacity > self.model.capacity:
            raise CapacityError(f"capacity {self.capacity} is past the {self.model.capacity} tokens the folder was "
                                "exported and validated for")
        self.prefill_chunk = self._aligned_chunk(self.prefill_chunk)
        self.cache = None
        self.cached: list[int] = []  # the tokens whose keys and values the cache holds, in order
        # Leading cached positions a fresh request would compute the same way (_reuse): prompt
        # positions prefilled exactly, or a sparse prefill's whole chunks; never reply tokens.
        self.reusable = 0
        self._busy = threading.Lock()

    @property
    def context_used(self) -> int:
        return len(self.cached)

    def _aligned_chunk(self, chunk: int) -> int:
        """A sparse prefill's steps hold whole chunks of queries (chunk_size): its chunks then start
        at multiples of chunk_size from position 0, as a fresh prefill's do, whatever was reused."""
        if self.prefill != "sparse":
            return chunk
        size = self.model.sidecar.settings.chunk_size
        return max(size, chunk // size * size)

    def reset(self) -> None:
        """Forget the cached tokens (the next request prefills everything). Refused (GeneratorBusyError)
        while a stream is open: its cache is in use."""
        if not self._busy.acquire(blocking=False):
            raise GeneratorBusyError("a stream of this TextGenerator is open: read or close it before reset()")
        try:
            if self.cache is not None:
                self.cache.reset()
            self.cached = []
            self.reusable = 0
        finally:
            self._busy.release()

    def sampling(self, prompt_tokens: int, sampling: Sampling | None = None, **options) -> Sampling:
        """The request's Sampling: `sampling`, or one from `options` (Sampling's fields, with
        max_new_tokens None or absent meaning up to the capacity); the model's end-of-turn ids when
        it names no stop tokens."""
        if sampling is None:
            if options.get("max_new_tokens") is None:
                options["max_new_tokens"] = max(0, self.capacity - prompt_tokens)
            sampling = Sampling(**options)
        elif options:
            raise TypeError(f"pass a Sampling or its fields, not both (got {', '.join(options)})")
        if not sampling.stop_tokens:
            sampling = dataclasses.replace(sampling, stop_tokens=self.stop_tokens)
        return sampling

    def complete(self, prompt: Sequence[int], sampling: Sampling | None = None, *, stop: Sequence[str] = (),
                 on_prefill: Callable[[int, int], None] | None = None,
                 on_finish: Callable[[TextStream], None] | None = None, logprobs: int | None = None,
                 **options) -> TextStream:
        """A TextStream of the text generated after the token ids `prompt`.

        Everything is checked here, before anything runs: a bad argument is a ValueError, a prompt
        plus max_new_tokens past the capacity a CapacityError, a request while another stream is
        open a GeneratorBusyError; the cache is untouched. `stop`: strings that end the reply (not
        included in it). `on_prefill(done, total)`: called after each prefill chunk. `logprobs`: None,
        or the stream records each reply token's TokenLogprob with that many alternatives (0 to
        LOGPROBS_MAX; the end-of-turn token that stops it is not part of the reply)."""
        prompt = inputs.prompts([prompt], self.model.vocab_size)[0].tolist()
        if logprobs is not None:
            logprobs = inputs.integer(logprobs, "logprobs", 0, LOGPROBS_MAX)
        sampling = self.sampling(len(prompt), sampling, **options)
        on_prefill = check_progress(on_prefill)
        if isinstance(stop, str):
            stop = (stop,)
        if not all(isinstance(s, str) for s in stop):
            raise inputs.InputTypeError(f"stop must be strings, got {stop!r:.80}")
        if len(prompt) + sampling.max_new_tokens > self.capacity:
            raise CapacityError(f"a prompt of {len(prompt)} tokens and up to {sampling.max_new_tokens} new ones pass "
                                f"the cache capacity {self.capacity}; nothing was run")
        if not self._busy.acquire(blocking=False):
            raise GeneratorBusyError("a stream of this TextGenerator is open: read or close it first, or use "
                                     "another TextGenerator (they may share one QuestModel)")
        stream = TextStream(Usage(prompt_tokens=len(prompt)), self._busy.release, on_finish)
        return stream.start(self._steps(stream, prompt, sampling, tuple(stop), on_prefill, logprobs))

    def _reuse(self, prompt: list[int]) -> list[int]:
        """Keep the cached tokens the prompt begins with, as far as they are reusable (always leaving
        its last token to run, for its logits); returns the tokens still to prefill."""
        if self.cache is None or self.cache.capacity != self.capacity:
            self.cache = self.model.new_cache(1, self.capacity)
            self.cached, self.reusable = [], 0
        shared = 0
        for cached, token in zip(self.cached[: self.reusable], prompt[:-1]):
            if cached != token:
                break
            shared += 1
        if self.prefill == "sparse":
            # kept where this prompt's own sparse part would have computed it, on a chunk boundary
            size = self.model.sidecar.settings.chunk_size
            sparse_end = prefill_segments(len(prompt), "sparse")[0][0]
            shared = min(shared, sparse_end) // size * size
        kept = self.model.truncate(self.cache, shared)
        if self.prefill == "sparse" and kept % size:
            kept = self.model.truncate(self.cache, kept // size * size)
        del self.cached[kept:]
        self.reusable = min(self.reusable, kept)
        return prompt[kept:]

    def _prefilled(self, prompt_length: int, kept: int) -> int:
        """Leading positions reusable after prefilling a prompt of `prompt_length` tokens from `kept`:
        an exact prefill's every one; a sparse one's whole chunks before its exact tail; none of a
        per-token prefill's (a step's block bounds hold its later tokens' keys too, so its selections
        depend on how the prompt was split into steps)."""
        if self.prefill == "exact":
            return prompt_length
        if self.prefill == "per-token":
            return 0
        size = self.model.sidecar.settings.chunk_size
        sparse_end = prefill_segments(prompt_length, "sparse")[0][0]
        return max(kept, sparse_end // size * size)

    def _steps(self, stream: TextStream, prompt: list[int], sampling: Sampling, stop: tuple[str, ...],
               on_prefill, logprobs: int | None) -> Iterator[str]:
        rest = self._reuse(prompt)
        kept = len(prompt) - len(rest)
        usage = stream.usage
        usage.reused_tokens = kept
        logits, done = None, 0
        for end, step_mode in prefill_segments(len(rest), self.prefill):  # (a sparse prefill ends exactly)
            for start in range(done, end, self.prefill_chunk):
                if stream.cancelled:
                    return
                chunk = rest[start : min(start + self.prefill_chunk, end)]
                began = time.perf_counter()
                logits = self.model.step(self.cache, np.array([chunk], np.int64), exact=step_mode == "exact",
                                         chunked=step_mode == "sparse", last_logits=1)[0, -1]
                usage.prefill_seconds += time.perf_counter() - began
                self.cached.extend(chunk)
                if on_prefill is not None:
                    on_prefill(start + len(chunk), len(rest))
            done = end
        self.reusable = self._prefilled(len(prompt), kept)
        rng = np.random.default_rng(sampling.seed)
        history = TokenHistory([prompt], logits.shape[-1]) if sampling.penalised else None
        deltas, stops = TextDeltas(self.tokenizer), StopText(stop)
        for step in range(sampling.max_new_tokens):
            if stream.cancelled:
                return
            began = time.perf_counter()
            token = int(choose(logits[None], sampling, rng, history)[0])
            usage.decode_seconds += time.perf_counter() - began
            if history is not None:
                history.add([token])
            stream.tokens.append(token)
            usage.completion_tokens += 1
            if token in sampling.stop_tokens:
                stream.finish_reason = "stop"
                break
            if logprobs is not None:
                stream.logprobs.append(token_logprobs(logits, token, logprobs))
            text = stops.add(deltas.add(token))
            if text:
                yield text
            if stops.stopped:
                stream.finish_reason = "stop"
                return
            if step + 1 == sampling.max_new_tokens:
                break
            began = time.perf_counter()
            logits = self.model.step(self.cache, np.array([[token]], np.int64))[0, -1]
            usage.decode_seconds += time.perf_counter() - began
            self.cached.append(token)
        text = stops.add(deltas.finish())
        text += stops.finish()
        if text:
            yield text
        if stream.finish_reason is None:
            stream.finish_reason = "stop" if stops.stopped else "length"

    def generate_text(self, prompt: str, *, stream: bool = False, **options):
        """The continuation of a plain text prompt (no chat template): a str, or a TextStream."""
        result = self.complete(self.tokenizer.encode(prompt), **options)
        return result if stream else result.read()


class Chat:
    """A conversation: each `send` adds the user's message and the model's reply, prefilling only
    the turn's new tokens."""

    def __init__(self, model, *, system: str | None = None, generator: TextGenerator | None = None, **defaults):
        """`defaults`: Sampling fields (temperature, top_p, max_new_tokens...) for every turn."""
        self.generator = generator or TextGenerator(model)
        self.system = system
        self.defaults = defaults
        self.messages: list[dict] = []
        self.reset()

    def reset(self) -> None:
        """Start the conversation again (the cache keeps what the new one shares with the old:
        the system prompt)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def send(self, text: str, *, stream: bool = False, **options):
        """The reply to `text`: a str, or with `stream` a TextStream of its deltas (the reply joins the
        conversation when the stream ends or is closed). `options`: Sampling fields for this turn;
        the reply stops where the cache is full (finish_reason 'length')."""
        if not isinstance(text, str):
            raise inputs.InputTypeError(f"text must be a str, got {type(text).__name__}")
        asked = [*self.messages, {"role": "user", "content": text}]
        ids = self.generator.tokenizer.encode_chat(asked)
        options = {**self.defaults, **options}
        room = self.generator.capacity - len(ids)
        if room <= 0:
            raise CapacityError(f"the conversation is {len(ids)} tokens, the cache holds {self.generator.capacity}: "
                                "reset() to start again")
        if options.get("max_new_tokens") is not None:  # a reply stops at the capacity ('length')
            options["max_new_tokens"] = min(options["max_new_tokens"], room)

        def remember(result: TextStream) -> None:
            self.messages = [*asked, {"role": "assistant", "content": result.text}]

        reply = self.generator.complete(ids, on_finish=remember, **options)
        return reply if stream else reply.read()


def generate_text(model, prompt: str, **options) -> str:
    """One completion of a plain text prompt with a folder's (or QuestModel's) tokenizer."""
    return TextGenerator(model).generate_text(prompt, **options)
