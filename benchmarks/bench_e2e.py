"""End-to-end decode and prefill on what users deploy: a model with Qwen3-0.6B's geometry and int4
weights (`export-sparse qwen3 --k 32 --weights int4`), the Quest ops over float16 and over int8
caches, against ONNX Runtime's GroupQueryAttention over float16 caches and over its own int8 cache.

Random weights (28 layers, hidden 1024, 16 query heads, 8 KV heads, head dim 128, vocab 151936),
quantized by the exporter (MatMulNBits and the embedding's GatherBlockQuantized). Decode: the caches
are filled synthetically to 4K, 8K, 16K and 32K tokens (the two float16 models read the very same
buffers; the int8 ones random codes), then the four models decode in turns, one step each per
round, so their ratios come from one stretch of time. Peak memory: each model alone in its own
process (benchmarks.decode_once) holding a 32K cache: its peak RSS over the whole run, in the
512-token exact prompt step that ends at 32K (the last step of a 32K prompt's prefill) and while it
decodes. Prefill (time to first token): 4K- and 8K-token prompts through the runtime's `prefill`
(exact, the default) for the two float16 models, each in its own process for its peak RSS, and the
time ratio side by side in one process, their prefill steps alternating chunk by chunk (this
machine's speed drifts by ten percent within a minute). Time to the first token: whole prompts of
4K, 16K and 32K random tokens through the runtime's `prefill`, each run in its own process (its
seconds and peak RSS): the Quest model over int8 caches prefilled exactly and sparsely
(`prefill="sparse"`), and GroupQueryAttention over float16 caches and over its int8 cache, one after
another per length. Long contexts (issue 43's flat-step target): the two int8-cache models alone, of a
second export whose capacity reaches 128K (the same checkpoint), decode in turns at 4K,
32K and 128K cached tokens; the JSON records each step's time over its 4K step and the block bound
bytes the Quest selection reads per step (every block's: the selection is flat). Prints a table,
writes results/e2e.json and e2e.png.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
from quest_ort.model_folder.cache import cache_bytes
from quest_ort.ops import native_kernel_isa
from quest_ort.ops.reference.int8_rows import dequantize_rows
from quest_ort.ops.reference.sparse_block_select import hierarchical_reads

from . import ROOT
from .harness import pyplot, read_bandwidth
from .quality_runtime import block_bounds, bound_arrays, bound_sets, sharing_cache, super_arrays

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MODELS = ROOT / "build" / "models"
GEOMETRY = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                tie_word_embeddings=True)
CONTEXTS = (4096, 8192, 16384, 32768)
CAPACITY = 32768 + 64
PREFILL_TOKENS = (4096, 8192)
# The int8-cache pair at long contexts, from an export reaching them (a 128K cache each: 7.5 GB of
# int8 keys and values per model, so the float16 pair stays at CONTEXTS); 4K is the reference step.
LONG_CONTEXTS = (4096, 32768, 131072)
LONG_KINDS = ("quest-int8", "gqa-int8")
LONG_CAPACITY = LONG_CONTEXTS[-1] + 64
FLAT_STEP_TARGET = 1.5  # issue 43: the step at 128K over the step at 4K, Quest over int8 caches
BOUND_BYTES_TARGET = 0.25  # issue 43: the bound bytes a 128K step's selections read, over the flat selection's
LONG_HEADROOM = 4 << 30  # bytes past the two caches: the sessions, fill's per-layer temporaries (peak measured 20 GiB in all)
TTFT_TOKENS = (4096, 16384, 32768)
# Time to the first token: (model kind, prefill mode) runs, in this order at each prompt length.
TTFT_RUNS = (("quest-int8", "exact"), ("quest-int8", "sparse"), ("gqa-float16", "exact"), ("gqa-int8", "exact"))
WEIGHTS = "int4"
# The models compared, by name: (attention, KV cache type); the export's defaults otherwise (--k 32).
KINDS = {"quest-float16": ("quest", "float16"), "quest-int8": ("quest", "int8"),
         "gqa-float16": ("gqa", "float16"), "gqa-int8": ("gqa", "int8")}
LABELS = {"gqa-float16": "GroupQueryAttention, float16 cache", "gqa-int8": "GroupQueryAttention, int8 cache (ORT)"}
SETTLE_S = 0.1  # the untimed pause before each timed decode step (decode_round_robin)
INT8_SCALE = 0.03  # the row scale of the Quest int8 caches' random codes (any scale costs the same)


def ensure_models(long: bool = False) -> dict[str, pathlib.Path]:
    """The folders of KINDS (`long`: of LONG_KINDS, exported with a capacity of LONG_CAPACITY),
    exported once under build/models (gqa-int8 is gqa-float16's folder: its int8
    graph is written there by benchmarks.gqa_int8)."""
    from quest_ort.export.families import FAMILIES, build_default_model
    from quest_ort.pipeline import export_sparse
    from quest_ort.export.rewrite import SparseSettings
    from quest_ort.model_folder.settings import default_bounds_dtype

    checkpoint = MODELS / "qwen3-0.6b-geometry" / "checkpoint"
    if not (checkpoint / "config.json").is_file():
        print("building the random Qwen3-0.6B-geometry checkpoint ...", flush=True)
        build_default_model(FAMILIES["qwen3"], checkpoint, **GEOMETRY)
    # The long export's positions pass the checkpoint's 40960: its graph computes the rotary angles
    # from each position (no table), so a step there costs what it would with Qwen3's 128K scaling.
    base, capacity = ("qwen3-0.6b-geometry-128k", LONG_CAPACITY) if long else ("qwen3-0.6b-geometry", CAPACITY)
    kinds = LONG_KINDS if long else tuple(KINDS)
    exported = {"gqa-float16" if kind == "gqa-int8" else kind for kind in kinds}
    folders = {}
    for kind in KINDS:
        if kind not in exported:
            continue
        attention, kv_dtype = KINDS[kind]
        settings = SparseSettings.for_budget(32, kv_dtype=kv_dtype, attention=attention, weights=WEIGHTS)
        # (named by what it exports, so an export of other defaults is not reused)
        bounds = default_bounds_dtype(kv_dtype, settings.score)
        name = "gqa" if attention == "gqa" else (f"quest-k{settings.top_k}-p{settings.block_size}-{settings.group_reduce}"
                                                 + ("" if bounds == "float16" else f"-b{bounds}")
                                                 + (f"-u{settings.superblocks}" if settings.superblocks else ""))
        folder = MODELS / f"{base}-{name}-{kv_dtype}-{WEIGHTS}"
        if not (folder / "quest_model.json").is_file() or _older_export(folder):
            print(f"exporting {kind} ({base}) ...", flush=True)  # (again, when an older exporter wrote the folder)
            export_sparse("qwen3", output=folder, settings=settings, model=str(checkpoint), capacity=capacity,
                          overwrite=True)
        folders[kind] = folder
    if "gqa-int8" in kinds:
        folders["gqa-int8"] = folders["gqa-float16"]
    return {kind: folders[kind] for kind in kinds}


def _older_export(folder: pathlib.Path) -> bool:
    """Whether an older exporter wrote `folder`: its graph has no logits_keep input, or a Quest node
    names an optional output nothing reads (the op computes it for nothing: an int8 cache's block
    importance, before 2026-12-04)."""
    import onnx

    from quest_ort.model_folder.folder_check import unread_optional_outputs
    from quest_ort.model_folder.sidecar import Sidecar

    sidecar = Sidecar.read(folder)
    if "logits_keep" not in sidecar.inputs:
        return True
    return bool(unread_optional_outputs(onnx.load(str(folder / sidecar.model_file), load_external_data=False).graph))


def open_model(kind: str, folder: pathlib.Path, threads: int):
    from quest_ort.runtime.model import QuestModel

    from .gqa_int8 import Int8CacheGqa

    return Int8CacheGqa(folder, threads=threads) if kind == "gqa-int8" else QuestModel(folder, threads=threads)


def _random_fill(array: np.ndarray, rng) -> None:
    """Random content in place, a piece at a time (no full-size temporary): N(0, 1) floats, or
    int8 codes in [-127, 127]."""
    flat = array.reshape(-1)
    for start in range(0, flat.size, 1 << 24):
        part = flat[start : start + (1 << 24)]
        if array.dtype == np.int8:
            part[:] = rng.integers(-127, 128, part.size, dtype=np.int8)
        else:
            part[:] = rng.standard_normal(part.size, dtype=np.float32)


def fill(cache, context: int, block_size: int | None, rng, superblock_size: int = 0) -> None:
    """Synthetic caches holding `context` tokens per row: random keys and values (int8 caches:
    random codes, row scales INT8_SCALE), and the block bounds QuestMetadata would write of the
    keys the cache holds (quality_runtime.block_bounds, by the op's NumPy reference)."""
    for layer in cache.layers:
        for array in (layer.key, layer.value):
            _random_fill(array, rng)
        for scale in (layer.key_scale, layer.value_scale):
            if scale is not None:
                scale[...] = INT8_SCALE
        if layer.block_max is None:  # a dense layer, or a model without bounds
            continue
        keys = layer.key
        if layer.key_scale is not None:  # what an int8 cache holds: code x row scale, exact in float32
            keys = dequantize_rows(keys[..., :context, :], layer.key_scale[..., :context])
        for arrays, size in bound_sets(layer, block_size, superblock_size):
            bounds = block_bounds(keys, context, size, layer.block_max.dtype)
            blocks = bounds[0].shape[-2]
            for array, values in zip(arrays, bounds, strict=True):
                array[:, :, :blocks] = values
    cache.lengths[:] = context


def decode_round_robin(models: dict, caches: dict, context: int, steps: int) -> dict[str, float]:
    """Median ms per decode step of each model at `context` cached tokens: `steps` rounds (after
    one warm-up round) in which every model decodes one token, the order turning each round. Each
    step follows an untimed pause: ONNX Runtime's pool threads spin on after a run, and the last
    session's spinning threads would take the cores from the next one's (measured: the Quest
    models' 32K step took 160 ms in turns without the pause, 89-104 ms alone)."""
    token = np.array([[7]], np.int64)
    times = {kind: [] for kind in models}
    kinds = list(models)
    for round_ in range(steps + 1):
        for kind in kinds[round_ % len(kinds):] + kinds[: round_ % len(kinds)]:
            cache = caches[kind]
            cache.lengths[:] = context  # every step decodes at the same position, so the cost is comparable
            time.sleep(SETTLE_S)
            begin = time.perf_counter()
            models[kind].step(cache, token)
            if round_:
                times[kind].append(time.perf_counter() - begin)
    return {kind: statistics.median(values) * 1e3 for kind, values in times.items()}


def available_memory() -> int | None:
    """The kernel's MemAvailable in bytes (None where /proc/meminfo does not say)."""
    try:
        lines = pathlib.Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:")), None)


def selection_bound_bytes(settings, cache, context: int, flat: bool = False) -> int:
    """The bound bytes a decode step's selections read at `context` cached tokens: every block's
    bounds (flat, or `flat` asked); selecting hierarchically past candidate_factor * top_k blocks,
    every superblock's and the candidates' blocks' (docs/ops.md)."""
    blocks = -(-context // settings.block_size)
    reads = None if flat else hierarchical_reads(context // settings.block_size, settings.top_k, settings.superblocks,
                                                 settings.candidate_factor)  # the decode query at `context`
    total = 0
    for layer in cache.layers:
        if layer.block_max is None:
            continue
        per_block = sum(array[:1, :, :1].nbytes for array in bound_arrays(layer))
        if reads is None:
            total += blocks * per_block
            continue
        superblocks, candidate_blocks = reads
        total += superblocks * sum(array[:1, :, :1].nbytes for array in super_arrays(layer)) + candidate_blocks * per_block
    return total * cache.batch


def dense_layer_bytes(cache, context: int) -> int:
    """The cache bytes a decode step's dense layers (the export's dense_layers: no block bounds) read
    at `context` cached tokens: every key and value row, and an int8 row's scales."""
    return cache.batch * sum(array[:1, :, :context].nbytes for layer in cache.layers if layer.block_max is None
                             for array in (layer.key, layer.value, layer.key_scale, layer.value_scale)
                             if array is not None)


def long_decode(folders: dict, threads: int, steps: int, rng) -> dict:
    """LONG_KINDS decoding in turns at each of LONG_CONTEXTS in caches of LONG_CAPACITY: rows as
    `decode`'s, each step's time over its 4K step, the block bound bytes the Quest step reads (and
    those a flat selection would), and the bytes its dense layers read, with the least time that
    takes at the machine's read bandwidth.
    Refused before any cache is filled where the memory available cannot hold the caches: then
    `not_measured` says why and there are no rows."""
    models = {kind: open_model(kind, folders[kind], threads) for kind in LONG_KINDS}
    # Measured before any cache is made: QuestModel.new_cache touches every page as it allocates
    # (GroupQueryAttention's np.zeros cache does not), so the Quest cache is counted from its layout
    # and made only once the check has passed.
    available = available_memory()
    caches = {"gqa-int8": models["gqa-int8"].new_cache(1, LONG_CAPACITY)}
    needed = (cache_bytes(models["quest-int8"].sidecar, 1, LONG_CAPACITY)
              + sum(array.nbytes for array in caches["gqa-int8"].buffers.values()) + LONG_HEADROOM)
    if available is not None and available < needed:
        reason = (f"needs {needed / 2**30:.1f} GiB (two {LONG_CAPACITY}-token caches and {LONG_HEADROOM >> 30} GiB "
                  f"for the sessions and the fill), {available / 2**30:.1f} GiB available")
        print(f"long contexts not measured: {reason}", flush=True)
        return dict(capacity=LONG_CAPACITY, not_measured=reason, rows=[], date=time.strftime("%Y-%m-%d"))
    bandwidth = read_bandwidth(threads)  # GB/s, before the caches are filled (a GB of its own)
    caches = {kind: caches[kind] if kind in caches else models[kind].new_cache(1, LONG_CAPACITY) for kind in LONG_KINDS}
    quest = models["quest-int8"]
    block_size = quest.sidecar.settings.block_size
    rows, bound_bytes, flat_bytes, dense_bytes = [], {}, {}, {}
    for context in LONG_CONTEXTS:
        for kind in LONG_KINDS:
            fill(caches[kind], context, block_size, rng, models[kind].sidecar.settings.superblocks)
        ms = decode_round_robin(models, caches, context, steps)
        rows += [dict(model=kind, context=context, ms_per_token=round(value, 2), threads=threads)
                 for kind, value in ms.items()]
        bound_bytes[str(context)] = selection_bound_bytes(quest.sidecar.settings, caches["quest-int8"], context)
        flat_bytes[str(context)] = selection_bound_bytes(quest.sidecar.settings, caches["quest-int8"], context, flat=True)
        dense_bytes[str(context)] = dense_layer_bytes(caches["quest-int8"], context)
        print(f"long, C={context:6d} " + "  ".join(f"{kind} {value:7.1f}" for kind, value in ms.items())
              + f" ms/token; Quest block bounds read per step {bound_bytes[str(context)] / 2**20:.0f} MiB", flush=True)
    del caches
    first = {row["model"]: row["ms_per_token"] for row in rows if row["context"] == LONG_CONTEXTS[0]}
    for row in rows:
        row["over_first_context"] = round(row["ms_per_token"] / first[row["model"]], 2)
    return dict(capacity=LONG_CAPACITY, folders={kind: folders[kind].name for kind in LONG_KINDS},
                machine=dict(cpu=platform.processor() or platform.machine(), cpus=os.cpu_count(),
                             isa=native_kernel_isa()),
                selection="hierarchical" if quest.sidecar.settings.superblocks else "flat",
                superblock_size=quest.sidecar.settings.superblocks,
                candidate_factor=quest.sidecar.settings.candidate_factor, bound_bytes_per_step=bound_bytes,
                flat_bound_bytes_per_step=flat_bytes,
                bound_bytes_of_flat={context: round(bound_bytes[context] / flat_bytes[context], 3)
                                     for context in bound_bytes},
                # The dense layers attend every cached token: their reads alone take at least this
                # long at the machine's read bandwidth (what no selection can save).
                read_bandwidth_gb_per_s=round(bandwidth, 2),
                dense_layers=list(quest.sidecar.settings.dense_layers), dense_layer_bytes_per_step=dense_bytes,
                dense_layer_floor_ms={context: round(value / bandwidth / 1e6, 2) for context, value in dense_bytes.items()},
                rows=rows, date=time.strftime("%Y-%m-%d"))


def prefill_run(folder: pathlib.Path, tokens: int, threads: int, mode: str = "exact", kind: str = "quest") -> dict:
    """One prefill of `tokens` random ids in a process of its own (benchmarks.prefill_once): seconds
    and peak RSS."""
    run = subprocess.run([sys.executable, "-m", "benchmarks.prefill_once", "gqa-int8" if kind == "gqa-int8" else "quest",
                          str(folder), str(tokens), "--threads", str(threads), "--prefill", mode],
                         capture_output=True, text=True, cwd=ROOT)
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1:]}
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return dict(result, seconds=float(f"{result['seconds']:.4g}"))  # 4 significant digits: a tiny run is not 0


