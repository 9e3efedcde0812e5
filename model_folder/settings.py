"""What a model folder was exported with: the model's attention geometry and the sparse settings.

The exporter builds graphs from these two objects and the sidecar records them (model_folder/sidecar.py);
the runtime sizes and reads its caches from what the sidecar recorded.
"""

from __future__ import annotations

import dataclasses

from ..ops.reference.sparse_block_select import most_chunk_forced
from ..ops.schemas import SPARSE_BLOCK_SELECT

# The settings that become SparseBlockSelect attributes (same names): their ranges are the op schema's,
# and an int attribute must fit in int32, so a bad value is refused here rather than by the checker.
ATTRIBUTE_SETTINGS = ("top_k", "block_size", "sink_blocks", "recent_blocks", "importance_fraction", "num_probes",
                      "chunk_size", "chunk_top_k", "chunk_share", "chunk_window", "chunk_sink", "chunk_pool",
                      "chunk_floor", "candidate_factor")
# The hierarchical selection's settings (docs/ops.md, hierarchical selection): superblock_size 0 is
# none (the flat selection: no superblock caches), else SparseBlockSelect's attribute of that name.
SUPERBLOCK_SETTINGS = ("superblock_size", "candidate_factor")
# The settings of a sparse prefill's chunk queries (docs/ops.md, chunk queries): SparseBlockSelect
# attributes (chunk_size is SparseBlockAttention's too), written into a folder's sidecar only where
# they differ from these defaults, which are the op schema's.
CHUNK_SETTINGS = ("chunk_size", "chunk_top_k", "chunk_share", "chunk_window", "chunk_sink", "chunk_pool", "chunk_floor")
# How the MatMul weights are stored: as the source has them ("float"), or quantized by the exporter
# into com.microsoft.MatMulNBits nodes of these bits (export/quantize.py).
WEIGHT_BITS = {"int8": 8, "int4": 4}
WEIGHT_TYPES = ("float", *WEIGHT_BITS)
# What `export-sparse --k K` counts: pages of this many tokens. Each selection reads K pages' worth
# of tokens (`--k 32`: 1024), scored in blocks of block_size (top_k = ceil(K * 32 / P) blocks, 128 at
# the default P=8). A budget in tokens, not blocks, because quality follows the tokens read and the
# scoring block size is a separate choice: at P=8 a 256-token budget keeps the pass keys but not the
# text (+6.9% / +9.0% perplexity on SmolLM2), 1024 tokens keeps both (+0.6% / +1.0%), docs/quality.md.
BUDGET_PAGE_TOKENS = 32


def attribute_range_problem(name: str, value) -> str | None:
    """Why `value` is out of range for SparseBlockSelect's attribute `name`, or None."""
    return SPARSE_BLOCK_SELECT.attribute(name).range_problem(value)


