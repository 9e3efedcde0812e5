"""Per-channel key scales for int8 KV caches, measured on the source graph (docs/ops.md, int8 caches).

An int8 cache row has one scale, so a key channel far larger than the others (Qwen2's keys carry
such outliers: its k projection has a bias) leaves the other channels a few int8 steps. The export
divides each key channel c of a layer's KV head by a power of two f[c] before the cache and
multiplies the query by the same f[c], so every logit q . k is unchanged, bit for bit in float
arithmetic (a product by a power of two is exact), while the cached channels have comparable
ranges. f[c] is the channel's largest |key| over a calibration prompt, rounded to a power of two
(relative to the head's largest channel).
RoPE turns channel c into channel c + D/2 and back (rotate-half layout), so the two share the
larger of their factors: the factors hold at positions the calibration never reached.
"""

from __future__ import annotations

import numpy as np

from .validate import SourceRunner

CALIBRATION_TOKENS = 256  # one prompt of random tokens (seeded), run through the source graph
# A channel's factor is at least its head's largest factor over this: a channel that is near zero
# on the calibration prompt is not magnified without limit.
SMALLEST_FACTOR = 2.0 ** -8


def key_channel_factors(key_magnitude: np.ndarray) -> np.ndarray:
    """The factors f [..., D] for the largest |key| per channel [..., D]: powers of two in proportion
    to it, shared by the channels c and c + D/2, the head's largest 1 and none below SMALLEST_FACTOR
    (about); all 1 where the head's keys were all zero or not finite."""
    magnitude = np.asarray(key_magnitude, np.float64).copy()
    half = magnitude.shape[-1] // 2
    if half and magnitude.shape[-1] % 2 == 0:
        pair = np.maximum(magnitude[..., :half], magnitude[..., half:])
        magnitude[..., :half], magnitude[..., half:] = pair, pair
    largest = magnitude.max(axis=-1, keepdims=True)
    usable = np.isfinite(largest) & (largest > 0)
    magnitude = np.maximum(magnitude, largest * SMALLEST_FACTOR)
    exponents = np.round(np.log2(np.where(usable, magnitude, 1.0)))
    # A head's factors matter only relative to each other (a row's scale absorbs a common one): the
    # largest is 1, so a scaled query never grows and a scaled key stays within twice the head's
    # largest |key|, both safe in float16.
    exponents -= exponents.max(axis=-1, keepdims=True)
    return np.where(usable, np.exp2(exponents), 1.0).astype(np.float32)


def calibrate_key_factors(runner: SourceRunner, vocab: int, tokens: int = CALIBRATION_TOKENS,
                          seed: int = 0) -> dict[int, np.ndarray]:
    """Each layer's key channel factors [N, D], from the keys the source graph (run by `runner`)
    caches for a prompt of `tokens` random tokens."""
    runner.reset(tokens)
    ids = np.random.default_rng(seed).integers(0, vocab, size=(1, tokens), dtype=np.int64)
    runner.step(ids)
    factors = {}
    for name, layer in runner.key_layers.items():
        keys = np.asarray(runner.past[name][0, :, :tokens], np.float32)  # [N, tokens, D]
        factors[layer] = key_channel_factors(np.abs(keys).max(axis=1))
    return factors
