"""The runtime side of the quality evaluation: selection policies as graph variants, caches shared between block sizes, and the steps Generator takes.

A prompt is prefilled once, exactly (what `Generator` does by default; exact prefill depends neither on
the selection policy nor on the block size P). Every policy then decodes from that state: a cache per
P shares the keys and values and holds its own block bounds, recomputed from the keys by QuestMetadata's
NumPy reference (rounded outward to the bounds' dtype, then merged in position order), and
restored from a snapshot before each policy. `greedy_steps` steps a model exactly as
`Generator.stream` does after its prefill, so a policy's answer is the one `Generator` would give.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import onnx
import onnxruntime as ort

from quest_ort.model_folder.cache import LayerCaches, cache_layout
from quest_ort.ops.reference import quest_metadata
from quest_ort.ops.reference.int8_rows import dequantize_rows
from quest_ort.runtime.buffers import cache_buffer
from quest_ort.runtime.generate import PREFILL_CHUNK
from quest_ort.runtime.sampling import Sampling, choose
from quest_ort.runtime.model import KVCache

from .harness import blocks_per_kv_head

GREEDY = Sampling(max_new_tokens=1)  # choose() with temperature 0: the argmax, as Generator's greedy default


@dataclasses.dataclass(frozen=True, order=True)
class Policy:
    """How SparseBlockSelect chooses: block size, group reduction, forced sink and recent blocks."""

    block_size: int
    group_reduce: str
    sink_blocks: int = 1
    recent_blocks: int = 1

    @classmethod
    def of(cls, settings) -> Policy:
        """The policy an export with these SparseSettings selects with."""
        return cls(settings.block_size, settings.group_reduce, settings.sink_blocks, settings.recent_blocks)

    @property
    def name(self) -> str:
        return f"P{self.block_size}-{self.group_reduce}-s{self.sink_blocks}r{self.recent_blocks}"


@dataclasses.dataclass(frozen=True, order=True)
class Config:
    """A policy at a budget of tokens per selection (K = budget / P blocks, forced blocks included)."""

    policy: Policy
    budget: int

    def __post_init__(self):
        if self.budget % self.policy.block_size:
            raise ValueError(f"a budget of {self.budget} tokens is no whole number of {self.policy.block_size}-token blocks")

    @property
    def top_k(self) -> int:
        return self.budget // self.policy.block_size

    @property
    def name(self) -> str:
        return f"{self.policy.name}-K{self.top_k}"

    def select_attributes(self) -> dict:
        """SparseBlockSelect's attributes for this configuration (the bound score, no importance)."""
        p = self.policy
        return dict(top_k=self.top_k, group_reduce=p.group_reduce, sink_blocks=p.sink_blocks,
                    recent_blocks=p.recent_blocks, score="bound", importance_fraction=0.0)


def write_variant(folder: pathlib.Path, name: str, analysis: bool = False, **attributes) -> str:
    """A graph next to the export in `folder` with new SparseBlockSelect attributes (same I/O, same
    external weights); returns its file name. `analysis` also makes every attention exact and adds,
    per sparse layer in graph order, two outputs: the selection [B, R, 1, K] and the attention mass
    per cache block [B, N, MC]."""
    model = onnx.load(str(folder / "model.quest.onnx"), load_external_data=False)
    extra = []
    for node in model.graph.node:
        if node.op_type == "SparseBlockSelect":
            kept = [a for a in node.attribute if a.name not in attributes]
            del node.attribute[:]
            node.attribute.extend(kept + [onnx.helper.make_attribute(k, v) for k, v in attributes.items()])
            if analysis:
                extra.append(node.output[0])
        if analysis and node.op_type == "SparseBlockAttention" and len(node.input) > 6 and node.input[6]:
            node.input[6] = ""  # no block_indices: every query attends exactly
            while len(node.output) < 4:
                node.output.append("")
            node.output[3] = node.output[3] or f"{node.output[0]}.block_mass"
            extra.append(node.output[3])
    for output in extra:
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(output))
    file = f"model.{name}{'.analysis' if analysis else ''}.onnx"
    onnx.save(model, str(folder / file))
    return file


