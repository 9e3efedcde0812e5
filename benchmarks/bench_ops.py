"""`make bench`: the op kernels against ONNX Runtime's GroupQueryAttention (float32 and its int8 KV
cache) and the machine's bandwidth.

The sparse settings measured are the export's defaults (`SparseSettings.for_budget(32)`: what
`export-sparse <family> --k 32` writes, its superblocks included: past candidate_factor * K blocks
the select ranks hierarchically, docs/ops.md) and, for reference at 32K, `--k 8` (the default's 256
tokens before `--k` counted 32-token pages) and the default before the policy sweep: blocks of 32
tokens, one selection per KV head, no superblocks. Bounds are random (the hierarchical selection reads
every superblock bound and its candidates' blocks whichever win, so its time does not depend on
them); the bytes a select reads are its superblocks' and candidate blocks' where it is hierarchical.
Every call reads cold data: each measurement rotates among enough copies of its buffers to exceed
the last-level cache. Caches are bound in place (IOBinding), GQA
shares its past/present buffers. The headline ratios (the default step at 32K, H=32 N=8 D=128,
float32, against GroupQueryAttention and its int8 KV cache, one and two threads) are also measured
side by side, the calls interleaved (paired_speedups), and so is the default step over int8 caches
against the one over float16 caches: the summary's `*_paired*` figures, the ones to quote on a
machine whose speed drifts. Prints a table and writes benchmarks/results/ops.json and
ops.png.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

from quest_ort.export.rewrite import SparseSettings
from quest_ort.graphs import op_model
from quest_ort.graphs.layer import LAYER_ALIASES, attention_layer_model
from quest_ort.model_folder.settings import default_bounds_dtype
from quest_ort.ops.reference import int8_bounds
from quest_ort.ops.reference.sparse_block_select import hierarchical_reads
from quest_ort.ops import native_kernel_isa
from quest_ort.runtime import make_session
from quest_ort.runtime.binding import InPlaceStep
from quest_ort.runtime.buffers import cache_buffer

from .harness import (blocks_per_kv_head, copies_for, gqa_decode_model, plain_session, pyplot, read_bandwidth,
                      time_rotating)

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
HEADS = ((32, 8, 128), (16, 8, 128))
CONTEXTS = (4096, 16384, 32768, 65536)
DTYPES = ("float32", "float16", "int8")  # the caches' (int8: float32 activations, float16 row scales)


@dataclasses.dataclass(frozen=True)
class Setting:
    """A sparse decode setting: blocks of P tokens, K per selection, a selection per KV head
    ("mean") or per query head ("none"), and the block bounds' dtype next to float caches (None:
    the cache's) and next to int8 caches."""

    name: str
    block_size: int
    top_k: int
    group_reduce: str
    bounds_dtype: str | None
    int8_cache_bounds_dtype: str = "float16"
    superblock_size: int = 0  # > 0: the hierarchical selection's superblocks of this many blocks
    candidate_factor: int = 16

    @classmethod
    def export_default(cls) -> "Setting":
        """What `export-sparse --k 32` writes, with float caches and with `--kv-dtype int8`."""
        default = SparseSettings.for_budget(32)
        return cls("default", default.block_size, default.top_k, default.group_reduce,
                   default_bounds_dtype("float32", default.score), default_bounds_dtype("int8", default.score),
                   default.superblocks, default.candidate_factor)

    def bounds_for(self, cache_dtype) -> np.dtype:
        if np.dtype(cache_dtype) == np.int8:
            return np.dtype(self.int8_cache_bounds_dtype)
        return np.dtype(self.bounds_dtype or cache_dtype)


    @classmethod
    def export_budget(cls, name: str, k: int) -> "Setting":
        """What `export-sparse --k k` writes (the default but for the budget)."""
        settings = SparseSettings.for_budget(k)
        return dataclasses.replace(cls.export_default(), name=name, top_k=settings.top_k)


# The default, then for reference: `--k 8` (256 tokens, the default until --k counted 32-token pages:
# what the larger budget costs) and the default before the policy sweep (P=32, one selection per KV head).
SETTINGS = (Setting.export_default(), Setting.export_budget("budget-256", 8), Setting("shared-p32", 32, 32, "mean", None))
# QuestMetadata's in-place outputs and the inputs they update.
METADATA_ALIASES = {name: source for name, source in LAYER_ALIASES.items() if name.startswith("block_")}
# The per-head row's query heads: this much of each is its own, the rest shared by its group, so the
# G heads' selections overlap about as a real model's do (SmolLM2 reads 1.45x the budget at 8K,
# docs/quality.md; this reads about 1.5x at 32K). Unrelated random heads would barely overlap.
PER_HEAD_OWN = 0.2


