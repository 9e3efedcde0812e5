"""Token generation over a QuestModel: batched prompts of different lengths, greedy decoding."""

from __future__ import annotations

import numpy as np

from .model import QuestModel


PREFILL_CHUNK = 512


def prefill(model: QuestModel, prompts: list[list[int]], capacity: int | None = None, chunk: int = PREFILL_CHUNK):
    """A fresh cache holding the prompts; returns (cache, logits of each prompt's last token [B, V]).

    The prompts are right-padded into one batch and fed `chunk` positions per step, so memory for
    logits and activations stays bounded whatever the prompt length.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
    lengths = np.array([len(p) for p in prompts], np.int32)
    cache = model.new_cache(len(prompts), capacity)
    if (lengths > cache.capacity).any():
        raise ValueError(f"a prompt of {int(lengths.max())} tokens does not fit the cache capacity {cache.capacity}")
    last = np.zeros((len(prompts), model.sidecar.vocab_size), np.float32)
    for start in range(0, width, chunk):
        valid = np.clip(lengths - start, 0, chunk).astype(np.int32)
        logits = model.step(cache, ids[:, start : start + chunk], valid=valid)
        ends = (lengths > start) & (lengths <= start + chunk)
        for row in np.flatnonzero(ends):
            last[row] = logits[row, lengths[row] - start - 1]
    return cache, last


def greedy(model: QuestModel, prompts: list[list[int]], max_new_tokens: int, capacity: int | None = None,
           return_logits: bool = False):
    """Greedy continuation of each prompt: lists of new tokens (and the logits of every step)."""
    cache, last = prefill(model, prompts, capacity)
    steps = [last]
    tokens = [[] for _ in prompts]
    for step in range(max_new_tokens):
        chosen = last.argmax(-1)
        for row, token in enumerate(chosen):
            tokens[row].append(int(token))
        if step + 1 == max_new_tokens:
            break
        last = model.step(cache, chosen[:, None].astype(np.int64))[:, 0]
        steps.append(last)
    return (tokens, steps) if return_logits else tokens