def shared_weights(folder: pathlib.Path, pool: dict | None = None) -> dict:
    """Every initializer of the export in `folder` as an OrtValue, for sessions that share one copy.
    `pool` (an earlier call's result, e.g. another block size's export of the same checkpoint)
    lends its OrtValue wherever a tensor of the same name holds the same values."""
    model = onnx.load(str(folder / "model.quest.onnx"))
    values = {}
    for tensor in model.graph.initializer:
        array = np.ascontiguousarray(onnx.numpy_helper.to_array(tensor))
        earlier = (pool or {}).get(tensor.name)
        if earlier is not None and earlier.shape() == list(array.shape) and np.array_equal(earlier.numpy(), array):
            values[tensor.name] = earlier
        else:
            values[tensor.name] = ort.OrtValue.ortvalue_from_numpy(array)
    return values


def block_bounds(keys: np.ndarray, length: int, block_size: int, dtype) -> tuple[np.ndarray, ...]:
    """Per-block channel max and min [..., ceil(length / P), D] of keys [..., C, D] over the first
    `length` positions, as QuestMetadata builds them into an empty cache (int8 bounds: and their
    exponents [..., ceil(length / P)]): computed by its NumPy reference
    (ops/reference/quest_metadata.py). Blocks do not interact, so the reference runs with every
    (leading index, block) as a KV head of a one-block cache (the whole blocks, then the last
    partial one): its loop over positions is P long instead of `length`."""
    keys = np.asarray(keys)
    lead, D, P = keys.shape[:-2], keys.shape[-1], block_size
    rows = int(np.prod(lead, dtype=np.int64))
    whole, tail = divmod(length, P)
    flat = keys[..., :length, :].reshape(rows, length, D)
    int8 = np.dtype(dtype) == np.int8
    parts = []  # per part, the bounds as [rows, blocks, ...]
    for start, blocks, tokens in ((0, whole, P), (whole * P, int(tail > 0), tail)):
        if blocks == 0:
            continue
        key = flat[:, start : start + blocks * tokens].reshape(1, rows * blocks, tokens, D)
        empty = np.zeros((1, rows * blocks, 1, D), dtype)
        exponent = np.zeros((1, rows * blocks, 1), np.int8) if int8 else None
        out = quest_metadata(key, empty, empty, np.zeros(1, np.int64), block_exponent=exponent, block_size=P)
        parts.append([array.reshape(rows, blocks, *array.shape[3:]) for array in out])
    if not parts:
        parts = [[np.zeros((rows, 0, D), dtype)] * 2 + ([np.zeros((rows, 0), np.int8)] if int8 else [])]
    return tuple(np.concatenate(arrays, axis=1).reshape(*lead, -1, *arrays[0].shape[2:]) for arrays in zip(*parts))


def bound_arrays(layer) -> tuple[np.ndarray, ...]:
    """A layer's block bound caches: max, min (and exponent, with int8 bounds)."""
    return tuple(array for array in (layer.block_max, layer.block_min, layer.block_exponent) if array is not None)


def super_arrays(layer) -> tuple[np.ndarray, ...]:
    """A layer's superblock bound caches (the hierarchical selection's; none where it selects flat)."""
    return tuple(array for array in (layer.super_max, layer.super_min, layer.super_exponent) if array is not None)


def bound_sets(layer, block_size: int, superblock_size: int) -> list[tuple[tuple[np.ndarray, ...], int]]:
    """(bound caches, their block size) of a layer: its blocks', and its superblocks' where it has them."""
    sets = [(bound_arrays(layer), block_size)]
    if layer.super_max is not None:
        sets.append((super_arrays(layer), block_size * superblock_size))
    return sets


def held_keys(layer, row: int, length: int) -> np.ndarray:
    """Row `row`'s first `length` keys [N, length, D] as the layer's cache holds them: an int8 cache's
    codes times their row scales (exact in float32), a float cache's as they are."""
    if layer.key_scale is None:
        return layer.key[row, :, :length]
    return dequantize_rows(layer.key[row, :, :length], layer.key_scale[row, :, :length])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit (so -0 differs from +0 and a NaN equals the same NaN)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        a.view(f"u{a.dtype.itemsize}"), b.view(f"u{b.dtype.itemsize}"))


def check_block_bounds(model, cache: KVCache) -> None:
    """Raise unless block_bounds, from the keys in `cache`, reproduces (bit for bit) every row's
    bounds that QuestMetadata built in it."""
    settings = model.sidecar.settings
    for index, layer in enumerate(cache.layers):
        if layer.block_max is None:
            continue
        for row, length in enumerate(cache.lengths.tolist()):
            for kind, (arrays, size) in zip(("block", "superblock"), bound_sets(layer, settings.block_size, settings.superblocks)):
                stored = [array[row] for array in arrays]
                computed = block_bounds(held_keys(layer, row, length), length, size, stored[0].dtype)
                blocks = computed[0].shape[-2]
                if not all(same_bits(mine, theirs[:, :blocks]) for mine, theirs in zip(computed, stored, strict=True)):
                    raise AssertionError(f"recomputed {kind} bounds differ from layer {index}'s (row {row}, {length} "
                                         f"tokens, blocks of {size}) that QuestMetadata built")


