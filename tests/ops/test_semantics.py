"""The contract on hand-built inputs whose answers are worked out by hand, for all three implementations."""

from __future__ import annotations

import numpy as np
import pytest

from support.impls import EACH_IMPLEMENTATION, run

D = 16  # one term per lane: bounds below are exact sums
P = 4
M = 8


def _metadata(bounds):
    """block_max/min [1,1,M,D] such that a query of +1s scores block m exactly bounds[m]."""
    per_channel = np.asarray(bounds, dtype=np.float32)[:, None] / D * np.ones((1, D), np.float32)
    return per_channel[None, None], (per_channel - 100.0)[None, None]


def _select(impl, bounds, *, top_k, sink=1, recent=1, past=31, new_tokens=1, total=None, importance=None,
            fraction=0.0, query=None, heads=1, reduce="mean", row=0, exact=None):
    block_max, block_min = _metadata(bounds)
    if query is None:
        query = np.ones((1, heads, new_tokens, D), np.float32)
    inputs = dict(query=query, block_max=block_max, block_min=block_min,
                  past_lens=np.array([past], np.int32),
                  total_lens=None if total is None else np.array([total], np.int32),
                  block_importance=None if importance is None else np.asarray(importance, np.float32)[None, None],
                  exact_lens=None if exact is None else np.array([exact], np.int32))
    attributes = dict(num_heads=heads, kv_num_heads=1, block_size=P, top_k=top_k, sink_blocks=sink,
                      recent_blocks=recent, group_reduce=reduce, importance_fraction=fraction)
    return run(impl, "SparseBlockSelect", inputs, attributes)["block_indices"][0, row]


BOUNDS = [9, 5, 7, 7, 3, 7, 1, 0]


@EACH_IMPLEMENTATION
def test_forced_then_best_scores_with_ties_to_lower_index(impl):
    # query at p = 31 -> own block 7; forced {7, 0}; best two of blocks 1..6 by bound: 7 @ 2, 3, 5 tie
    assert _select(impl, BOUNDS, top_k=4).tolist() == [[0, 2, 3, 7]]


@EACH_IMPLEMENTATION
def test_nan_score_ranks_lowest(impl):
    bounds = list(BOUNDS)
    bounds[2] = np.nan
    bounds[4] = -np.inf
    # among 1..6: 7 @ 3, 5 then 5 @ 1, 1 @ 6, -inf @ 4, NaN @ 2 last
    assert _select(impl, bounds, top_k=6).tolist() == [[0, 1, 3, 5, 6, 7]]
    assert _select(impl, bounds, top_k=7).tolist() == [[0, 1, 3, 4, 5, 6, 7]]


@EACH_IMPLEMENTATION
def test_numbers_displace_nan_scores_taken_first(impl):
    # forced {7, 0}; blocks 1 and 2 (NaN) fill the best-so-far first, then every number outranks them
    bounds = [9, np.nan, np.nan, 5, 7, 3, 1, 0]
    assert _select(impl, bounds, top_k=3).tolist() == [[0, 4, 7]]
    assert _select(impl, bounds, top_k=4).tolist() == [[0, 3, 4, 7]]
    assert _select(impl, bounds, top_k=8).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]


@EACH_IMPLEMENTATION
def test_forced_blocks_beyond_budget_keep_recent_newest_first(impl):
    # forced priority: 7, 6 (recent, newest first), then sinks 0, 1
    assert _select(impl, BOUNDS, top_k=2, sink=2, recent=2).tolist() == [[6, 7]]
    assert _select(impl, BOUNDS, top_k=3, sink=2, recent=2).tolist() == [[0, 6, 7]]
    assert _select(impl, BOUNDS, top_k=1, sink=1, recent=0).tolist() == [[0]]


@EACH_IMPLEMENTATION
def test_no_forced_blocks_pure_top_k(impl):
    bounds = list(BOUNDS)
    bounds[0] = -5
    assert _select(impl, bounds, top_k=1, sink=0, recent=0).tolist() == [[2]]
    assert _select(impl, bounds, top_k=3, sink=0, recent=0).tolist() == [[2, 3, 5]]


