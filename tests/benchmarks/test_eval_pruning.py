"""make eval-pruning's arithmetic on made-up bounds: superblock bounds over partial superblocks, scores that bound their blocks', the fractions it reports, the approximate selection's recall and the attention mass it holds."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import eval_pruning


def _bounds(rng, blocks, dim):
    keys = rng.standard_normal((blocks, 8, dim)).astype(np.float32)
    return keys.max(1), keys.min(1)


@pytest.mark.parametrize("blocks, size", [(1, 8), (7, 8), (8, 8), (9, 8), (33, 16)])
def test_superblock_bounds_cover_their_blocks_and_a_partial_last_one(blocks, size):
    top, bottom = _bounds(np.random.default_rng(blocks), blocks, 16)
    super_top, super_bottom = eval_pruning.superblock_bounds(top, bottom, size)
    assert super_top.shape == super_bottom.shape == (-(-blocks // size), 16)
    for m in range(blocks):
        assert np.all(super_top[m // size] >= top[m]) and np.all(super_bottom[m // size] <= bottom[m])
    last = (blocks - 1) // size
    np.testing.assert_array_equal(super_top[last], top[last * size :].max(0))


@pytest.mark.parametrize("top_k, size, repeats", [(1, 8, 1), (4, 8, 2), (16, 16, 1), (200, 8, 1)])
def test_exact_pruning_reads_at_least_every_superblock_holding_a_top_k_block(top_k, size, repeats):
    rng = np.random.default_rng(top_k)
    layers = []
    for _ in range(2):  # two layers, 4 query heads on 2 KV heads
        top, bottom = zip(*(_bounds(rng, 50, 16) for _ in range(2)))
        layers.append((rng.standard_normal((4, 16)).astype(np.float32), np.stack(top), np.stack(bottom)))
    measured = eval_pruning.pruning(layers, top_k, size, repeats)
    assert 0 < measured["holding_top_k_fraction"] <= measured["must_read_fraction"]
    assert measured["bytes_fraction"] > measured["must_read_fraction"]
    if top_k >= 50 * repeats:  # every block is among the best: every superblock is read
        assert measured["must_read_fraction"] == measured["holding_top_k_fraction"] == round(
            -(-50 * repeats // size) * size / (50 * repeats), 3)


def test_one_dominant_block_is_all_an_exact_pruning_reads():
    """Keys near zero but one block far along the query: K = 1 reads that block's superblock only."""
    top = np.full((64, 4), 0.01, np.float32)
    bottom = -top
    top[37] = bottom[37] = 10.0
    query = np.ones((1, 4), np.float32)
    measured = eval_pruning.pruning([(query, top[None], bottom[None])], 1, 8, 1)
    assert measured["must_read_fraction"] == measured["holding_top_k_fraction"] == 8 / 64


def test_approximate_selection_misses_a_best_block_behind_a_looser_superblock():
    """Superblock A's bound (10) outranks B's (6.5) though A's blocks score 5 and B holds the best
    block (6.5): within the byte budget one superblock is read, A, so K = 1 recalls nothing."""
    top = np.array([[5, 0], [0, 5], [6, 0.5], [0, 0]], np.float32)
    bottom = np.zeros_like(top)
    measured = eval_pruning.pruning([(np.ones((1, 2), np.float32), top[None], bottom[None])], 1, 2, 1)
    assert measured["approximate_recall"] == 0
    assert measured["approximate_bytes_fraction"] == (2 + 2) / 4


@pytest.mark.parametrize("top_k, size, repeats", [(1, 8, 1), (4, 8, 4), (16, 16, 2), (200, 8, 1)])
def test_approximate_recall_is_a_share_and_whole_when_the_floor_reads_every_superblock(top_k, size, repeats):
    rng = np.random.default_rng(top_k + size)
    top, bottom = _bounds(rng, 50, 16)
    query = rng.standard_normal((2, 16)).astype(np.float32)
    measured = eval_pruning.pruning([(query, top[None], bottom[None])], top_k, size, repeats)
    assert 0 <= measured["approximate_recall"] <= 1
    if top_k >= 50 * repeats:  # the budget's floor reads every superblock: the flat selection
        assert measured["approximate_recall"] == 1


def test_attention_mass_sums_per_block_and_follows_the_selection():
    keys = np.zeros((1, 64 * 8 - 3, 4), np.float32)  # a partial last block
    keys[0, 37 * 8 : 38 * 8] = 10.0
    query = np.ones(4, np.float32)
    mass = eval_pruning.block_attention(query, keys[0], 8)
    assert mass.shape == (64,) and np.isclose(mass.sum(), 1) and mass[37] > 0.999
    top = np.full((64, 4), 0.01, np.float32)
    top[37] = 10.0
    layers = [(query[None], top[None], -top[None], keys)]
    measured = eval_pruning.pruning(layers, 1, 8, repeats=2)
    # two copies of block 37, each holding half the mass; K = 1 selects one of them
    assert measured["flat_attention_mass"] == measured["approximate_attention_mass"] == pytest.approx(0.5, abs=1e-3)


