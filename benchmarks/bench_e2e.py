"""End-to-end decode and prefill: a model with Qwen3-0.6B's geometry exported with the defaults
(`export-sparse qwen3 --k 32 --kv-dtype float16`) against the same model with ONNX Runtime's
GroupQueryAttention, both over float16 in-place caches.

Random weights (28 layers, hidden 1024, 16 query heads, 8 KV heads, head dim 128, vocab 151936).
Decode: the caches are filled synthetically to 4K, 16K and 32K tokens (both models read the very
same buffers), then each decodes a few tokens. Prefill (time to first token): 4K- and 8K-token
prompts through the runtime's `prefill` (exact, the default), each model in its own process so
its peak RSS is its own; the time ratio is measured side by side in one process, the two models'
prefill steps alternating chunk by chunk (this machine's speed drifts by ten percent within a
minute, which one model after the other would measure). Prints a table, writes results/e2e.json
and e2e.png.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

from . import ROOT
from .quality_runtime import block_bounds, sharing_cache

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MODELS = ROOT / "build" / "models"
GEOMETRY = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                tie_word_embeddings=True)
CONTEXTS = (4096, 16384, 32768)
CAPACITY = 32768 + 64
PREFILL_TOKENS = (4096, 8192)
SETTINGS = dict(top_k=32, kv_dtype="float16")  # the export's defaults otherwise


def ensure_models() -> dict[str, pathlib.Path]:
    from quest_ort.export.families import FAMILIES, build_default_model
    from quest_ort.apps.pipeline import export_sparse
    from quest_ort.export.rewrite import SparseSettings

    checkpoint = MODELS / "qwen3-0.6b-geometry" / "checkpoint"
    if not (checkpoint / "config.json").is_file():
        print("building the random Qwen3-0.6B-geometry checkpoint ...", flush=True)
        build_default_model(FAMILIES["qwen3"], checkpoint, **GEOMETRY)
    folders = {}
    for attention in ("quest", "gqa"):
        settings = SparseSettings(**SETTINGS, attention=attention)
        # (named by what selection it exports, so an export of other defaults is not reused)
        name = "gqa" if attention == "gqa" else f"quest-k{settings.top_k}-p{settings.block_size}-{settings.group_reduce}"
        folder = MODELS / f"qwen3-0.6b-geometry-{name}"
        if not (folder / "quest_model.json").is_file():
            export_sparse("qwen3", output=folder, settings=settings, model=str(checkpoint), capacity=CAPACITY,
                          overwrite=True)
        folders[attention] = folder
    return folders


def fill(model, cache, context: int, rng) -> None:
    """Synthetic caches holding `context` tokens per row: random keys/values, and the block bounds
    QuestMetadata would write (quality_runtime.block_bounds, by the op's NumPy reference)."""
    for layer in cache.layers:
        for array in (layer.key, layer.value):
            flat = array.reshape(-1)
            for start in range(0, flat.size, 1 << 24):
                part = flat[start : start + (1 << 24)]
                part[:] = rng.standard_normal(part.size, dtype=np.float32)
        if layer.block_max is None:  # a dense layer
            continue
        bounds = block_bounds(layer.key, context, model.sidecar.settings.block_size, layer.block_max.dtype)
        blocks = bounds[0].shape[-2]
        layer.block_max[:, :, :blocks], layer.block_min[:, :, :blocks] = bounds
    cache.lengths[:] = context


def decode_ms(model, cache, context: int, steps: int) -> float:
    times = []
    token = np.array([[7]], np.int64)
    for _ in range(steps + 1):
        cache.lengths[:] = context  # every step decodes at the same position, so the cost is comparable
        begin = time.perf_counter()
        model.step(cache, token)
        times.append(time.perf_counter() - begin)
    return statistics.median(times[1:]) * 1e3


def prefill_run(folder: pathlib.Path, tokens: int, threads: int) -> dict:
    """One prefill of `tokens` random ids in a process of its own (benchmarks.prefill_once): seconds
    and peak RSS."""
    run = subprocess.run([sys.executable, "-m", "benchmarks.prefill_once", "quest", str(folder), str(tokens),
                          "--threads", str(threads)], capture_output=True, text=True, cwd=ROOT)
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1:]}
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return dict(result, seconds=round(result["seconds"], 2))


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
            models[kind].step(caches[kind], ids[:, start : start + PREFILL_CHUNK], exact=True)
            seconds[kind] += time.perf_counter() - begin
    return {kind: round(value, 2) for kind, value in seconds.items()}


