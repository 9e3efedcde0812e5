"""Slots: up to N replies generated at once over one cache of N rows, the decode steps batched.

    cache rows:   row 0  [prompt A ...........|reply A ..]      (a slot per row)
                  row 1  [prompt B ....|reply B ..]
                  row 2  [what an ended request left]           (idle: kept for prefix reuse)
    a round:      one prefill chunk of one slot (batch 1: the row's own view of the cache)
                  one decode step of every slot with a token to feed (one batch over the rows
                  from the first such slot's to the last's, idle rows among them masked)

Prompts and decode steps interleave, so a long prompt delays the others' tokens by one chunk per
token, not by its whole prefill. Each reply keeps its own sampler state (seeded generator,
penalties' history), stop strings and log-probabilities.

A slot keeps the tokens its row holds when its reply ends. A new request goes to the free slot
whose tokens share its longest reusable prefix (else the one used least recently). Reusable are only
the positions a fresh request computes the same way: the prompt positions an exact prefill wrote
(with prefill="sparse", the whole chunks of its sparse part before its exact tail; with
"per-token", none: a step's block bounds hold its later tokens' keys, so its selections depend on
how the prompt was split into steps), never a reply's tokens, whose keys and values sparse decode
steps computed. The prefix is kept back to a metadata block (QuestModel.truncate).

Whatever ran before, a request's prompt is prefilled as on a fresh slot (batch 1, the same steps,
the same bits). Its decode steps share a batch with the other slots: the model's weights are read
once for every row; each row's attention reads its own row only. runtime/chat.py's TextGenerator
drives the slots; `quest-ort serve --parallel N` runs N of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import threading
import time
import zipfile
from collections.abc import Callable

import numpy as np

from ..model_folder.sidecar import SIDECAR_NAME
from .model import KVCache
from .sampling import Sampling, TokenHistory, choose
from .text import StopText, TextDeltas

LOGPROBS_MAX = 20  # alternatives per token, as OpenAI's top_logprobs
PREFILL_MODES = ("exact", "sparse", "per-token")
# A sparse prefill's last tokens, prefilled exactly (prefill_segments): one chunk of queries.
SPARSE_PREFILL_EXACT_TAIL = 64


def prefill_segments(length: int, mode: str) -> list[tuple[int, str]]:
    """How a prompt of `length` new tokens is prefilled: (end position, step mode) segments in order,
    the step modes "exact", "sparse" (chunks select their blocks) or "per-token". A sparse prefill
    reads its last SPARSE_PREFILL_EXACT_TAIL tokens exactly: the prompt's end, which a reply answers,
    attends to every position (it costs a 64th of one 4K-position step per 4K of prompt)."""
    if mode != "sparse":
        return [(length, mode)]
    return [(max(0, length - SPARSE_PREFILL_EXACT_TAIL), "sparse"), (length, "exact")]


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model's distribution (the step's raw logits,
    before penalties, temperature and cuts, as vLLM reports them), and the `top` likeliest tokens'."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def token_logprobs(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """The token's log-probability and the `top` likeliest tokens' (ties: the smaller id first), found
    by a partial sort: a full sort of a 150K vocabulary per token cost more than a small model's step."""
    shifted = logits.astype(np.float64) - logits.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())
    if top == 0:
        return TokenLogprob(token, float(logprobs[token]), ())
    candidates = np.argpartition(-logprobs, top - 1)[:top] if top < logprobs.size else np.arange(logprobs.size)
    threshold = logprobs[candidates].min()
    tied = np.flatnonzero(logprobs >= threshold)  # every token as likely as the top's last, for the order
    best = tied[np.lexsort((tied, -logprobs[tied]))][:top]
    return TokenLogprob(token, float(logprobs[token]), tuple((int(t), float(logprobs[t])) for t in best))


@dataclasses.dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens the cache already held (not prefilled again)
    prefill_seconds: float = 0.0  # in the model's prefill steps
    decode_seconds: float = 0.0  # in the decode steps (shared with the batch's other rows) and the sampler


