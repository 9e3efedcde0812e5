"""What a selection policy reads: distinct KV tokens per KV head and sparse layer at the first
answer token of pass-key prompts (SmolLM2-135M-Instruct, the `make eval` exports).

With group_reduce='none' each query head selects its own K blocks, so a KV head reads the union
of its G heads' lists: between 1 and G times the budget. Usage (about 5 minutes on 2 cores):

    cd benchmarks && ../.venv/bin/python eval_reads.py [--budget 1024]
"""

from __future__ import annotations

import argparse

import numpy as np

import eval_quality as quality
from harness import blocks_per_kv_head
from quality_inputs import keys, pass_key_prompt

POLICIES = ("mean", "none")  # the bound score with a KV head's mean query, or each query head's own
LENGTHS = (2048, 8192)
DEPTHS = (0.25, 0.75)


def distinct_tokens(model, cache, token: int) -> list[int]:
    """Distinct tokens each (sparse layer, KV head) attends in one decode step (whole blocks)."""
    return [chosen.size * model.sidecar.block_size
            for selected, _ in quality.analysis_step(model, cache, token)
            for chosen in blocks_per_kv_head(selected, model.sidecar.kv_num_heads)]


def main(argv=None):
    from quest_ort.runtime.generate import prefill
    from quest_ort.runtime.model import QuestModel

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=1024, help="tokens per selection (K x P)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    dense, models = {}, {}
    for P in quality.BLOCK_SIZES:
        folder = quality.export_base(P, quality.CAPACITY)
        weights = quality.shared_weights(folder)
        open_ = lambda file, folder=folder, weights=weights: QuestModel(  # noqa: E731
            folder, threads=args.threads, model_file=file, initializers=weights)
        dense[P] = open_(quality.write_variant(folder, "dense", top_k=-(-quality.CAPACITY // P), importance_fraction=0.0))
        for reduce in POLICIES:
            models[(P, reduce)] = open_(quality.write_variant(
                folder, f"reads-{reduce}-{args.budget}", analysis=True, top_k=args.budget // P, score="bound",
                group_reduce=reduce, importance_fraction=0.0))
    tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(
        quality.export_base(quality.BLOCK_SIZES[0], quality.CAPACITY) / "tokenizer")
    largest = max(quality.BLOCK_SIZES)
    print(f"budget {args.budget} tokens; distinct tokens read per KV head and sparse layer (mean), x budget")
    for length in LENGTHS:
        for depth in DEPTHS:
            key = keys(1, seed=length + int(depth * 100))[0]
            prompt = pass_key_prompt(tokenizer, key, length, depth, seed=0)
            source = dense[largest].new_cache(1, len(prompt) + 16)
            first = int(np.argmax(prefill(dense[largest], source, [prompt])[0]))
            cells = []
            for (P, reduce), model in models.items():
                cache = source if P == largest else quality.rebuilt_cache(dense[P], source)
                state = quality.snapshot(cache)
                read = np.mean(distinct_tokens(model, cache, first))
                quality.restore(cache, state)
                cells.append(f"P={P} {reduce}: {read / args.budget:.2f}")
            print(f"{len(prompt)} tokens, depth {depth}: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