def prefill_side_by_side(models: dict, tokens: int) -> dict[str, float]:
    """Seconds each model's prefill of the same `tokens` random ids takes when their steps alternate:
    the steps `prefill` takes for one prompt (PREFILL_CHUNK positions each, exact), in turns, the
    first model of each turn swapped every chunk."""
    from quest_ort.runtime.generate import PREFILL_CHUNK

    (vocab_size,) = {model.sidecar.vocab_size for model in models.values()}  # the same checkpoint
    ids = np.random.default_rng(0).integers(0, vocab_size, (1, tokens))
    caches = {kind: model.new_cache(1, tokens + 64) for kind, model in models.items()}
    seconds = dict.fromkeys(models, 0.0)
    for turn, start in enumerate(range(0, tokens, PREFILL_CHUNK)):
        kinds = list(models) if turn % 2 == 0 else list(models)[::-1]
        for kind in kinds:
            begin = time.perf_counter()
            models[kind].step(caches[kind], ids[:, start : start + PREFILL_CHUNK], exact=True, last_logits=1)
            seconds[kind] += time.perf_counter() - begin
    return {kind: round(value, 2) for kind, value in seconds.items()}


def prefill_pairs(folders: dict, models: dict, lengths, threads: int) -> list[dict]:
    """Per prompt length: each model's prefill alone in its own process (seconds, peak RSS), then
    both side by side (the time ratio, the first model's time over the second's)."""
    first, second = models
    rows = []
    for tokens in lengths:
        runs = {kind: prefill_run(folders[kind], tokens, threads) for kind in models}
        row = dict(tokens=tokens, **{kind: run for kind, run in runs.items()})
        if all("seconds" in run for run in runs.values()):
            paired = prefill_side_by_side(models, tokens)
            for kind, run in runs.items():
                run["side_by_side_seconds"] = paired[kind]
            row["time_ratio"] = round(paired[first] / paired[second], 3)
            row["time_ratio_alone"] = round(runs[first]["seconds"] / runs[second]["seconds"], 3)
            row["peak_rss_ratio"] = round(runs[first]["peak_rss_gb"] / runs[second]["peak_rss_gb"], 3)
        print(f"prefill {tokens:5d} tokens: {row}", flush=True)
        rows.append(row)
    return rows


