"""NumPy reference of QuestMetadata: per-block channel max/min of the keys as stored in the cache."""

from __future__ import annotations


from ._common import fmax, fmin, resolve_total_lens, valid_positions


def quest_metadata(key, block_max, block_min, past_lens, total_lens=None, *, block_size):
    """Return (block_max_out, block_min_out) after adding this call's valid new keys.

    Keys are rounded to the metadata dtype first, so the metadata bounds the keys the cache holds.
    Block p // P is overwritten by the key of token p when p % P == 0 and merged otherwise.
    """
    B, N, S, D = key.shape
    M = block_max.shape[2]
    total = resolve_total_lens(past_lens, total_lens, S, M * block_size, "M * block_size")
    out_max, out_min = block_max.copy(), block_min.copy()
    stored = key.astype(block_max.dtype)
    for b in range(B):
        for i, p in valid_positions(int(past_lens[b]), int(total[b])):
            m, x = p // block_size, stored[b, :, i, :]
            if p % block_size == 0:
                out_max[b, :, m], out_min[b, :, m] = x, x
            else:
                out_max[b, :, m] = fmax(out_max[b, :, m], x)
                out_min[b, :, m] = fmin(out_min[b, :, m], x)
    return out_max, out_min
