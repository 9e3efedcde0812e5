"""What every attention rewrite rule shares: new model inputs, the Quest node emitter, failure records.

The inputs the rewrite adds, the per-layer emitter of Quest nodes, and the record of why layers
failed to match (the settings are model_folder/settings.py's).
"""

from __future__ import annotations

import collections
import dataclasses

import onnx_ir as ir

from ...model_folder.settings import Geometry, SparseSettings, default_bounds_dtype
from ...ops.schemas import DOMAIN, INT32_MAX

# Activation types (a source's caches hold one of them); KV caches may also be int8 (the Quest ops' own format).
IR_TYPES = {"float32": ir.DataType.FLOAT, "float16": ir.DataType.FLOAT16}
KV_IR_TYPES = {**IR_TYPES, "int8": ir.DataType.INT8}


def input_value(name: str, dtype: ir.DataType, shape: list) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))


class RewriteContext:
    """Inputs and bookkeeping for rewriting one model's attention layers.

    The graph inputs created here (past_lens, total_lens, block metadata) are added to the graph by
    the I/O pass once every layer has been rewritten.
    """

    def __init__(self, settings: SparseSettings, geometry: Geometry, batch_dim: str = "batch_size",
                 graph: ir.Graph | None = None, key_factors: dict | None = None):
        self.graph = graph
        self.settings = settings
        self.geometry = geometry
        self.batch_dim = batch_dim
        self.activation_type = IR_TYPES[geometry.activation_dtype]
        self.kv_dtype = KV_IR_TYPES[settings.kv_dtype or geometry.activation_dtype]
        self.int8 = self.kv_dtype == ir.DataType.INT8
        probe = settings.score == "probe"
        kv_name = settings.kv_dtype or geometry.activation_dtype
        self.bounds_dtype = KV_IR_TYPES[settings.bounds_dtype or default_bounds_dtype(kv_name, settings.score)]
        if settings.bounds_dtype is not None:
            if probe and self.bounds_dtype != self.kv_dtype:
                raise ValueError(f"score='probe' reads the key cache ({self.kv_dtype.name.lower()}) and the block "
                                 f"bounds as one type; bounds_dtype {settings.bounds_dtype!r} differs")
        if probe and self.bounds_dtype == ir.DataType.INT8:
            raise ValueError("score='probe' reads a float key cache and float block bounds; int8 caches select by "
                             "the bound (--score bound)")
        # int8 bounds: a per-block exponent [B, N, M] next to them (docs/ops.md, int8 block bounds).
        self.int8_bounds = self.bounds_dtype == ir.DataType.INT8
        self.past_lens = input_value("past_lens", ir.DataType.INT32, [batch_dim])
        self.total_lens = input_value("total_lens", ir.DataType.INT32, [batch_dim])
        # Queries below exact_lens attend exactly (the runtime's prompt steps), the rest below chunk_lens
        # select per chunk (a sparse prefill's), the others per token (decode).
        self.exact_lens = input_value("exact_lens", ir.DataType.INT32, [batch_dim])
        self.chunk_lens = input_value("chunk_lens", ir.DataType.INT32, [batch_dim])
        N, D = geometry.kv_num_heads, geometry.head_dim
        self.block_max: dict[int, ir.Value] = {}
        self.block_min: dict[int, ir.Value] = {}
        self.block_importance: dict[int, ir.Value] = {}
        self.block_exponent: dict[int, ir.Value] = {}
        # The hierarchical selection's superblock bounds [B, N, MS, D] (and int8 exponents [B, N, MS]).
        self.superblock_size = settings.superblocks
        self.super_max: dict[int, ir.Value] = {}
        self.super_min: dict[int, ir.Value] = {}
        self.super_exponent: dict[int, ir.Value] = {}
        self.super_outputs: dict[int, tuple] = {}
        for layer in self.sparse_layers():
            if self.superblock_size:
                supers = [batch_dim, N, "num_superblocks", D]
                self.super_max[layer] = input_value(f"past_super_max.{layer}", self.bounds_dtype, supers)
                self.super_min[layer] = input_value(f"past_super_min.{layer}", self.bounds_dtype, supers)
                if self.int8_bounds:
                    self.super_exponent[layer] = input_value(f"past_super_exponent.{layer}", ir.DataType.INT8,
                                                             supers[:3])
        for layer in self.sparse_layers():
            shape = [batch_dim, N, "num_blocks", D]
            self.block_max[layer] = input_value(f"past_block_max.{layer}", self.bounds_dtype, shape)
            self.block_min[layer] = input_value(f"past_block_min.{layer}", self.bounds_dtype, shape)
            if self.int8_bounds:
                self.block_exponent[layer] = input_value(f"past_block_exponent.{layer}", ir.DataType.INT8, shape[:3])
            if settings.importance:
                self.block_importance[layer] = input_value(
                    f"past_block_importance.{layer}", ir.DataType.FLOAT, [batch_dim, N, "num_blocks"])
        # int8 caches: each layer's row scales [B, N, C] float16, in and out.
        self.key_scale: dict[int, ir.Value] = {}
        self.value_scale: dict[int, ir.Value] = {}
        self.scale_outputs: dict[int, tuple[ir.Value, ir.Value]] = {}
        if self.int8:
            for layer in range(geometry.num_layers):
                for role, values in (("key", self.key_scale), ("value", self.value_scale)):
                    values[layer] = input_value(f"past_{role}_scale.{layer}", ir.DataType.FLOAT16,
                                                [batch_dim, N, "capacity"])
        # int8 caches: layer -> key channel factors [N, D] (pipeline/calibrate.py); keys enter the ops divided
        # by them, queries multiplied.
        self.key_factors = dict(key_factors or {}) if self.int8 else {}
        self.rewritten: dict[int, str] = {}  # layer -> rule name
        self.cache_inputs: dict[int, int] = {}  # id(past key or value input) -> layer
        self.positions: ir.Value | None = None  # [B, S] int64 past_lens + i, for rules that apply RoPE
        self.probe = None  # probe.SourceProbe of the graph before the rewrite, set by rewrite_attention
        self._gqa_lengths = None  # (seqlens_k, total_sequence_length), shared by the GQA layers
        self.failures: dict[int, list[str]] = collections.defaultdict(list)
        self.metadata_outputs: dict[int, tuple[ir.Value, ...]] = {}  # max, min (and exponent: int8 bounds)
        self.importance_outputs: dict[int, ir.Value] = {}
        # layer -> ((old present key, new key cache), (old present value, new value cache))
        self.replaced_presents: dict[int, tuple] = {}

    def layer_of(self, past: ir.Value | None) -> int | None:
        return None if past is None else self.cache_inputs.get(id(past))

    def sparse_layers(self) -> list[int]:
        if self.settings.attention != "quest":
            return []
        return [i for i in range(self.geometry.num_layers) if i not in self.settings.dense_layers]

    def exported_settings(self) -> SparseSettings:
        """The settings as this rewrite exports them, every choice left to a default resolved: the
        cache and bound types, key smoothing (int8 caches only), the dense layers (those the model
        has), whether the sparse layers carry block importance. The one value the folder records."""
        kv = self.settings.kv_dtype or self.geometry.activation_dtype
        sparse = self.sparse_layers()
        bounds = self.settings.bounds_dtype or default_bounds_dtype(kv, self.settings.score)
        return dataclasses.replace(
            self.settings, kv_dtype=kv, key_smoothing=self.settings.key_smoothing and kv == "int8",
            bounds_dtype=bounds if sparse else None, superblock_size=self.superblock_size if sparse else 0,
            dense_layers=tuple(i for i in range(self.geometry.num_layers) if i not in sparse),
            track_importance=self.settings.importance and bool(sparse))

    def is_sparse(self, layer: int) -> bool:
        return layer in self.sparse_layers()

    def fail(self, layer: int | None, reason: str) -> str:
        if layer is not None:
            self.failures[layer].append(reason)
        return reason

    def emit_layer(self, op, layer: int, rule: str, query, key, value, key_cache, value_cache, scale: float,
                   softcap: float = 0.0):
        """The Quest nodes of one layer; returns (output [B,S,H*D], key_cache_out, value_cache_out).

        ```
        key --QuestMetadata(past_block_max.l, past_block_min.l, [past_block_exponent.l])   (sparse)
            --> block_max', block_min', [block_exponent']                                  (int8 bounds)
        key --QuestMetadata(past_super_max.l, past_super_min.l, [past_super_exponent.l],
                            block_size = P * U)                                  (superblocks)
            --> super_max', super_min', [super_exponent']
        query --SparseBlockSelect(block_max', block_min', exact_lens, [block_exponent'], chunk_lens,
                                  [super_max', super_min', [super_exponent']])
              --> block_indices, chunk_indices                                              (sparse)
        query, key, value --SparseBlockAttention(key_cache, value_cache, [block_indices, exact_lens],
                                                 [key_scale.l, value_scale.l],          (int8 caches)
                                                 [chunk_indices, chunk_lens])                (sparse)
                          --> output, key_cache_out, value_cache_out, [key_scale', value_scale']
        ```
        """
        s, g = self.settings, self.geometry
        if s.attention == "gqa":
            return self._emit_gqa(op, layer, rule, query, key, value, key_cache, value_cache, scale, softcap)
        heads = dict(num_heads=g.num_heads, kv_num_heads=g.kv_num_heads, block_size=s.block_size)
        if layer in self.key_factors:
            query, key = self._smooth_keys(op, layer, query, key)
        indices = chunk_indices = None
        importance = self.block_importance.get(layer)
        if self.is_sparse(layer):
            key_cache_type = {"key_cache_type": "int8"} if self.int8 else {}
            exponent = self.block_exponent.get(layer)
            metadata = op.QuestMetadata(
                key, self.block_max[layer], self.block_min[layer], self.past_lens, self.total_lens, exponent,
                block_size=s.block_size, **key_cache_type, _domain=DOMAIN, _outputs=3 if exponent else 2)
            self.metadata_outputs[layer] = tuple(metadata)
            block_max, block_min = metadata[:2]
            exponent_out = metadata[2] if exponent else None
            select_attributes = dict(top_k=s.top_k, sink_blocks=s.sink_blocks, recent_blocks=s.recent_blocks,
                                     group_reduce=s.group_reduce, score=s.score, num_probes=s.num_probes,
                                     chunk_size=s.chunk_size, chunk_top_k=s.chunk_top_k,
                                     chunk_share=float(s.chunk_share), chunk_window=s.chunk_window,
                                     chunk_pool=s.chunk_pool, chunk_floor=s.chunk_floor)
            if s.importance_fraction:
                select_attributes["importance_fraction"] = s.importance_fraction
            supers = ()
            if self.superblock_size:
                super_exponent = self.super_exponent.get(layer)
                coarse = op.QuestMetadata(
                    key, self.super_max[layer], self.super_min[layer], self.past_lens, self.total_lens, super_exponent,
                    block_size=s.block_size * self.superblock_size, **key_cache_type, _domain=DOMAIN,
                    _outputs=3 if super_exponent else 2)
                self.super_outputs[layer] = tuple(coarse)
                supers = tuple(coarse)
                select_attributes.update(superblock_size=self.superblock_size, candidate_factor=s.candidate_factor)
            probe_inputs = (key_cache, key) if s.score == "probe" else (None, None)
            indices, chunk_indices = op.SparseBlockSelect(
                query, block_max, block_min, self.past_lens, self.total_lens, importance, *probe_inputs,
                self.exact_lens, exponent_out, self.chunk_lens, *supers, **heads, **select_attributes,
                _domain=DOMAIN, _outputs=2)
        scales = (self.key_scale[layer], self.value_scale[layer]) if self.int8 else (None, None)
        chunks = (chunk_indices, self.chunk_lens) if chunk_indices is not None else ()
        chunk_size = {"chunk_size": s.chunk_size} if chunks else {}
        outputs = op.SparseBlockAttention(
            query, key, value, key_cache, value_cache, self.past_lens, indices, self.total_lens,
            self.exact_lens if indices is not None else None, *(scales if self.int8 or chunks else ()), *chunks,
            **heads, scale=float(scale), softcap=float(softcap), **chunk_size, _domain=DOMAIN,
            _outputs=6 if self.int8 else 4 if importance is not None else 3)
        output, key_out, value_out = outputs[:3]
        if self.int8:
            # outputs[3], the block importance, stays unread without `importance`: steps.save_folder
            # leaves it unnamed (absent), and the op then computes none
            self.scale_outputs[layer] = (outputs[4], outputs[5])
        if importance is not None:
            # The mass this call's queries gave each block joins what earlier calls gave it. A graph
            # output right away, so the rewriter's dead-code removal keeps it.
            self.importance_outputs[layer] = op.Add(importance, outputs[3])
            self.graph.outputs.append(self.importance_outputs[layer])
        self.rewritten[layer] = rule
        return output, key_out, value_out

    def _smooth_keys(self, op, layer: int, query, key):
        """query * f, key / f with the layer's power-of-two key channel factors f [N, D] (each query
        head takes its KV head's): q . k is unchanged, the cached channels have comparable ranges.

        ```
        query [B,H,S,D] -Mul(f per query head [H,1,D])->  query'
        key   [B,N,S,D] -Mul(1 / f          [N,1,D])->  key'
        ```
        """
        import numpy as np

        g = self.geometry
        factors = np.asarray(self.key_factors[layer], np.float32)
        if factors.shape != (g.kv_num_heads, g.head_dim):
            raise ValueError(f"layer {layer}: key factors of shape {factors.shape}, expected "
                             f"{(g.kv_num_heads, g.head_dim)}")
        dtype = np.dtype(self.geometry.activation_dtype)
        per_query_head = np.repeat(factors, g.num_heads // g.kv_num_heads, axis=0)[:, None, :]
        query = op.Mul(query, op.Constant(value=ir.tensor(per_query_head.astype(dtype))))
        key = op.Mul(key, op.Constant(value=ir.tensor((1.0 / factors)[:, None, :].astype(dtype))))
        return query, key

    def _emit_gqa(self, op, layer, rule, query, key, value, key_cache, value_cache, scale, softcap):
        """The dense baseline: ONNX Runtime's GroupQueryAttention over the shared past/present buffer.

        ```
        query [B,H,S,D] -Transpose(0,2,1,3)-Reshape[0,0,H*D]-.        (key, value likewise)
        total_lens -Sub(1)--> seqlens_k;  ReduceMax(total_lens) --> total_sequence_length
        GroupQueryAttention(q, k, v, key_cache, value_cache, seqlens_k, total) --> output, caches
        ```
        """
        import numpy as np

        g = self.geometry

        def flat(x, heads):
            shape = op.Constant(value=ir.tensor(np.array([0, 0, heads * g.head_dim], np.int64)))
            return op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), shape)

        if self._gqa_lengths is None:
            one = op.Constant(value=ir.tensor(np.array(1, np.int32)))
            self._gqa_lengths = (op.Sub(self.total_lens, one), op.ReduceMax(self.total_lens, keepdims=0))
        seqlens, total = self._gqa_lengths
        cast = (lambda x: op.Cast(x, to=self.kv_dtype)) if self.kv_dtype != self.activation_type else (lambda x: x)
        output, key_out, value_out = op.GroupQueryAttention(
            cast(flat(query, g.num_heads)), cast(flat(key, g.kv_num_heads)), cast(flat(value, g.kv_num_heads)),
            key_cache, value_cache, seqlens, total, num_heads=g.num_heads, kv_num_heads=g.kv_num_heads,
            scale=float(scale), softcap=float(softcap), _domain="com.microsoft", _outputs=3)
        if self.kv_dtype != self.activation_type:
            output = op.Cast(output, to=self.activation_type)
        self.rewritten[layer] = rule
        return output, key_out, value_out
