"""float16 storage: cache writes round to nearest even exactly as NumPy, block bounds round outward
(toward +inf into the max, toward -inf into the min), specials and subnormals included."""

from __future__ import annotations

import numpy as np
import pytest

from quest_ort.ops.reference.quest_metadata import rounded_outward
from support.impls import run
from support.rounding_keys import rounding_keys
from support.tolerances import assert_equal


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
    key = rounding_keys()
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
    key = rounding_keys()
    S = key.shape[0]
    f16 = np.float16
    inputs = dict(query=np.zeros((1, 1, S, 1), np.float32), key=key.reshape(1, 1, S, 1),
                  value=np.zeros((1, 1, S, 1), np.float32), key_cache=np.zeros((1, 1, S, 1), f16),
                  value_cache=np.zeros((1, 1, S, 1), f16), past_lens=np.zeros(1, np.int32))
    cache = run(impl, "SparseBlockAttention", inputs, dict(num_heads=1, kv_num_heads=1, block_size=16))["key_cache_out"]
    with np.errstate(over="ignore"):
        expected = key.astype(f16)
    assert_equal(cache[0, 0, :, 0], expected, "float16 key cache")
