"""End-to-end decode: a model with Qwen3-0.6B's geometry, Quest (K=32, P=32) against the same model
with ONNX Runtime's GroupQueryAttention, both over float16 in-place caches.

Random weights (28 layers, hidden 1024, 16 query heads, 8 KV heads, head dim 128, vocab 151936);
the caches are filled synthetically to 4K, 16K and 32K tokens (both models read the very same
buffers), then each decodes a few tokens. Also a 4K-token prefill per model: seconds and peak RSS
(each in its own process). Prints a table, writes results/e2e.json and e2e.png.
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

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MODELS = pathlib.Path(__file__).resolve().parents[1] / "build" / "models"
GEOMETRY = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                tie_word_embeddings=True)
CONTEXTS = (4096, 16384, 32768)
CAPACITY = 32768 + 64


def ensure_models() -> dict[str, pathlib.Path]:
    from quest_ort.export.families import FAMILIES, build_default_model
    from quest_ort.export.pipeline import export_sparse
    from quest_ort.export.rewrite import SparseSettings

    checkpoint = MODELS / "qwen3-0.6b-geometry" / "checkpoint"
    if not (checkpoint / "config.json").is_file():
        print("building the random Qwen3-0.6B-geometry checkpoint ...", flush=True)
        build_default_model(FAMILIES["qwen3"], checkpoint, **GEOMETRY)
    folders = {}
    for attention in ("quest", "gqa"):
        folder = MODELS / f"qwen3-0.6b-geometry-{attention}"
        if not (folder / "quest_model.json").is_file():
            settings = SparseSettings(top_k=32, block_size=32, kv_dtype="float16", attention=attention)
            export_sparse("qwen3", output=folder, settings=settings, model=str(checkpoint), capacity=CAPACITY,
                          overwrite=True)
        folders[attention] = folder
    return folders


def fill(cache, context: int, rng) -> None:
    """Synthetic caches holding `context` tokens per row: random keys/values, consistent metadata."""
    for name, array in cache.buffers.items():
        if "block" in name:
            continue
        flat = array.reshape(-1)
        for start in range(0, flat.size, 1 << 24):
            part = flat[start : start + (1 << 24)]
            part[:] = rng.standard_normal(part.size, dtype=np.float32)
    for name, array in cache.buffers.items():
        if name.startswith("past_block_max."):
            layer = name.split(".")[-1]
            keys = cache.buffers[f"past_key.{layer}"][:, :, :context]
            B, N, _, D = keys.shape
            blocks = keys.reshape(B, N, context // 32, 32, D)
            array[:, :, : context // 32] = blocks.max(axis=3)
            cache.buffers[f"past_block_min.{layer}"][:, :, : context // 32] = blocks.min(axis=3)
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


PREFILL_CHILD = r"""
import json, sys, time
import numpy as np
from quest_ort.runtime.generate import prefill
from quest_ort.runtime.model import QuestModel
folder, tokens, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = QuestModel(folder, threads=threads)
ids = np.random.default_rng(0).integers(0, 151936, tokens).tolist()
cache = model.new_cache(1, tokens + 64)
begin = time.perf_counter()
prefill(model, cache, [ids])
seconds = time.perf_counter() - begin
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"seconds": round(seconds, 2), "peak_rss_gb": round(peak / 2**20, 2)}))
"""


def prefill_run(folder: pathlib.Path, tokens: int, threads: int) -> dict:
    run = subprocess.run([sys.executable, "-c", PREFILL_CHILD, str(folder), str(tokens), str(threads)],
                         capture_output=True, text=True, cwd=pathlib.Path(__file__).resolve().parent)
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1:]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, color in (("quest", "tab:green"), ("gqa", "tab:red")):
        points = sorted((r["context"], r["ms_per_token"]) for r in rows if r["model"] == kind)
        ax.plot(*zip(*points), marker="o", color=color, label={"quest": "Quest K=32 P=32", "gqa": "GroupQueryAttention"}[kind])
    ax.set(xscale="log", xlabel="cached tokens", ylabel="ms per decoded token",
           title="Qwen3-0.6B geometry, float16 KV, 28 layers")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prefill-tokens", type=int, default=4096)
    args = parser.parse_args(argv)
    from quest_ort.runtime.model import QuestModel

    folders = ensure_models()
    quest = QuestModel(folders["quest"], threads=args.threads)
    gqa = QuestModel(folders["gqa"], threads=args.threads)
    cache = quest.new_cache(1, CAPACITY)
    gqa_cache = gqa.new_cache(1, CAPACITY)
    # Both models read the same key/value buffers (same layout), so they decode the same context.
    for name in gqa_cache.buffers:
        gqa_cache.buffers[name] = cache.buffers[name]
        gqa_cache.values[name] = cache.values[name]
    rng = np.random.default_rng(0)
    rows = []
    for context in CONTEXTS:
        fill(cache, context, rng)
        for kind, model, model_cache in (("quest", quest, cache), ("gqa", gqa, gqa_cache)):
            ms = decode_ms(model, model_cache, context, args.steps)
            rows.append(dict(model=kind, context=context, ms_per_token=round(ms, 2), threads=args.threads))
            print(f"C={context:6d} {kind:<6} {ms:8.1f} ms/token", flush=True)
    speedups = {c: next(r["ms_per_token"] for r in rows if r["model"] == "gqa" and r["context"] == c)
                / next(r["ms_per_token"] for r in rows if r["model"] == "quest" and r["context"] == c) for c in CONTEXTS}
    print("speedup:", {c: round(s, 2) for c, s in speedups.items()})
    del quest, gqa, cache, gqa_cache
    prefill = {kind: prefill_run(folder, args.prefill_tokens, args.threads) for kind, folder in folders.items()}
    print("prefill:", prefill)
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = dict(geometry=GEOMETRY, kv_dtype="float16", top_k=32, block_size=32, threads=args.threads,
                  decode=rows, speedup={str(c): round(s, 2) for c, s in speedups.items()},
                  prefill_tokens=args.prefill_tokens, prefill=prefill)
    (RESULTS / "e2e.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(rows, RESULTS / "e2e.png")
    print(f"wrote {RESULTS / 'e2e.json'} and e2e.png")


if __name__ == "__main__":
    main()
