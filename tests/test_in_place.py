"""In-place cache updates through IOBinding: a decode step writes only the new tokens, copies nothing,
and a failing step leaves the bound caches exactly as they were."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from quest_ort.graphs import op_model
from quest_ort.ops import native_copied_bytes
from quest_ort.ops.reference import quest_metadata, sparse_block_attention
from quest_ort.runtime import make_session
from quest_ort.runtime.binding import InPlaceStep
from tolerances import assert_close

B, H, N, D, P, C = 2, 8, 2, 64, 16, 256
ATTENTION = dict(num_heads=H, kv_num_heads=N, block_size=P)


def _attention_session():
    x = dict(query=np.zeros((B, H, 1, D), np.float32), key=np.zeros((B, N, 1, D), np.float32),
             value=np.zeros((B, N, 1, D), np.float32), key_cache=np.zeros((B, N, C, D), np.float32),
             value_cache=np.zeros((B, N, C, D), np.float32), past_lens=np.zeros(B, np.int32))
    session = make_session(op_model("SparseBlockAttention", x, ATTENTION))
    return InPlaceStep(session, {"key_cache_out": "key_cache", "value_cache_out": "value_cache"})


def _caches(rng):
    key_cache = rng.standard_normal((B, N, C, D)).astype(np.float32)
    value_cache = rng.standard_normal((B, N, C, D)).astype(np.float32)
    return key_cache, value_cache


def _decode_feeds(rng, past, key_value, value_value):
    return dict(query=rng.standard_normal((B, H, 1, D)).astype(np.float32),
                key=rng.standard_normal((B, N, 1, D)).astype(np.float32),
                value=rng.standard_normal((B, N, 1, D)).astype(np.float32),
                key_cache=key_value, value_cache=value_value, past_lens=np.array(past, np.int32))


def test_decode_steps_update_the_bound_caches_in_place():
    rng = np.random.default_rng(0)
    key_cache, value_cache = _caches(rng)
    expected_keys, expected_values = key_cache.copy(), value_cache.copy()
    key_value = ort.OrtValue.ortvalue_from_numpy(key_cache)
    value_value = ort.OrtValue.ortvalue_from_numpy(value_cache)
    pointer = key_value.data_ptr()
    step = _attention_session()
    past = [100, 37]
    copied_before = native_copied_bytes()
    for _ in range(3):
        feeds = _decode_feeds(rng, past, key_value, value_value)
        out = step.run(feeds)["output"]
        reference = sparse_block_attention(feeds["query"], feeds["key"], feeds["value"], expected_keys,
                                           expected_values, feeds["past_lens"], **ATTENTION)
        expected_keys, expected_values = reference[1], reference[2]
        assert_close(out, reference[0], np.float32, "output")
        past = [p + 1 for p in past]
    assert native_copied_bytes() == copied_before, "an in-place step copied a cache"
    assert key_value.data_ptr() == pointer
    # The caller's own buffers hold exactly the reference caches: only rows 100..102 / 37..39 changed.
    np.testing.assert_array_equal(key_cache, expected_keys)
    np.testing.assert_array_equal(value_cache, expected_values)


def test_unbound_outputs_copy_the_cache_once_per_step():
    rng = np.random.default_rng(1)
    key_cache, value_cache = _caches(rng)
    session = _attention_session().session
    feeds = _decode_feeds(rng, [3, 4], key_cache, value_cache)
    copied_before = native_copied_bytes()
    session.run(None, feeds)
    assert native_copied_bytes() - copied_before == key_cache.nbytes + value_cache.nbytes


def test_failed_step_leaves_bound_caches_untouched():
    rng = np.random.default_rng(2)
    key_cache, value_cache = _caches(rng)
    snapshot = key_cache.copy(), value_cache.copy()
    step = _attention_session()
    feeds = _decode_feeds(rng, [C, 5], ort.OrtValue.ortvalue_from_numpy(key_cache),
                          ort.OrtValue.ortvalue_from_numpy(value_cache))  # row 0 is full
    with pytest.raises(Exception, match="capacity"):
        step.run(feeds)
    np.testing.assert_array_equal(key_cache, snapshot[0])
    np.testing.assert_array_equal(value_cache, snapshot[1])
    feeds["past_lens"] = np.array([C - 1, 5], np.int32)  # the session still works afterwards
    step.run(feeds)
    assert not np.array_equal(key_cache, snapshot[0])


def test_metadata_updates_in_place():
    rng = np.random.default_rng(3)
    M = C // P
    block_max = rng.standard_normal((B, N, M, D)).astype(np.float32)
    block_min = block_max - 1.0
    x = dict(key=np.zeros((B, N, 1, D), np.float32), block_max=block_max, block_min=block_min,
             past_lens=np.zeros(B, np.int32))
    step = InPlaceStep(make_session(op_model("QuestMetadata", x, dict(block_size=P))),
                       {"block_max_out": "block_max", "block_min_out": "block_min"})
    key = rng.standard_normal((B, N, 1, D)).astype(np.float32)
    past = np.array([33, 64], np.int32)
    expected = quest_metadata(key, block_max, block_min, past, block_size=P)
    copied_before = native_copied_bytes()
    step.run(dict(key=key, block_max=ort.OrtValue.ortvalue_from_numpy(block_max),
                  block_min=ort.OrtValue.ortvalue_from_numpy(block_min), past_lens=past))
    assert native_copied_bytes() == copied_before
    np.testing.assert_array_equal(block_max, expected[0])
    np.testing.assert_array_equal(block_min, expected[1])
