"""How the next token is chosen from a step's logits: greedy or a seeded draw, with the sampling
fields OpenAI's API, vLLM and llama.cpp's server take (temperature, top-k, top-p, min-p and the
presence, frequency and repetition penalties), every one checked when a Sampling is made.

The order, per row (as vLLM's sampler):

1. penalties on the raw logits: `repetition_penalty` r on every token of the prompt or the reply so
   far (a positive logit divided by r, a negative one multiplied: the CTRL / Hugging Face rule);
   then, over the reply's tokens only, `frequency_penalty` times the token's count plus
   `presence_penalty` once it occurred (OpenAI's rule);
2. temperature 0: the argmax (the cuts below change nothing then);
3. else the logits over the temperature; `top_k` keeps the k largest; softmax; `top_p` keeps the
   smallest set of most likely tokens whose mass reaches p; `min_p` keeps the tokens at least
   min_p times as likely as the likeliest; a draw from what is left, renormalised, with the
   request's seeded generator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from . import inputs

TEMPERATURE_MAX = 100.0  # past it every distribution is flat to float64's precision: a mistake, refused
PENALTY_RANGE = (-2.0, 2.0)  # presence and frequency penalties, as OpenAI's API bounds them
REPETITION_MAX = 10.0


@dataclasses.dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0  # 1: no nucleus cut
    seed: int | None = None
    stop_tokens: tuple[int, ...] = ()
    min_p: float = 0.0  # 0: no min-p cut
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1: none

    def __post_init__(self):
        # Normalised to Python numbers (frozen: hence object.__setattr__), so equal settings hash equal.
        low, high = PENALTY_RANGE
        checked = dict(max_new_tokens=inputs.integer(self.max_new_tokens, "max_new_tokens", 0),
                       temperature=_temperature(self.temperature),
                       top_k=inputs.integer(self.top_k, "top_k", 0),
                       top_p=inputs.number(self.top_p, "top_p", minimum=0.0, maximum=1.0, above_minimum=True),
                       seed=None if self.seed is None else inputs.integer(self.seed, "seed", 0),
                       min_p=inputs.number(self.min_p, "min_p", minimum=0.0, maximum=1.0),
                       presence_penalty=inputs.number(self.presence_penalty, "presence_penalty", minimum=low,
                                                      maximum=high),
                       frequency_penalty=inputs.number(self.frequency_penalty, "frequency_penalty", minimum=low,
                                                       maximum=high),
                       repetition_penalty=inputs.number(self.repetition_penalty, "repetition_penalty", minimum=0.0,
                                                        maximum=REPETITION_MAX, above_minimum=True))
        stop = self.stop_tokens
        if isinstance(stop, (str, bytes)) or not isinstance(stop, (Sequence, np.ndarray)):
            raise inputs.InputTypeError(f"stop_tokens must be a sequence of token ids, got {type(stop).__name__} {stop!r}")
        checked["stop_tokens"] = tuple(inputs.integer(t, f"stop_tokens[{i}]", 0) for i, t in enumerate(stop))
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @property
    def penalised(self) -> bool:
        """Whether a penalty changes the logits (then the tokens so far must be tracked)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0


def _temperature(value) -> float:
    """0 (greedy) or a normal float up to TEMPERATURE_MAX: a subnormal one divides the logits into
    infinities, a huge one flattens them to noise."""
    temperature = inputs.number(value, "temperature", minimum=0.0, maximum=TEMPERATURE_MAX)
    if 0.0 < temperature < 2.2250738585072014e-308:
        raise ValueError(f"temperature must be 0 or a normal number, got {temperature!r}")
    return temperature


class TokenHistory:
    """What the penalties read, per row of a batch: which tokens the prompt or the reply holds and
    how often each occurred in the reply. Kept as vocabulary-sized arrays, updated per token: a
    step's penalties cost O(V), whatever the lengths."""

    def __init__(self, prompts: Sequence[Sequence[int]], vocab: int):
        self.seen = np.zeros((len(prompts), vocab), bool)
        self.counts = np.zeros((len(prompts), vocab), np.int32)
        for row, prompt in enumerate(prompts):
            self.seen[row, np.asarray(prompt, np.int64)] = True

    def add(self, tokens: Sequence[int | None]) -> None:
        """The step's new token per row (None: the row generated nothing)."""
        for row, token in enumerate(tokens):
            if token is not None:
                self.seen[row, token] = True
                self.counts[row, token] += 1

    def penalise(self, logits: np.ndarray, sampling: Sampling) -> np.ndarray:
        """The logits [B, V] (float64) with the penalties applied, in the module's order."""
        out = logits.astype(np.float64)
        r = sampling.repetition_penalty
        if r != 1.0:
            out = np.where(self.seen, np.where(out > 0, out / r, out * r), out)
        if sampling.frequency_penalty != 0.0 or sampling.presence_penalty != 0.0:
            out = out - sampling.frequency_penalty * self.counts - sampling.presence_penalty * (self.counts > 0)
        return out


def choose(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator | None,
           history: TokenHistory | None = None) -> np.ndarray:
    """Next token per row of logits [B, V], in the module's order; `history` is required when a
    penalty is set."""
    if sampling.penalised:
        if history is None:
            raise ValueError("a penalised Sampling needs the tokens so far (a TokenHistory)")
        logits = history.penalise(logits, sampling)
    if sampling.temperature == 0:
        return logits.argmax(-1)
    # The largest logit subtracted first: every scaled value is <= 0 whatever the temperature, and
    # one that overflows is -inf (a weight of 0), never a NaN.
    logits = logits.astype(np.float64)
    with np.errstate(over="ignore"):
        scaled = (logits - logits.max(-1, keepdims=True)) / sampling.temperature
    if sampling.top_k:
        cut = np.sort(scaled, axis=-1)[:, -min(sampling.top_k, scaled.shape[-1])][:, None]
        scaled = np.where(scaled < cut, -np.inf, scaled)
    probabilities = np.exp(scaled)
    probabilities /= probabilities.sum(-1, keepdims=True)
    if sampling.top_p < 1.0:
        order = np.argsort(-probabilities, axis=-1)
        ranked = np.take_along_axis(probabilities, order, -1)
        keep = np.cumsum(ranked, -1) - ranked < sampling.top_p  # the smallest prefix reaching top_p
        kept = np.zeros_like(probabilities)
        np.put_along_axis(kept, order, np.where(keep, ranked, 0.0), -1)
        probabilities = kept / kept.sum(-1, keepdims=True)
    if sampling.min_p > 0.0:
        floor = sampling.min_p * probabilities.max(-1, keepdims=True)
        probabilities = np.where(probabilities >= floor, probabilities, 0.0)
        probabilities /= probabilities.sum(-1, keepdims=True)
    return np.array([rng.choice(len(row), p=row) for row in probabilities])
