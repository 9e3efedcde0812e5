"""`make eval-levers`: what a larger recent window or more dense layers buy SparseBlockSelect's
bound policy in perplexity on SmolLM2-135M-Instruct, at the budgets of `make eval` (22 minutes
with --threads 1). Prints a table and writes docs/quality_levers.json.

Each lever is a variant of the `make eval` export (bound, mean reduction): `recent_blocks` covering
256 tokens of the budget, or the first sparse layers selecting every block (dense-equivalent, as an
export with more `--dense-layers` would be). The budget K x P stays the token budget of the sparse
layers; `reads` is what one decode step reads of the KV cache at the end of the text, relative to
dense attention in every layer.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

from eval_quality import CAPACITY, DOCS, export_base, natural_text, perplexity, shared_weights, write_variant

BUDGETS = (256, 1024)
BLOCK_SIZES = (16, 32)
LEVERS = {  # name: (SparseBlockSelect attributes given P, extra sparse layers made dense)
    "default (recent 1 block)": (lambda P: {}, 0),
    "recent 256 tokens": (lambda P: {"recent_blocks": 256 // P}, 0),
    "layers 2-3 dense": (lambda P: {}, 2),
    "layers 2-5 dense": (lambda P: {}, 4),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ppl-tokens", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", type=pathlib.Path, default=DOCS / "quality_levers.json")
    args = parser.parse_args(argv)
    from quest_ort.runtime.model import QuestModel
    from transformers import AutoTokenizer

    from quest_ort.export.sidecar import Sidecar

    started = time.time()
    tokenizer = AutoTokenizer.from_pretrained(export_base(BLOCK_SIZES[0], CAPACITY) / "tokenizer")
    ids = tokenizer(natural_text(), add_special_tokens=False).input_ids[: args.ppl_tokens]
    if len(ids) < args.ppl_tokens:
        raise ValueError(f"the natural text has only {len(ids)} tokens, fewer than {args.ppl_tokens}")
    rows, dense = [], None
    for P in BLOCK_SIZES:
        folder = export_base(P, CAPACITY)
        sidecar = Sidecar.read(folder)
        weights = shared_weights(folder)
        every_block = -(-sidecar.capacity // P)
        open_ = lambda file: QuestModel(folder, threads=args.threads, model_file=file, initializers=weights)  # noqa: E731
        if dense is None:  # once: the same weights and text at every block size
            dense = perplexity(open_(write_variant(folder, "dense", top_k=every_block, importance_fraction=0.0)), ids)
            rows.append(dict(lever="dense", block_size=None, budget=None, reads=1.0, perplexity=round(dense, 4)))
            print(f"dense: perplexity {dense:.3f}", flush=True)
        for budget in BUDGETS:
            for lever, (attributes, extra_dense) in LEVERS.items():
                name = f"lever-P{P}-B{budget}-{len(rows)}"
                file = write_variant(folder, name, dense_selects=(extra_dense, every_block), top_k=budget // P,
                                     score="bound", group_reduce="mean", importance_fraction=0.0, **attributes(P))
                value = perplexity(open_(file), ids)
                (folder / file).unlink()
                dense_layers = len(sidecar.dense_layers) + extra_dense
                reads = (dense_layers * len(ids) + (sidecar.num_layers - dense_layers) * budget) / (
                    sidecar.num_layers * len(ids))
                rows.append(dict(lever=lever, block_size=P, budget=budget, reads=round(reads, 4),
                                 perplexity=round(value, 4), change=round(value / dense - 1, 4)))
                print(f"P={P} budget={budget} {lever}: perplexity {value:.3f} ({value / dense - 1:+.1%}), "
                      f"reads {reads:.1%} of dense [{time.time() - started:.0f}s]", flush=True)
    args.output.write_text(json.dumps(dict(text_tokens=len(ids), rows=rows), indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
