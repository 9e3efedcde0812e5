"""Conformance cases: shapes chosen to break kernels, sampled so every value of every axis is covered.

A case fixes one decode or prefill call; `op_inputs` builds the arguments of each op for it, from
one consistent cache state (metadata computed from the cached keys by the reference), so a case
exercises the three ops the way a model's layer chains them.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from quest_ort.ops.reference import quest_metadata, sparse_block_select
from quest_ort.ops.reference.int8_bounds import LOWEST, NON_FINITE
from quest_ort.ops.reference.int8_rows import NAN_SCALE, dequantize_rows, quantize_rows

HEAD_LAYOUTS = ((4, 4), (8, 2), (14, 2), (32, 8))
HEAD_DIMS = (64, 80, 128)
BLOCK_SIZES = (16, 32, 128)
CACHED = ("0", "1", "P-1", "P", "P+1", "2P-1", "~1000")
LONG_CACHED = "~4000"  # LONG_CASES only
NEW_TOKENS = (1, 7, 64)
TOP_K = ("1", "2", "8", "32", "more than eligible")
FORCED = (0, 1, 2)
REDUCES = ("mean", "max", "none")
DTYPES = (("float32", "float32"), ("float16", "float16"), ("float32", "float16"), ("float16", "float32"))
# SparseBlockAttention's int8 caches (row-wise int8 and a float16 scale); their block bounds are
# float16, as the exporter keeps them. Drawn after the float pairs (_covering_cases).
INT8_DTYPES = (("float32", "int8"), ("float16", "int8"))
# The block bounds: the cache's own float type (float16 next to int8 caches), or int8 codes with a
# per-block exponent (docs/ops.md, int8 block bounds). Each int8-bound case takes one of these
# pairs, drawn after the float bounds' cases (_covering_cases): float32 keys (rounded outward to
# float16 first), float16 keys (exact), keys as an int8 cache holds them.
BOUNDS = ("cache", "int8")
INT8_BOUNDS_DTYPES = (("float32", "float32"), ("float16", "float16"), ("float32", "int8"))
BATCHES = (1, 3)
# exact_lens: absent, 0 (given, nothing exact), every query of the call, or its first half.
EXACT = ("none", "none", "zero", "all", "half")

AXES = {
    "batch": BATCHES,
    "heads": HEAD_LAYOUTS,
    "head_dim": HEAD_DIMS,
    "block_size": BLOCK_SIZES,
    "cached": CACHED,
    "new_tokens": NEW_TOKENS,
    "top_k": TOP_K,
    "sink": FORCED,
    "recent": FORCED,
    "reduce": REDUCES,
    "importance": (False, False, True),  # repeated values weight the random draw
    "equal_scores": (False, False, False, True),
    "score": ("bound", "bound", "probe"),
    "num_probes": (3, 8),
    "dtypes": DTYPES + INT8_DTYPES,
    "exact": EXACT,
}

# Keep each case's largest function-body tensor near this many elements (about 100 MB fp32).
BODY_BUDGET = 2.5e7
EXTRA_CASES = 12  # random combinations beyond the covering set, for mixing


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    heads: tuple[int, int]
    head_dim: int
    block_size: int
    cached: str
    new_tokens: int
    top_k: str
    sink: int
    recent: int
    reduce: str
    importance: bool
    equal_scores: bool
    score: str
    num_probes: int
    dtypes: tuple[str, str]
    exact: str
    bounds: str = "cache"  # BOUNDS; a default, so that the float bounds' cases are built as before
    # Chunk queries (sparse prefill; CHUNK_CASES): "none", "all" (chunk_lens = total_lens: every query
    # not below exact_lens) or "three-quarters" (chunk_lens at 3/4 of the call: the rest select per
    # token). The chunk attributes are given to chunk cases only.
    chunk: str = "none"
    chunk_size: int = 64
    chunk_pool: int = 1
    chunk_window: int = 1
    chunk_share: float = 0.25
    chunk_room: int = 0  # chunk_top_k beyond the most forced blocks a chunk can have
    chunk_floor: int = 0  # 0: top_k is the floor of the blocks a chunk scores in
    # Hierarchical selection (HIERARCHY_CASES): superblocks of superblock_size blocks (0: none, the
    # flat selection) and the candidate_factor attribute.
    superblock_size: int = 0
    candidate_factor: int = 16

    @property
    def int8(self) -> bool:
        """int8 KV caches (with row scales), bounded by float16 metadata unless the bounds are int8."""
        return self.dtypes[1] == "int8"

    @property
    def int8_bounds(self) -> bool:
        """int8 block bounds with their per-block exponents."""
        return self.bounds == "int8"

    def bounds_dtype(self) -> np.dtype:
        """The block bounds' dtype: int8 codes, or the cache's own, float16 next to int8 caches."""
        if self.int8_bounds:
            return np.dtype(np.int8)
        return np.dtype(np.float16 if self.int8 else self.dtypes[1])

    @property
    def id(self) -> str:
        H, N = self.heads
        short = {"float32": "32", "float16": "16", "int8": "i8"}
        return (
            f"B{self.batch}-H{H}N{N}-D{self.head_dim}-P{self.block_size}-L{self.cached.replace('~', '')}"
            f"-S{self.new_tokens}-K{self.top_k.split()[0]}-s{self.sink}r{self.recent}-{self.reduce}"
            f"{'-imp' if self.importance else ''}{'-eq' if self.equal_scores else ''}"
            f"{f'-probe{self.num_probes}' if self.score == 'probe' else ''}"
            f"-{short[self.dtypes[0]]}{short[self.dtypes[1]]}"
            f"{'' if self.exact == 'none' else '-x' + self.exact}{'-b8' if self.int8_bounds else ''}"
            + ("" if self.chunk == "none" else f"-c{self.chunk.split('-')[0]}Q{self.chunk_size}p{self.chunk_pool}"
               f"w{self.chunk_window}s{self.chunk_share:g}k{self.chunk_room}"
               + (f"f{self.chunk_floor}" if self.chunk_floor else ""))
            + (f"-U{self.superblock_size}c{self.candidate_factor}" if self.superblock_size else "")
        )

    def num_superblocks(self) -> int:
        return -(-self.num_blocks() // self.superblock_size)

    def superblock_attributes(self) -> dict:
        """SparseBlockSelect's superblock attributes (hierarchy cases only; the others keep the defaults)."""
        if not self.superblock_size:
            return {}
        return dict(superblock_size=self.superblock_size, candidate_factor=self.candidate_factor)

    def past_lens(self) -> np.ndarray:
        """Row 0 holds the case's cached length; other rows hold other listed lengths."""
        P = self.block_size
        lengths = {"0": 0, "1": 1, "P-1": P - 1, "P": P, "P+1": P + 1, "2P-1": 2 * P - 1, "~1000": 1000 + 7}
        if self.cached == LONG_CACHED:  # LONG_CASES: every row long, each a block and a bit shorter
            return np.array([4000 + 5 - b * (P + 3) for b in range(self.batch)], dtype=np.int32)
        first = CACHED.index(self.cached)
        rows = [lengths[CACHED[(first + 3 * b) % len(CACHED)]] for b in range(self.batch)]
        return np.array(rows, dtype=np.int32)

    def total_lens(self) -> np.ndarray | None:
        """With several rows, the last is padded: only half its new tokens (rounded down) are valid."""
        if self.batch == 1:
            return None
        total = self.past_lens() + self.new_tokens
        total[-1] -= (self.new_tokens + 1) // 2
        return total.astype(np.int32)

    def exact_lens(self) -> np.ndarray | None:
        """Positions below which the call's queries attend exactly (at most total_lens)."""
        if self.exact == "none":
            return None
        past = self.past_lens()
        total = self.total_lens() if self.total_lens() is not None else past + self.new_tokens
        exact = {"zero": np.zeros_like(past), "all": total, "half": np.minimum(past + self.new_tokens // 2, total)}
        return exact[self.exact].astype(np.int32)

    def chunk_lens(self) -> np.ndarray | None:
        """Positions below which the call's queries (not below exact_lens) select per chunk."""
        if self.chunk == "none":
            return None
        total = self.total_lens() if self.total_lens() is not None else self.past_lens() + self.new_tokens
        if self.chunk == "all":
            return total.astype(np.int32)
        return np.minimum(self.past_lens() + (3 * self.new_tokens) // 4, total).astype(np.int32)

    def chunk_top_k(self) -> int:
        most = (self.chunk_size + self.block_size - 2) // self.block_size + 1 + self.chunk_window + self.sink
        return most + self.chunk_room

    def chunk_attributes(self) -> dict:
        """SparseBlockSelect's chunk attributes (chunk cases only; the others keep the defaults)."""
        if self.chunk == "none":
            return {}
        return dict(chunk_size=self.chunk_size, chunk_top_k=self.chunk_top_k(), chunk_share=self.chunk_share,
                    chunk_window=self.chunk_window, chunk_sink=self.sink, chunk_pool=self.chunk_pool,
                    chunk_floor=self.chunk_floor)

    def chunks_rank(self) -> bool:
        """True when the last chunk has more candidate blocks than its budget: scores decide."""
        if self.chunk == "none":
            return False
        P = self.block_size
        last = (int(self.past_lens().max()) + self.new_tokens - 1) // P
        first = max(last - (self.chunk_size + P - 1) // P, 0)
        forced = last + 1 - max(first - self.chunk_window, 0) + min(self.sink, max(first - self.chunk_window, 0))
        candidates = last + 1 - forced
        keep = min(self.chunk_top_k() - forced,
                   max(self.k(), self.chunk_floor, -(-int(self.chunk_share * candidates * 1e6) // 10**6)))
        return candidates > keep

    def capacity(self) -> int:
        """Room for the longest row plus a partial block, so the last block is not full."""
        return int(self.past_lens().max()) + self.new_tokens + self.block_size // 2 + 3

    def num_blocks(self) -> int:
        return -(-self.capacity() // self.block_size)

    def k(self) -> int:
        if self.top_k == "more than eligible":
            return self.num_blocks() + 3
        return int(self.top_k)

    def ranks_blocks(self) -> bool:
        """True when some query has more eligible blocks than its forced blocks and budget cover,
        so the ranking (scores, importance, ties) decides part of the selection."""
        last_block = (int(self.past_lens().max()) + self.new_tokens - 1) // self.block_size
        return last_block + 1 > self.k() and self.k() > self.sink + self.recent

    def body_cost(self) -> float:
        H, N = self.heads
        heads = N if self.reduce == "mean" and self.chunk == "none" else H
        select = self.batch * heads * self.new_tokens * self.num_blocks() * self.head_dim
        if self.score == "probe":
            select *= self.num_probes
        attention = self.batch * H * self.new_tokens * self.capacity()
        return max(select, attention)


def _covering_cases(seed: int = 7) -> list[Case]:
    """Random combinations, kept while they add an uncovered (axis, value) and fit the budget.

    Cases whose ranking decides part of the selection are preferred; the others are taken only for
    values that cannot rank (a budget above the eligible blocks) once the draws run long. The float
    dtype pairs are drawn first, as before int8 caches existed, so those cases stay the same; the
    int8 pairs then get a case each (_int8_cases), and then int8 bounds (_int8_bounds_cases).
    """
    cases = _draw({**AXES, "dtypes": DTYPES}, np.random.default_rng(seed), EXTRA_CASES)
    cases += _int8_cases(np.random.default_rng(seed + 1))
    cases += _int8_bounds_cases(np.random.default_rng(seed + 2))
    return cases + _chunk_cases(np.random.default_rng(seed + 3))


# Where int8 rows take paths of their own in the SIMD kernels, which the int8 cases should reach.
# (Rows that end inside a 16-lane chunk: no HEAD_DIMS has them; test_kernel_variants' int8 rows do.)
INT8_PATHS = {
    "per-head block lists, walked as one union": lambda case: case.reduce == "none" and case.heads[0] > case.heads[1],
    "block lists a group's heads share": lambda case: case.reduce != "none" and case.heads[0] > case.heads[1],
    "decode": lambda case: case.new_tokens == 1,
    "a prefill of whole query tiles": lambda case: case.new_tokens == 64,
    "exact and sparse queries in one call": lambda case: case.exact == "half" and case.new_tokens > 1,
}


# What int8 bounds change, which the int8-bound cases should reach: the exponent's product after
# each group reduction, and codes dequantized, merged and quantized again by a call that adds keys
# to a block an earlier call began.
INT8_BOUNDS_PATHS = {
    "the mean query": lambda case: case.reduce == "mean" and case.heads[0] > case.heads[1],
    "the max over a group's heads": lambda case: case.reduce == "max" and case.heads[0] > case.heads[1],
    "per-head rows": lambda case: case.reduce == "none" and case.heads[0] > case.heads[1],
    "a block begun by an earlier call": lambda case: case.cached in ("1", "P-1", "P+1", "2P-1", "~1000"),
    "decode": lambda case: case.new_tokens == 1,
    "a prefill over several blocks": lambda case: case.new_tokens == 64,
    "importance": lambda case: case.importance,
}


# What chunk queries (sparse prefill) exercise, which the chunk cases should reach.
CHUNK_PATHS = {
    "a chunk of one query": lambda case: case.chunk_size == 1,
    "a chunk longer than the call": lambda case: case.chunk_size > case.new_tokens > 1,
    "several chunks in a call": lambda case: 1 < case.chunk_size < case.new_tokens,
    "every query scored alone": lambda case: case.chunk_pool == 1,
    "pooled rows": lambda case: 1 < case.chunk_pool < case.chunk_size,
    "one mean row per head": lambda case: case.chunk_pool >= case.chunk_size > 1,
    "exact, chunk and per-token queries in one call": lambda case: case.chunk == "three-quarters"
    and case.exact == "half" and case.new_tokens > 4,
    "the budget binds at chunk_top_k": lambda case: case.chunk_room == 0 and case.chunk_share == 1.0,
    "no window": lambda case: case.chunk_window == 0,
    "rows of different lengths": lambda case: case.batch > 1,
    "int8 caches": lambda case: case.int8,
    "int8 bounds": lambda case: case.int8_bounds,
    "float16 queries": lambda case: case.dtypes[0] == "float16",
    "query heads per KV head": lambda case: case.heads[0] > case.heads[1],
    "a cache longer than one exact tile": lambda case: case.cached == "~1000",
}
CHUNK_AXES = dict(chunk=("all", "three-quarters"), chunk_size=(1, 5, 16, 64), chunk_pool=(1, 2, 64),
                  chunk_window=(0, 1, 3), chunk_share=(0.0, 0.3, 1.0), chunk_room=(0, 9),
                  dtypes=DTYPES + INT8_DTYPES, bounds=BOUNDS, block_size=(4, 8, 16))
CHUNK_DRAWS = 8  # chunk cases


def _chunk_cases(rng, draws: int = 2000) -> list[Case]:
    """CHUNK_DRAWS bound-scored cases with chunk queries whose scores decide part of a selection, each
    the first of `draws` random ones within the budget to reach the most CHUNK_PATHS the earlier ones
    missed (int8 bounds only next to an int8-capable pair, as _int8_bounds_cases pairs them)."""
    axes = {**AXES, **CHUNK_AXES, "score": ("bound",), "importance": (False,), "new_tokens": (7, 64)}
    cases, missed = [], set(CHUNK_PATHS)
    for _ in range(CHUNK_DRAWS):
        best, reached = None, -1
        for _ in range(draws):
            choice = {axis: values[rng.integers(len(values))] for axis, values in axes.items()}
            if choice["bounds"] == "int8" and choice["dtypes"] not in INT8_BOUNDS_DTYPES:
                choice["bounds"] = "cache"
            case = Case(**choice)
            if case.body_cost() > BODY_BUDGET or not case.chunks_rank():
                continue
            gain = sum(CHUNK_PATHS[path](case) for path in missed)
            if gain > reached:
                best, reached = case, gain
        cases.append(best)
        missed = {path for path in missed if not CHUNK_PATHS[path](best)}
    return [_with_chunk_floor(case) if i % 2 else case for i, case in enumerate(cases)]


def _with_chunk_floor(case: Case) -> Case:
    """The case with a chunk_floor above its top_k, where scores still decide part of a selection
    (chosen after the draws, so that the draws and their data stay those of the cases before it)."""
    floored = dataclasses.replace(case, chunk_floor=case.k() + 3)
    return floored if floored.chunks_rank() else case


def _int8_cases(rng, draws: int = 1000) -> list[Case]:
    """One case per int8 cache dtype pair: of `draws` random ranking cases within the budget, the
    first that reaches the most INT8_PATHS the earlier int8 cases missed. Never score='probe': the
    probe reads float key caches only (its refusal of int8 is a bad input, tests/ops/test_bad_inputs.py)."""
    return _reaching_cases(rng, INT8_DTYPES, INT8_PATHS, draws)


def _int8_bounds_cases(rng, draws: int = 1000) -> list[Case]:
    """One int8-bound case per pair of INT8_BOUNDS_DTYPES, reaching INT8_BOUNDS_PATHS as _int8_cases
    does INT8_PATHS (never score='probe' either: it refuses int8 bounds)."""
    return _reaching_cases(rng, INT8_BOUNDS_DTYPES, INT8_BOUNDS_PATHS, draws, bounds="int8")


def _reaching_cases(rng, pairs, paths, draws: int, **fixed) -> list[Case]:
    """One case per dtype pair (with the `fixed` fields): of `draws` random bound-scored ranking cases
    within the budget, the first that reaches the most `paths` the earlier ones missed."""
    axes = {**AXES, "score": ("bound",)}
    cases, missed = [], set(paths)
    for dtypes in pairs:
        best, reached = None, -1
        for _ in range(draws):
            choice = {axis: values[rng.integers(len(values))] for axis, values in axes.items()}
            case = Case(**{**choice, "dtypes": dtypes, **fixed})
            if case.body_cost() > BODY_BUDGET or not case.ranks_blocks():
                continue
            gain = sum(paths[path](case) for path in missed)
            if gain > reached:
                best, reached = case, gain
        cases.append(best)
        missed = {path for path in missed if not paths[path](best)}
    return cases


def _draw(axes, rng, extra_cases) -> list[Case]:
    """Cases drawn from `axes` until every (axis, value) is covered, then `extra_cases` more."""
    uncovered = {(axis, value) for axis, values in axes.items() for value in values}
    cases: list[Case] = []
    extra = 0
    for attempt in range(200000):
        if not uncovered and extra >= extra_cases:
            break
        choice = {axis: values[rng.integers(len(values))] for axis, values in axes.items()}
        case = Case(**choice)
        if case.body_cost() > BODY_BUDGET:
            continue
        ranking = case.ranks_blocks()
        if (case.equal_scores or case.importance or case.score == "probe") and not ranking:
            continue  # ties and importance only matter when the ranking picks blocks
        gained = set(choice.items()) & uncovered
        if gained and (ranking or attempt > 50000):
            uncovered -= gained
            cases.append(case)
        elif not uncovered and ranking:
            cases.append(case)
            extra += 1
    assert not uncovered, f"axis values never covered within budget: {sorted(uncovered)}"
    return cases


CASES = _covering_cases()

# The hierarchical selection's edges (docs/ops.md, hierarchical selection), against the reference on
# every path: one superblock; a partial last superblock; K past the block count; candidates no
# more than the forced blocks' superblocks (every other block pruned); ties; each group reduction,
# float and int8 bounds, rows of different lengths, several queries, exact and chunk queries beside
# hierarchical ones. Non-finite bounds: the edge runs of tests/kernels and tests/ops (with_specials).
_HIERARCHY = dict(batch=1, heads=(14, 2), head_dim=64, block_size=4, cached="~1000", new_tokens=1, top_k="8", sink=1,
                  recent=1, reduce="none", importance=False, equal_scores=False, score="bound", num_probes=8,
                  dtypes=("float32", "float16"), exact="none", superblock_size=4, candidate_factor=2)
HIERARCHY_CASES = [
    Case(**{**_HIERARCHY, "cached": "P+1", "top_k": "1", "superblock_size": 64}),  # one superblock
    Case(**{**_HIERARCHY, "batch": 3, "new_tokens": 7, "superblock_size": 5}),  # partial last superblock
    Case(**{**_HIERARCHY, "top_k": "more than eligible"}),
    Case(**{**_HIERARCHY, "top_k": "3", "candidate_factor": 1, "new_tokens": 3}),  # only the forced superblocks
    Case(**{**_HIERARCHY, "heads": (9, 3), "equal_scores": True, "candidate_factor": 1}),
    Case(**{**_HIERARCHY, "heads": (8, 2), "head_dim": 128, "reduce": "mean", "importance": True, "sink": 2,
            "dtypes": ("float16", "float16")}),
    Case(**{**_HIERARCHY, "heads": (8, 2), "head_dim": 80, "reduce": "max", "new_tokens": 7, "exact": "half",
            "recent": 2, "superblock_size": 3, "dtypes": ("float32", "float32")}),
    Case(**{**_HIERARCHY, "batch": 3, "dtypes": ("float32", "float32"), "bounds": "int8", "new_tokens": 3}),
    Case(**{**_HIERARCHY, "heads": (4, 4), "reduce": "mean", "dtypes": ("float16", "float16"), "bounds": "int8"}),
    Case(**{**_HIERARCHY, "heads": (8, 2), "reduce": "max", "dtypes": ("float32", "int8"), "bounds": "int8"}),
    Case(**{**_HIERARCHY, "dtypes": ("float32", "int8"), "superblock_size": 8}),  # int8 caches, float16 bounds
    Case(**{**_HIERARCHY, "new_tokens": 64, "chunk": "three-quarters", "chunk_size": 16, "chunk_window": 3,
            "chunk_room": 9}),  # chunk rows stay flat
    # candidates near the superblocks' count: each head's best ranked without a floor (select_order.h best_ranked)
    Case(**{**_HIERARCHY, "candidate_factor": 8, "dtypes": ("float16", "float16")}),
]

# Rows of about 4000 tokens, for the selection paths no short case reaches: SIMD select scores four
# blocks at a time, and with every score known it skips the blocks below a floor
# (select_order.h collect_above_floor) once a row holds 8 x (K + forced blocks) eligible blocks.
# Geometries of the models (32/8, SmolLM2's 9/3, Qwen2.5's 14/2), P = 8 as the default export,
# and the options that change the procedure: importance, forced blocks, ties, several queries.
_LONG = dict(batch=1, cached=LONG_CACHED, new_tokens=1, block_size=8, sink=1, recent=1, reduce="none",
             importance=False, equal_scores=False, score="bound", num_probes=8, exact="none")
LONG_CASES = [
    Case(**{**_LONG, "heads": (32, 8), "head_dim": 128, "top_k": "32", "dtypes": ("float32", "float16")}),
    Case(**{**_LONG, "heads": (9, 3), "head_dim": 64, "top_k": "32", "dtypes": ("float32", "float32")}),
    Case(**{**_LONG, "heads": (14, 2), "head_dim": 64, "top_k": "8", "sink": 0, "recent": 2, "new_tokens": 7,
            "dtypes": ("float16", "float16")}),
    Case(**{**_LONG, "heads": (14, 2), "head_dim": 80, "top_k": "32", "importance": True,
            "dtypes": ("float32", "float16")}),
    Case(**{**_LONG, "batch": 3, "heads": (8, 2), "head_dim": 80, "block_size": 16, "top_k": "8", "sink": 2,
            "recent": 0, "reduce": "mean", "importance": True, "dtypes": ("float32", "float32")}),
    Case(**{**_LONG, "heads": (4, 4), "head_dim": 128, "top_k": "16", "reduce": "max", "equal_scores": True,
            "dtypes": ("float32", "float16")}),
    Case(**{**_LONG, "batch": 3, "heads": (32, 8), "head_dim": 128, "top_k": "32", "new_tokens": 3,
            "dtypes": ("float16", "float16")}),
    # Groups of two (the default Qwen3's) and three, flat: the rows left after the fours scored
    # together (row_bounds), with a partial last chunk at D = 80.
    Case(**{**_LONG, "heads": (16, 8), "head_dim": 128, "top_k": "32", "new_tokens": 3, "dtypes": ("float32", "float16")}),
    Case(**{**_LONG, "heads": (6, 3), "head_dim": 80, "top_k": "8", "dtypes": ("float16", "float16")}),
    Case(**{**_LONG, "heads": (6, 2), "head_dim": 80, "top_k": "16", "reduce": "max", "dtypes": ("float32", "float32")}),
    # Chunk queries over long rows: a chunk's many scoring rows in tiles of four against four blocks
    # (float bounds on AVX-512; int8 bounds' integer tiles: the chunk cases of CASES).
    Case(**{**_LONG, "heads": (16, 8), "head_dim": 128, "top_k": "32", "new_tokens": 64, "chunk": "all",
            "chunk_size": 16, "chunk_window": 3, "chunk_share": 0.3, "chunk_room": 200,
            "dtypes": ("float32", "float16")}),
    Case(**{**_LONG, "heads": (14, 2), "head_dim": 64, "top_k": "8", "new_tokens": 64, "chunk": "three-quarters",
            "chunk_size": 64, "chunk_pool": 3, "chunk_window": 1, "chunk_share": 0.1, "chunk_room": 200,
            "dtypes": ("float16", "float16")}),
    # Hierarchical selection over long rows: candidates of whole tiles of four blocks and more.
    Case(**{**_LONG, "heads": (16, 8), "head_dim": 128, "top_k": "16", "superblock_size": 8, "candidate_factor": 4,
            "dtypes": ("float32", "float16")}),
    Case(**{**_LONG, "heads": (14, 2), "head_dim": 64, "top_k": "8", "new_tokens": 3, "superblock_size": 6,
            "candidate_factor": 3, "bounds": "int8", "dtypes": ("float16", "float16")}),
    Case(**{**_LONG, "heads": (9, 3), "head_dim": 64, "top_k": "8", "reduce": "max", "superblock_size": 8,
            "candidate_factor": 2, "dtypes": ("float32", "float32")}),
]


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


@dataclasses.dataclass
class CaseData:
    """Arrays of one case: the cache state before the call and the call's new tokens."""

    case: Case
    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    key_cache: np.ndarray
    value_cache: np.ndarray
    block_max: np.ndarray  # metadata before the call (cached keys only; other blocks garbage)
    block_min: np.ndarray
    past_lens: np.ndarray
    total_lens: np.ndarray | None
    block_importance: np.ndarray | None
    exact_lens: np.ndarray | None
    key_scale: np.ndarray | None = None  # int8 caches: each row's float16 scale [B, N, C]
    chunk_lens: np.ndarray | None = None  # chunk cases: positions below which queries select per chunk
    value_scale: np.ndarray | None = None
    block_exponent: np.ndarray | None = None  # int8 bounds: each block's exponent [B, N, M], before the call


def make_data(case: Case, seed: int = 0) -> CaseData:
    rng = np.random.default_rng(seed)
    H, N = case.heads
    B, S, D, C, M = case.batch, case.new_tokens, case.head_dim, case.capacity(), case.num_blocks()
    act, bounds = np.dtype(case.dtypes[0]), case.bounds_dtype()
    # An int8 cache's rows are drawn as float32 and quantized (the same draws as a float cache's).
    drawn = np.dtype(np.float32 if case.int8 else case.dtypes[1])
    past = case.past_lens()
    key_cache = _normal(rng, (B, N, C, D), drawn)
    value_cache = _normal(rng, (B, N, C, D), drawn)
    key = _normal(rng, (B, N, S, D), act)
    if case.equal_scores:  # every key the same vector: every block bound ties
        row = _normal(rng, (D,), np.float32)
        key_cache[:] = row.astype(drawn)
        key[:] = row.astype(act)
    scales = {}
    if case.int8:
        key_cache, scales["key_scale"] = quantize_rows(key_cache)
        value_cache, scales["value_scale"] = quantize_rows(value_cache)
    # Metadata of the cached keys (as the cache holds them), built by the reference as a prefill
    # would; unused blocks garbage (int8 bounds: any codes, exponents of every kind but 127).
    if case.int8_bounds:
        garbage = rng.integers(-128, 128, (B, N, M, D), dtype=np.int8)
        exponent = {"block_exponent": rng.integers(-128, NON_FINITE, (B, N, M), dtype=np.int8)}
    else:
        garbage, exponent = _normal(rng, (B, N, M, D), bounds), {}
    held = dequantize_rows(key_cache, scales["key_scale"]) if case.int8 else key_cache
    cached = held[:, :, : max(int(past.max()), 1)]
    block_max, block_min, *made = quest_metadata(
        cached, garbage, garbage.copy(), np.zeros(B, np.int32), past, block_size=case.block_size, **exponent
    )
    importance = None
    if case.importance:
        importance = np.round(rng.random((B, N, M)), 1).astype(np.float32)  # ties on purpose
        importance[0, 0, min(1, M - 1)] = np.nan  # NaN ranks lowest
    return CaseData(
        case=case,
        query=_normal(rng, (B, H, S, D), act),
        key=key,
        value=_normal(rng, (B, N, S, D), act),
        key_cache=key_cache,
        value_cache=value_cache,
        block_max=block_max,
        block_min=block_min,
        past_lens=past,
        total_lens=case.total_lens(),
        block_importance=importance,
        exact_lens=case.exact_lens(),
        chunk_lens=case.chunk_lens(),
        **scales,
        block_exponent=made[0] if made else None,
    )


def metadata_args(data: CaseData) -> tuple[dict, dict]:
    """The new keys into the bounds; next to int8 caches, each key as the int8 cache will hold it."""
    inputs = dict(key=data.key, block_max=data.block_max, block_min=data.block_min,
                  past_lens=data.past_lens, total_lens=data.total_lens, block_exponent=data.block_exponent)
    int8 = dict(key_cache_type="int8") if data.case.int8 else {}
    return inputs, dict(block_size=data.case.block_size, **int8)


def select_attributes(case: Case) -> dict:
    H, N = case.heads
    return dict(num_heads=H, kv_num_heads=N, block_size=case.block_size, top_k=case.k(),
                sink_blocks=case.sink, recent_blocks=case.recent, group_reduce=case.reduce,
                importance_fraction=0.5 if case.importance else 0.0, score=case.score,
                num_probes=case.num_probes, **case.chunk_attributes(), **case.superblock_attributes())


def select_args(data: CaseData) -> tuple[dict, dict]:
    """Select runs on the metadata after this call's update, as in a layer."""
    inputs, attributes = metadata_args(data)
    block_max, block_min, *exponent = quest_metadata(**inputs, **attributes)
    probe = data.case.score == "probe"
    return (
        dict(query=data.query, block_max=block_max, block_min=block_min, past_lens=data.past_lens,
             total_lens=data.total_lens, block_importance=data.block_importance,
             key_cache=data.key_cache if probe else None, key=data.key if probe else None,
             exact_lens=data.exact_lens, block_exponent=exponent[0] if exponent else None,
             **({} if data.chunk_lens is None else {"chunk_lens": data.chunk_lens}),
             **(superblock_inputs(data) if data.case.superblock_size else {})),
        select_attributes(data.case),
    )


def superblock_inputs(data: CaseData) -> dict:
    """super_max, super_min (and super_exponent with int8 bounds) after this call's update: QuestMetadata's
    at block size P * U, over the cached keys (as make_data builds the blocks') and then the new ones."""
    case = data.case
    rng = np.random.default_rng(5)
    B, N, D = data.key_cache.shape[0], data.key_cache.shape[1], case.head_dim
    shape = (B, N, case.num_superblocks(), D)
    if case.int8_bounds:
        garbage = rng.integers(-128, 128, shape, dtype=np.int8)
        exponent = {"block_exponent": rng.integers(-128, NON_FINITE, shape[:3], dtype=np.int8)}
    else:
        garbage, exponent = _normal(rng, shape, case.bounds_dtype()), {}
    held = dequantize_rows(data.key_cache, data.key_scale) if case.int8 else data.key_cache
    size = case.block_size * case.superblock_size
    past = data.past_lens
    top, bottom, *made = quest_metadata(held[:, :, : max(int(past.max()), 1)], garbage, garbage.copy(),
                                        np.zeros(B, np.int32), past, block_size=size, **exponent)
    inputs, attributes = metadata_args(data)
    inputs = dict(inputs, block_max=top, block_min=bottom, block_exponent=made[0] if made else None)
    top, bottom, *made = quest_metadata(**inputs, **dict(attributes, block_size=size))
    return dict(super_max=top, super_min=bottom, super_exponent=made[0] if made else None)

def attention_args(data: CaseData, sparse: bool = True) -> tuple[dict, dict]:
    """Attention over the reference selection (sparse: chunk cases with their chunks' selections too)
    or dense causal."""
    indices = chunks = None
    if sparse:
        inputs, attributes = select_args(data)
        indices = sparse_block_select(**inputs, **attributes)
        if data.chunk_lens is not None:
            indices, chunks = indices
    H, N = data.case.heads
    chunk_inputs = {} if chunks is None else dict(chunk_indices=chunks, chunk_lens=data.chunk_lens)
    chunk_size = {} if chunks is None else dict(chunk_size=data.case.chunk_size)
    return (
        dict(query=data.query, key=data.key, value=data.value, key_cache=data.key_cache,
             value_cache=data.value_cache, past_lens=data.past_lens, block_indices=indices,
             total_lens=data.total_lens, exact_lens=data.exact_lens, key_scale=data.key_scale,
             value_scale=data.value_scale, **chunk_inputs),
        dict(num_heads=H, kv_num_heads=N, block_size=data.case.block_size, **chunk_size),
    )


# Every call the conformance cases drive: (op, its arguments from a case's data); the schema coverage
# test requires every op here. Dense causal attention is a call of its own: its prefill takes
# another path (query tiles) than the sparse one.
CALLS = {
    "QuestMetadata": ("QuestMetadata", metadata_args),
    "SparseBlockSelect": ("SparseBlockSelect", select_args),
    "SparseBlockAttention": ("SparseBlockAttention", attention_args),
    "SparseBlockAttention-dense": ("SparseBlockAttention", functools.partial(attention_args, sparse=False)),
}


# Numbers at and past the edges: NaN of either sign, infinities, signed zeros, float32 and float16
# subnormals, float16's largest value and values that overflow it (a float16 cache stores them as inf).
SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3e-8, 65504.0, -65504.0, 7e4, -7e4],
                    np.float64)
# An int8 cache's specials are its row scales at their edges, the scales rows can get: NaN (a row
# with a non-finite value, or past 127 * 65504; 0x7E00), 0 (a zero row), float16's least
# subnormal and its largest value. (Its int8 values are all plain numbers.)
SCALE_SPECIALS = np.array([NAN_SCALE, 0.0, 2.0**-24, 65504.0], np.float16)
SCALES = ("key_scale", "value_scale")
# int8 bounds' specials: exponents whose 2^e is subnormal (-128, -127), the least QuestMetadata
# writes, 0, the largest float16 keys give (10), the largest any finite bound gives (122), the
# largest finite 2^e (126, where codes past 1 overflow) and the non-finite block's 127; and codes at
# the int8 range's ends, -128 included, which QuestMetadata never writes but an input may hold.
EXPONENT_SPECIALS = np.array([-128, -127, LOWEST, 0, 10, 122, 126, NON_FINITE], np.int8)
CODE_SPECIALS = np.array([-128, -127, -1, 0, 1, 127], np.int8)
INT8_SPECIALS = {"block_exponent": EXPONENT_SPECIALS, "block_max": CODE_SPECIALS, "block_min": CODE_SPECIALS,
                 "super_exponent": EXPONENT_SPECIALS, "super_max": CODE_SPECIALS, "super_min": CODE_SPECIALS}


def sprinkle_specials(array, rng, fraction=0.003, specials=SPECIALS):
    """Replaces about `fraction` of the elements (at least one) with `specials`, in place."""
    flat = array.reshape(-1)
    assert np.shares_memory(flat, array), "sprinkle_specials needs a contiguous array"
    if flat.size == 0:
        return
    hits = np.unique(np.concatenate([rng.integers(0, flat.size, 1), np.flatnonzero(rng.random(flat.size) < fraction)]))
    with np.errstate(over="ignore"):
        flat[hits] = rng.choice(specials, hits.size).astype(np.float32).astype(array.dtype)


def with_specials(inputs: dict, seed: int = 11) -> dict:
    """The inputs with about 0.3% (at least one) of each floating array's elements replaced by
    SPECIALS, of an int8 cache's scales by SCALE_SPECIALS, of int8 bounds' codes and exponents by
    INT8_SPECIALS (block_importance aside: it is not a number the model makes; an int8 cache's
    values are all plain numbers)."""
    rng = np.random.default_rng(seed)
    out = dict(inputs)
    for name, array in inputs.items():
        if not isinstance(array, np.ndarray) or name == "block_importance":
            continue
        if array.dtype.kind == "f":
            out[name] = array.copy()
            sprinkle_specials(out[name], rng, specials=SCALE_SPECIALS if name in SCALES else SPECIALS)
        elif array.dtype == np.int8 and name in INT8_SPECIALS:
            out[name] = array.copy()
            sprinkle_specials(out[name], rng, specials=INT8_SPECIALS[name])
    return out
