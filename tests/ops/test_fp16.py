"""float16 storage: cache writes round to nearest even exactly as NumPy, block bounds round outward
(toward +inf into the max, toward -inf into the min), specials and subnormals included."""

from __future__ import annotations

import numpy as np
import pytest

from quest_ort.ops.reference.quest_metadata import rounded_outward
from support.impls import run
from support.tolerances import assert_equal

SPECIALS = np.array(
    [0.0, -0.0, 1e-8, -1e-8, 2.0**-24, 2.0**-25, -2.0**-25, 3 * 2.0**-26, 2.0**-14, -2.0**-14, 2.0**-14 - 2.0**-25,
     65504.0, 65519.0, 65520.0, -65519.0, 1e6, -1e6, np.inf, -np.inf, np.nan, 1 + 2.0**-11, 1 + 3 * 2.0**-11,
     -(1 + 2.0**-11), 0.1, -0.1, 1 / 3, 2.0 - 2.0**-12, -(2.0 - 2.0**-12)],
    dtype=np.float32,
)


def _keys():
    rng = np.random.default_rng(0)
    with np.errstate(over="ignore"):
        random = (rng.standard_normal(4000) * np.exp(rng.uniform(-20, 12, 4000))).astype(np.float32)
    return np.concatenate([SPECIALS, random])


def _zero_sign_blind(x, impl):
    """The function body's ScatterElements max/min returns +0 for -0: sign of zero is not compared there."""
    return np.where(x == 0, np.zeros_like(x), x) if impl == "body" else x


def _bounds(impl, key, bounds_dtype):
    """QuestMetadata with P = 1 stores every key, rounded outward, as its own block's max and min."""
    S = key.shape[0]
    inputs = dict(key=key.reshape(1, 1, S, 1), block_max=np.zeros((1, 1, S, 1), bounds_dtype),
                  block_min=np.zeros((1, 1, S, 1), bounds_dtype), past_lens=np.zeros(1, np.int32))
    out = run(impl, "QuestMetadata", inputs, dict(block_size=1))
    return out["block_max_out"][0, 0, :, 0], out["block_min_out"][0, 0, :, 0]


@pytest.mark.parametrize("impl", ["kernel", "body"])
def test_float32_keys_round_outward_into_float16_bounds(impl):
    key = _keys()
    with np.errstate(over="ignore", invalid="ignore"):
        up, down = rounded_outward(key, np.float16)
        finite = np.isfinite(key)
        assert (up[finite].astype(np.float32) >= key[finite]).all() and (down[finite].astype(np.float32) <= key[finite]).all()
        # each is the nearest float16 on its side: no float16 value lies between it and the key
        assert (np.nextafter(up[finite], np.float16(-np.inf)).astype(np.float32) < key[finite]).all()
        assert (np.nextafter(down[finite], np.float16(np.inf)).astype(np.float32) > key[finite]).all()
    high, low = _bounds(impl, key, np.float16)
    assert_equal(_zero_sign_blind(high, impl), _zero_sign_blind(up, impl), "block_max (rounded up)")
    assert_equal(_zero_sign_blind(low, impl), _zero_sign_blind(down, impl), "block_min (rounded down)")


@pytest.mark.parametrize("impl", ["kernel", "body"])
def test_float16_keys_are_exact_in_any_bounds(impl):
    every_half = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    every_half = every_half[~np.isnan(every_half)]
    for bounds_dtype in (np.float16, np.float32):
        high, low = _bounds(impl, every_half, bounds_dtype)
        expected = every_half.astype(bounds_dtype)
        assert_equal(_zero_sign_blind(high, impl), _zero_sign_blind(expected, impl), f"{bounds_dtype} max")
        assert_equal(_zero_sign_blind(low, impl), _zero_sign_blind(expected, impl), f"{bounds_dtype} min")


@pytest.mark.parametrize("impl", ["kernel", "body"])
def test_float32_keys_round_to_nearest_into_a_float16_cache(impl):
    key = _keys()
    S = key.shape[0]
    f16 = np.float16
    inputs = dict(query=np.zeros((1, 1, S, 1), np.float32), key=key.reshape(1, 1, S, 1),
                  value=np.zeros((1, 1, S, 1), np.float32), key_cache=np.zeros((1, 1, S, 1), f16),
                  value_cache=np.zeros((1, 1, S, 1), f16), past_lens=np.zeros(1, np.int32))
    cache = run(impl, "SparseBlockAttention", inputs, dict(num_heads=1, kv_num_heads=1, block_size=16))["key_cache_out"]
    with np.errstate(over="ignore"):
        expected = key.astype(f16)
    assert_equal(cache[0, 0, :, 0], expected, "float16 key cache")
