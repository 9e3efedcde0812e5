"""The benchmarks' one-layer graph (graphs/layer.py, what `make bench` times as the sparse step) computes
what the reference ops compute in turn, with the default export's superblocks and without them."""

from __future__ import annotations

import numpy as np
import pytest

from quest_ort.graphs.layer import LAYER_ALIASES, attention_layer_model
from quest_ort.ops.reference import quest_metadata, sparse_block_attention, sparse_block_select
from quest_ort.ops.reference.int8_rows import quantize_rows
from quest_ort.ops.reference.sparse_block_select import hierarchical_reads
from quest_ort.runtime import make_session
from quest_ort.runtime.binding import InPlaceStep
from support.tolerances import assert_close, assert_equal

# 14/2 heads (groups of 7), blocks of 4, a budget of 3 blocks; with superblocks of 2 blocks and
# candidate_factor 1 a query whose own block is 4 or later selects hierarchically. PASTS: every block
# fits the budget (one superblock, then two), the flat rule past the budget (block 3), hierarchical
# with a partial last superblock (block 4), and over many superblocks up to the capacity.
H, N, D, C, P, K, U, FACTOR = 14, 2, 64, 96, 4, 3, 2, 1
PASTS = (1, 5, 13, 18, 40, 93)
CACHES = ("float32", "int8")


def _empty_bounds(prefix: str, count: int, dtype) -> dict:
    bounds = {f"{prefix}_max": np.zeros((1, N, count, D), dtype), f"{prefix}_min": np.zeros((1, N, count, D), dtype)}
    if np.dtype(dtype) == np.int8:
        bounds[f"{prefix}_exponent"] = np.zeros((1, N, count), np.int8)
    return bounds


def _bounds_of(keys, past, prefix, block_size, count, dtype, int8_cache) -> dict:
    """Bounds of the first `past` keys as QuestMetadata builds them over a prompt."""
    empty = _empty_bounds(prefix, count, dtype)
    out = quest_metadata(keys[:, :, :past], empty[f"{prefix}_max"], empty[f"{prefix}_min"], np.zeros(1, np.int32),
                         None, empty.get(f"{prefix}_exponent"), block_size=block_size,
                         key_cache_type="int8" if int8_cache else "float")
    return dict(zip(empty, out))


@pytest.mark.parametrize("superblocks", [0, U], ids=["flat", "superblocks"])
@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("past", PASTS)
def test_layer_step_is_the_reference_ops_in_turn(cache, superblocks, past):
    rng = np.random.default_rng(past)
    int8 = cache == "int8"
    bounds_dtype = np.int8 if int8 else np.float16
    M = -(-C // P)
    keys = rng.standard_normal((1, N, C, D)).astype(np.float32)
    values = rng.standard_normal((1, N, C, D)).astype(np.float32)
    feeds = dict(query=rng.standard_normal((1, H, 1, D)).astype(np.float32),
                 key=rng.standard_normal((1, N, 1, D)).astype(np.float32),
                 value=rng.standard_normal((1, N, 1, D)).astype(np.float32), past_lens=np.array([past], np.int32))
    if int8:
        (key_cache, key_scale), (value_cache, value_scale) = quantize_rows(keys), quantize_rows(values)
        feeds.update(key_cache=key_cache, value_cache=value_cache, key_scale=key_scale, value_scale=value_scale)
    else:
        feeds.update(key_cache=keys, value_cache=values)
    bound_sets = [("block", P, M)] + ([("super", P * U, -(-M // U))] if superblocks else [])
    for prefix, tokens, count in bound_sets:
        feeds.update(_bounds_of(keys, past, prefix, tokens, count, bounds_dtype, int8))
    model = attention_layer_model(num_heads=H, kv_num_heads=N, head_dim=D, capacity=C, block_size=P, top_k=K,
                                  cache_dtype=np.int8 if int8 else np.float32, bounds_dtype=bounds_dtype,
                                  group_reduce="none", superblock_size=superblocks, candidate_factor=FACTOR)
    expected = {name: np.copy(value) for name, value in feeds.items()}
    step = InPlaceStep(make_session(model), LAYER_ALIASES)
    output = step.run(feeds)["output"]

    metadata_type = "int8" if int8 else "float"
    updated = {}
    for prefix, tokens, _ in bound_sets:
        names = [f"{prefix}_max", f"{prefix}_min"] + ([f"{prefix}_exponent"] if int8 else [])
        out = quest_metadata(expected["key"], expected[names[0]], expected[names[1]], expected["past_lens"], None,
                             expected.get(names[2]) if int8 else None, block_size=tokens, key_cache_type=metadata_type)
        updated.update(zip(names, out))
    hierarchy = dict(super_max=updated["super_max"], super_min=updated["super_min"],
                     super_exponent=updated.get("super_exponent"), superblock_size=U,
                     candidate_factor=FACTOR) if superblocks else {}
    indices = sparse_block_select(expected["query"], updated["block_max"], updated["block_min"], expected["past_lens"],
                                  num_heads=H, kv_num_heads=N, block_size=P, top_k=K, group_reduce="none",
                                  block_exponent=updated.get("block_exponent"), **hierarchy)
    scales = dict(key_scale=expected["key_scale"], value_scale=expected["value_scale"]) if int8 else {}
    reference = sparse_block_attention(expected["query"], expected["key"], expected["value"], expected["key_cache"],
                                       expected["value_cache"], expected["past_lens"], indices, **scales,
                                       num_heads=H, kv_num_heads=N, block_size=P)
    assert_close(output, reference[0], np.float32, "output")
    for name, value in updated.items():  # every bound updated in place, as the reference updates it
        assert_equal(feeds[name], value, name)
    if superblocks:  # the case is what it says: a hierarchical selection from block 4 on
        assert (hierarchical_reads(past // P, K, U, FACTOR) is not None) == (past // P >= 4)