@EACH_IMPLEMENTATION
def test_all_equal_scores_pick_the_lowest_blocks(impl):
    assert _select(impl, [1.0] * M, top_k=4, sink=0, recent=1).tolist() == [[0, 1, 2, 7]]


@EACH_IMPLEMENTATION
def test_importance_reserves_its_share_of_the_remaining_budget(impl):
    importance = [0.0, 0.1, 0.2, 0.3, 0.1, 0.2, 0.9, 0.5]
    # K=5: forced {7, 0}; remaining 3 -> floor(0.5 * 3) = 1 by importance (6), then 2 by bound (2, 3)
    assert _select(impl, BOUNDS, top_k=5, importance=importance, fraction=0.5).tolist() == [[0, 2, 3, 6, 7]]
    # fraction 1: all 3 by importance (6, 3, then 0.2 tie between 2 and 5 -> 2)
    assert _select(impl, BOUNDS, top_k=5, importance=importance, fraction=1.0).tolist() == [[0, 2, 3, 6, 7]]
    importance[2] = np.nan
    assert _select(impl, BOUNDS, top_k=5, importance=importance, fraction=1.0).tolist() == [[0, 3, 5, 6, 7]]


@EACH_IMPLEMENTATION
def test_budget_covering_eligible_blocks_selects_all_and_pads(impl):
    # p = 9 -> own block 2, three eligible blocks, K = 5
    assert _select(impl, BOUNDS, top_k=5, past=9).tolist() == [[0, 1, 2, -1, -1]]


@EACH_IMPLEMENTATION
def test_positions_follow_past_lens_and_padding(impl):
    # S = 3 at past = 7: positions 7, 8, 9 -> own blocks 1, 2, 2; total 9 makes position 9 invalid
    rows = _select(impl, BOUNDS, top_k=2, sink=1, recent=1, past=7, new_tokens=3, total=9)
    assert rows.tolist() == [[0, 1], [0, 2], [-1, -1]]


@EACH_IMPLEMENTATION
def test_queries_below_exact_lens_select_nothing(impl):
    # positions 28..31 (own blocks 7); exact_lens 30: the first two attend exactly, the others select
    rows = _select(impl, BOUNDS, top_k=3, past=28, new_tokens=4, exact=30)
    assert rows.tolist() == [[-1, -1, -1], [-1, -1, -1], [0, 2, 7], [0, 2, 7]]
    assert _select(impl, BOUNDS, top_k=3, past=28, new_tokens=4, exact=0).tolist() == [[0, 2, 7]] * 4


@EACH_IMPLEMENTATION
def test_group_reduce_mean_and_max(impl):
    # head 0 queries +1s, head 1 queries -1s: the mean query is 0 (every bound 0, ties),
    # the max takes max(sum kmax, -sum kmin) = bounds[m] (kmin = bound/D - 100 makes -sum kmin large)
    query = np.stack([np.ones((1, D)), -np.ones((1, D))])[None].astype(np.float32)
    assert _select(impl, BOUNDS, top_k=3, sink=0, recent=0, query=query, heads=2, reduce="mean").tolist() == [[0, 1, 2]]
    # -sum(kmin) = 1600 - bound: the max reduction prefers the smallest bounds: 7 (0), 6 (1), 4 (3)
    assert _select(impl, BOUNDS, top_k=3, sink=0, recent=0, query=query, heads=2, reduce="max").tolist() == [[4, 6, 7]]


@EACH_IMPLEMENTATION
def test_group_reduce_none_selects_for_each_query_head(impl):
    # The two heads of test_group_reduce_mean_and_max, each with its own row: head 0 takes the
    # largest bounds (9 @ 0, then the 7s at 2 and 3), head 1 the smallest (its bounds are 1600 - b).
    query = np.stack([np.ones((1, D)), -np.ones((1, D))])[None].astype(np.float32)
    for head, want in ((0, [[0, 2, 3]]), (1, [[4, 6, 7]])):
        got = _select(impl, BOUNDS, top_k=3, sink=0, recent=0, query=query, heads=2, reduce="none", row=head)
        assert got.tolist() == want