def time_to_first_token(folders: dict, lengths, threads: int, on_row=None, runs=TTFT_RUNS) -> list[dict]:
    """Per prompt length, each of `runs` in its own process (prefill_run): seconds to the first
    token and peak RSS; with the sparse prefill's speed-up over the exact one and over each baseline.
    `on_row(rows)` after each length (a run of an hour keeps what it measured if stopped)."""
    rows = []
    for tokens in lengths:
        row = dict(tokens=tokens, date=time.strftime("%Y-%m-%d"))
        for kind, mode in runs:
            row[f"{kind} {mode}"] = prefill_run(folders[kind], tokens, threads, mode, kind)
            print(f"time to first token, {tokens:5d} tokens: {kind} {mode}: {row[f'{kind} {mode}']}", flush=True)
        sparse = row.get("quest-int8 sparse", {}).get("seconds")
        row["sparse_times_faster"] = {label: round(run["seconds"] / sparse, 2) for label, run in row.items()
                                      if isinstance(run, dict) and "seconds" in run and label != "quest-int8 sparse"
                                      and sparse}
        rows.append(row)
        if on_row:
            on_row(rows)
    return rows


def merge_ttft_rows(earlier: dict[int, dict], rows: list[dict]) -> list[dict]:
    """The rows of a time-to-first-token run over the `earlier` rows (by prompt length): a length
    measured now keeps the earlier runs it did not repeat, each marked `earlier_run` with the date
    of its own run (one already marked keeps its mark). sparse_times_faster compares only runs
    measured together: this run's ratios, and the earlier ones neither of whose runs it repeated."""
    merged = dict(earlier)
    for row in rows:
        old = earlier.get(row["tokens"], {})
        kept = {label: run if run.get("earlier_run") else
                dict(run, earlier_run=True, **({"date": old["date"]} if "date" in old else {}))
                for label, run in old.items() if isinstance(run, dict) and "seconds" in run and label not in row}
        ratios = {label: ratio for label, ratio in old.get("sparse_times_faster", {}).items()
                  if label in kept and "quest-int8 sparse" in kept}
        merged[row["tokens"]] = {**row, **kept, "sparse_times_faster": {**ratios, **row.get("sparse_times_faster", {})}}
    return [merged[tokens] for tokens in sorted(merged)]