@pytest.mark.parametrize("top_k, size", [(4, 8), (8, 16), (200, 8)])
def test_design_is_the_flat_selection_while_its_candidates_cover_every_superblock(top_k, size):
    """50 blocks: 16 x K candidate blocks cover every superblock, so the design reads and selects as flat."""
    rng = np.random.default_rng(top_k * size)
    top, bottom = _bounds(rng, 50, 16)
    keys = rng.standard_normal((1, 50 * 8, 16)).astype(np.float32)
    layers = [(rng.standard_normal((2, 16)).astype(np.float32), top[None], bottom[None], keys)]
    measured = eval_pruning.pruning(layers, top_k, size, 1)
    assert measured["design_bytes_fraction"] == 1 and measured["design_recall"] == 1
    assert measured["design_attention_mass"] == measured["flat_attention_mass"]


def test_design_candidates_are_the_heads_best_superblocks_taken_in_turn():
    """Two heads of one KV head, each with one far block along its own channel (superblocks 2 and 5 of
    eight): K = 1 gives two candidate superblocks, each head's best, and each head finds its block,
    even where the other head's bounds are far larger than its own (a max over the group would pick
    the other head's two best superblocks)."""
    top = np.full((64, 2), 0.01, np.float32)
    top[2 * 8 + 3, 0] = 10.0
    top[5 * 8 + 6, 1] = 10.0
    query = np.eye(2, dtype=np.float32)
    measured = eval_pruning.pruning([(query, top[None], -top[None])], 1, 8, 1)
    assert measured["design_recall"] == 1
    assert measured["design_bytes_fraction"] == (8 + 2 * 8) / 64
    top[5 * 8 + 6, 1] = 0.02
    top[7 * 8, 0] = 9.0  # head 0's second-best superblock: by the group's max it would outrank 5
    assert eval_pruning.pruning([(query, top[None], -top[None])], 1, 8, 1)["design_recall"] == 1


def test_candidates_in_turn_skip_a_superblock_already_taken():
    scores = [np.array([5.0, 4, 3, 2, 1]), np.array([5.0, 1, 4, 3, 2]), np.array([0.0, 0, 0, 0, 9])]
    # 16 x K = 32 blocks: 4 superblocks of 8, taken in turn: head 0 -> 0, head 1 -> 0 (taken),
    # head 2 -> 4, head 0 -> 1, head 1 -> 2
    np.testing.assert_array_equal(eval_pruning.group_candidates(scores, 2, 8), [0, 1, 2, 4])
    assert eval_pruning.group_candidates(scores, 3, 8) is None  # 48 blocks: every superblock


def test_group_bytes_count_the_union_of_the_heads_candidates():
    """Two heads of one KV head preferring different superblocks: per head each reads its own quarter,
    the group the union of both."""
    top = np.full((64, 2), 0.01, np.float32)
    top[2 * 8 + 3, 0] = top[5 * 8 + 6, 1] = 10.0
    measured = eval_pruning.pruning([(np.eye(2, dtype=np.float32), top[None], -top[None])], 1, 8, 1)
    # 8 superblocks, then (0.25 * 64 - 8) // 8 = 1 superblock of fine bounds per head
    assert measured["approximate_bytes_fraction"] == (8 + 8) / 64
    assert measured["approximate_group_bytes_fraction"] == (8 + 2 * 8) / 64


@pytest.mark.parametrize("top_k, repeats", [(4, 1), (2, 8)])
def test_the_op_keeps_flat_mass_while_flat_and_reads_less_past_it(top_k, repeats):
    """The op's own selections (SparseBlockSelect, native): 50 blocks repeated; with 16 x K candidate
    blocks covering every superblock it is the flat selection (same mass, every byte), and with
    2 x 8 copies the candidates are fewer than the superblocks, so it reads less."""
    rng = np.random.default_rng(top_k)
    top, bottom = _bounds(rng, 50, 16)
    keys = rng.standard_normal((1, 50 * 8, 16)).astype(np.float32)
    layers = [(rng.standard_normal((2, 16)).astype(np.float32), top[None], bottom[None], keys)]
    measured = eval_pruning.op_selection(layers, top_k, 2, repeats)
    assert 0 < measured["op_attention_mass"] <= 1 and 0 < measured["op_flat_attention_mass"] <= 1
    if repeats == 1:
        assert measured["op_bytes_fraction"] == 1
        assert measured["op_attention_mass"] == measured["op_flat_attention_mass"]
    else:  # 400 blocks, 200 superblocks, 16 of them candidates
        assert measured["op_bytes_fraction"] == pytest.approx((200 + 32) / 400, abs=1e-3)
