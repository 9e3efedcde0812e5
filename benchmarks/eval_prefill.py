"""`make eval-prefill`: what a sparse prefill keeps, through the runtime users run: pass keys and the perplexity of a continuation, exact against sparse prefill; writes docs/quality_prefill.json.

Checkpoints: SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct (export/weights.py), each exported
with the default settings (`SparseSettings.for_budget(32)`, the real export_sparse) at a capacity that holds
its longest prompt.

Pass key. Every prompt goes through `Generator(model).generate(prompt, 12 tokens)` with the default
exact prefill and with `prefill="sparse"`. The reference is dense: the exact prefill's state (the
Generator's own cache, its lengths set back to the prompt's) decoded by a variant of the default graph
whose budget covers every block (exactly dense by contract), from the exact prefill's first token. A
key counts where dense retrieves it; "lost" = dense retrieves it and the mode does not. Prompts: 2K,
4K and 8K tokens at depths 0.1, 0.5 and 0.9 with three keys each; Qwen2.5-Coder (32K context) also
16K and 32K, one key per depth (three prompts per length).

Perplexity of natural text (Debian's licenses, quality_inputs.natural_text): its first half fed by
the runtime's prefill steps (exact, or sparse), the second half teacher-forced with every token
selecting its blocks as a decode step does (the continuation a long generation would make after that
prompt).
Reported: the continuation's perplexity after each prefill, and the prompt's own (exact, or each
chunk attending its chunk's blocks).

Time: the two prefills of every prompt dominate: about 40 minutes for SmolLM2 and 3 hours for
Qwen2.5-Coder (its 32K prompts) on 2 cores; `--model`, `--lengths` and `--quick` run less.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

from . import quality_runtime as qr
from .quality_inputs import keys, natural_text, pass_key_prompt

ROOT = pathlib.Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "build" / "weights"
WORK = ROOT / "build" / "eval" / "prefill"
DOCS = ROOT / "docs"
ANSWER_TOKENS = 12
DEPTHS = (0.1, 0.5, 0.9)
# Per checkpoint: prompt length -> keys per depth; the perplexity text's tokens (its first half the prompt).
MODELS = {
    "smollm2": dict(lengths={2048: 3, 4096: 3, 8192: 3}, text_tokens=8192),
    "qwen2.5-coder": dict(lengths={2048: 3, 4096: 3, 8192: 3, 16384: 1, 32768: 1}, text_tokens=8192),
}


def log(started: float, message: str) -> None:
    print(f"[{time.time() - started:7.0f}s] {message}", flush=True)


def export_default(name: str, capacity: int, reuse: bool) -> pathlib.Path:
    """The default export of checkpoint `name`, at `capacity` tokens."""
    from quest_ort.pipeline import export_sparse
    from quest_ort.export.rewrite import SparseSettings
    from quest_ort.export.weights import CHECKPOINTS, checkpoint
    from quest_ort.model_folder.settings import CHUNK_SETTINGS
    import onnx

    from quest_ort.model_folder.folder_check import check_sidecar_against_graph
    from quest_ort.model_folder.sidecar import SIDECAR_NAME, ModelFolderError, Sidecar

    settings = SparseSettings.for_budget(32)
    folder = WORK / name
    if reuse and (folder / "quest_model.json").is_file():
        try:  # the sidecar as this code reads it, and the graph it describes (the defaults may have moved)
            sidecar = Sidecar.read(folder)
            graph = onnx.load(str(folder / sidecar.model_file), load_external_data=False)
            check_sidecar_against_graph(sidecar, graph, folder / SIDECAR_NAME, folder / sidecar.model_file)
        except ModelFolderError:
            sidecar = None
        same = sidecar is not None and all(getattr(sidecar.settings, field) == getattr(settings, field)
                                           for field in CHUNK_SETTINGS)
        if same and sidecar.capacity >= capacity and sidecar.prefill_problem("sparse") is None:
            return folder
    export_sparse(CHECKPOINTS[name].family, output=folder, settings=settings, model=str(checkpoint(name, WEIGHTS)),
                  capacity=capacity, overwrite=True, log=lambda *args, **kwargs: None)
    return folder


def variant(model, threads: int | None, name: str, attributes: dict, weights: dict):
    """The default graph with other SparseBlockSelect attributes, on one shared copy of the weights
    (`weights`: filled on first use)."""
    from quest_ort.runtime.model import QuestModel

    if not weights:
        weights.update(qr.shared_weights(model.directory))
    file = qr.write_variant(model.directory, name, **attributes)
    return QuestModel(model.directory, threads=threads, model_file=file, initializers=weights)


def dense_variant(model, threads: int | None, weights: dict):
    """The default graph with a budget covering every block: exactly dense."""
    settings = model.sidecar.settings
    config = qr.Config(qr.Policy.of(settings), -(-model.sidecar.capacity // settings.block_size) * settings.block_size)
    return variant(model, threads, "prefill-eval-dense", config.select_attributes(), weights)


def pass_keys(model, tokenizer, lengths: dict[int, int], sparse: dict, dense, started: float) -> list[dict]:
    """Every prompt through Generator with each prefill (`sparse`: name -> model prefilled sparsely),
    and the dense reference (docstring)."""
    from quest_ort.runtime.generate import Generator, Sampling

    sampling = Sampling(max_new_tokens=ANSWER_TOKENS)
    rows = []
    for length, count in lengths.items():
        for depth in DEPTHS:
            for index, key in enumerate(keys(count, seed=length + int(depth * 100))):
                ids = pass_key_prompt(tokenizer, key, length, depth, seed=index)
                row = dict(length=length, depth=depth, key=key, prompt_tokens=len(ids))
                for name, mode, runner in [("exact", "exact", model)] + [(n, "sparse", m) for n, m in sparse.items()]:
                    generator = Generator(runner, capacity=len(ids) + ANSWER_TOKENS, prefill=mode)
                    begin = time.perf_counter()
                    answer = generator.generate([ids], sampling)[0]
                    row[name] = dict(hit=key in tokenizer.decode(answer), seconds=round(time.perf_counter() - begin, 2),
                                     answer=tokenizer.decode(answer, skip_special_tokens=True).strip())
                    if name == "exact":  # dense from the exact prefill's state and first token
                        cache = generator.cache
                        cache.lengths[:] = len(ids)
                        tokens = qr.greedy_steps(dense, cache, [answer[0]], ANSWER_TOKENS)[0]
                        row["dense"] = dict(hit=key in tokenizer.decode(tokens),
                                            answer=tokenizer.decode(tokens, skip_special_tokens=True).strip())
                rows.append(row)
                log(started, f"{length:6d} tokens, depth {depth}, key {key}: dense {row['dense']['hit']}, " + ", ".join(
                    f"{name} {row[name]['hit']} ({row[name]['seconds']} s)" for name in ["exact", *sparse]))
    return rows


def perplexities(model, tokenizer, tokens: int, sparse: dict) -> list[dict]:
    """The continuation's perplexity (and the prompt's own) after an exact prefill and each sparse one
    (`sparse`: name -> model)."""
    from quest_ort.runtime.generate import PREFILL_CHUNK, prefill_segments

    ids = tokenizer(natural_text(), add_special_tokens=False).input_ids[:tokens]
    half = len(ids) // 2
    rows = []
    for name, mode, runner in [("exact", "exact", model)] + [(n, "sparse", m) for n, m in sparse.items()]:
        cache = runner.new_cache(1, len(ids))
        begin = time.perf_counter()
        prompt_losses, done = [], 0
        for end, step_mode in prefill_segments(half, mode):  # prefill's own steps, every position's logits kept
            for start in range(done, end, PREFILL_CHUNK):
                piece = ids[start : min(start + PREFILL_CHUNK, end)]
                logits = runner.step(cache, np.array([piece], np.int64), exact=step_mode == "exact",
                                     chunked=step_mode == "sparse")[0]
                targets = np.array(ids[start + 1 : start + 1 + len(piece)], np.int64)
                prompt_losses.append(qr.token_losses(logits[: len(targets)], targets))
                del logits
            done = end
        prefill_seconds = time.perf_counter() - begin
        continued, _ = qr.teacher_forced(runner, cache, ids, half, exact=False)
        rows.append(dict(prefill=name, tokens=len(ids), prompt_tokens=half,
                         prompt=round(qr.perplexity(np.concatenate(prompt_losses)), 4),
                         continuation=round(qr.perplexity(continued), 4), prefill_seconds=round(prefill_seconds, 1)))
    return rows


def summary(rows: list[dict], names: list[str]) -> dict:
    """Per prompt length: keys dense retrieves, and those each prefill retrieves and loses."""
    out = {}
    for length in sorted({row["length"] for row in rows}):
        group = [row for row in rows if row["length"] == length]
        out[str(length)] = dict(prompts=len(group), dense=sum(r["dense"]["hit"] for r in group),
                                **{name: dict(retrieved=sum(r[name]["hit"] for r in group),
                                              lost=sum(r["dense"]["hit"] and not r[name]["hit"] for r in group),
                                              seconds=round(sum(r[name]["seconds"] for r in group), 1))
                                   for name in names})
    return out


def evaluate(name: str, plan: dict, args, started: float) -> dict:
    import transformers

    from quest_ort.export.weights import CHECKPOINTS
    from quest_ort.model_folder.settings import CHUNK_SETTINGS
    from quest_ort.runtime.model import QuestModel

    capacity = max(max(plan["lengths"]), plan["text_tokens"]) + 256
    folder = export_default(name, capacity, args.reuse_exports)
    model = QuestModel(folder, threads=args.threads)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder / "tokenizer")
    log(started, f"{name}: exported ({folder}), capacity {capacity}")
    weights = {}  # one copy for every variant
    sparse = {"sparse": model, **{label: variant(model, args.threads, f"prefill-{label}", attributes, weights)
                                  for label, attributes in (args.policy or [])}}
    rows = pass_keys(model, tokenizer, plan["lengths"], sparse, dense_variant(model, args.threads, weights), started)
    ppl = perplexities(model, tokenizer, plan["text_tokens"], sparse)
    log(started, f"{name}: perplexity {ppl}")
    settings = model.sidecar.settings
    return dict(model=CHECKPOINTS[name].title, export=dict(top_k=settings.top_k, block_size=settings.block_size,
                                                           group_reduce=settings.group_reduce,
                                                           kv_dtype=settings.kv_dtype,
                                                           bounds_dtype=model.sidecar.bounds_dtype,
                                                           **{f: getattr(settings, f) for f in CHUNK_SETTINGS}),
                policies={label: attributes for label, attributes in (args.policy or [])},
                lengths=plan["lengths"], depths=list(DEPTHS), answer_tokens=ANSWER_TOKENS,
                summary=summary(rows, ["exact", *sparse]),
                pass_key=rows, perplexity=ppl, threads=args.threads)


BEGIN, END = "<!-- BEGIN GENERATED: benchmarks/eval_prefill.py -->", "<!-- END GENERATED: benchmarks/eval_prefill.py -->"


def render(report: dict) -> str:
    """The generated part of docs/quality.md's sparse prefill section: per model, pass keys by prompt
    length and the perplexities, for the exact prefill and each sparse one."""
    lines = [BEGIN, ""]
    for result in report.values():
        names = [name for name in next(iter(result["summary"].values())) if name not in ("prompts", "dense")]
        export = result["export"]
        lines += [f"**{result['model']}** (the default export: K={export['top_k']}, P={export['block_size']}, "
                  f"{export['kv_dtype']} caches, {export['bounds_dtype']} bounds; sparse prefill: chunks of "
                  f"{export['chunk_size']} queries, share {export['chunk_share']:g}, window {export['chunk_window']} "
                  f"and sink {export['chunk_sink']} blocks, pool {export['chunk_pool']}, "
                  + (f"at least {export['chunk_floor']} scored, " if "chunk_floor" in export else "")
                  + f"at most {export['chunk_top_k']} blocks; {threads_text(result['threads'])})", ""]
        for label, attributes in result.get("policies", {}).items():
            lines.append(f"- `{label}`: the same export prefilled with " + ", ".join(
                f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}" for k, v in attributes.items()))
        if result.get("policies"):
            lines.append("")
        header = "| prompt tokens | prompts | dense retrieves | " + " | ".join(
            f"{name}: retrieved (lost) | {name}: seconds" for name in names) + " |"
        lines += [header, "|" + "---|" * (3 + 2 * len(names))]
        for length, row in result["summary"].items():
            cells = [length, str(row["prompts"]), str(row["dense"])]
            for name in names:
                cells += [f"{row[name]['retrieved']} ({row[name]['lost']})", f"{row[name]['seconds']:.0f}"]
            lines.append("| " + " | ".join(cells) + " |")
        exact = next(row for row in result["perplexity"] if row["prefill"] == "exact")
        lines += ["", f"Perplexity of {exact['tokens']} tokens of natural text, the first {exact['prompt_tokens']} "
                  "the prompt:", "", "| prefill | the prompt | the continuation | continuation vs exact | prefill seconds |",
                  "|---|---|---|---|---|"]
        for row in result["perplexity"]:
            change = 100 * (row["continuation"] / exact["continuation"] - 1)
            lines.append(f"| {row['prefill']} | {row['prompt']:.3f} | {row['continuation']:.3f} | {change:+.2f}% | "
                         f"{row['prefill_seconds']:.0f} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def threads_text(threads: int | None) -> str:
    return "all threads" if not threads else f"{threads} thread" + ("s" if threads > 1 else "")


def write_markdown(report: dict, path: pathlib.Path) -> None:
    """docs/quality.md's generated sparse-prefill part (the text around the markers is kept)."""
    import re

    text = path.read_text()
    if BEGIN not in text:
        raise ValueError(f"{path} has no {BEGIN} marker")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    path.write_text(pattern.sub(lambda _: render(report), text, count=1))


