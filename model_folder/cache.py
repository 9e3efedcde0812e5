"""The caches a model folder's graph reads and writes: their layout, and a typed per-layer view.

Per layer: key and value [B, N, C, D] in the sidecar's kv_dtype (with int8 caches also their row
scales key_scale / value_scale [B, N, C] float16); for a sparse layer also the block bounds
block_max / block_min [B, N, ceil(C / P), D] in its bounds dtype and, when the layer tracks it,
the accumulated block importance [B, N, ceil(C / P)] float32, and with int8 bounds their per-block
exponents block_exponent [B, N, ceil(C / P)] int8; where it selects hierarchically (superblock_size U
not 0) also the superblock bounds super_max / super_min [B, N, ceil(ceil(C / P) / U), D] (and their
exponents super_exponent with int8 bounds). Each cache is the graph input the
sidecar's LayerIO names (its present output updates it in place).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Generic, Iterator, TypeVar

import numpy as np

from .sidecar import CACHE_ROLES, LayerIO, Sidecar

T = TypeVar("T")
U = TypeVar("U")

# Role in LayerCaches -> the LayerIO field naming its graph input.
PAST_INPUTS = {role: f"past_{role}" for role in CACHE_ROLES}


@dataclasses.dataclass(frozen=True)
class LayerCaches(Generic[T]):
    """One layer's caches by role (arrays, specs, ...); the block caches are None where the layer
    has none (a dense layer; a layer that does not track importance), the scales where the caches
    are not int8."""

    key: T
    value: T
    block_max: T | None = None
    block_min: T | None = None
    block_importance: T | None = None
    key_scale: T | None = None
    value_scale: T | None = None
    block_exponent: T | None = None
    super_max: T | None = None
    super_min: T | None = None
    super_exponent: T | None = None

    def items(self) -> Iterator[tuple[str, T]]:
        """(role, cache) of every cache the layer has."""
        for role in PAST_INPUTS:
            if getattr(self, role) is not None:
                yield role, getattr(self, role)

    def map(self, function: Callable[[T], U]) -> LayerCaches[U]:
        return LayerCaches(**{role: function(cache) for role, cache in self.items()})


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    """One cache: the graph input it is fed as, its shape and element type."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


def cache_bytes(sidecar: Sidecar, batch: int, capacity: int) -> int:
    """The bytes of every cache of `batch` rows of `capacity` tokens (cache_layout's), none allocated."""
    return sum(int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize
               for layer in cache_layout(sidecar, batch, capacity) for _, spec in layer.items())


def input_names(io: LayerIO) -> LayerCaches[str]:
    """The graph input of each of a layer's caches."""
    return LayerCaches(**{role: getattr(io, field) for role, field in PAST_INPUTS.items()})


def cache_layout(sidecar: Sidecar, batch: int, capacity: int) -> list[LayerCaches[CacheSpec]]:
    """Every layer's caches for `batch` rows of `capacity` tokens."""
    geometry, settings = sidecar.geometry, sidecar.settings
    heads, blocks = geometry.kv_num_heads, -(-capacity // settings.block_size)
    supers = settings.superblock_count(blocks)
    shapes = {"key": (batch, heads, capacity, geometry.head_dim), "value": (batch, heads, capacity, geometry.head_dim),
              "block_max": (batch, heads, blocks, geometry.head_dim), "block_min": (batch, heads, blocks, geometry.head_dim),
              "block_importance": (batch, heads, blocks), "key_scale": (batch, heads, capacity),
              "value_scale": (batch, heads, capacity), "block_exponent": (batch, heads, blocks),
              "super_max": (batch, heads, supers, geometry.head_dim), "super_min": (batch, heads, supers, geometry.head_dim),
              "super_exponent": (batch, heads, supers)}
    dtypes = {"key": settings.kv_dtype, "value": settings.kv_dtype, "block_max": sidecar.bounds_dtype,
              "block_min": sidecar.bounds_dtype, "block_importance": "float32", "key_scale": "float16",
              "value_scale": "float16", "block_exponent": "int8", "super_max": sidecar.bounds_dtype,
              "super_min": sidecar.bounds_dtype, "super_exponent": "int8"}
    return [LayerCaches(**{role: CacheSpec(name, shapes[role], np.dtype(dtypes[role]))
                           for role, name in input_names(io).items()}) for io in sidecar.layers]