def peak_memory(folders: dict, context: int, threads: int, steps: int) -> dict[str, dict]:
    """Each model alone in its own process (benchmarks.decode_once) decoding at `context` tokens in
    a cache of CAPACITY: its peak RSS over the whole run, in the prompt step that ends at `context`
    and while decoding, and its cache bytes."""
    rows = {}
    for kind, folder in folders.items():
        run = subprocess.run([sys.executable, "-m", "benchmarks.decode_once", kind, str(folder), str(context),
                              "--capacity", str(CAPACITY), "--threads", str(threads), "--steps", str(steps)],
                             capture_output=True, text=True, cwd=ROOT)
        rows[kind] = (json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0
                      else {"error": run.stderr.strip().splitlines()[-1:]})
        print(f"alone, C={context}: {kind:<14} {rows[kind]}", flush=True)
    return rows


def ratios(ms: dict[str, float]) -> dict[str, float]:
    """Each baseline's time over each Quest model's, "gqa-float16/quest-int8": how many times faster."""
    return {f"{base}/{quest}": round(ms[base] / ms[quest], 2) for base in ms if base.startswith("gqa")
            for quest in ms if quest.startswith("quest")}


def plot(rows, memory, path, title, ttft=(), long_part=None):
    plt = pyplot(path.name)
    if plt is None:
        return False

    long_part = long_part or {}
    long_rows = long_part.get("rows", [])
    # (the long run may be of another day or machine than the decode rows: its own, named)
    long_run = (f" ({long_part['machine']['isa']}, {long_part['date']})" if "machine" in long_part else "")
    panels = 3 if ttft else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5),
                             gridspec_kw=dict(width_ratios=(3, 2, 3)[:panels]))
    time_ax, memory_ax = axes[:2]
    colors = {"quest-float16": "tab:green", "quest-int8": "tab:olive", "gqa-float16": "tab:red", "gqa-int8": "tab:orange"}
    for kind, color in colors.items():
        points = sorted((r["context"], r["ms_per_token"]) for r in rows if r["model"] == kind)
        time_ax.plot(*zip(*points), marker="o", color=color, label=label_of(kind))
        long_points = sorted((r["context"], r["ms_per_token"]) for r in long_rows if r["model"] == kind)
        if long_points:  # the 128K-capacity export's run (bench_e2e.long_decode), dashed
            time_ax.plot(*zip(*long_points), marker="s", linestyle="--", color=color,
                         label=f"{label_of(kind)}, to {long_points[-1][0] // 1024}K{long_run}")
    time_ax.set(xscale="log", yscale="log", xlabel="cached tokens", ylabel="ms per decoded token", title=title)
    far = max((r for r in long_rows if r["model"] == "quest-int8"), key=lambda r: r["context"], default=None)
    if far is not None:  # issue 43's targets, said where the long run's line ends
        of_flat = long_part.get("bound_bytes_of_flat", {}).get(str(far["context"]))
        dense_ms = long_part.get("dense_layer_floor_ms", {}).get(str(far["context"]))
        time_ax.annotate(f"{far['context'] // 1024}K step: {far['over_first_context']}x the "
                         f"{LONG_CONTEXTS[0] // 1024}K step (target <= {FLAT_STEP_TARGET}x)"
                         + (f";\nselection reads {of_flat} of the flat bound bytes (target <= {BOUND_BYTES_TARGET})"
                            if of_flat is not None else "")
                         + (f";\nthe dense layers' reads alone >= {dense_ms} ms" if dense_ms is not None else ""),
                         (far["context"], far["ms_per_token"]), xytext=(0, -52), textcoords="offset points",
                         ha="right", fontsize=8)
    time_ax.legend(fontsize=8)
    kinds = [kind for kind in colors if "peak_rss_gb" in memory.get(kind, {})]
    # (decode_once measures GiB, under the keys' historical "_gb" names) the peak of the prompt step
    # that ends at the context, hatched behind the peak while decoding
    for key, alpha, hatch in (("prompt_step_peak_rss_gb", 0.35, "//"), ("decode_peak_rss_gb", 1.0, None)):
        memory_ax.bar(range(len(kinds)), [memory[kind].get(key, 0.0) for kind in kinds], alpha=alpha, hatch=hatch,
                      color=[colors[kind] for kind in kinds])
    memory_ax.set_xticks(range(len(kinds)), [kind for kind in kinds], fontsize=8)
    memory_ax.set(ylabel="peak RSS (GiB): decoding; hatched: the last prompt step",
                  title=f"memory at {CONTEXTS[-1] // 1024}K tokens, one process each")
    if ttft:
        runs = [f"{kind} {mode}" for kind, mode in TTFT_RUNS]
        run_colors = {"quest-int8 exact": "tab:olive", "quest-int8 sparse": "tab:green", "gqa-float16 exact": "tab:red",
                      "gqa-int8 exact": "tab:orange"}
        width = 0.8 / len(runs)
        for index, run in enumerate(runs):
            points = [(position, row[run]["seconds"]) for position, row in enumerate(ttft) if "seconds" in row.get(run, {})]
            if points:
                positions, seconds = zip(*points)
                axes[2].bar([x + (index - len(runs) / 2 + 0.5) * width for x in positions], seconds, width,
                            color=run_colors.get(run), label=run.replace("quest-int8", "Quest int8").replace(
                                " exact", ", exact prefill").replace(" sparse", ", sparse prefill"))
        axes[2].set_xticks(range(len(ttft)), [f"{row['tokens'] // 1024}K" for row in ttft])
        axes[2].set(yscale="log", xlabel="prompt tokens", ylabel="seconds to the first token",
                    title="time to first token, one process each")
        axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def ttft_runs(text: str) -> tuple[tuple[str, str], ...]:
    """--ttft-runs: 'quest-int8 exact,gqa-float16 exact' -> the TTFT_RUNS named, refusing others."""
    runs = tuple(tuple(label.split()) for label in text.split(",") if label.strip())
    unknown = [" ".join(run) for run in runs if run not in TTFT_RUNS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown runs {unknown}; known: "
                                         + ", ".join(f"{kind} {mode}" for kind, mode in TTFT_RUNS))
    return runs


