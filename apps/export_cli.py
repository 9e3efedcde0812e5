"""`export-sparse`: export a Hugging Face model with its attention rewritten into the Quest ops.

    export-sparse qwen3 --k 32                       # the embedded default Qwen3, random weights
    export-sparse llama --model path/to/SmolLM2.gguf --k 32 --kv-dtype float16
    export-sparse llama --model path/to/SmolLM2.gguf --k 32 --weights int4   # 4-bit MatMul weights
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from ..export.families import FAMILIES
from ..export.genai_variant import GENAI_CONFIG_FILE, GENAI_MODEL_FILE
from ..export.rewrite import ExportError, SparseSettings
from ..model_folder.settings import BUDGET_PAGE_TOKENS, WEIGHT_TYPES, attribute_range_problem
from ..ops.schemas import INT32_MAX, SPARSE_BLOCK_SELECT
from .console import add_logging_flags, configure_logging

_DEFAULT = SparseSettings(top_k=1)  # the option defaults are the settings' own (one source of truth)


def _layers(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        layers = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer numbers or 'none', got {text!r}") from error
    if any(not 0 <= layer <= INT32_MAX for layer in layers):
        raise argparse.ArgumentTypeError(f"layer numbers must lie in [0, {INT32_MAX}], got {text!r}")
    return layers


def _positive(text: str) -> int:
    value = int(text)
    if not 1 <= value <= INT32_MAX:  # lengths are int32 in the model
        raise argparse.ArgumentTypeError(f"must lie in [1, {INT32_MAX}], got {text}")
    return value


def _setting(name: str):
    """The argparse type of an option that becomes SparseBlockSelect's attribute `name`: the op
    schema's range, refused before any work."""
    kind = int if SPARSE_BLOCK_SELECT.attribute(name).kind == "int" else float

    def parse(text: str):
        value = kind(text)
        problem = attribute_range_problem(name, value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = name  # argparse names it in "invalid top_k value: 'x'"
    return parse


def parser() -> argparse.ArgumentParser:
    families = "\n".join(f"  {name:<7} {family.description}" for name, family in FAMILIES.items())
    families += ("\n  onnx    an already exported model.onnx: GroupQueryAttention (ONNX Runtime GenAI) or "
                 "opset-23 Attention graphs, or an optimum export (--model is the .onnx file)")
    p = argparse.ArgumentParser(
        prog="export-sparse",
        description="Export a Hugging Face causal LM to ONNX with every attention layer rewritten into "
        "the Quest operators (query-aware block-sparse attention over an in-place KV cache).",
        epilog=f"families:\n{families}\n\nThe output folder holds the model, its external data, "
        "quest_model.json (what the runtime needs) and the tokenizer when the source has one.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("family", choices=sorted(FAMILIES) + ["onnx"],
                   help="model family (decides the default model and which rewrite rules apply)")
    p.add_argument("--model", help="local Hugging Face folder, a .gguf file, or a hub id (needs a network); "
                   "default: a small model of the family with deterministic random weights")
    p.add_argument("--k", type=_setting("top_k"), required=True,
                   help=f"selection budget in pages of {BUDGET_PAGE_TOKENS} tokens: each selection reads "
                   f"{BUDGET_PAGE_TOKENS}*K tokens (--k 32: 1024), as ceil({BUDGET_PAGE_TOKENS}*K/P) blocks of "
                   "--block-size P, its sink and recent blocks included; per query head with --group-reduce none "
                   "(the default), per KV head otherwise")
    p.add_argument("--block-size", type=_setting("block_size"), default=_DEFAULT.block_size,
                   help=f"tokens per metadata block P (default {_DEFAULT.block_size})")
    p.add_argument("--sink", type=_setting("sink_blocks"), default=_DEFAULT.sink_blocks,
                   help=f"leading blocks always selected (default {_DEFAULT.sink_blocks})")
    p.add_argument("--recent", type=_setting("recent_blocks"), default=_DEFAULT.recent_blocks,
                   help=f"blocks ending at the query's own block always selected (default {_DEFAULT.recent_blocks})")
    p.add_argument("--group-reduce", choices=("none", "mean", "max"), default=_DEFAULT.group_reduce,
                   help=f"'none': every query head selects its own K blocks (Quest's per-head selection; a KV head "
                   f"reads the union, up to G times the blocks); 'mean' or 'max': one selection per KV head scored "
                   f"with its query heads' mean or the max of their bounds (default {_DEFAULT.group_reduce})")
    p.add_argument("--importance-fraction", type=_setting("importance_fraction"), default=0.0,
                   help="share of the free budget chosen by accumulated attention mass, recorded from the "
                   "prefill on (default 0: off)")
    p.add_argument("--score", choices=("bound", "probe"), default="bound",
                   help="block scores: Quest's upper bound (default) or probes of num-probes keys per block")
    p.add_argument("--num-probes", type=_setting("num_probes"), default=8, help="keys per block read by --score probe (default 8)")
    p.add_argument("--superblock-size", type=int, default=None,
                   help="blocks per superblock of the hierarchical selection: past --candidate-factor x its blocks a "
                   "decode query ranks only its best superblocks' blocks, reading a fraction of the bounds "
                   "(approximate there; docs/ops.md); 0: the flat selection (default "
                   f"{SPARSE_BLOCK_SELECT.attribute('superblock_size').default} with --score bound)")
    p.add_argument("--candidate-factor", type=_setting("candidate_factor"), default=_DEFAULT.candidate_factor,
                   help="candidate blocks per selected block of the hierarchical selection (default "
                   f"{_DEFAULT.candidate_factor})")
    prefill = p.add_argument_group("sparse prefill (Generator(prefill='sparse'), quest-ort --prefill sparse; "
                                   "docs/ops.md chunk queries)")
    prefill.add_argument("--prefill-share", type=_setting("chunk_share"), default=_DEFAULT.chunk_share,
                         help="share of the other blocks each chunk of prompt queries selects, at least --k "
                         f"and --prefill-floor (default {_DEFAULT.chunk_share:g})")
    prefill.add_argument("--prefill-floor", type=_setting("chunk_floor"), default=_DEFAULT.chunk_floor,
                         help="fewest of the other blocks each chunk selects by score (default "
                         f"{_DEFAULT.chunk_floor}; past {_DEFAULT.chunk_floor} / share candidates the share decides)")
    prefill.add_argument("--prefill-window", type=_setting("chunk_window"), default=_DEFAULT.chunk_window,
                         help=f"blocks before each chunk it always attends (default {_DEFAULT.chunk_window})")
    prefill.add_argument("--prefill-sink", type=_setting("chunk_sink"), default=_DEFAULT.chunk_sink,
                         help="leading blocks every chunk attends: cover a long system prompt (default "
                         f"{_DEFAULT.chunk_sink})")
    prefill.add_argument("--prefill-chunk", type=_setting("chunk_size"), default=_DEFAULT.chunk_size,
                         help=f"prompt queries that share a selection (default {_DEFAULT.chunk_size})")
    prefill.add_argument("--prefill-top-k", type=_setting("chunk_top_k"), default=_DEFAULT.chunk_top_k,
                         help=f"most blocks a chunk attends, its forced ones included (default {_DEFAULT.chunk_top_k})")
    prefill.add_argument("--prefill-pool", type=_setting("chunk_pool"), default=_DEFAULT.chunk_pool,
                         help="consecutive queries averaged into one scoring row per head (default "
                         f"{_DEFAULT.chunk_pool}: every query scores)")
    p.add_argument("--portable", action="store_true",
                   help="write every Quest op as its standard-op function body: runs without the op library, e.g. "
                   "on ONNX Runtime's CANN execution provider in graph mode (slower on CPUs; docs/cann.md)")
    p.add_argument("--dense-layers", type=_layers, default=(0, 1),
                   help="layers that keep dense attention, e.g. 0,1 (default) or none")
    p.add_argument("--capacity", type=_positive, default=None,
                   help="default KV cache capacity in tokens recorded for the runtime "
                   "(default: the model's context, at most 8192)")
    p.add_argument("--kv-dtype", choices=("float32", "float16", "int8"), default="float32",
                   help="storage type of the KV caches (default float32); int8: one float16 scale per row, "
                   "written with each token (docs/ops.md, int8 caches)")
    p.add_argument("--no-key-smoothing", action="store_true",
                   help="with --kv-dtype int8: cache the keys as they are, not rescaled per channel by the powers "
                   "of two measured on the source graph (docs/ops.md, int8 caches; for comparisons)")
    p.add_argument("--bounds-dtype", choices=("float16", "float32", "int8"), default=None,
                   help="storage type of the block bounds (default float16, rounded outward so they still bound "
                   "every key: half the bytes a decode step's selection reads; int8 with --kv-dtype int8: codes on a "
                   "power-of-two grid per block, half again (docs/ops.md, int8 block bounds); with --score probe, "
                   "the KV dtype)")
    p.add_argument("--weights", choices=WEIGHT_TYPES, default=_DEFAULT.weights,
                   help=f"MatMul weights (q/k/v/o and MLP projections, LM head): '{_DEFAULT.weights}' (default) keeps the "
                   "source's; 'int8' or 'int4' quantizes them with ONNX Runtime's MatMulNBitsQuantizer (com.microsoft."
                   "MatMulNBits, symmetric blocks of 32) after the rewrite, and the validation bounds the logit drift "
                   "against the float source (the embedding stays float)")
    p.add_argument("--attention", choices=("quest", "gqa"), default="quest",
                   help="quest (default), or gqa: the dense baseline with ONNX Runtime's GroupQueryAttention "
                   "over the same in-place caches and I/O, for side-by-side comparisons")
    p.add_argument("-o", "--output", type=pathlib.Path, default=None,
                   help="output folder (default: <family>-quest-k<K>)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    p.add_argument("--no-validate", action="store_true", help="skip the numeric comparison with the source graph (optimum's, or the input .onnx)")
    add_logging_flags(p)  # -v / --quiet: the progress lines (stderr); the summary stays on stdout
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    configure_logging(args.verbose, args.quiet)
    from ..export.requirements import missing_message
    from ..pipeline import export_sparse, rewrite_onnx

    if (missing := missing_message(args.family, args.model)) is not None:
        print(f"export-sparse: error: {missing}", file=sys.stderr)
        return 1

    try:  # the settings' own checks (a prefill chunk's forced blocks past --prefill-top-k, ...)
        settings = SparseSettings.for_budget(
            args.k, block_size=args.block_size, sink_blocks=args.sink, recent_blocks=args.recent,
            group_reduce=args.group_reduce, importance_fraction=args.importance_fraction,
            dense_layers=args.dense_layers, kv_dtype=args.kv_dtype, bounds_dtype=args.bounds_dtype,
            attention=args.attention, score=args.score, num_probes=args.num_probes, portable=args.portable,
            weights=args.weights, key_smoothing=not args.no_key_smoothing, chunk_share=args.prefill_share,
            chunk_window=args.prefill_window, chunk_sink=args.prefill_sink, chunk_size=args.prefill_chunk,
            chunk_top_k=args.prefill_top_k, chunk_pool=args.prefill_pool, chunk_floor=args.prefill_floor,
            superblock_size=args.superblock_size, candidate_factor=args.candidate_factor,
        )
    except ValueError as error:
        print(f"export-sparse: error: {error}", file=sys.stderr)
        return 1
    output = args.output or pathlib.Path(f"{args.family}-{args.attention}-k{args.k}")
    try:
        if args.family == "onnx":
            if not args.model:
                parser().error("family onnx needs --model path/to/model.onnx")
            report = rewrite_onnx(pathlib.Path(args.model), output=output, settings=settings,
                                  capacity=args.capacity, overwrite=args.overwrite, validate=not args.no_validate)
        else:
            report = export_sparse(args.family, output=output, settings=settings, model=args.model,
                                   capacity=args.capacity, overwrite=args.overwrite, validate=not args.no_validate)
    except (ExportError, FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"\nexport-sparse: error: {error}", file=sys.stderr)
        return 1
    rewrite = report.rewrite
    print(f"rewrote {len(rewrite.layers)} attention layers: sparse {rewrite.sparse_layers}, "
          f"dense {rewrite.dense_layers}")
    if rewrite.logits_keep_refused:
        print(f"logits_keep not added ({rewrite.logits_keep_refused}): every prompt step computes every "
              "position's logits")
    if report.validation_max_abs_diff is not None:
        source = "the input graph" if args.family == "onnx" else "the optimum graph"
        twin = " (the rewrite with caches of the activation type)" if report.cache_drift is not None else ""
        print(f"validation{twin}: max |logit difference| vs {source} = {report.validation_max_abs_diff:.2e}")
    if report.quantized is not None:
        quantized = report.quantized
        lookups = f" and {len(quantized.gathers)} embedding table{'s' * (len(quantized.gathers) > 1)}" if quantized.gathers else ""
        print(f"weights: {len(quantized.matmuls)} MatMul weights{lookups} quantized to {quantized.weights}")
    for drift in (report.cache_drift, report.weight_drift):
        if drift is not None:
            print(f"validation of the {drift.what}: relative logit error vs the float source = "
                  f"{drift.relative_error:.3f} (tolerance {drift.tolerance:.3g}), max |logit difference| "
                  f"{drift.max_abs_diff:.3g}, spread {drift.spread_ratio:.3f} and correlation {drift.correlation:.3f} "
                  "of the source's")
    if isinstance(report.genai, list):
        print(f"onnxruntime-genai: {GENAI_CONFIG_FILE} and {GENAI_MODEL_FILE} (og.Model(\"{report.output}\"))")
    elif report.genai is not None:
        print(f"onnxruntime-genai: no files for {report.genai}")
    print(f"wrote {report.output} in {report.seconds:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