def _value(array):
    """An OrtValue over a huge-page buffer holding `array`, as the runtime allocates caches."""
    buffer = cache_buffer(array.shape, array.dtype)
    buffer[...] = array
    return ort.OrtValue.ortvalue_from_numpy(buffer)


class Config:
    """Buffers for one (H, N, D, C, cache dtype): `copies` independent caches and metadata. int8
    caches come with their float16 row scales and float32 activations."""

    def __init__(self, H, N, D, C, dtype, rng):
        self.H, self.N, self.D, self.C, self.dtype = H, N, D, C, np.dtype(dtype)
        self.int8 = self.dtype == np.int8
        self.activation = np.dtype(np.float32) if self.int8 else self.dtype
        self.past = C - 64
        cache_bytes = self.cache_bytes(C)
        # Cache copies rotate, and so do the selections (from per-copy metadata), so that every call
        # reads blocks no recent call read; metadata copies are sized by their own bytes.
        self.cache_copies = copies_for(cache_bytes, most=4)
        self.copies = copies_for(2 * N * (C // 16) * D * SETTINGS[0].bounds_for(dtype).itemsize)
        make = lambda shape: rng.standard_normal(shape).astype(np.float32).astype(self.activation)  # noqa: E731

        def cache():
            if self.int8:
                return rng.integers(-127, 128, (1, N, C, D), dtype=np.int8)
            return make((1, N, C, D))

        caches = [(_value(cache()), _value(cache())) for _ in range(self.cache_copies)]
        self.key_cache = [caches[c % self.cache_copies][0] for c in range(self.copies)]
        self.value_cache = [caches[c % self.cache_copies][1] for c in range(self.copies)]
        scales = [tuple(_value((rng.random((1, N, C)) * 0.04).astype(np.float16)) for _ in range(2))
                  for _ in range(self.cache_copies if self.int8 else 0)]
        self.scales = [scales[c % self.cache_copies] for c in range(self.copies)] if self.int8 else []
        self.query = make((1, H, 1, D))
        self.key = make((1, N, 1, D))
        self.value = make((1, N, 1, D))
        self.past_lens = np.array([self.past], np.int32)

    def cache_feeds(self, c) -> dict:
        """Copy c's caches (and int8 row scales) by input name."""
        feeds = dict(key_cache=self.key_cache[c], value_cache=self.value_cache[c])
        if self.int8:
            feeds.update(key_scale=self.scales[c][0], value_scale=self.scales[c][1])
        return feeds

    def cache_arrays(self) -> dict:
        """Copy 0's caches as arrays: what a model is built from."""
        return {name: value.numpy() for name, value in self.cache_feeds(0).items()}

    def metadata_attributes(self, P) -> dict:
        return dict(block_size=P, **({"key_cache_type": "int8"} if self.int8 else {}))

    def grouped_query(self, own, rng):
        """Query heads made of a direction shared by their KV head's group and their own (weight `own`)."""
        G = self.H // self.N
        shared = np.repeat(rng.standard_normal((1, self.N, 1, self.D)), G, axis=1)
        mine = rng.standard_normal((1, self.H, 1, self.D))
        return (shared * np.sqrt(1.0 - own**2) + mine * own).astype(np.float32).astype(self.activation)

    def metadata(self, P, rng, dtype, superblock_size=0):
        """Per-copy metadata feeds (block_max, block_min [1, N, ceil(C/P), D] of random content,
        cold like the caches, of `dtype`; int8 bounds with their block_exponent [1, N, ceil(C/P)]),
        and with `superblock_size` U the bounds over superblocks of U blocks (super_max, super_min
        [1, N, ceil(M/U), D], super_exponent), the max of their blocks' maxima and the min of their
        minima, as QuestMetadata at block size P * U would bound the same keys."""
        M = -(-self.C // P)
        out = []
        for _ in range(self.copies):
            hi = rng.standard_normal((1, self.N, M, self.D)).astype(np.float32)
            bounds = dict(block=(hi, hi - 1.0))
            if superblock_size:
                bounds["super"] = (by_superblock(hi, superblock_size, -np.inf).max(3),
                                   by_superblock(hi - 1.0, superblock_size, np.inf).min(3))
            feeds = {}
            for prefix, (high, low) in bounds.items():
                if np.dtype(dtype) == np.int8:
                    codes_max, codes_min, exponent = int8_bounds.quantize(high, low, np.zeros(high.shape[:3], bool))
                    feeds.update({f"{prefix}_max": _value(codes_max), f"{prefix}_min": _value(codes_min),
                                  f"{prefix}_exponent": _value(exponent)})
                else:
                    feeds.update({f"{prefix}_max": _value(high.astype(dtype)),
                                  f"{prefix}_min": _value(low.astype(dtype))})
            out.append(feeds)
        return out

    def cache_bytes(self, tokens):
        """Bytes of `tokens` rows of both caches (with an int8 row's float16 scale)."""
        return 2 * self.N * tokens * (self.D * self.dtype.itemsize + (2 if self.int8 else 0))


def by_superblock(bounds: np.ndarray, superblock_size: int, fill: float) -> np.ndarray:
    """Block bounds [B, N, M, D] as [B, N, ceil(M / U), U, D], the last superblock filled with `fill`."""
    B, N, M, D = bounds.shape
    padded = -(-M // superblock_size) * superblock_size
    filled = np.pad(bounds, ((0, 0), (0, 0), (0, padded - M), (0, 0)), constant_values=fill)
    return filled.reshape(B, N, padded // superblock_size, superblock_size, D)


def _steps(step: InPlaceStep, feeds_of):
    bindings = [step.bind(feeds_of(copy)) for copy in range(len(feeds_of.copies))]
    return lambda copy: step.run_bound(bindings[copy])


class Feeds:
    def __init__(self, copies, fn):
        self.copies = range(copies)
        self.fn = fn

    def __call__(self, copy):
        return self.fn(copy)


def bench_config(cfg: Config, setting: Setting, threads: int, rng, rows: list):
    P, K, group_reduce = setting.block_size, setting.top_k, setting.group_reduce
    if group_reduce == "none":  # query heads that overlap in their selections as a real model's do
        cfg = copy.copy(cfg)
        cfg.query = cfg.grouped_query(PER_HEAD_OWN, rng)
    H, N, D, C = cfg.H, cfg.N, cfg.D, cfg.C
    bounds_dtype = setting.bounds_for(cfg.dtype)
    U = setting.superblock_size
    meta = cfg.metadata(P, rng, bounds_dtype, U)
    arrays = {name: value.numpy() for name, value in meta[0].items()}  # what the sessions are built from
    block_meta = [{name: value for name, value in feeds.items() if name.startswith("block_")} for feeds in meta]
    # Bytes per block and KV head the selection reads: both bounds (and an int8 block's exponent);
    # the decode query's blocks, or with superblocks every superblock and its candidates' blocks.
    bounds_bytes = 2 * D * bounds_dtype.itemsize + ("block_exponent" in arrays)
    current = cfg.past // P
    hierarchical = hierarchical_reads(current, K, U, setting.candidate_factor)
    bounds_read = N * bounds_bytes * (sum(hierarchical) if hierarchical else current + 1)
    base = dict(heads=f"{H}/{N}/{D}", context=C, dtype=cfg.dtype.name, setting=setting.name, block_size=P, top_k=K,
                threads=threads, group_reduce=group_reduce, bounds=bounds_dtype.name, superblock_size=U,
                selection="hierarchical" if hierarchical else "flat")

    def record(kind, ms, bytes_read=None, **extra):
        row = dict(base, kind=kind, ms=round(ms, 4), **extra)
        if bytes_read is not None:
            row["bytes"] = int(bytes_read)
            row["gb_per_s"] = round(bytes_read / ms / 1e6, 2)
        rows.append(row)
        gbs = f"{row['gb_per_s']:7.1f} GB/s" if bytes_read is not None else ""
        print(f"  {kind:<18} {ms:9.3f} ms {gbs}", flush=True)

    # Per-step metadata update (decode, in place).
    block_arrays = {name: value for name, value in arrays.items() if name.startswith("block_")}
    update = InPlaceStep(make_session(op_model("QuestMetadata", dict(key=cfg.key, past_lens=cfg.past_lens, **block_arrays),
                                               cfg.metadata_attributes(P)), threads=threads), METADATA_ALIASES)
    run = _steps(update, Feeds(cfg.copies, lambda c: dict(key=cfg.key, past_lens=cfg.past_lens, **block_meta[c])))
    record("metadata_update", time_rotating(run, cfg.copies))

    # Selection over the cached context.
    select_attributes = dict(num_heads=H, kv_num_heads=N, block_size=P, top_k=K, group_reduce=group_reduce)
    if U:
        select_attributes.update(superblock_size=U, candidate_factor=setting.candidate_factor)
    select = InPlaceStep(make_session(op_model("SparseBlockSelect", dict(query=cfg.query, past_lens=cfg.past_lens,
                                                                         **arrays),
                                               select_attributes), threads=threads), {})
    feeds = Feeds(cfg.copies, lambda c: dict(query=cfg.query, past_lens=cfg.past_lens, **meta[c]))
    run = _steps(select, feeds)
    indices = [select.run(feeds(c))["block_indices"] for c in range(cfg.copies)]
    record("select", time_rotating(run, cfg.copies), bounds_read)

    # Sparse attention over the selected blocks.
    attention_attributes = dict(num_heads=H, kv_num_heads=N, block_size=P)
    sparse_inputs = dict(query=cfg.query, key=cfg.key, value=cfg.value, **cfg.cache_arrays(), past_lens=cfg.past_lens,
                         block_indices=indices[0])
    sparse = InPlaceStep(make_session(op_model("SparseBlockAttention", sparse_inputs, attention_attributes),
                                      threads=threads), LAYER_ALIASES)
    run = _steps(sparse, Feeds(cfg.copies, lambda c: dict(query=cfg.query, key=cfg.key, value=cfg.value,
                                                         **cfg.cache_feeds(c), past_lens=cfg.past_lens,
                                                         block_indices=indices[c])))
    # Bytes it must read: every distinct selected block of each KV head, keys and values.
    blocks = [sum(b.size for b in blocks_per_kv_head(i[0, :, 0], N)) for i in indices]  # per decode query
    attended = int(cfg.cache_bytes(P) * np.mean(blocks) / N)
    record("sparse_attention", time_rotating(run, cfg.copies), attended,
           reads_over_budget=round(attended / cfg.cache_bytes(P * K), 2))

    # The whole sparse decode step: the three ops as one layer graph, everything in place.
    layer = InPlaceStep(make_session(attention_layer_model(num_heads=H, kv_num_heads=N, head_dim=D, capacity=C,
                                                           block_size=P, top_k=K, activation_dtype=cfg.activation,
                                                           cache_dtype=cfg.dtype, bounds_dtype=bounds_dtype,
                                                           group_reduce=group_reduce, superblock_size=U,
                                                           candidate_factor=setting.candidate_factor),
                                      threads=threads), LAYER_ALIASES)
    run = _steps(layer, Feeds(cfg.copies, lambda c: dict(query=cfg.query, key=cfg.key, value=cfg.value,
                                                        **cfg.cache_feeds(c), past_lens=cfg.past_lens, **meta[c])))
    record("sparse_step", time_rotating(run, cfg.copies), bounds_read + attended)
    return run


def bench_dense(cfg: Config, threads: int, rows: list):
    H, N, D, C = cfg.H, cfg.N, cfg.D, cfg.C
    base = dict(heads=f"{H}/{N}/{D}", context=C, dtype=cfg.dtype.name, threads=threads)
    dense = InPlaceStep(make_session(attention_layer_model(num_heads=H, kv_num_heads=N, head_dim=D, capacity=C,
                                                           block_size=32, top_k=None, activation_dtype=cfg.activation,
                                                           cache_dtype=cfg.dtype), threads=threads), LAYER_ALIASES)
    run = _steps(dense, Feeds(cfg.copies, lambda c: dict(query=cfg.query, key=cfg.key, value=cfg.value,
                                                        **cfg.cache_feeds(c), past_lens=cfg.past_lens)))
    results, runs = {}, {}
    results["dense"] = time_rotating(run, cfg.copies, budget_s=1.0)
    # GroupQueryAttention's float caches and its own int8 cache (next to the float32 configuration).
    kinds = [] if cfg.int8 else [("gqa", False)] + ([("gqa_int8", True)] if cfg.dtype == np.float32 else [])
    for kind, int8_kv in kinds:
        runs[kind] = _gqa_run(cfg, threads, int8_kv)
        results[kind] = time_rotating(runs[kind], cfg.copies, budget_s=1.0)
    for kind, ms in results.items():
        bytes_read = cfg.cache_bytes(cfg.past + 1) // (cfg.dtype.itemsize if kind == "gqa_int8" else 1)
        rows.append(dict(base, kind=kind, ms=round(ms, 4), bytes=bytes_read, gb_per_s=round(bytes_read / ms / 1e6, 2)))
        print(f"  {kind:<18} {ms:9.3f} ms {bytes_read / ms / 1e6:7.1f} GB/s  ({threads} thread{'s' if threads > 1 else ''})", flush=True)
    return runs


def _gqa_run(cfg: Config, threads: int, int8_kv: bool):
    """run(copy): GroupQueryAttention decoding one token over the config's rotating caches (its own
    int8 copies with `int8_kv`), present bound to past."""
    H, N, D, C = cfg.H, cfg.N, cfg.D, cfg.C
    gqa = plain_session(gqa_decode_model(H, N, D, C, cfg.dtype, int8_kv=int8_kv), threads)
    rng = np.random.default_rng(1)
    int8_caches = [(_value(rng.integers(-127, 128, (1, N, C, D), dtype=np.int8)),
                    _value(rng.integers(-127, 128, (1, N, C, D), dtype=np.int8)))
                   for _ in range(cfg.cache_copies if int8_kv else 0)]
    bindings = []
    for c in range(cfg.copies):
        key_cache, value_cache = (int8_caches[c % cfg.cache_copies] if int8_kv
                                  else (cfg.key_cache[c], cfg.value_cache[c]))
        io = gqa.io_binding()
        io.bind_cpu_input("query", cfg.query.reshape(1, 1, H * D))
        io.bind_cpu_input("key", cfg.key.reshape(1, 1, N * D))
        io.bind_cpu_input("value", cfg.value.reshape(1, 1, N * D))
        io.bind_ortvalue_input("past_key", key_cache)
        io.bind_ortvalue_input("past_value", value_cache)
        io.bind_cpu_input("seqlens_k", np.array([cfg.past], np.int32))
        io.bind_cpu_input("total_sequence_length", np.array(cfg.past + 1, np.int32))
        if int8_kv:
            for name in ("k_scale", "v_scale"):
                io.bind_cpu_input(name, np.full((N, 1, D), 0.02, np.float32))
        io.bind_output("output")
        io.bind_ortvalue_output("present_key", key_cache)
        io.bind_ortvalue_output("present_value", value_cache)
        bindings.append(io)
    return lambda c: gqa.run_with_iobinding(bindings[c])


# The paired headline measurement (paired_speedups): rounds, and per round the calls of each baseline
# and of the sparse step that follow each other.
PAIRED_ROUNDS, PAIRED_BASELINE_CALLS, PAIRED_STEP_CALLS = 12, 4, 60
PAIRED_SETTLE_S = 0.05  # untimed pause before a run of the other session (see paired_speedups)


def paired_speedups(step_run, baseline_runs: dict, copies: int, rows: list, **where) -> None:
    """The headline ratios, measured side by side: calls of the sparse step and of each baseline
    interleaved (PAIRED_ROUNDS rounds of a few calls of each baseline, each followed by a run of
    steps), and the ratio of their median times. This machine's speed drifts by tens of percent
    within seconds, so ratios of times taken a minute apart moved between 32x and 54x for the same
    code; interleaved, a slow stretch slows both sides. Runs, not single calls, alternate, after
    an untimed pause: a session's intra-op threads spin for a while after its call and slow the
    other session (with two threads, alternating call by call without pauses cost
    GroupQueryAttention 60%). Appends one row per baseline."""
    calls = itertools.count()  # one rotation over the copies for every call, so data stays cold

    def timed_ms(run):
        copy = next(calls) % copies
        begin = time.perf_counter()
        run(copy)
        return (time.perf_counter() - begin) * 1e3

    baseline_ms: dict[str, list[float]] = {kind: [] for kind in baseline_runs}
    step_ms: list[float] = []
    for _ in range(PAIRED_ROUNDS):
        for kind, run in baseline_runs.items():
            time.sleep(PAIRED_SETTLE_S)
            baseline_ms[kind].extend(timed_ms(run) for _ in range(PAIRED_BASELINE_CALLS))
            time.sleep(PAIRED_SETTLE_S)
            step_ms.extend(timed_ms(step_run) for _ in range(PAIRED_STEP_CALLS))
    step = statistics.median(step_ms)
    for kind, times in baseline_ms.items():
        baseline = statistics.median(times)
        row = dict(where, kind="paired_speedup", baseline=kind, speedup=round(baseline / step, 1),
                   step_ms=round(step, 4), baseline_ms=round(baseline, 3), calls=[len(step_ms), len(times)])
        rows.append(row)
        print(f"  step vs {kind:<9} {row['speedup']:6.1f}x  (interleaved medians: step {step:.3f} ms, "
              f"{kind} {baseline:.2f} ms)", flush=True)


def int8_against_float16_steps(int8_runs: dict, int8_copies: int, float16_steps: dict, rows: list, **where) -> None:
    """The default step over int8 caches (int8 bounds) side by side with the step over float16
    caches (paired_speedups, the float16 step as the baseline), per thread count: how much the
    halved reads buy, measured where the machine's drift slows both alike."""
    for threads, int8_run in int8_runs.items():
        if threads not in float16_steps:
            continue
        float16_run, float16_copies = float16_steps[threads]
        print(f"  int8 step against the float16 step, side by side, {threads} thread{'s' if threads > 1 else ''}",
              flush=True)
        copies = max(int8_copies, float16_copies)  # each run rotates over its own copies
        paired_speedups(lambda c: int8_run(c % int8_copies), {"float16_step": lambda c: float16_run(c % float16_copies)},
                        copies, rows, dtype="int8", setting="default", threads=threads, **where)


def bench_metadata_build(dtype, C, P, N, D, threads, rng, rows, bounds_dtype="float16"):
    """A prefill's metadata build over C keys; with int8 caches (`dtype`) float32 keys, bounded as
    the int8 cache stores them."""
    int8 = np.dtype(dtype) == np.int8
    key = rng.standard_normal((1, N, C, D)).astype(np.float32).astype(np.float32 if int8 else dtype)
    copies = copies_for(key.nbytes)
    keys = [key] + [np.roll(key, c, axis=2) for c in range(1, copies)]
    M = -(-C // P)

    def empty():
        bounds = dict(block_max=np.zeros((1, N, M, D), bounds_dtype), block_min=np.zeros((1, N, M, D), bounds_dtype))
        if np.dtype(bounds_dtype) == np.int8:
            bounds["block_exponent"] = np.zeros((1, N, M), np.int8)
        return bounds

    meta = [{name: _value(array) for name, array in empty().items()} for _ in range(copies)]
    zero = np.zeros(1, np.int32)
    build = InPlaceStep(make_session(op_model("QuestMetadata", dict(key=key, past_lens=zero, **empty()),
                                              dict(block_size=P, **({"key_cache_type": "int8"} if int8 else {}))),
                                 threads=threads), METADATA_ALIASES)
    run = _steps(build, Feeds(copies, lambda c: dict(key=keys[c], past_lens=zero, **meta[c])))
    ms = time_rotating(run, copies)
    rows.append(dict(kind="metadata_build", context=C, dtype=np.dtype(dtype).name, block_size=P, heads=f"-/{N}/{D}",
                     bounds=np.dtype(bounds_dtype).name, threads=threads, ms=round(ms, 4), bytes=key.nbytes,
                     gb_per_s=round(key.nbytes / ms / 1e6, 2)))
    print(f"  metadata_build     {ms:9.3f} ms {key.nbytes / ms / 1e6:7.1f} GB/s  (C={C}, {np.dtype(dtype).name} keys, "
          f"{np.dtype(bounds_dtype).name} bounds, P={P})", flush=True)


def summarize(rows, bandwidth):
    """The issue's targets, from the measured rows (None where a row is missing)."""
    def row(**match):
        found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
        return found[0] if found else None

    headline = dict(heads="32/8/128", context=32768, dtype="float32")
    out = {}
    for threads, suffix in ((1, ""), (2, "_two_threads")):
        at = dict(headline, threads=threads)
        gqa, gqa_int8, dense = (row(kind=kind, **at) for kind in ("gqa", "gqa_int8", "dense"))
        for setting in SETTINGS:
            step = row(kind="sparse_step", setting=setting.name, **at)
            if step is None:
                continue
            if gqa:
                out[f"{setting.name}_step_speedup_vs_gqa{suffix}"] = round(gqa["ms"] / step["ms"], 1)
            if gqa_int8:
                out[f"{setting.name}_step_speedup_vs_gqa_int8{suffix}"] = round(gqa_int8["ms"] / step["ms"], 1)
            out[f"{setting.name}_step_ms{suffix}"] = step["ms"]
            for kind in ("select", "sparse_attention"):
                measured = row(kind=kind, setting=setting.name, **at)
                if measured and "gb_per_s" in measured:
                    out[f"{setting.name}_{kind}_fraction_of_bandwidth{suffix}"] = round(
                        measured["gb_per_s"] / bandwidth[threads], 3)
            attention = row(kind="sparse_attention", setting=setting.name, **at)
            if attention and "reads_over_budget" in attention:
                out[f"{setting.name}_attention_reads_over_budget"] = attention["reads_over_budget"]
            for kind in ("gqa", "gqa_int8"):
                paired = row(kind="paired_speedup", baseline=kind, setting=setting.name, **at)
                if paired:  # side by side: the figure to quote (paired_speedups)
                    out[f"{setting.name}_step_speedup_vs_{kind}_paired{suffix}"] = paired["speedup"]
        if gqa and dense:
            out[f"dense_speedup_vs_gqa{suffix}"] = round(gqa["ms"] / dense["ms"], 2)
        if gqa and gqa_int8:
            out[f"gqa_int8_speedup_vs_gqa{suffix}"] = round(gqa["ms"] / gqa_int8["ms"], 2)
        # int8 caches: the default step against float16 caches and GroupQueryAttention's float32 and int8.
        int8_step = row(kind="sparse_step", setting="default", **dict(at, dtype="int8"))
        float16_step = row(kind="sparse_step", setting="default", **dict(at, dtype="float16"))
        if int8_step and float16_step:
            out[f"int8_step_speedup_vs_float16_step{suffix}"] = round(float16_step["ms"] / int8_step["ms"], 2)
        paired = row(kind="paired_speedup", baseline="float16_step", setting="default", **dict(at, dtype="int8"))
        if paired:  # side by side: the figure to quote
            out[f"int8_step_speedup_vs_float16_step_paired{suffix}"] = paired["speedup"]
        for kind, baseline in (("gqa", gqa), ("gqa_int8", gqa_int8)):
            if int8_step and baseline:
                out[f"int8_step_speedup_vs_{kind}{suffix}"] = round(baseline["ms"] / int8_step["ms"], 1)
        for kind in ("select", "sparse_attention"):
            measured = row(kind=kind, setting="default", **dict(at, dtype="int8"))
            if measured and "gb_per_s" in measured:
                out[f"int8_{kind}_fraction_of_bandwidth{suffix}"] = round(measured["gb_per_s"] / bandwidth[threads], 3)
    for dtype, prefix in (("float32", ""), ("int8", "int8_")):
        build = row(kind="metadata_build", context=32768, dtype=dtype, threads=1)
        if build:
            out[f"{prefix}metadata_build_fraction_of_bandwidth"] = round(build["gb_per_s"] / bandwidth[1], 3)
    small = row(kind="metadata_update", heads="32/8/128", context=4096, dtype="float32", threads=1, setting="default")
    large = row(kind="metadata_update", heads="32/8/128", context=65536, dtype="float32", threads=1, setting="default")
    if small and large:
        out["metadata_update_64k_over_4k"] = round(large["ms"] / small["ms"], 2)
    one, two = row(kind="dense", **dict(headline, threads=1)), row(kind="dense", **dict(headline, threads=2))
    if one and two:
        out["dense_two_thread_speedup"] = round(one["ms"] / two["ms"], 2)
    return out


def plot(rows, bandwidth, path):
    plt = pyplot(path.name)
    if plt is None:
        return False

    default = SETTINGS[0]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for dtype, style in (("float32", "-"), ("float16", "--"), ("int8", ":")):
        for kind, setting, color in (("sparse_step", "default", "tab:green"), ("dense", None, "tab:blue"),
                                     ("gqa", None, "tab:red"), ("gqa_int8", None, "tab:orange")):
            points = sorted((r["context"], r["ms"]) for r in rows if r["kind"] == kind and r["dtype"] == dtype
                            and r["heads"] == "32/8/128" and r["threads"] == 1 and r.get("setting") == setting)
            if points:
                axes[0].plot(*zip(*points), style, marker="o", color=color, label=f"{kind} {dtype}")
    axes[0].set(xscale="log", yscale="log", xlabel="cached tokens", ylabel="ms per decode step (one layer)",
                title=f"H=32 N=8 D=128, 1 thread; default P={default.block_size} K={default.top_k} "
                f"{default.group_reduce}" + (f", superblocks of {default.superblock_size}" if default.superblock_size else ""))
    axes[0].legend(fontsize=8)
    kinds = ("metadata_build", "select", "sparse_attention", "dense", "gqa", "gqa_int8")
    for offset, dtype in enumerate(DTYPES):
        values = []
        for kind in kinds:
            found = [r["gb_per_s"] for r in rows if r["kind"] == kind and r["dtype"] == dtype and r["threads"] == 1
                     and r["context"] == 32768 and r["heads"] in ("32/8/128", "-/8/128")
                     and r.get("setting") in (None, "default")]
            values.append(found[0] if found else 0)
        width = 0.8 / len(DTYPES)
        axes[1].bar(np.arange(len(kinds)) + width * offset, values, width=width, label=f"{dtype} caches")
    axes[1].axhline(bandwidth[1], color="black", linestyle=":", label=f"read bandwidth {bandwidth[1]:.0f} GB/s")
    axes[1].axhline(0.7 * bandwidth[1], color="gray", linestyle=":", label="70%")
    axes[1].set_xticks(np.arange(len(kinds)) + 0.4 - 0.4 / len(DTYPES), kinds, rotation=20)
    axes[1].set(ylabel="GB/s on the bytes each must read", title="C=32K, 1 thread, default setting")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="only the headline shape (H=32 N=8 D=128, C=32K)")
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    print(f"quest_ort kernels: {native_kernel_isa()}; onnxruntime {ort.__version__}; {platform.processor() or platform.machine()}")
    print("settings: " + "; ".join(f"{s.name}: P={s.block_size} K={s.top_k} {s.group_reduce}, bounds "
                                   f"{s.bounds_dtype or 'as the cache'} ({s.int8_cache_bounds_dtype} with int8 caches)"
                                   + (f", superblocks of {s.superblock_size} (candidate_factor {s.candidate_factor})"
                                      if s.superblock_size else "")
                                   for s in SETTINGS))
    bandwidth = {threads: read_bandwidth(threads, repeats=12) for threads in (1, 2)}
    print(f"read bandwidth: {bandwidth[1]:.1f} GB/s (1 thread), {bandwidth[2]:.1f} GB/s (2 threads)")
    heads = HEADS[:1] if args.quick else HEADS
    contexts = (32768,) if args.quick else CONTEXTS
    default, references = SETTINGS[0], SETTINGS[1:]
    float16_steps = {}  # threads -> (run, copies): the default step over float16 caches at 32K
    for dtype in DTYPES:
        for C in contexts:
            bench_metadata_build(dtype, C, default.block_size, *HEADS[0][1:], 1, rng, rows, default.bounds_for(dtype))
    for H, N, D in heads:
        for C in (sorted(set(contexts) | {4096, 65536}) if not args.quick else (4096, 32768, 65536)):
            for dtype in DTYPES:
                cfg = Config(H, N, D, C, dtype, rng)
                print(f"H={H} N={N} D={D} C={C} {dtype}, {default.name}", flush=True)
                step_runs = {1: bench_config(cfg, default, 1, rng, rows)}
                if C in contexts and (H, N, D) == HEADS[0]:
                    print(f"H={H} N={N} D={D} C={C} {dtype}, {default.name}, 2 threads", flush=True)
                    step_runs[2] = bench_config(cfg, default, 2, rng, rows)
                if (H, N, D, C) == (*HEADS[0], 32768):
                    if dtype == "float16":
                        float16_steps = {threads: (run, cfg.copies) for threads, run in step_runs.items()}
                    if dtype == "int8":
                        int8_against_float16_steps(step_runs, cfg.copies, float16_steps, rows, heads=f"{H}/{N}/{D}",
                                                   context=C)
                    for reference in references:
                        print(f"H={H} N={N} D={D} C={C} {dtype}, {reference.name}", flush=True)
                        bench_config(cfg, reference, 1, rng, rows)
                    print(f"H={H} N={N} D={D} C={C} {dtype} dense, GroupQueryAttention", flush=True)
                    for threads in (1, 2):
                        baselines = bench_dense(cfg, threads, rows)
                        if dtype == "float32":
                            print(f"H={H} N={N} D={D} C={C} {dtype}, {default.name} step against GroupQueryAttention, "
                                  f"side by side, {threads} thread{'s' if threads > 1 else ''}", flush=True)
                            paired_speedups(step_runs[threads], baselines, cfg.copies, rows, heads=f"{H}/{N}/{D}", context=C,
                                            dtype=dtype, setting=default.name, threads=threads)
                del cfg
    summary = summarize(rows, bandwidth)
    print("\nsummary:", json.dumps(summary, indent=1))
    args.output.mkdir(parents=True, exist_ok=True)
    report = dict(machine=dict(processor=platform.processor(), cpus=os.cpu_count(), isa=native_kernel_isa(),
                               onnxruntime=ort.__version__, python=sys.version.split()[0]),
                  settings=[dataclasses.asdict(s) for s in SETTINGS],
                  read_bandwidth_gb_per_s={str(k): round(v, 2) for k, v in bandwidth.items()},
                  summary=summary, rows=rows)
    (args.output / "ops.json").write_text(json.dumps(report, indent=1))
    drawn = plot(rows, bandwidth, args.output / "ops.png")
    print(f"wrote {args.output / 'ops.json'}" + (f" and {args.output / 'ops.png'}" if drawn else ""))


if __name__ == "__main__":
    main()
