"""float16 storage: cache writes round to nearest even exactly as NumPy, block bounds round outward
(toward +inf into the max, toward -inf into the min), int8 rows take float16 scales rounded to
nearest even; specials and subnormals included."""

from __future__ import annotations

import numpy as np
import pytest

from quest_ort.ops.reference import quest_metadata, sparse_block_attention
from quest_ort.ops.reference.quest_metadata import rounded_outward
from support.driver_cases import SCALE_OUTPUTS
from support.impls import run
from support.rounding_keys import int8_rows, rounding_keys
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


def _int8_write(rows, act):
    """A SparseBlockAttention call that writes rows [S, D] (as `act`) as the new keys, and the rows
    reversed as the new values, into int8 caches of capacity S (one head)."""
    rows = rows.astype(act)
    S, D = rows.shape
    return dict(query=np.zeros((1, 1, S, D), act), key=rows.reshape(1, 1, S, D),
                value=rows[::-1].copy().reshape(1, 1, S, D), key_cache=np.zeros((1, 1, S, D), np.int8),
                value_cache=np.zeros((1, 1, S, D), np.int8), past_lens=np.zeros(1, np.int32),
                key_scale=np.zeros((1, 1, S), np.float16), value_scale=np.zeros((1, 1, S), np.float16))


@pytest.mark.parametrize("act", [np.float32, np.float16])
@pytest.mark.parametrize("impl", ["kernel", "body"])
def test_rows_quantize_into_int8_caches_as_the_reference(impl, act):
    """Each row's float16 scale (amax / 127 rounded to nearest even, ties included; 0 for tiny rows;
    the NaN 0x7E00 for non-finite rows and past 127 * 65504) and its int8 values (x times the row's
    reciprocal 1 / scale, rounded half to even, clamped) bit for bit."""
    with np.errstate(over="ignore"):  # float16 activations hold the largest rows as inf
        inputs = _int8_write(int8_rows(), act)
    attributes = dict(num_heads=1, kv_num_heads=1, block_size=16)
    names = ("key_cache_out", "value_cache_out", *SCALE_OUTPUTS)
    got = run(impl, "SparseBlockAttention", inputs, attributes, outputs=("output", *names))
    with np.errstate(invalid="ignore"):
        expected = sparse_block_attention(**inputs, **attributes)
    for name, want in zip(names, expected[1:3] + expected[4:], strict=True):
        assert_equal(got[name], want, name, axes="row x D" if name.endswith("cache_out") else "scales")


@pytest.mark.parametrize("bounds_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("impl", ["kernel", "body"])
def test_keys_of_int8_caches_are_bounded_as_the_cache_holds_them(impl, bounds_dtype):
    """QuestMetadata with key_cache_type 'int8' and P = 1: every block's bounds are its key
    quantized, dequantized (exactly) and rounded outward to the bounds' dtype."""
    rows = int8_rows()
    S, D = rows.shape
    inputs = dict(key=rows.reshape(1, 1, S, D), block_max=np.zeros((1, 1, S, D), bounds_dtype),
                  block_min=np.zeros((1, 1, S, D), bounds_dtype), past_lens=np.zeros(1, np.int32))
    attributes = dict(block_size=1, key_cache_type="int8")
    got = run(impl, "QuestMetadata", inputs, attributes)
    for name, want in zip(("block_max_out", "block_min_out"), quest_metadata(**inputs, **attributes), strict=True):
        assert_equal(got[name], want, name, axes="row x D")
