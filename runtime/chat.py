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
at `max_new_tokens` (default: as far as the cache capacity allows). A TextGenerator owns one cache
of `slots` rows (default 1; runtime/slots.py runs them, their decode steps batched) and remembers
which tokens each row holds: a request whose tokens begin with them prefills only the rest; one
that departs from them keeps the shared beginning, back to a metadata block boundary
(QuestModel.truncate). Only positions a fresh request would compute the same way are kept: those an
exact prefill wrote (with `prefill="sparse"`, the whole chunks of its sparse part; with "per-token",
none), never a reply's tokens, whose keys and values sparse decode steps computed. A later prompt
that holds a reply prefills it again, so a request gets the same tokens whatever ran before it.
The prompt is prefilled exactly by default and generated tokens select their blocks, as Generator
does (runtime/generate.py); `prefill="sparse"` prefills in chunks that select their blocks (a long
prompt's first token sooner: docs/quality.md says what it keeps).
"""

from __future__ import annotations

import dataclasses
import pathlib
import threading
from collections.abc import Callable, Iterator, Sequence

from . import inputs
from .generate import PREFILL_CHUNK, GeneratorBusyError, Stream, check_prefill_mode, check_progress
from .model import CapacityError, KVCache, QuestModel
from .sampling import Sampling
from .slots import LOGPROBS_MAX, Reply, Slot, Slots, TokenLogprob, Usage, restore_slot, save_slot
from .text import FolderTokenizer


def _model(model) -> QuestModel:
    """A folder opened as a QuestModel; a model object as given (a QuestModel, or one that behaves
    like it: a test's slowed-down model)."""
    if isinstance(model, (str, pathlib.Path)):
        return QuestModel(model)
    if not all(hasattr(model, name) for name in ("step", "truncate", "new_cache", "sidecar", "directory")):
        raise inputs.InputTypeError(f"model must be a QuestModel or a folder path, got {type(model).__name__}")
    return model


class TextStream(Stream):
    """The text of one request, delta by delta. Once it ends: `text` (the whole reply), `finish_reason`
    ('stop': an end-of-turn id or a stop string, 'length': max_new_tokens or the capacity,
    'cancelled': closed or cancelled first), `usage`, the generated `tokens` and, when asked for,
    their `logprobs`.

    `cancel()` may be called from any thread (a server whose client went away): the generation
    stops before its next step. As Generator's Stream, closing it (or a `with` block, or dropping
    it) frees its slot of the TextGenerator for the next request."""

    def __init__(self, reply: Reply, release: Callable[[], None], on_finish: Callable[[TextStream], None] | None):
        super().__init__(None, release)  # the steps come with start(): they need the stream itself
        self._reply, self._on_finish = reply, on_finish
        self.usage: Usage = reply.usage
        self.text = ""
        self.tokens: list[int] = reply.tokens
        self.logprobs: list[TokenLogprob] = reply.token_logprobs  # with complete(logprobs=...): per reply token
        self.logprobs_given = 0  # of them, those of the tokens whose text the deltas so far hold

    @property
    def finish_reason(self) -> str | None:
        return self._reply.finish_reason

    def start(self, steps: Iterator[str]) -> TextStream:
        self._steps = steps
        return self

    def __next__(self) -> str:
        delta = super().__next__()
        self.text += delta
        return delta

    def cancel(self) -> None:
        self._reply.cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._reply.cancelled.is_set()

    def read(self) -> str:
        """The rest of the reply, generated to its end; the whole reply."""
        for _ in self:
            pass
        return self.text

    def close(self) -> None:
        if self._steps is None:
            return
        super().close()
        self._reply.end("cancelled")
        if self._on_finish is not None:
            self._on_finish(self)


class TextGenerator:
    """Text completions of token prompts over `slots` cache rows that remember their tokens
    (runtime/slots.py): up to that many streams at once, their decode steps batched."""

    def __init__(self, model, *, tokenizer: FolderTokenizer | None = None, capacity: int | None = None,
                 prefill_chunk: int = PREFILL_CHUNK, prefill: str = "exact", slots: int = 1):
        """`prefill`: how prompts are prefilled, as Generator's ("exact", "sparse" or "per-token").
        `slots`: the requests it runs at once, each in a row of one cache of that batch (allocated
        here: slots x the cache of `capacity` tokens)."""
        self.model = _model(model)
        self.prefill = check_prefill_mode(prefill)
        self.model.check_prefill(self.prefill)
        self.tokenizer = tokenizer or FolderTokenizer.from_folder(self.model.directory)
        self.capacity = self.model.capacity if capacity is None else inputs.integer(capacity, "capacity", 1)
        prefill_chunk = inputs.integer(prefill_chunk, "prefill_chunk", 1)
        slots = inputs.integer(slots, "slots", 1)
        self.stop_tokens = tuple(self.model.sidecar.eos_token_ids)
        if self.capacity > self.model.capacity:
            raise CapacityError(f"capacity {self.capacity} is past the {self.model.capacity} tokens the folder was "
                                "exported and validated for")
        self.prefill_chunk = self._aligned_chunk(prefill_chunk)
        self.slots = Slots(self.model, slots, self.capacity, self.prefill, self.prefill_chunk)
        self._state = threading.Lock()  # taking and freeing slots

    @property
    def cache(self) -> KVCache:
        """The cache of every slot's row."""
        return self.slots.cache

    @property
    def cached(self) -> list[int]:
        """The tokens the first slot's row holds, in order (the one slot of a TextGenerator of one)."""
        return self.slots.slots[0].cached

    @property
    def context_used(self) -> int:
        return max(len(slot.cached) for slot in self.slots.slots)

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
        with self._state, self.slots.lock:
            self.slots.sweep()
            if self.slots.running:
                raise GeneratorBusyError("a stream of this TextGenerator is open: read or close it before reset()")
            self.slots.cache.reset()
            for slot in self.slots.slots:
                slot.cached.clear()
                slot.reusable = 0

    def save_slot(self, index: int, path) -> int:
        """Writes slot `index`'s cached tokens (keys, values, bounds, the tokens) to `path`, with the
        folder's identity (runtime/slots.py save_slot); returns the tokens saved. Refused
        (GeneratorBusyError) while the slot runs a stream."""
        with self._state, self.slots.lock:
            return save_slot(self.model, self._free_slot(index), pathlib.Path(path), self.prefill)

    def restore_slot(self, index: int, path) -> int:
        """Loads a file save_slot wrote into slot `index`, checked against this folder (SlotFileError
        names a foreign, truncated or mismatched file; the slot is then untouched); returns the tokens
        restored. Refused (GeneratorBusyError) while the slot runs a stream."""
        with self._state, self.slots.lock:
            return restore_slot(self.model, self._free_slot(index), pathlib.Path(path), self.prefill)

    def _free_slot(self, index: int) -> Slot:
        index = inputs.integer(index, "slot", 0, len(self.slots.slots) - 1)
        self.slots.sweep()
        slot = self.slots.slots[index]
        if slot.reply is not None:
            raise GeneratorBusyError(f"slot {index} runs a stream: read or close it first")
        return slot

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
        plus max_new_tokens past the capacity a CapacityError, a request while every slot runs a
        stream a GeneratorBusyError; the cache is untouched. `stop`: strings that end the reply (not
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
        reply = Reply(prompt, sampling, tuple(stop), logprobs, on_prefill, self.tokenizer)
        with self._state, self.slots.lock:
            slot = self.slots.take(reply)
        if slot is None:
            raise GeneratorBusyError("every slot of this TextGenerator runs an open stream: read or close one first, "
                                     "or use another TextGenerator (they may share one QuestModel)")
        # Closing the stream ends its reply; the slot is freed by the next sweep (no lock taken here).
        stream = TextStream(reply, lambda: reply.cancelled.set(), on_finish)
        return stream.start(self._texts(reply, stream))

    def _texts(self, reply: Reply, stream: TextStream) -> Iterator[str]:
        """The reply's text as it comes: rounds of every slot's work (under the slots' lock) until
        it has text to give or has ended."""
        while True:
            if reply.pending:
                text, stream.logprobs_given = reply.pending.pop(0)
                yield text
            elif reply.ended:
                return
            else:
                with self.slots.lock:
                    if not reply.ended and not reply.pending:
                        self.slots.run_round()

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