def sharing_cache(model, source: KVCache) -> KVCache:
    """A cache of `model` (any block size) that shares `source`'s key and value buffers and has its
    own block bounds, empty until `rebuild_bounds`. Decode steps write keys and values only at and
    after each row's length, so caches sharing them stay valid as long as each restores its own
    lengths and bounds (Snapshot) before it steps."""
    layout = cache_layout(model.sidecar, source.batch, source.capacity)
    if any(layer.block_importance is not None for layer in layout):
        raise ValueError(f"{model.directory}: the evaluation runs bound-score exports without block importance")

    def own_bounds(spec):
        return None if spec is None else cache_buffer(spec.shape, spec.dtype)

    layers = [LayerCaches(shared.key, shared.value, own_bounds(specs.block_max), own_bounds(specs.block_min),
                          key_scale=shared.key_scale, value_scale=shared.value_scale,
                          block_exponent=own_bounds(specs.block_exponent), super_max=own_bounds(specs.super_max),
                          super_min=own_bounds(specs.super_min), super_exponent=own_bounds(specs.super_exponent))
              for specs, shared in zip(layout, source.layers, strict=True)]
    names = [specs.map(lambda spec: spec.name) for specs in layout]
    shared = {name: source.values[name] for named in names
              for name in (named.key, named.value, named.key_scale, named.value_scale) if name is not None}
    return KVCache.of(source.capacity, source.lengths.copy(), layers, names, values=shared)


def rebuild_bounds(model, cache: KVCache) -> None:
    """Recompute every row's block bounds in `cache` from its keys (the state after an exact prefill
    of `cache.lengths` tokens at `model`'s block size)."""
    settings = model.sidecar.settings
    for layer in cache.layers:
        if layer.block_max is None:
            continue
        for row, length in enumerate(cache.lengths.tolist()):
            for arrays, size in bound_sets(layer, settings.block_size, settings.superblocks):
                computed = block_bounds(held_keys(layer, row, length), length, size, layer.block_max.dtype)
                for array, values in zip(arrays, computed, strict=True):
                    array[row, :, : values.shape[1]] = values


def copy_prompt_state(source: KVCache, target: KVCache, row: int, length: int) -> None:
    """Row 0's first `length` keys and values of `source` into `row` of `target` (caches of exports of
    one checkpoint, layer for layer), which then holds `length` tokens (bounds rebuilt later)."""
    for into, layer in zip(target.layers, source.layers, strict=True):
        into.key[row, :, :length] = layer.key[0, :, :length]
        into.value[row, :, :length] = layer.value[0, :, :length]
    target.lengths[row] = length


class Snapshot:
    """A cache's lengths, block bounds and block importance, to put back before the next policy steps from them
    (keys and values need no copy: see sharing_cache)."""

    def __init__(self, cache: KVCache):
        self.cache = cache
        self.saved = [(array, array.copy()) for layer in cache.layers
                      for array in (layer.block_max, layer.block_min, layer.block_importance, layer.block_exponent,
                                    layer.super_max, layer.super_min, layer.super_exponent)
                      if array is not None]
        self.lengths = cache.lengths.copy()

    def restore(self) -> KVCache:
        for array, saved in self.saved:
            array[...] = saved
        self.cache.lengths[...] = self.lengths
        return self.cache


def greedy_steps(model, cache: KVCache, first_tokens, tokens: int) -> list[list[int]]:
    """Generator.stream's greedy decode after its prefill, from a prefilled cache (no stop tokens):
    each row's first token is the one chosen from the prefill's logits (`first_tokens`, the same
    for every policy: an exact prefill does not select); each chosen token is then stepped with
    every row valid and the next one chosen from the step's logits. Returns each row's `tokens`."""
    chosen = np.asarray(first_tokens, np.int64)
    rows = [[int(token)] for token in chosen]
    valid = np.ones(cache.batch, np.int32)
    for _ in range(tokens - 1):
        logits = model.step(cache, chosen[:, None].astype(np.int64), valid=valid)[:, 0]
        chosen = choose(logits, GREEDY, None)
        for row, token in zip(rows, chosen.tolist()):
            row.append(int(token))
    return rows