def label_of(kind: str) -> str:
    return LABELS.get(kind) or f"Quest --k 32, {KINDS[kind][1]} cache"


def earlier_report() -> dict:
    """results/e2e.json as the last run left it (empty before any run): what an --only-* run adds to."""
    return json.loads((RESULTS / "e2e.json").read_text()) if (RESULTS / "e2e.json").is_file() else {}


def write_report(report: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "e2e.json").write_text(json.dumps(report, indent=1) + "\n")


def write_part(report: dict) -> None:
    """results/e2e.json after an --only-* part, and e2e.png from every part it holds (once there are
    decode rows to draw)."""
    write_report(report)
    if report.get("decode"):
        plot(report["decode"], report.get("memory", {}), RESULTS / "e2e.png",
             f"Qwen3-0.6B geometry, {WEIGHTS} weights, {report.get('threads')} threads",
             report.get("time_to_first_token", ()), report.get("long_decode"))
    print(f"wrote {RESULTS / 'e2e.json'}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prefill-tokens", type=lambda text: tuple(int(t) for t in text.split(",") if t),
                        default=PREFILL_TOKENS, help="prompt lengths of the prefill runs, comma-separated ('' for none)")
    parser.add_argument("--ttft-tokens", type=lambda text: tuple(int(t) for t in text.split(",") if t),
                        default=TTFT_TOKENS, help="prompt lengths of the time-to-first-token runs ('' for none)")
    parser.add_argument("--ttft-runs", type=ttft_runs, default=TTFT_RUNS,
                        help="which time-to-first-token runs, comma-separated (default: all of "
                        + ", ".join(f"'{kind} {mode}'" for kind, mode in TTFT_RUNS) + ")")
    parser.add_argument("--only-decode", action="store_true",
                        help="only the decode steps in turns, kept with the other parts of results/e2e.json (which "
                        "say the settings and the date they were measured with)")
    parser.add_argument("--only-long", action="store_true",
                        help="only the int8-cache pair's decode at " + ", ".join(f"{c // 1024}K" for c in LONG_CONTEXTS)
                        + " (about 20 GiB at its peak), kept with the other parts of results/e2e.json")
    parser.add_argument("--only-ttft", action="store_true",
                        help="only the time-to-first-token runs, kept with the other parts of results/e2e.json "
                        "(rows of lengths not measured again stay)")
    args = parser.parse_args(argv)
    from quest_ort.apps.console import configure_logging

    configure_logging()  # the exports' steps and the checkpoints' conversion, on stderr
    from .gqa_int8 import MODEL_FILE

    if args.only_long:
        report = earlier_report()
        report["long_decode"] = long_decode(ensure_models(long=True), args.threads, args.steps,
                                            np.random.default_rng(0))
        write_part(report)
        return
    folders = ensure_models()
    if args.only_ttft:
        report = earlier_report()
        earlier = {row["tokens"]: row for row in report.get("time_to_first_token", [])}

        def save(rows):  # what is measured now replaces its entries; the rest stays, marked as earlier
            report["time_to_first_token"] = merge_ttft_rows(earlier, rows)
            write_report(report)

        time_to_first_token(folders, args.ttft_tokens, args.threads, on_row=save, runs=args.ttft_runs)
        write_part(report)
        return
    models = {kind: open_model(kind, folder, args.threads) for kind, folder in folders.items()}
    quest = models["quest-float16"]
    settings = quest.sidecar.settings
    caches = {"quest-float16": quest.new_cache(1, CAPACITY), "quest-int8": models["quest-int8"].new_cache(1, CAPACITY),
              "gqa-int8": models["gqa-int8"].new_cache(1, CAPACITY)}
    # The two float16 models read the same key/value buffers (same layout), so they decode the same context.
    caches["gqa-float16"] = sharing_cache(models["gqa-float16"], caches["quest-float16"])
    rng = np.random.default_rng(0)
    rows, speedups = [], {}
    for context in CONTEXTS:
        for kind in ("quest-float16", "quest-int8", "gqa-int8"):
            fill(caches[kind], context, settings.block_size, rng, models[kind].sidecar.settings.superblocks)
        ms = decode_round_robin(models, caches, context, args.steps)
        for kind, value in ms.items():
            rows.append(dict(model=kind, context=context, ms_per_token=round(value, 2), threads=args.threads))
        speedups[str(context)] = ratios(ms)
        print(f"C={context:6d} " + "  ".join(f"{kind} {value:7.1f}" for kind, value in ms.items()) + " ms/token",
              flush=True)
        print(f"          times faster: {speedups[str(context)]}", flush=True)
    del caches
    if args.only_decode:
        report = earlier_report()
        earlier = {key: report.get(key) for key in ("top_k", "block_size", "group_reduce", "bounds_dtype", "threads")}
        if any(value is not None for value in earlier.values()) and "earlier_settings" not in report:
            report["earlier_settings"] = dict(earlier, parts="memory, prefill, time_to_first_token")
        report.update(top_k=settings.top_k, block_size=settings.block_size, group_reduce=settings.group_reduce,
                      bounds_dtype=quest.sidecar.bounds_dtype, threads=args.threads, decode=rows, speedup=speedups,
                      decode_date=time.strftime("%Y-%m-%d"))
        write_report(report)
        drawn = plot(rows, report.get("memory", {}), RESULTS / "e2e.png",
                     f"Qwen3-0.6B geometry, {WEIGHTS} weights, {quest.sidecar.geometry.num_layers} layers, "
                     f"{args.threads} threads", report.get("time_to_first_token", ()), report.get("long_decode"))
        print(f"wrote {RESULTS / 'e2e.json'}" + (" and e2e.png" if drawn else ""))
        return
    report = dict(geometry=GEOMETRY, weights=WEIGHTS, top_k=settings.top_k, block_size=settings.block_size,
                  group_reduce=settings.group_reduce, bounds_dtype=quest.sidecar.bounds_dtype, threads=args.threads,
                  models={kind: dict(folder=str(folders[kind].relative_to(ROOT)), attention=KINDS[kind][0],
                                     kv_dtype=KINDS[kind][1], graph=MODEL_FILE if kind == "gqa-int8" else
                                     models[kind].sidecar.model_file,
                                     **({"bounds_dtype": models[kind].sidecar.bounds_dtype}
                                        if KINDS[kind][0] == "quest" else {})) for kind in KINDS},
                  decode=rows, speedup=speedups, memory_at=CONTEXTS[-1], memory={}, prefill=[])
    title = f"Qwen3-0.6B geometry, {WEIGHTS} weights, {quest.sidecar.geometry.num_layers} layers, {args.threads} threads"

    def save() -> bool:  # after each part: a later failure loses nothing measured
        write_report(report)
        return plot(rows, report["memory"], RESULTS / "e2e.png", title, report.get("time_to_first_token", ()),
                    report.get("long_decode"))

    save()
    # (the decode caches are freed; the long part allocates two 128K caches of its own)
    report["long_decode"] = long_decode(ensure_models(long=True), args.threads, args.steps, rng)
    save()
    report["memory"] = peak_memory(folders, CONTEXTS[-1], args.threads, args.steps)
    save()
    # The float16 models stay loaded for the side-by-side prefill; the per-process runs measure their
    # own peaks, which this process does not touch.
    float16 = {kind: models[kind] for kind in ("quest-float16", "gqa-float16")}
    report["prefill"] = prefill_pairs(folders, float16, args.prefill_tokens, args.threads)
    save()
    del models, float16  # (each run of time_to_first_token opens its model in a process of its own)
    report["time_to_first_token"] = time_to_first_token(folders, args.ttft_tokens, args.threads, runs=args.ttft_runs)
    drawn = save()
    print(f"wrote {RESULTS / 'e2e.json'}" + (" and e2e.png" if drawn else ""))


if __name__ == "__main__":
    main()