def top_k_for_budget(k: int, block_size: int) -> int:
    """SparseBlockSelect's top_k for `export-sparse --k k`: the fewest blocks of block_size tokens
    holding k pages of BUDGET_PAGE_TOKENS tokens."""
    if k < 1 or block_size < 1:
        raise ValueError(f"--k and the block size must be at least 1, got k = {k}, block size = {block_size}")
    return -(-k * BUDGET_PAGE_TOKENS // block_size)


def default_superblock_size(score: str = "bound", attention: str = "quest") -> int:
    """The superblock size of an export that does not choose one (SparseSettings.superblock_size):
    the op's default with bound scores, none with probes (they read keys, not bounds) or without
    the Quest ops."""
    if score == "probe" or attention != "quest":
        return 0
    return SPARSE_BLOCK_SELECT.attribute("superblock_size").default


def default_bounds_dtype(kv_dtype: str, score: str = "bound") -> str:
    """The block bounds' dtype of an export that does not choose one (SparseSettings.bounds_dtype)."""
    if score == "probe":
        return kv_dtype
    return "int8" if kv_dtype == "int8" else "float16"


@dataclasses.dataclass(frozen=True)
class SparseSettings:
    top_k: int  # SparseBlockSelect's budget in blocks (`export-sparse --k` counts pages: for_budget)
    # The defaults keep the answers (docs/quality.md, measured through Generator on SmolLM2):
    # blocks of 8 tokens, every query head selecting its own K of them.
    block_size: int = 8
    sink_blocks: int = 1
    recent_blocks: int = 1
    group_reduce: str = "none"
    importance_fraction: float = 0.0
    dense_layers: tuple[int, ...] = (0, 1)
    kv_dtype: str | None = None  # None: the model's activation dtype
    # The block bounds' dtype. None: float16 (half the bytes a decode step's selection reads; keys
    # round outward into them), int8 with int8 caches (a per-block power of two, docs/ops.md: half
    # again), except with score="probe", whose select reads the key cache and the bounds as one
    # type: then the cache's.
    bounds_dtype: str | None = None
    # "quest": the Quest ops; "gqa": the dense baseline, com.microsoft.GroupQueryAttention over the
    # same in-place caches and model I/O (for side-by-side comparisons in one runtime)
    attention: str = "quest"
    # Write every Quest node as its standard-op body: a graph of standard ops only (graphs/portable.py)
    portable: bool = False
    score: str = "bound"  # SparseBlockSelect's policy: "bound" or "probe" (then reads the key cache)
    num_probes: int = 8
    # Carry every layer's accumulated attention mass per block (past/present_block_importance.l)
    # into SparseBlockSelect; on by default when importance_fraction > 0.
    track_importance: bool | None = None
    weights: str = "float"  # one of WEIGHT_TYPES
    # int8 caches: the keys' channels rescaled by powers of two measured on the source graph, the
    # queries by the inverse, so that one scale per row suits every channel (pipeline/calibrate.py).
    # A folder records whether its graph does it (false with float caches).
    key_smoothing: bool = True
    # A sparse prefill (Generator(prefill="sparse")): each chunk of chunk_size prompt queries lists
    # its own blocks, a window of chunk_window blocks before them and the sinks, and selects
    # chunk_share of the other blocks (at least top_k and chunk_floor, at most chunk_top_k listed in
    # all), scored by rows that average chunk_pool queries (docs/ops.md, chunk queries).
    chunk_size: int = SPARSE_BLOCK_SELECT.attribute("chunk_size").default
    chunk_top_k: int = SPARSE_BLOCK_SELECT.attribute("chunk_top_k").default
    chunk_share: float = SPARSE_BLOCK_SELECT.attribute("chunk_share").default
    chunk_window: int = SPARSE_BLOCK_SELECT.attribute("chunk_window").default
    chunk_sink: int = SPARSE_BLOCK_SELECT.attribute("chunk_sink").default
    chunk_pool: int = SPARSE_BLOCK_SELECT.attribute("chunk_pool").default
    chunk_floor: int = SPARSE_BLOCK_SELECT.attribute("chunk_floor").default
    # The hierarchical selection (docs/ops.md): each sparse layer also keeps bounds over superblocks of
    # superblock_size blocks, and a decode query past candidate_factor * top_k blocks ranks only the
    # blocks of its best superblocks. None: default_superblock_size; 0: none (the flat selection).
    superblock_size: int | None = None
    candidate_factor: int = SPARSE_BLOCK_SELECT.attribute("candidate_factor").default

    def __post_init__(self):
        for name in ATTRIBUTE_SETTINGS:
            problem = attribute_range_problem(name, getattr(self, name))
            if problem:
                raise ValueError(f"{name} {problem}")
        most = most_chunk_forced(self.chunk_size, self.block_size, self.chunk_window, self.chunk_sink)
        if self.chunk_top_k < most:
            raise ValueError(f"chunk_top_k = {self.chunk_top_k} cannot hold a prefill chunk's forced blocks: up to "
                             f"{most} (its own blocks, chunk_window = {self.chunk_window}, chunk_sink = "
                             f"{self.chunk_sink})")
        if self.superblock_size is not None and (not isinstance(self.superblock_size, int) or self.superblock_size < 0
                                                 or self.superblock_size > 2**31 - 1):
            raise ValueError(f"superblock_size must be 0 (none) or a number of blocks, got {self.superblock_size!r}")
        if self.superblock_size and self.score == "probe":
            raise ValueError("superblock_size: score='probe' reads keys, not bounds; it takes no superblocks (0)")
        if self.weights not in WEIGHT_TYPES:
            raise ValueError(f"weights must be one of {list(WEIGHT_TYPES)}, got {self.weights!r}")
        if self.kv_dtype == "int8" and self.attention == "gqa":
            raise ValueError("kv_dtype 'int8' is the Quest ops' cache format; the GroupQueryAttention baseline "
                             "(attention 'gqa') takes float caches here")
        if self.kv_dtype == "int8" and self.score == "probe":
            raise ValueError("score='probe' reads a float key cache; with kv_dtype 'int8' select by the bound")

    @classmethod
    def for_budget(cls, k: int, **settings) -> SparseSettings:
        """What `export-sparse --k k` writes with the other options as `settings`: top_k from the
        budget in pages at the settings' block size (top_k_for_budget)."""
        block_size = settings.get("block_size", cls.__dataclass_fields__["block_size"].default)
        return cls(top_k=top_k_for_budget(k, block_size), **settings)

    @property
    def budget_tokens(self) -> int:
        """Tokens one selection reads, its forced blocks included."""
        return self.top_k * self.block_size

    @property
    def superblocks(self) -> int:
        """The superblock size this export uses: superblock_size, or its default; 0 for none."""
        if self.superblock_size is None:
            return default_superblock_size(self.score, self.attention)
        return self.superblock_size

    def superblock_count(self, blocks: int) -> int:
        """The superblocks that hold `blocks` metadata blocks (as many as the blocks without superblocks)."""
        return -(-blocks // max(self.superblocks, 1))

    @property
    def importance(self) -> bool:
        return self.importance_fraction > 0 if self.track_importance is None else self.track_importance


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The attention shape of a model: layers, query and KV heads, head size, activation type."""

    num_layers: int
    num_heads: int
    kv_num_heads: int
    head_dim: int
    activation_dtype: str = "float32"  # "float32" or "float16"