def _attention(impl, key_cache, value_cache, *, past, query, key, value, indices=None, total=None, softcap=0.0,
               block_size=P, exact=None):
    inputs = dict(query=query, key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                  past_lens=np.array([past], np.int32), block_indices=indices,
                  total_lens=None if total is None else np.array([total], np.int32),
                  exact_lens=None if exact is None else np.array([exact], np.int32))
    attributes = dict(num_heads=query.shape[1], kv_num_heads=1, block_size=block_size, scale=1.0, softcap=softcap)
    return run(impl, "SparseBlockAttention", inputs, attributes,
               outputs=("output", "key_cache_out", "value_cache_out", "block_importance"))


def _one_hot_caches(capacity=16):
    """Key t is e_0 * t/8 (logit t/8 for query e_0); value t is e_1 * t (output = weighted mean of t)."""
    keys = np.zeros((1, 1, capacity, D), np.float32)
    values = np.zeros((1, 1, capacity, D), np.float32)
    keys[0, 0, :, 0] = np.arange(capacity) / 8
    values[0, 0, :, 1] = np.arange(capacity)
    return keys, values


def _expected_mean_position(positions, logit_scale=1 / 8):
    weights = np.exp(np.asarray(positions) * logit_scale)
    return float((weights * positions).sum() / weights.sum())


@EACH_IMPLEMENTATION
@pytest.mark.parametrize("sparse", [False, True])
def test_causal_inside_the_current_block_and_sparse_blocks(impl, sparse):
    keys, values = _one_hot_caches()
    keys[0, 0, 7:, 0] = 50.0  # huge logits after the query position: never attended
    query = np.zeros((1, 1, 1, D), np.float32)
    query[..., 0] = 1.0
    new_key = keys[:, :, 6:7].copy()
    new_value = values[:, :, 6:7].copy()
    indices = np.array([[[[0, 1, -1, 3]]]], np.int32) if sparse else None  # block 3 lies after p
    got = _attention(impl, keys, values, past=6, query=query, key=new_key, value=new_value, indices=indices)
    attended = [0, 1, 2, 3, 4, 5, 6]  # blocks 0 and 1 up to p = 6 either way
    np.testing.assert_allclose(got["output"][0, 0, 1], _expected_mean_position(attended), rtol=1e-5)
    mass = got["block_importance"][0, 0]
    weights = np.exp(np.array(attended) / 8)
    np.testing.assert_allclose(mass[:2], [weights[:4].sum() / weights.sum(), weights[4:].sum() / weights.sum()], rtol=1e-5)
    assert (mass[2:] == 0).all()


@EACH_IMPLEMENTATION
def test_sparse_attention_reads_only_selected_blocks(impl):
    keys, values = _one_hot_caches()
    query = np.zeros((1, 1, 1, D), np.float32)
    query[..., 0] = 1.0
    indices = np.array([[[[3, -1, 0]]]], np.int32)  # any order, -1 skipped
    got = _attention(impl, keys, values, past=14, query=query, key=keys[:, :, 14:15], value=values[:, :, 14:15],
                     indices=indices)
    np.testing.assert_allclose(got["output"][0, 0, 1], _expected_mean_position([0, 1, 2, 3, 12, 13, 14]), rtol=1e-5)


@EACH_IMPLEMENTATION
def test_queries_below_exact_lens_attend_every_position(impl):
    # Positions 13 and 14 with one selected block each; exact_lens 14 makes position 13 attend every
    # position up to its own (its -1 row is ignored), while position 14 keeps to block 0.
    keys, values = _one_hot_caches()
    query = np.zeros((1, 1, 2, D), np.float32)
    query[..., 0] = 1.0
    indices = np.array([[[[-1], [0]]]], np.int32)
    got = _attention(impl, keys, values, past=13, query=query, key=keys[:, :, 13:15], value=values[:, :, 13:15],
                     indices=indices, exact=14)
    np.testing.assert_allclose(got["output"][0, 0, 1], _expected_mean_position(list(range(14))), rtol=1e-5)
    np.testing.assert_allclose(got["output"][0, 1, 1], _expected_mean_position([0, 1, 2, 3]), rtol=1e-5)
    # importance: position 13's mass over blocks 0..3, position 14's all on block 0
    weights = np.exp(np.arange(14) / 8)
    shares = [weights[m * P:(m + 1) * P].sum() / weights.sum() for m in range(4)]
    np.testing.assert_allclose(got["block_importance"][0, 0], [shares[0] + 1.0, *shares[1:]], rtol=1e-5)


