"""The single source of truth for every Quest operator: inputs, outputs, dims, attributes, types.

This module is plain Python (no onnx import) so that the C++ build can read it too:
`ops/schema_codegen.py` turns it into the header the ORT adapter validates against, and
`ops/registry.py` turns it into `onnx.defs` schemas for the checker and shape inference.

Dims are named by symbols. A symbol is bound by the first input that has it (or by an attribute,
see `OpSpec.symbol_attrs`); every later use must agree. `OpSpec.derived` defines symbols computed
from others (products and ceiling divisions), used only by outputs.

Adding an op touches exactly: this file, `reference/<op>.py`, `graphs/bodies/<op>.py`,
`csrc/kernels/<op>.h` + `csrc/kernels/scalar/<op>.cc`, `csrc/ort/<op>_op.cc`, the conformance
cases in `tests/support/cases.py`. `tests/ops/test_schemas.py` fails until all of them exist.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

DOMAIN = "quest"
VERSION = 1

# Element types. "T" is the activation type (query, key, value, output), "TC" the storage type of
# an op's caches or block bounds; they need not be equal. T ranges over FLOAT_TYPES; TC over the
# op's `cache_types` (FLOAT_TYPES, and int8: SparseBlockAttention's quantized caches, the other ops'
# int8 block bounds, which come with a per-block exponent).
FLOAT_TYPES = ("float32", "float16")
CACHE_TYPES = (*FLOAT_TYPES, "int8")
TYPE_VARS = {"T": FLOAT_TYPES, "TC": CACHE_TYPES}  # the widest ranges; OpSpec.type_vars() per op

ElemType = Literal["T", "TC", "int32", "int8", "float32", "float16"]


@dataclasses.dataclass(frozen=True)
class Tensor:
    name: str
    elem: ElemType
    dims: tuple[str, ...]
    doc: str
    optional: bool = False


INT32_MAX = 2**31 - 1  # the largest value an ONNX int attribute the kernels take may hold


@dataclasses.dataclass(frozen=True)
class Attribute:
    name: str
    kind: Literal["int", "float", "string"]
    doc: str
    default: int | float | str | None = None  # None: required
    choices: tuple[str, ...] = ()  # allowed values of a string attribute
    minimum: float | None = None  # inclusive lower bound of a numeric attribute
    maximum: float | None = None  # inclusive upper bound of a numeric attribute

    @property
    def required(self) -> bool:
        return self.default is None

    def range_problem(self, value) -> str | None:
        """Why `value` is out of this numeric attribute's range (an int attribute also within
        int32, a float one a number), or None."""
        integer = self.kind == "int"
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            return f"must be {'an integer' if integer else 'a number'}, got {value!r}"
        low = self.minimum
        high = self.maximum if self.maximum is not None else (INT32_MAX if integer else float("inf"))
        if integer:
            low, high = int(low), int(high)
        if not low <= value <= high:  # NaN fails too
            return f"must lie in [{low}, {high}], got {value!r}"
        return None


@dataclasses.dataclass(frozen=True)
class Derived:
    """A dim symbol computed from two others: `mul` (a*b), `ceil_div` (ceil(a/b)), or `pick`:
    b when the string attribute when[0] equals when[1], else a."""

    name: str
    op: Literal["mul", "ceil_div", "pick"]
    a: str
    b: str
    when: tuple[str, str] | None = None  # (attribute, value), for `pick`

    def value(self, dims: dict, attributes: dict):
        """The symbol's value from known dims (and, for `pick`, the op's attributes); None if unknown."""
        if self.op == "pick":
            return dims.get(self.b if attributes.get(self.when[0]) == self.when[1] else self.a)
        a, b = dims.get(self.a), dims.get(self.b)
        if not (isinstance(a, int) and isinstance(b, int) and b > 0):
            return None
        return a * b if self.op == "mul" else -(-a // b)

    def describe(self) -> str:
        if self.op == "pick":
            return f"{self.name} = {self.b} when {self.when[0]} is '{self.when[1]}', else {self.a}"
        return f"{self.name} = {self.a}*{self.b}" if self.op == "mul" else f"{self.name} = ceil({self.a}/{self.b})"


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    doc: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    attributes: tuple[Attribute, ...]
    symbol_attrs: dict[str, str] = dataclasses.field(default_factory=dict)
    derived: tuple[Derived, ...] = ()
    cache_types: tuple[str, ...] = FLOAT_TYPES  # what TC may be for this op

    def type_vars(self) -> dict[str, tuple[str, ...]]:
        """The element types each type variable of this op ranges over."""
        return {"T": FLOAT_TYPES, "TC": self.cache_types}

    def input_index(self, name: str) -> int:
        return [t.name for t in self.inputs].index(name)

    def output_index(self, name: str) -> int:
        return [t.name for t in self.outputs].index(name)

    def attribute(self, name: str) -> Attribute:
        return next(a for a in self.attributes if a.name == name)

    def defaults(self) -> dict[str, int | float | str]:
        return {a.name: a.default for a in self.attributes if not a.required}


_PAST_LENS = Tensor("past_lens", "int32", ("B",), "tokens already cached in each row before this call")
_TOTAL_LENS = Tensor(
    "total_lens",
    "int32",
    ("B",),
    "valid tokens of each row after this call; default past_lens + S, smaller for padded rows",
    optional=True,
)
_EXACT_LENS = Tensor(
    "exact_lens",
    "int32",
    ("B",),
    "queries at positions below it attend exactly (every position up to their own); default 0, none",
    optional=True,
)
_CHUNK_LENS = Tensor(
    "chunk_lens",
    "int32",
    ("B",),
    "queries at positions below it, and not below exact_lens, attend to the blocks their chunk of chunk_size "
    "queries selected (sparse prefill); default 0, none",
    optional=True,
)
_CHUNK_SIZE = Attribute("chunk_size", "int", "queries per prefill chunk Q: a call's queries [c*Q, c*Q + Q) share a "
                        "selection (chunk_lens)", default=64, minimum=1)
_HEADS = (
    Attribute("num_heads", "int", "query heads H", minimum=1),
    Attribute("kv_num_heads", "int", "KV heads N; num_heads must be a multiple", minimum=1),
)
_BLOCK_SIZE = Attribute("block_size", "int", "tokens per metadata block P", minimum=1)
_BLOCK_EXPONENT = Tensor("block_exponent", "int8", ("B", "N", "M"),
                         "per-block power of two of int8 bounds: a bound is code * 2^e (int8 bounds only)", optional=True)

QUEST_METADATA = OpSpec(
    name="QuestMetadata",
    doc=(
        "Update the per-block channel-wise max and min of the keys with this call's new keys. "
        "Block p // P is set to the key of token p when p % P == 0, else merged element-wise."
    ),
    inputs=(
        Tensor("key", "T", ("B", "N", "S", "D"), "new keys, after RoPE and k-norm"),
        Tensor("block_max", "TC", ("B", "N", "M", "D"), "per-block channel max so far"),
        Tensor("block_min", "TC", ("B", "N", "M", "D"), "per-block channel min so far"),
        _PAST_LENS,
        _TOTAL_LENS,
        _BLOCK_EXPONENT,
    ),
    outputs=(
        Tensor("block_max_out", "TC", ("B", "N", "M", "D"), "updated block max (may alias block_max)"),
        Tensor("block_min_out", "TC", ("B", "N", "M", "D"), "updated block min (may alias block_min)"),
        Tensor("block_exponent_out", "int8", ("B", "N", "M"),
               "updated block exponents (int8 bounds only; may alias block_exponent)", optional=True),
    ),
    attributes=(
        _BLOCK_SIZE,
        Attribute(
            "key_cache_type",
            "string",
            "the key cache the bounds must hold: 'float' (float32 or float16), or 'int8': each key as "
            "SparseBlockAttention's int8 cache stores it (quantized per row, dequantized exactly)",
            default="float",
            choices=("float", "int8"),
        ),
    ),
    symbol_attrs={"P": "block_size"},
    cache_types=CACHE_TYPES,
)

SPARSE_BLOCK_SELECT = OpSpec(
    name="SparseBlockSelect",
    doc=(
        "Pick, for every KV head (or, with group_reduce='none', every query head) and query position, "
        "the top_k blocks by the Quest upper bound sum_d max(q_d*kmax_d, q_d*kmin_d), after the forced "
        "recent and sink blocks and the importance reservation. Output ascending, padded with -1; "
        "all -1 for queries that attend exactly (positions below exact_lens)."
    ),
    inputs=(
        Tensor("query", "T", ("B", "H", "S", "D"), "queries, after RoPE and q-norm"),
        Tensor("block_max", "TC", ("B", "N", "M", "D"), "per-block channel max (QuestMetadata output)"),
        Tensor("block_min", "TC", ("B", "N", "M", "D"), "per-block channel min (QuestMetadata output)"),
        _PAST_LENS,
        _TOTAL_LENS,
        Tensor(
            "block_importance",
            "float32",
            ("B", "N", "M"),
            "optional per-block importance (e.g. prefill attention mass)",
            optional=True,
        ),
        Tensor("key_cache", "TC", ("B", "N", "C", "D"), "the key cache before this call (score='probe')", optional=True),
        Tensor("key", "T", ("B", "N", "S", "D"), "this call's new keys (score='probe')", optional=True),
        _EXACT_LENS,
        _BLOCK_EXPONENT,
        _CHUNK_LENS,
        Tensor("super_max", "TC", ("B", "N", "MS", "D"),
               "per-superblock channel max: QuestMetadata's at block size P * U (hierarchical selection)",
               optional=True),
        Tensor("super_min", "TC", ("B", "N", "MS", "D"),
               "per-superblock channel min: QuestMetadata's at block size P * U (with super_max)", optional=True),
        Tensor("super_exponent", "int8", ("B", "N", "MS"),
               "per-superblock power of two of int8 superblock bounds (int8 bounds with super_max only)",
               optional=True),
    ),
    outputs=(
        Tensor("block_indices", "int32", ("B", "R", "S", "K"),
               "selected blocks, ascending, -1 padded; R = H with group_reduce='none', else N"),
        Tensor("chunk_indices", "int32", ("B", "N", "NC", "KC"),
               "blocks each chunk of queries selected (queries below chunk_lens), ascending, -1 padded",
               optional=True),
    ),
    attributes=(
        *_HEADS,
        _BLOCK_SIZE,
        Attribute("top_k", "int", "selection budget K in blocks", minimum=1),
        Attribute("sink_blocks", "int", "leading blocks always selected", default=1, minimum=0),
        Attribute(
            "recent_blocks",
            "int",
            "blocks ending at the query's own block that are always selected",
            default=1,
            minimum=0,
        ),
        Attribute(
            "group_reduce",
            "string",
            "'mean': score once with the mean query of the G heads; 'max': max of each head's bound; "
            "'none': every query head selects its own blocks (its own bound, R = H rows of output)",
            default="mean",
            choices=("mean", "max", "none"),
        ),
        Attribute(
            "importance_fraction",
            "float",
            "share of the non-forced budget chosen by block_importance when it is given",
            default=0.0,
            minimum=0.0,
            maximum=1.0,
        ),
        Attribute(
            "score",
            "string",
            "'bound': the Quest upper bound from block_max/min; 'probe': the max dot product with "
            "num_probes evenly spaced keys of the block (needs key_cache and key)",
            default="bound",
            choices=("bound", "probe"),
        ),
        Attribute("num_probes", "int", "keys sampled per block by score='probe'", default=8, minimum=1),
        _CHUNK_SIZE,
        Attribute("chunk_top_k", "int", "most blocks a chunk's selection lists KC, its forced blocks included",
                  default=1024, minimum=1),
        Attribute("chunk_share", "float", "share of a chunk's candidate blocks it selects by score (at least "
                  "top_k and chunk_floor, at most what chunk_top_k leaves)", default=0.0625, minimum=0.0, maximum=1.0),
        Attribute("chunk_floor", "int", "fewest of a chunk's candidate blocks it selects by score, with top_k (the "
                  "larger of the two counts)", default=64, minimum=0),
        Attribute("chunk_window", "int", "blocks before a chunk's first block that it always lists",
                  default=64, minimum=0),
        Attribute("chunk_sink", "int", "leading blocks every chunk lists (a prompt's instructions; decode's are "
                  "sink_blocks)", default=16, minimum=0),
        Attribute("chunk_pool", "int", "consecutive queries of a chunk averaged into one scoring row per head",
                  default=16, minimum=1),
        Attribute("superblock_size", "int", "blocks per superblock U of super_max/super_min", default=16, minimum=1),
        Attribute("candidate_factor", "int", "with super_max: a query ranks blocks of candidate_factor * top_k "
                  "blocks' worth of superblocks, chosen by superblock score (approximate past that many)",
                  default=16, minimum=1),
    ),
    symbol_attrs={"H": "num_heads", "N": "kv_num_heads", "P": "block_size", "K": "top_k", "Q": "chunk_size",
                  "KC": "chunk_top_k", "U": "superblock_size"},
    derived=(Derived("R", "pick", "N", "H", when=("group_reduce", "none")), Derived("NC", "ceil_div", "S", "Q"),
             Derived("MS", "ceil_div", "M", "U")),
    cache_types=CACHE_TYPES,
)

SPARSE_BLOCK_ATTENTION = OpSpec(
    name="SparseBlockAttention",
    doc=(
        "Write the new keys and values into the caches at their positions, then let every valid "
        "query attend causally to the cache positions of its selected blocks, or to every position up "
        "to its own when it attends exactly (block_indices absent, or its position below exact_lens). "
        "Softmax in float32 over exactly the attended set."
    ),
    inputs=(
        Tensor("query", "T", ("B", "H", "S", "D"), "queries, after RoPE and q-norm"),
        Tensor("key", "T", ("B", "N", "S", "D"), "new keys, after RoPE and k-norm"),
        Tensor("value", "T", ("B", "N", "S", "D"), "new values"),
        Tensor("key_cache", "TC", ("B", "N", "C", "D"), "key cache at capacity C"),
        Tensor("value_cache", "TC", ("B", "N", "C", "D"), "value cache at capacity C"),
        _PAST_LENS,
        Tensor(
            "block_indices",
            "int32",
            ("B", "R", "S", "K"),
            "blocks each query may attend (SparseBlockSelect output): R = N, shared by a KV head's G query "
            "heads, or R = H, each query head its own; absent: every query attends exactly",
            optional=True,
        ),
        _TOTAL_LENS,
        _EXACT_LENS,
        Tensor("key_scale", "float16", ("B", "N", "C"), "per-row scales of an int8 key cache (int8 only)", optional=True),
        Tensor("value_scale", "float16", ("B", "N", "C"), "per-row scales of an int8 value cache (int8 only)",
               optional=True),
        Tensor("chunk_indices", "int32", ("B", "N", "NC", "KC"),
               "blocks each chunk of chunk_size queries attends (SparseBlockSelect output), shared by a KV head's "
               "G query heads: NC = ceil(S / chunk_size); needs chunk_lens", optional=True),
        _CHUNK_LENS,
    ),
    outputs=(
        Tensor("output", "T", ("B", "S", "HD"), "attention output, heads concatenated"),
        Tensor("key_cache_out", "TC", ("B", "N", "C", "D"), "key cache with the new keys (may alias)"),
        Tensor("value_cache_out", "TC", ("B", "N", "C", "D"), "value cache with the new values (may alias)"),
        Tensor(
            "block_importance",
            "float32",
            ("B", "N", "MC"),
            "attention mass per cache block, summed over valid queries and the G heads",
            optional=True,
        ),
        Tensor("key_scale_out", "float16", ("B", "N", "C"), "key_scale with the new rows' scales (int8 only; may alias)",
               optional=True),
        Tensor("value_scale_out", "float16", ("B", "N", "C"),
               "value_scale with the new rows' scales (int8 only; may alias)", optional=True),
    ),
    attributes=(
        *_HEADS,
        _BLOCK_SIZE,
        Attribute("scale", "float", "logit scale; 0 means 1/sqrt(D)", default=0.0, minimum=0.0),
        Attribute("softcap", "float", "logit soft cap c: c*tanh(x/c); 0 means off", default=0.0, minimum=0.0),
        _CHUNK_SIZE,
    ),
    symbol_attrs={"H": "num_heads", "N": "kv_num_heads", "P": "block_size", "Q": "chunk_size"},
    derived=(Derived("HD", "mul", "H", "D"), Derived("MC", "ceil_div", "C", "P")),
    cache_types=CACHE_TYPES,
)

ALL_OPS: tuple[OpSpec, ...] = (QUEST_METADATA, SPARSE_BLOCK_SELECT, SPARSE_BLOCK_ATTENTION)
OPS_BY_NAME = {op.name: op for op in ALL_OPS}
