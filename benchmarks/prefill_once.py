"""One prefill of random token ids in a process of its own, for the prefill benchmarks.

bench_e2e and bench_prefill_rss run it; it prints its seconds and peak RSS as one JSON line.

    python -m benchmarks.prefill_once quest FOLDER TOKENS [--threads N] [--time-load] [--prefill MODE]
    python -m benchmarks.prefill_once gqa-int8 FOLDER TOKENS [--threads N]
    python -m benchmarks.prefill_once optimum FOLDER TOKENS

`quest`: the export in FOLDER through the runtime's `prefill` (exact, the default, or `--prefill
sparse`) into a cache of TOKENS + 64 positions, the time to the first token (the last position's
logits); `gqa-int8`: the GroupQueryAttention baseline's int8-cache graph in FOLDER (benchmarks.gqa_int8)
the same way; `optimum`: FOLDER/model.onnx (optimum's export) run once over the whole prompt from an
empty past. The ids are drawn (seed 0) from the model's own vocabulary: the Quest
sidecar's, optimum's config.json; optimum's past shapes are read from its graph's inputs.
`--time-load`: the seconds include opening the model. Peak RSS is the process's VmHWM.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np


def random_ids(vocab_size: int, tokens: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, vocab_size, size=(1, tokens))


def quest_prefill(folder: pathlib.Path, tokens: int, threads: int | None, time_load: bool, mode: str = "exact",
                  kind: str = "quest") -> float:
    from quest_ort.runtime.generate import prefill
    from quest_ort.runtime.model import QuestModel

    begin = time.perf_counter()
    if kind == "gqa-int8":
        from .gqa_int8 import Int8CacheGqa

        model = Int8CacheGqa(folder, threads=threads)
    else:
        model = QuestModel(folder) if threads is None else QuestModel(folder, threads=threads)
    ids = random_ids(model.sidecar.vocab_size, tokens)
    cache = model.new_cache(1, tokens + 64)
    if not time_load:
        begin = time.perf_counter()
    prefill(model, cache, [ids[0].tolist()], mode=mode)
    return time.perf_counter() - begin


def optimum_prefill(folder: pathlib.Path, tokens: int) -> float:
    import onnxruntime as ort

    ids = random_ids(json.loads((folder / "config.json").read_text())["vocab_size"], tokens)
    begin = time.perf_counter()
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(tokens)[None]}
    for value in session.get_inputs():
        if value.name.startswith("past_key_values"):  # [batch, KV heads, past, head dim]: an empty past
            _, heads, _, head_dim = value.shape
            feeds[value.name] = np.zeros((1, heads, 0, head_dim), np.float32)
    session.run(["logits"], {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}})
    return time.perf_counter() - begin


def peak_rss_gb() -> float:
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
    return peak / 2**20


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("quest", "gqa-int8", "optimum"))
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument("tokens", type=int)
    parser.add_argument("--threads", type=int, help="the Quest model's intra-op threads (default: the runtime's)")
    parser.add_argument("--time-load", action="store_true", help="count opening the Quest model in the seconds")
    parser.add_argument("--prefill", choices=("exact", "sparse", "per-token"), default="exact",
                        help="the runtime's prefill mode (default exact)")
    args = parser.parse_args(argv)
    if args.kind != "optimum":
        seconds = quest_prefill(args.folder, args.tokens, args.threads, args.time_load, args.prefill, args.kind)
    else:
        seconds = optimum_prefill(args.folder, args.tokens)
    print(json.dumps({"seconds": seconds, "peak_rss_gb": round(peak_rss_gb(), 2)}))


if __name__ == "__main__":
    main()