@EACH_IMPLEMENTATION
def test_block_indices_per_query_head_give_each_head_its_blocks(impl):
    # Two query heads on one KV head: head 0 attends blocks 0 and 3, head 1 block 1 alone; the
    # block importance sums both heads' masses.
    keys, values = _one_hot_caches()
    query = np.zeros((1, 2, 1, D), np.float32)
    query[..., 0] = 1.0
    indices = np.array([[[[0, 3]], [[1, -1]]]], np.int32)  # [B, H, S, K]
    got = _attention(impl, keys, values, past=14, query=query, key=keys[:, :, 14:15], value=values[:, :, 14:15],
                     indices=indices)
    head_0 = [0, 1, 2, 3, 12, 13, 14]
    np.testing.assert_allclose(got["output"][0, 0, 1], _expected_mean_position(head_0), rtol=1e-5)
    np.testing.assert_allclose(got["output"][0, 0, D + 1], _expected_mean_position([4, 5, 6, 7]), rtol=1e-5)
    weights = np.exp(np.array(head_0) / 8)
    np.testing.assert_allclose(got["block_importance"][0, 0],
                               [weights[:4].sum() / weights.sum(), 1.0, 0.0, weights[4:].sum() / weights.sum()],
                               rtol=1e-5)


@EACH_IMPLEMENTATION
@pytest.mark.parametrize("sparse", [False, True])
def test_a_block_larger_than_the_cache_is_the_whole_cache(impl, sparse):
    # The largest block size the contract allows: per-block scratch must follow the cache, not P.
    keys, values = _one_hot_caches()
    query = np.zeros((1, 1, 1, D), np.float32)
    query[..., 0] = 1.0
    got = _attention(impl, keys, values, past=9, query=query, key=keys[:, :, 9:10], value=values[:, :, 9:10],
                     indices=np.array([[[[0]]]], np.int32) if sparse else None, block_size=2**31 - 1)
    np.testing.assert_allclose(got["output"][0, 0, 1], _expected_mean_position(range(10)), rtol=1e-5)
    np.testing.assert_allclose(got["block_importance"][0, 0], [1.0], rtol=1e-5)


@EACH_IMPLEMENTATION
def test_new_tokens_written_in_place_then_attended(impl):
    keys, values = _one_hot_caches()
    query = np.zeros((1, 1, 2, D), np.float32)
    query[..., 0] = 1.0
    new_keys = np.full((1, 1, 2, D), 0.0, np.float32)
    new_values = np.zeros((1, 1, 2, D), np.float32)
    new_values[0, 0, :, 1] = [100.0, 200.0]
    got = _attention(impl, keys, values, past=5, query=query, key=new_keys, value=new_values)
    expected_cache = keys.copy()
    expected_cache[0, 0, 5:7] = 0.0
    np.testing.assert_array_equal(got["key_cache_out"], expected_cache)
    np.testing.assert_array_equal(got["value_cache_out"][0, 0, 5:7, 1], [100.0, 200.0])
    np.testing.assert_array_equal(got["value_cache_out"][0, 0, 7:], values[0, 0, 7:])


@EACH_IMPLEMENTATION
def test_invalid_queries_and_empty_selections_output_zeros(impl):
    keys, values = _one_hot_caches()
    query = np.ones((1, 1, 2, D), np.float32)
    indices = np.array([[[[0, 1], [-1, -1]]]], np.int32)
    got = _attention(impl, keys, values, past=4, query=query, key=keys[:, :, 4:6], value=values[:, :, 4:6],
                     indices=indices)
    assert np.abs(got["output"][0, 0]).sum() > 0
    assert (got["output"][0, 1] == 0).all()  # nothing selected
    got = _attention(impl, keys, values, past=4, query=query, key=keys[:, :, 4:6], value=values[:, :, 4:6], total=5)
    assert (got["output"][0, 1] == 0).all()  # position 5 is padding
    np.testing.assert_array_equal(got["key_cache_out"][0, 0, 5], keys[0, 0, 5])  # and is not written