def decode_feeds(model, cache: KVCache, tokens) -> dict:
    """The feeds of one decode step of tokens [B] over `cache`, as QuestModel.step feeds it, for a
    session of a variant graph with extra outputs (run directly: QuestModel.step returns logits only)."""
    names = model.sidecar.inputs
    feeds = {names["input_ids"]: np.asarray(tokens, np.int64)[:, None], names["past_lens"]: cache.lengths.copy(),
             names["total_lens"]: cache.lengths + 1, names["exact_lens"]: cache.lengths.copy(), **cache.values}
    if "chunk_lens" in names:
        feeds[names["chunk_lens"]] = cache.lengths.copy()  # no chunk queries: a decode step
    if "logits_keep" in names:
        feeds[names["logits_keep"]] = np.array([0], np.int64)  # every position: the step's one
    return feeds


def analysis_step(model, cache: KVCache, tokens: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """One decode step of tokens [B] through an analysis variant (write_variant(analysis=True)),
    fed as QuestModel.step feeds a decode step; returns, per sparse layer in graph order, (the
    selection [B, R, K], the exact attention mass per block [B, N, M]). The cache keeps what the step
    wrote: restore it before the next policy."""
    outputs = model._step.run(decode_feeds(model, cache, tokens))  # the variant's extra outputs come back too
    extra = [o.name for o in model.session.get_outputs()
             if o.name != model.sidecar.outputs["logits"] and not o.name.startswith("present")]
    return [(outputs[selected][:, :, 0], outputs[mass]) for selected, mass in zip(extra[0::2], extra[1::2])]


def attention_recall(layers: list[tuple[np.ndarray, np.ndarray]], kv_heads: int) -> list[float]:
    """Per row: the mean, over sparse layers and KV heads, of the share of the exact attention mass
    that falls in the blocks the KV head reads (analysis_step's output)."""
    batch = layers[0][0].shape[0] if layers else 0
    shares = [[] for _ in range(batch)]
    for selected, mass in layers:
        for row in range(batch):
            for head, chosen in enumerate(blocks_per_kv_head(selected[row], kv_heads)):
                shares[row].append(mass[row, head, chosen].sum() / mass[row, head].sum())
    return [float(np.mean(row)) if row else float("nan") for row in shares]


def tokens_read(layers: list[tuple[np.ndarray, np.ndarray]], kv_heads: int, block_size: int, budget: int) -> list[float]:
    """Per row: the tokens a KV head reads (whole blocks of the union of its rows' selections),
    relative to the budget, averaged over sparse layers and KV heads (analysis_step's output)."""
    batch = layers[0][0].shape[0] if layers else 0
    return [float(np.mean([chosen.size * block_size / budget for selected, _ in layers
                           for chosen in blocks_per_kv_head(selected[row], kv_heads)])) for row in range(batch)]


def token_losses(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood (float64) of each target under logits [S, V]."""
    shifted = logits - logits.max(-1, keepdims=True)  # float32: exp of it cannot overflow
    log_total = np.log(np.exp(shifted).sum(-1, dtype=np.float64))
    return log_total - shifted[np.arange(len(targets)), targets].astype(np.float64)


def teacher_forced(model, cache: KVCache, ids: list[int], start: int, exact: bool,
                   chunk: int = PREFILL_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """Feed ids[start:] (the cache holding ids[:start] in its one row) `chunk` positions per step;
    returns the losses of targets ids[start + 1:] and the last position's logits. `exact`: every
    token attends to its whole past; otherwise each selects its blocks, as a generated token does."""
    if cache.batch != 1 or int(cache.lengths[0]) != start:
        raise ValueError(f"the cache must hold the first {start} tokens in one row, it holds {cache.lengths.tolist()}")
    losses, last = [], None
    for begin in range(start, len(ids), chunk):
        piece = ids[begin : begin + chunk]
        logits = model.step(cache, np.array([piece], np.int64), exact=exact)[0]
        targets = np.array(ids[begin + 1 : begin + 1 + len(piece)], np.int64)
        losses.append(token_losses(logits[: len(targets)], targets))
        last = logits[-1].copy()  # not a view: the chunk's logits go before the next step
        del logits
    return np.concatenate(losses), last


def perplexity(losses: np.ndarray) -> float:
    return float(np.exp(np.mean(losses)))