class Reply:
    """One request's generation in a slot: what is left of its prompt to prefill, its sampler, its
    stop strings; the text it produced and not yet handed out (`pending`), and how it ended.
    Without a tokenizer it makes tokens only (Generator's rows: no text, no stop strings);
    `keep_logits`: `step_logits` keeps the logits each token was chosen from. `sample`: which of a
    request's samples this is (a Generator's row): sample 0 draws from `sampling.seed`, sample i
    from (seed, i), so rows of one seeded request differ even where their prompts are the same,
    and none depends on what the others hold."""

    def __init__(self, prompt: list[int], sampling: Sampling, stop: tuple[str, ...] = (), logprobs: int | None = None,
                 on_prefill: Callable[[int, int], None] | None = None, tokenizer=None, keep_logits: bool = False,
                 sample: int = 0):
        if stop and tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        self.prompt, self.sampling, self.logprobs, self.on_prefill = prompt, sampling, logprobs, on_prefill
        self.step_logits: list[np.ndarray] | None = [] if keep_logits else None
        self.usage = Usage(prompt_tokens=len(prompt))
        self.tokens: list[int] = []
        self.token_logprobs: list[TokenLogprob] = []
        # text produced, not yet taken, each with the count of token_logprobs up to its last token
        self.pending: list[tuple[str, int]] = []
        self.finish_reason: str | None = None  # set when it ends
        self.cancelled = threading.Event()
        self.rest: list[int] = []  # the prompt tokens to prefill (set when a slot takes it)
        self.fed = 0  # of them, prefilled
        self.logits: np.ndarray | None = None  # the last step's, for the next token
        self.feed: int | None = None  # the token the next decode step feeds
        seeded = sampling.seed is not None and sample > 0
        self._rng = np.random.default_rng([sampling.seed, sample] if seeded else sampling.seed)
        self._history: TokenHistory | None = None
        self._deltas = None if tokenizer is None else TextDeltas(tokenizer)
        self._stops = StopText(stop)

    @property
    def ended(self) -> bool:
        return self.finish_reason is not None

    def end(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def advance(self) -> None:
        """Choose the next token from `logits`: record it, produce its text, and either end (an
        end-of-turn token, a stop string, max_new_tokens) or leave it to feed (`feed`)."""
        sampling, logits = self.sampling, self.logits
        if sampling.max_new_tokens == 0:
            self._finish("length")
            return
        began = time.perf_counter()
        if self._history is None and sampling.penalised:
            self._history = TokenHistory([self.prompt], logits.shape[-1])
        token = int(choose(logits[None], sampling, self._rng, self._history)[0])
        self.usage.decode_seconds += time.perf_counter() - began
        if self._history is not None:
            self._history.add([token])
        if self.step_logits is not None:
            self.step_logits.append(np.array(logits))  # a copy: `logits` is a view of the whole batch's step
        self.tokens.append(token)
        self.usage.completion_tokens += 1
        if token in sampling.stop_tokens:
            self._finish("stop")
            return
        if self.logprobs is not None:
            self.token_logprobs.append(token_logprobs(logits, token, self.logprobs))
        text = "" if self._deltas is None else self._stops.add(self._deltas.add(token))
        if text:
            self.pending.append((text, len(self.token_logprobs)))
        if self._stops.stopped:
            self.end("stop")
        elif len(self.tokens) == sampling.max_new_tokens:
            self._finish("length")
        else:
            self.feed = token

    def _finish(self, reason: str) -> None:
        """The end of the text: what the decoder and the stop strings held back, then the reason."""
        text = "" if self._deltas is None else self._stops.add(self._deltas.finish()) + self._stops.finish()
        if text:
            self.pending.append((text, len(self.token_logprobs)))
        self.end("stop" if self._stops.stopped else reason)


@dataclasses.dataclass
class Slot:
    """A row of the cache: the tokens it holds, how many of them a new request may reuse, and the
    reply it runs (None: free)."""

    row: int
    cache: KVCache  # the row's view (batch 1)
    cached: list[int] = dataclasses.field(default_factory=list)
    reusable: int = 0
    reply: Reply | None = None
    used: int = 0  # when it last took a request (for the least recently used)

    @property
    def busy(self) -> bool:
        """Whether its reply still runs (one that ended or was cancelled leaves at the next sweep)."""
        return self.reply is not None and not self.reply.ended and not self.reply.cancelled.is_set()


class Slots:
    """N slots over one cache of N rows; `run_round` advances every running reply.

    `model`: a StepModel (runtime/generate.py); `cache`: one of its caches to run in (default: a new
    one of `count` rows and `capacity` tokens). A prompt is prefilled on its row alone, at most
    `prefill_chunk` positions per step (as the model takes them: StepModel.prefill_chunk)."""

    def __init__(self, model, count: int, capacity: int, prefill: str, prefill_chunk: int, *, cache=None):
        self.model, self.prefill = model, prefill
        self.prefill_chunk = model.prefill_chunk(1, prefill_chunk)
        self.cache = model.new_cache(count, capacity) if cache is None else cache
        count = self.cache.batch
        self.slots = [Slot(row, self.cache if count == 1 else self.cache.row(row)) for row in range(count)]
        self.lock = threading.Lock()  # one round at a time; taken by whoever drives the slots
        self._spans: dict[tuple[int, int], KVCache] = {}  # views of consecutive rows, made once
        self._clock = 0
        self._turn = 0  # the slot whose prefill goes first in the next round

    @property
    def running(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.busy]

    def sweep(self) -> None:
        """Frees the slots whose reply ended or was cancelled. (Streams only mark their reply when
        they close, taking no lock: a stream dropped by the garbage collector inside a round must not
        wait for the lock its own thread holds.)"""
        for slot in self.slots:
            if slot.reply is not None and not slot.busy:
                slot.reply.end("cancelled")
                slot.reply = None

    def clear(self) -> None:
        """Forget every row's tokens and replies (the cache stays allocated)."""
        for slot in self.slots:
            if slot.reply is not None:
                slot.reply.end("cancelled")
            slot.reply, slot.reusable = None, 0
            slot.cached.clear()
        self.cache.reset()

    def take(self, reply: Reply, row: int | None = None) -> Slot | None:
        """A free slot for `reply` (None: every slot runs one): the slot of `row` when given (None
        when it is busy), else the one whose reusable tokens share the prompt's longest beginning,
        else the least recently used. Keeps what it can reuse."""
        self.sweep()
        free = [slot for slot in self.slots if slot.reply is None and row in (None, slot.row)]
        if not free:
            return None
        slot = max(free, key=lambda s: (self._keepable(s, reply.prompt), -s.used))
        self._clock += 1
        slot.used, slot.reply = self._clock, reply
        kept = self._reuse(slot, reply.prompt)
        reply.rest = reply.prompt[kept:]
        reply.usage.reused_tokens = kept
        return slot

    @staticmethod
    def _shared(slot: Slot, prompt: list[int]) -> int:
        shared = 0
        for cached, token in zip(slot.cached[: slot.reusable], prompt[:-1]):
            if cached != token:
                break
            shared += 1
        return shared

    def _reusable_prefix(self, slot: Slot, prompt: list[int]) -> int:
        """The slot's reusable tokens the prompt begins with (always leaving its last token to run,
        for its logits), with a sparse prefill where this prompt's own sparse part would have
        computed them, on a chunk boundary."""
        shared = self._shared(slot, prompt)
        if self.prefill != "sparse":
            return shared
        size = self.model.chunk_size
        return min(shared, self._sparse_chunks_end(len(prompt))) // size * size

    def _sparse_chunks_end(self, prompt_length: int) -> int:
        """Where the whole chunks of a sparse prefill of `prompt_length` tokens end (before its exact
        tail), counted from position 0 as a fresh prefill's chunks are."""
        size = self.model.chunk_size
        return prefill_segments(prompt_length, "sparse")[0][0] // size * size

    def _keepable(self, slot: Slot, prompt: list[int]) -> int:
        """What _reuse would keep (a metadata block's worth at least, or nothing)."""
        block = self.model.block_size
        return self._reusable_prefix(slot, prompt) // block * block

    def _reuse(self, slot: Slot, prompt: list[int]) -> int:
        """Keep the slot's reusable prefix of the prompt (back to a metadata block, QuestModel.truncate);
        returns how many tokens."""
        size = self.model.chunk_size
        kept = self._truncate(slot, self._reusable_prefix(slot, prompt))
        if self.prefill == "sparse" and kept % size:
            kept = self._truncate(slot, kept // size * size)
        del slot.cached[kept:]
        slot.reusable = min(slot.reusable, kept)
        return kept

    def _truncate(self, slot: Slot, length: int) -> int:
        """The model's truncate, when the row holds more than `length` tokens (a fresh row: nothing)."""
        held = int(slot.cache.lengths[0])
        return self.model.truncate(slot.cache, length) if held > length else held

    def _reusable_after_prefill(self, prompt_length: int, kept: int) -> int:
        if self.prefill == "exact":
            return prompt_length
        if self.prefill == "per-token":
            return 0
        return max(kept, self._sparse_chunks_end(prompt_length))

    def run_round(self, decode: bool = True) -> None:
        """One prefill chunk of one slot (in turns), then (unless `decode` is False) one decode step of
        every slot with a token to feed. Cancelled replies end first; a reply that ends frees its slot."""
        self.sweep()
        prefilling = [slot for slot in self.running if slot.reply.logits is None]
        if prefilling:
            slot = min(prefilling, key=lambda s: (s.row - self._turn) % len(self.slots))
            self._turn = (slot.row + 1) % len(self.slots)
            self._prefill_chunk(slot)
        decoding = [slot for slot in self.running if slot.reply.feed is not None] if decode else []
        if decoding:
            self._decode(decoding)
        self.sweep()

    def _span(self, start: int, stop: int) -> KVCache:
        if (start, stop) not in self._spans:
            self._spans[start, stop] = self.slots[start].cache if stop == start + 1 else self.cache.rows(start, stop)
        return self._spans[start, stop]

    def _prefill_chunk(self, slot: Slot) -> None:
        reply = slot.reply
        kept = len(reply.prompt) - len(reply.rest)
        for end, mode in prefill_segments(len(reply.rest), self.prefill):  # (a sparse prefill ends exactly)
            if reply.fed < end:
                break
        chunk = reply.rest[reply.fed : min(reply.fed + self.prefill_chunk, end)]
        began = time.perf_counter()
        logits = self.model.step(slot.cache, np.array([chunk], np.int64), exact=mode == "exact",
                                 chunked=mode == "sparse", last_logits=1)[0, -1]
        reply.usage.prefill_seconds += time.perf_counter() - began
        slot.cached.extend(chunk)
        reply.fed += len(chunk)
        if reply.on_prefill is not None:
            reply.on_prefill(reply.fed, len(reply.rest))
        if reply.fed == len(reply.rest):
            slot.reusable = self._reusable_after_prefill(len(reply.prompt), kept)
            reply.logits = logits
            reply.advance()

    def _decode(self, decoding: list[Slot]) -> None:
        # The step runs over the rows from the first decoding slot's to the last's (a view of the
        # cache): rows outside that span are not run at all, idle rows inside it are masked.
        first, last = min(slot.row for slot in decoding), max(slot.row for slot in decoding)
        cache = self.cache if last - first + 1 == len(self.slots) else self._span(first, last + 1)
        for slot in self.slots[first : last + 1]:  # an idle row at the capacity has no room for the masked position
            if slot.reply is None and slot.cache.lengths[0] >= cache.capacity:
                self._truncate(slot, int(slot.cache.lengths[0]) - 1)
                del slot.cached[int(slot.cache.lengths[0]):]
                slot.reusable = min(slot.reusable, len(slot.cached))
        ids = np.zeros((cache.batch, 1), np.int64)
        valid = np.zeros(cache.batch, np.int32)
        for slot in decoding:
            ids[slot.row - first, 0], valid[slot.row - first] = slot.reply.feed, 1
        began = time.perf_counter()
        logits = self.model.step(cache, ids, valid=valid)[:, 0]
        seconds = time.perf_counter() - began
        for slot in decoding:
            reply = slot.reply
            slot.cached.append(reply.feed)
            reply.feed, reply.logits = None, logits[slot.row - first]
            reply.usage.decode_seconds += seconds
            reply.advance()


class SlotFileError(ValueError):
    """A slot file that is not this folder's, is truncated, or does not fit the cache."""


SLOT_FILE_FORMAT = "quest-ort slot 1"
_POSITION_ROLES = ("key", "value", "key_scale", "value_scale")  # indexed by token; the rest by metadata block
_SUPERBLOCK_ROLES = ("super_max", "super_min", "super_exponent")  # by superblock (the hierarchical selection's)


def _saved_size(model, role: str, length: int) -> int:
    """How much of a cache of `role` a slot of `length` tokens fills along its second axis: tokens,
    metadata blocks or superblocks."""
    settings = model.sidecar.settings
    if role in _POSITION_ROLES:
        return length
    blocks = -(-length // settings.block_size)
    return settings.superblock_count(blocks) if role in _SUPERBLOCK_ROLES else blocks


def folder_identity(model) -> str:
    """What a slot file must have been saved from: the sidecar's bytes and the graph file's name and
    size (a slot's keys and values hold only for the graph and settings that wrote them)."""
    sidecar = model.directory / SIDECAR_NAME
    graph = model.directory / model.sidecar.model_file
    digest = hashlib.sha256(sidecar.read_bytes())
    digest.update(f"{graph.name}:{graph.stat().st_size}".encode())
    return digest.hexdigest()


def save_slot(model, slot: Slot, path: pathlib.Path, prefill: str) -> int:
    """Writes the slot's row (its tokens' keys, values, scales and their blocks' bounds), the tokens
    and what of them is reusable under the `prefill` mode that wrote them, with the folder's
    identity; returns the tokens saved."""
    length = int(slot.cache.lengths[0])
    arrays = {f"{index}.{role}": array[0, :, : _saved_size(model, role, length)]
              for index, layer in enumerate(slot.cache.layers) for role, array in layer.items()}
    meta = {"format": SLOT_FILE_FORMAT, "folder": folder_identity(model), "prefill": prefill, "length": length,
            "reusable": slot.reusable, "tokens": slot.cached}
    with open(path, "wb") as file:
        np.savez(file, meta=np.array(json.dumps(meta)), **arrays)
    return length


def restore_slot(model, slot: Slot, path: pathlib.Path, prefill: str) -> int:
    """Reads a file save_slot wrote into the (free) slot's row; SlotFileError, naming the file, when it
    is not one, is truncated, belongs to another folder or was written under another prefill mode
    (whose positions this one would compute otherwise); the row is then untouched."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            contents = {name: saved[name] for name in saved.files}
        meta = json.loads(str(contents.pop("meta")))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise SlotFileError(f"{path.name} is not a readable slot file ({error})") from None
    if not isinstance(meta, dict) or meta.get("format") != SLOT_FILE_FORMAT:
        raise SlotFileError(f"{path.name} is not a slot file of this version")
    if meta.get("folder") != folder_identity(model):
        raise SlotFileError(f"{path.name} was saved from another model folder (or another export of it)")
    if meta.get("prefill") != prefill:
        raise SlotFileError(f"{path.name} was saved by a {meta.get('prefill')!r} prefill; this one is {prefill!r}")
    length, tokens, reusable = meta.get("length"), meta.get("tokens"), meta.get("reusable")
    capacity, vocab = slot.cache.capacity, model.vocab_size
    if not (type(length) is int and type(reusable) is int and isinstance(tokens, list)
            and all(type(t) is int and 0 <= t < vocab for t in tokens)):
        raise SlotFileError(f"{path.name}: its length, reusable count or tokens are not what a slot file holds")
    if not 0 <= length <= capacity or len(tokens) != length:
        raise SlotFileError(f"{path.name} holds {length} tokens; the cache holds {capacity}")
    targets = {f"{index}.{role}": array for index, layer in enumerate(slot.cache.layers) for role, array in layer.items()}
    if contents.keys() != targets.keys():
        raise SlotFileError(f"{path.name} holds other caches than this folder's")
    for name, array in contents.items():
        target = targets[name]
        size = _saved_size(model, name.split(".")[1], length)
        if array.dtype != target.dtype or array.shape != target.shape[1:2] + (size,) + target.shape[3:]:
            raise SlotFileError(f"{path.name}: {name} is {array.dtype} {array.shape}, not what the cache holds")
    for name, array in contents.items():
        targets[name][0, :, : array.shape[1]] = array
    slot.cache.lengths[0] = length
    slot.cached[:] = tokens
    slot.reusable = max(0, min(reusable, length))
    return length