@EACH_IMPLEMENTATION
def test_softcap_bounds_the_logits(impl):
    keys, values = _one_hot_caches()
    keys[0, 0, :, 0] = np.arange(16) * 10.0  # raw logits up to 150
    query = np.zeros((1, 1, 1, D), np.float32)
    query[..., 0] = 1.0
    got = _attention(impl, keys, values, past=3, query=query, key=keys[:, :, 3:4], value=values[:, :, 3:4], softcap=5.0)
    logits = 5.0 * np.tanh(np.arange(4) * 10.0 / 5.0)
    weights = np.exp(logits - logits.max())
    np.testing.assert_allclose(got["output"][0, 0, 1], (weights * np.arange(4)).sum() / weights.sum(), rtol=1e-5)


@EACH_IMPLEMENTATION
@pytest.mark.parametrize("past", [0, 3, 4, 5, 13])
def test_metadata_sets_on_first_token_of_a_block_and_merges_after(impl, past):
    rng = np.random.default_rng(past)
    keys = rng.standard_normal((1, 1, 20, D)).astype(np.float32)
    block_max = np.full((1, 1, 5, D), 7.0, np.float32)  # stale values that a set must overwrite
    block_min = np.full((1, 1, 5, D), -7.0, np.float32)
    # metadata of the first `past` keys, by hand
    for m in range(-(-past // P)):
        block_max[0, 0, m] = keys[0, 0, m * P : min(past, m * P + P)].max(0)
        block_min[0, 0, m] = keys[0, 0, m * P : min(past, m * P + P)].min(0)
    inputs = dict(key=keys[:, :, past:], block_max=block_max, block_min=block_min, past_lens=np.array([past], np.int32))
    got = run(impl, "QuestMetadata", inputs, dict(block_size=P))
    for m in range(5):
        np.testing.assert_array_equal(got["block_max_out"][0, 0, m], keys[0, 0, m * P : m * P + P].max(0))
        np.testing.assert_array_equal(got["block_min_out"][0, 0, m], keys[0, 0, m * P : m * P + P].min(0))


def _probe_select(impl, aligned_position, *, past, new_tokens, num_probes=2, top_k=2):
    """P = 8, query at the last new position; one key (at aligned_position) matches the query."""
    P8, D16 = 8, 16
    total = past + new_tokens
    keys = np.zeros((1, 1, total, D16), np.float32)
    keys[0, 0, :, 1] = 1.0  # every key scores 0 against the query (which is e_0)
    keys[0, 0, aligned_position] = 0.0
    keys[0, 0, aligned_position, 0] = 5.0
    cache = np.zeros((1, 1, 64, D16), np.float32)
    cache[0, 0, :past] = keys[0, 0, :past]
    query = np.zeros((1, 1, new_tokens, D16), np.float32)
    query[..., 0] = 1.0
    M8 = 8
    inputs = dict(query=query, block_max=np.zeros((1, 1, M8, D16), np.float32),
                  block_min=np.zeros((1, 1, M8, D16), np.float32), past_lens=np.array([past], np.int32),
                  key_cache=cache, key=keys[:, :, past:])
    attributes = dict(num_heads=1, kv_num_heads=1, block_size=P8, top_k=top_k, sink_blocks=0, recent_blocks=1,
                      score="probe", num_probes=num_probes)
    return run(impl, "SparseBlockSelect", inputs, attributes)["block_indices"][0, 0, -1].tolist()


@EACH_IMPLEMENTATION
def test_probe_reads_evenly_spaced_keys_including_this_calls_new_ones(impl):
    # query at p = 39 (block 4): blocks 0..3 are probed at first + 0 and first + 4
    assert _probe_select(impl, 20, past=40 - 5, new_tokens=5) == [2, 4]  # 20 = 2*8 + 4: probed
    assert _probe_select(impl, 19, past=40 - 5, new_tokens=5) == [0, 4]  # 19 = 2*8 + 3: missed; ties -> 0
    assert _probe_select(impl, 19, past=40 - 5, new_tokens=5, num_probes=8) == [2, 4]  # every key probed
    # prefill (past = 0): the aligned key is one of this call's new keys
    assert _probe_select(impl, 12, past=0, new_tokens=40) == [1, 4]


@EACH_IMPLEMENTATION
def test_int8_bounds_quantize_on_a_power_of_two_grid(impl):
    # Block 0 takes keys with largest magnitude 3: e = -5 (127 * 2^-5 = 3.97 >= 3 > 127 * 2^-6), so
    # 1.0 -> max code 32, -3.0 -> min code -96, and 0.1 (in all four keys) rounds outward: ceil(3.2) = 4 and
    # floor(float16(0.1) rounded down * 32) = 3. Block 1 holds a key past float16's range: e = 127,
    # codes 0. The untouched blocks keep their input bits (here 5 and e = -2).
    key = np.zeros((1, 1, 5, D), np.float32)
    key[0, 0, :2, 0] = [1.0, -3.0]
    key[0, 0, :4, 1] = 0.1
    key[0, 0, 4, 2] = 7e4
    inputs = dict(key=key, block_max=np.full((1, 1, M, D), 5, np.int8), block_min=np.full((1, 1, M, D), 5, np.int8),
                  past_lens=np.zeros(1, np.int32), total_lens=None, block_exponent=np.full((1, 1, M), -2, np.int8))
    got = run(impl, "QuestMetadata", inputs, dict(block_size=P),
              outputs=("block_max_out", "block_min_out", "block_exponent_out"))
    codes_max, codes_min, exponent = (got[name][0, 0] for name in
                                      ("block_max_out", "block_min_out", "block_exponent_out"))
    assert exponent.tolist() == [-5, 127] + [-2] * (M - 2)
    assert codes_max[0, :3].tolist() == [32, 4, 0] and codes_min[0, :3].tolist() == [-96, 3, 0]
    assert (codes_max[1] == 0).all() and (codes_min[1] == 0).all() and (codes_max[2:] == 5).all()


@EACH_IMPLEMENTATION
def test_int8_bounds_scale_each_block_score_by_its_power_of_two(impl):
    # Codes of the float bounds' BOUNDS scaled by 2^4 (the same selection as they give), then block 2
    # with the largest codes but e = -20 drops below everything, and block 5 with e = 127 (NaN) ranks last.
    codes = np.array([9, 5, 7, 7, 3, 7, 1, 0], np.int8)
    block_max = np.broadcast_to(codes[None, None, :, None], (1, 1, M, D)).astype(np.int8)
    inputs = dict(query=np.full((1, 1, 1, D), 1 / D, np.float32), block_max=block_max, block_min=-block_max,
                  past_lens=np.array([31], np.int32), block_exponent=np.full((1, 1, M), 4, np.int8))
    attributes = dict(num_heads=1, kv_num_heads=1, block_size=P, top_k=4, sink_blocks=1, recent_blocks=1)
    assert run(impl, "SparseBlockSelect", inputs, attributes)["block_indices"][0, 0].tolist() == [[0, 2, 3, 7]]
    inputs["block_exponent"] = inputs["block_exponent"].copy()
    inputs["block_exponent"][0, 0, [2, 5]] = [-20, 127]
    # among 1..6: 7 * 16 @ 3, then 5 * 16 @ 1; then 3 * 16 @ 4, 1 * 16 @ 6, 7 * 2^-20 @ 2, NaN @ 5
    assert run(impl, "SparseBlockSelect", inputs, attributes)["block_indices"][0, 0].tolist() == [[0, 1, 3, 7]]
    assert run(impl, "SparseBlockSelect", inputs, {**attributes, "top_k": 7})["block_indices"][0, 0].tolist() == [
        [0, 1, 2, 3, 4, 6, 7]]