def prefill_pairs(folders: dict, models: dict, lengths, threads: int) -> list[dict]:
    """Per prompt length: each model's prefill alone in its own process (seconds, peak RSS), then
    both side by side (the time ratio)."""
    rows = []
    for tokens in lengths:
        runs = {kind: prefill_run(folder, tokens, threads) for kind, folder in folders.items()}
        row = dict(tokens=tokens, **{kind: run for kind, run in runs.items()})
        if all("seconds" in run for run in runs.values()):
            paired = prefill_side_by_side(models, tokens)
            for kind, run in runs.items():
                run["side_by_side_seconds"] = paired[kind]
            row["time_ratio"] = round(paired["quest"] / paired["gqa"], 3)
            row["time_ratio_alone"] = round(runs["quest"]["seconds"] / runs["gqa"]["seconds"], 3)
            row["peak_rss_ratio"] = round(runs["quest"]["peak_rss_gb"] / runs["gqa"]["peak_rss_gb"], 3)
        print(f"prefill {tokens:5d} tokens: {row}", flush=True)
        rows.append(row)
    return rows


def plot(rows, path, label, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, color in (("quest", "tab:green"), ("gqa", "tab:red")):
        points = sorted((r["context"], r["ms_per_token"]) for r in rows if r["model"] == kind)
        ax.plot(*zip(*points), marker="o", color=color, label={"quest": label, "gqa": "GroupQueryAttention"}[kind])
    ax.set(xscale="log", xlabel="cached tokens", ylabel="ms per decoded token",
           title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prefill-tokens", type=lambda text: tuple(int(t) for t in text.split(",")),
                        default=PREFILL_TOKENS, help="prompt lengths of the prefill runs, comma-separated")
    args = parser.parse_args(argv)
    from quest_ort.runtime.model import QuestModel

    folders = ensure_models()
    quest = QuestModel(folders["quest"], threads=args.threads)
    gqa = QuestModel(folders["gqa"], threads=args.threads)
    settings = quest.sidecar.settings
    label = f"Quest K={settings.top_k} P={settings.block_size} {settings.group_reduce}"
    cache = quest.new_cache(1, CAPACITY)
    # Both models read the same key/value buffers (same layout), so they decode the same context.
    gqa_cache = sharing_cache(gqa, cache)
    rng = np.random.default_rng(0)
    rows = []
    for context in CONTEXTS:
        fill(quest, cache, context, rng)
        for kind, model, model_cache in (("quest", quest, cache), ("gqa", gqa, gqa_cache)):
            ms = decode_ms(model, model_cache, context, args.steps)
            rows.append(dict(model=kind, context=context, ms_per_token=round(ms, 2), threads=args.threads))
            print(f"C={context:6d} {kind:<6} {ms:8.1f} ms/token", flush=True)
    speedups = {c: next(r["ms_per_token"] for r in rows if r["model"] == "gqa" and r["context"] == c)
                / next(r["ms_per_token"] for r in rows if r["model"] == "quest" and r["context"] == c) for c in CONTEXTS}
    print("speedup:", {c: round(s, 2) for c, s in speedups.items()})
    del cache, gqa_cache
    # The two models stay loaded for the side-by-side prefill (about 5 GB here); the per-process
    # runs measure their own peaks, which this process does not touch.
    prefill = prefill_pairs(folders, dict(quest=quest, gqa=gqa), args.prefill_tokens, args.threads)
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = dict(geometry=GEOMETRY, kv_dtype=settings.kv_dtype, top_k=settings.top_k, block_size=settings.block_size,
                  group_reduce=settings.group_reduce, bounds_dtype=settings.bounds_dtype, threads=args.threads,
                  decode=rows, speedup={str(c): round(s, 2) for c, s in speedups.items()}, prefill=prefill)
    (RESULTS / "e2e.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(rows, RESULTS / "e2e.png", label,
         f"Qwen3-0.6B geometry, {settings.kv_dtype} KV, {quest.sidecar.geometry.num_layers} layers")
    print(f"wrote {RESULTS / 'e2e.json'} and e2e.png")


if __name__ == "__main__":
    main()