def parse_policy(text: str) -> tuple[str, dict]:
    label, _, fields = text.partition(":")
    attributes = {}
    for field in fields.split(","):
        name, _, value = field.partition("=")
        attributes[f"chunk_{name}" if not name.startswith("chunk_") else name] = (
            float(value) if name.endswith("share") else int(value))
    return label, attributes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), action="append", help="one checkpoint (default: both)")
    parser.add_argument("--lengths", type=lambda text: [int(t) for t in text.split(",")],
                        help="prompt lengths (default per model), comma-separated")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true",
                        help="one 2K prompt per depth, a 2K text (build/eval/prefill-quick.json)")
    parser.add_argument("--reuse-exports", action="store_true", help="reuse the exports of an earlier run")
    parser.add_argument("--text-tokens", type=int, help="tokens of the perplexity text (default per model)")
    parser.add_argument("--output", type=pathlib.Path, default=None)
    parser.add_argument("--policy", type=parse_policy, action="append",
                        help="also a sparse prefill with other chunk attributes: LABEL:share=0.0625,window=32,pool=4 "
                        "(the attributes chunk_share, chunk_window, chunk_pool, chunk_size, chunk_top_k, chunk_floor)")
    args = parser.parse_args(argv)
    started = time.time()
    output = args.output or (WORK.parent / "prefill-quick.json" if args.quick else DOCS / "quality_prefill.json")
    report = json.loads(output.read_text()) if output.is_file() else {}
    for name in args.model or list(MODELS):
        plan = dict(MODELS[name])
        if args.quick:
            plan = dict(lengths={2048: 1}, text_tokens=2048)
        elif args.lengths:
            plan["lengths"] = {length: plan["lengths"].get(length, 1) for length in args.lengths}
        if args.text_tokens:
            plan["text_tokens"] = args.text_tokens
        report[name] = evaluate(name, plan, args, started)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(report, indent=1) + "\n")  # after each model: nothing measured is lost
        log(started, f"{name}: {report[name]['summary']}")
    if output == DOCS / "quality_prefill.json":
        write_markdown(report, DOCS / "quality.md")
    log(started, f"wrote {output}")


if __name__ == "__main__":
    main()
