"""float16 storage: conversions round to nearest even exactly as NumPy, specials and subnormals included."""

from __future__ import annotations

import numpy as np
import pytest

from impls import run
from tolerances import assert_equal

SPECIALS = np.array(
    [0.0, -0.0, 1e-8, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-14, 2.0**-14 - 2.0**-25, 65504.0, 65519.0, 65520.0,
     1e6, -1e6, np.inf, -np.inf, np.nan, 1 + 2.0**-11, 1 + 3 * 2.0**-11, -(1 + 2.0**-11), 0.1, 1 / 3],
    dtype=np.float32,
)


def _zero_sign_blind(x, impl):
    """The function body's ScatterElements max/min returns +0 for -0: sign of zero is not compared there."""
    return np.where(x == 0, np.zeros_like(x), x) if impl == "body" else x


def _convert(impl, key, cache_dtype):
    """QuestMetadata with P = 1 stores every key, converted, as its own block's max."""
    N, S, D = 1, key.shape[0], key.shape[1]
    inputs = dict(key=key.reshape(1, N, S, D), block_max=np.zeros((1, N, S, D), cache_dtype),
                  block_min=np.zeros((1, N, S, D), cache_dtype), past_lens=np.zeros(1, np.int32))
    return run(impl, "QuestMetadata", inputs, dict(block_size=1))["block_max_out"][0, 0]


@pytest.mark.parametrize("impl", ["kernel", "body"])
def test_float32_to_float16_rounds_like_numpy(impl):
    rng = np.random.default_rng(0)
    with np.errstate(over="ignore"):
        random = (rng.standard_normal(4000) * np.exp(rng.uniform(-20, 12, 4000))).astype(np.float32)
    key = np.concatenate([SPECIALS, random]).reshape(-1, 1)
    with np.errstate(over="ignore"):
        expected = key.astype(np.float16)
    assert_equal(_zero_sign_blind(_convert(impl, key, np.float16), impl), _zero_sign_blind(expected, impl), "float16 cache")


@pytest.mark.parametrize("impl", ["kernel", "body"])
def test_float16_to_float32_is_exact(impl):
    every_half = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    every_half = every_half[~np.isnan(every_half)].reshape(-1, 1)
    expected = every_half.astype(np.float32)
    assert_equal(_zero_sign_blind(_convert(impl, every_half, np.float32), impl), _zero_sign_blind(expected, impl), "float32 cache")
