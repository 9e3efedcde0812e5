"""`make eval`: pass-key retrieval and perplexity of the real checkpoints through the runtime users run, across selection policies and budgets; writes docs/quality.{json,md} and docs/quality_*.png.

Checkpoints: SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct (export/weights.py). Each is exported
with the default settings (`SparseSettings.for_budget(32)`, the real `export_sparse`) and once more per other
block size P; every policy (P, group reduction, forced sink and recent blocks) at every budget is a
variant of its P's graph with other SparseBlockSelect attributes, sharing that export's weights.

Pass key. Every prompt goes through the user's path, `Generator(model).generate([prompt], 12 tokens)`:
the default export with exact prefill (the default) and with `prefill="per-token"` (every prompt
token selects its blocks as a decode step does), the old default (P=32, mean, K=32) with per-token
prefill, and the dense reference (the default graph with a budget
covering every block: exactly dense by contract). The exact prefill is the same for every policy, so
the other policies decode from the default Generator's own prefilled keys and values: a cache per P
shares them, holds its block bounds recomputed from the keys (checked bit for bit against the bounds
QuestMetadata built) and is restored from a snapshot before each policy, which then steps as
`Generator.stream` does, a batch of prompts at a time. The default export runs that way too, and its
tokens must equal the Generator's on every prompt (the run stops otherwise). A key counts where dense
retrieves it; "lost" = dense retrieves it and the policy does not.

Harder retrieval (benchmarks/quality_retrieval.py): per prompt length, one prompt per depth holding
four keys for named locks with the question naming one, and the single pass key asked, answered and
asked again in one conversation; the default export and the dense reference, through
`Generator(model).generate`.

KV cache types. The default export once more with float16 and with int8 KV caches (every other
setting the default's), through the user's path: every pass-key prompt through
`Generator(model).generate`, and both perplexity measures at the default budget.

Perplexity over 8192 tokens of natural text: (a) every token sparse (teacher-forced with exact=False:
each token selects its blocks, as a long generation's would); (b) continuation: the first 4096
tokens prefilled exactly, the rest teacher-forced sparsely, scoring tokens 4096..8191. Dense: every
step exact.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import numpy as np

from . import quality_retrieval
from . import quality_runtime as qr
from .quality_inputs import keys, natural_text, pass_key_prompt

ROOT = pathlib.Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "build" / "weights"
WORK = ROOT / "build" / "eval"
DOCS = ROOT / "docs"
RUNS = WORK / "runs"  # every model run's own report, kept
ANSWER_TOKENS = 12
DEPTHS = (0.1, 0.25, 0.5, 0.75, 0.9)
BUDGETS = (128, 256, 512, 1024)
BLOCK_SIZES = (8, 16, 32)
REDUCTIONS = ("none", "mean")  # each query head its own blocks; one selection per KV head (mean query)
FORCED_AT_P8 = ((1, 1), (1, 2), (2, 2), (1, 4))  # (sink, recent) blocks of the P=8 "none" variants
OLD_DEFAULT = qr.Config(qr.Policy(32, "mean", 1, 1), 1024)  # the defaults before this sweep: --k 32
PERPLEXITY_TOKENS, CONTINUATION_FROM = 8192, 4096
# Per checkpoint, what fits its time: the pass-key prompt lengths (LENGTH:N: N keys per depth there),
# keys per (length, depth) and the perplexity budgets. Each prompt costs three Generator prefills
# and each perplexity configuration 12K sparse tokens, which a 0.5B model on 2 cores pays for in
# hours: Qwen2.5-Coder runs one key per (length, depth) and perplexity at two budgets.
MODELS = {
    "smollm2": dict(lengths="2048,4096,8192", keys=3, perplexity_budgets=BUDGETS),
    "qwen2.5-coder": dict(lengths="2048,4096,8192", keys=1, perplexity_budgets=(256, 1024)),
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one model's run measures."""

    lengths: dict  # prompt length -> keys per depth
    depths: tuple = DEPTHS
    budgets: tuple = BUDGETS  # pass key
    perplexity_budgets: tuple = BUDGETS
    perplexity_tokens: int = PERPLEXITY_TOKENS
    continuation_from: int = CONTINUATION_FROM

    @classmethod
    def of(cls, name: str, args) -> Plan:
        defaults = MODELS[name]
        if args.quick:  # one short prompt, one budget, a short text
            return cls(lengths_option(args.lengths or "1024", args.keys or 1), depths=(0.5,), budgets=(256,),
                       perplexity_budgets=(256,), perplexity_tokens=1024, continuation_from=512)
        tokens = args.perplexity_tokens or PERPLEXITY_TOKENS
        return cls(lengths_option(args.lengths or defaults["lengths"], args.keys or defaults["keys"]),
                   perplexity_budgets=args.perplexity_budgets or defaults["perplexity_budgets"],
                   perplexity_tokens=tokens, continuation_from=tokens // 2)


def lengths_option(text: str, keys_per_depth: int) -> dict[int, int]:
    """"2048,4096,16384:1" -> {2048: keys_per_depth, 4096: keys_per_depth, 16384: 1}."""
    lengths = {}
    for item in text.split(","):
        length, _, count = item.partition(":")
        lengths[int(length)] = int(count) if count else keys_per_depth
    return lengths


def sweep(default: qr.Config, budgets) -> list[qr.Config]:
    """Every policy at every budget, and the default export's own configuration."""
    policies = {qr.Policy(P, reduce) for P in BLOCK_SIZES for reduce in REDUCTIONS}
    policies |= {qr.Policy(8, "none", sink, recent) for sink, recent in FORCED_AT_P8}
    configs = {qr.Config(policy, budget) for policy in policies for budget in budgets
               if budget % policy.block_size == 0}
    return sorted(configs | {default})


class Clock:
    """Elapsed time for progress lines, and named phase durations for the report."""

    def __init__(self):
        self.started = time.time()
        self.phases: dict[str, float] = {}

    def log(self, message: str) -> None:
        print(f"[{time.time() - self.started:7.0f}s] {message}", flush=True)

    def phase(self, name: str, seconds: float) -> None:
        self.phases[name] = round(self.phases.get(name, 0.0) + seconds, 1)


class Suite:
    """One checkpoint's exports and the sessions of every configuration.

    `default` is the export users get (`settings`, the real export_sparse), opened as they open it
    (`QuestModel(folder)`, its own weights). Variants share one copy of the weights and therefore
    run without ONNX Runtime's weight prepacking, which changes logits in their last bits only.
    """

    def __init__(self, name: str, family: str, source: pathlib.Path, capacity: int, settings,
                 configs: list[qr.Config], clock: Clock, *, threads: int | None = None, reuse: bool = False,
                 work: pathlib.Path = WORK, tokenizer=None, old_default: bool = True):
        """`source`: the checkpoint folder; exports go to work/name; `tokenizer` (default: the
        export's own) turns text into ids and back; `old_default`: export OLD_DEFAULT's P too."""
        from quest_ort.runtime.model import QuestModel

        self.name, self.family, self.capacity, self.threads, self.clock = name, family, capacity, threads, clock
        self.work = work / name
        self.settings = settings
        self.default_config = default = qr.Config(qr.Policy.of(settings), settings.budget_tokens)
        begin = time.time()
        self.folders = {default.policy.block_size: self._export(source, "default", self.settings, reuse)}
        for P in sorted({c.policy.block_size for c in configs + [OLD_DEFAULT] * old_default} - set(self.folders)):
            self.folders[P] = self._export(source, f"p{P}", dataclasses.replace(self.settings, block_size=P), reuse)
        clock.phase("exports", time.time() - begin)
        self.default = QuestModel(self.folders[default.policy.block_size], threads=threads)
        self.sidecar = self.default.sidecar
        if tokenizer is None:
            import transformers

            tokenizer = transformers.AutoTokenizer.from_pretrained(self.default.directory / "tokenizer")
        self.tokenizer = tokenizer
        self.weights = {}
        pool = None
        for P, folder in self.folders.items():
            pool = self.weights[P] = qr.shared_weights(folder, pool)
        every_block = -(-capacity // default.policy.block_size)  # a budget covering every block: exactly dense
        self.dense = self.variant(qr.Config(default.policy, every_block * default.policy.block_size))

    def _export(self, source, label: str, settings, reuse: bool) -> pathlib.Path:
        from quest_ort.pipeline import export_sparse
        from quest_ort.model_folder.sidecar import Sidecar

        folder = self.work / label
        if reuse and (folder / "quest_model.json").is_file():
            sidecar = Sidecar.read(folder)
            if reusable(sidecar, settings, self.capacity):
                self.clock.log(f"{self.name}: reusing {folder}")
                return folder
        begin = time.time()
        export_sparse(self.family, output=folder, settings=settings, model=str(source), capacity=self.capacity,
                      overwrite=True, log=lambda *args, **kwargs: None)
        self.clock.log(f"{self.name}: exported {label} (P={settings.block_size}) in {time.time() - begin:.0f} s")
        return folder

    def variant(self, config: qr.Config, analysis: bool = False):
        """A session of `config`'s variant of its P's export (shared weights)."""
        from quest_ort.runtime.model import QuestModel

        P = config.policy.block_size
        file = qr.write_variant(self.folders[P], config.name, analysis=analysis, **config.select_attributes())
        return QuestModel(self.folders[P], threads=self.threads, model_file=file, initializers=self.weights[P])

    def model_for(self, config: qr.Config):
        """The default export itself for its own configuration, else a variant."""
        return self.default if config == self.default_config else self.variant(config)


def reusable(sidecar, settings, capacity: int) -> bool:
    """Whether an earlier export (its sidecar) holds `capacity` tokens and selects as `settings` do."""
    selection = ("block_size", "top_k", "group_reduce", "sink_blocks", "recent_blocks")
    return sidecar.capacity >= capacity and all(getattr(sidecar.settings, name) == getattr(settings, name)
                                                for name in selection)


@dataclasses.dataclass
class Prompt:
    length: int
    depth: float
    key: str
    ids: list[int]


def pass_key_prompts(tokenizer, lengths: dict[int, int], depths) -> list[Prompt]:
    return [Prompt(length, depth, key, pass_key_prompt(tokenizer, key, length, depth, seed=index))
            for length, count in lengths.items() for depth in depths
            for index, key in enumerate(keys(count, seed=length + int(depth * 100)))]


def batches(prompts: list[Prompt], bytes_per_token: int, memory: float) -> list[list[Prompt]]:
    """Prompts of one length per batch, as many as fit `memory` bytes of keys and values."""
    groups: dict[int, list[Prompt]] = {}
    for prompt in prompts:
        groups.setdefault(prompt.length, []).append(prompt)
    out = []
    for group in groups.values():
        size = max(1, int(memory // (bytes_per_token * (max(len(p.ids) for p in group) + ANSWER_TOKENS))))
        out += [group[i : i + size] for i in range(0, len(group), size)]
    return out


def _row(prompt: Prompt, config: qr.Config | None, prefill: str, tokens: list[int], tokenizer, **extra) -> dict:
    answer = tokenizer.decode(tokens, skip_special_tokens=True).strip()
    policy = config.policy if config else None
    return dict(length=prompt.length, depth=prompt.depth, key=prompt.key, prompt_tokens=len(prompt.ids),
                config=config.name if config else "dense", prefill=prefill,
                block_size=policy and policy.block_size, group_reduce=policy and policy.group_reduce,
                sink_blocks=policy and policy.sink_blocks, recent_blocks=policy and policy.recent_blocks,
                budget=config and config.budget, hit=prompt.key in answer, answer=answer, **extra)


def run_pass_key(suite: Suite, configs: list[qr.Config], prompts: list[Prompt], memory: float, recall: bool,
                 clock: Clock) -> tuple[list[dict], dict]:
    """Every prompt through the user's Generators, then every configuration from the default
    Generator's prefilled state; returns the rows and the checks' counts."""
    from quest_ort.runtime.generate import Generator, Sampling

    sampling = Sampling(max_new_tokens=ANSWER_TOKENS)
    default = suite.default_config
    generators = {"default": Generator(suite.default), "dense": Generator(suite.dense),
                  "default-per-token": Generator(suite.default, prefill="per-token")}
    if default != OLD_DEFAULT:
        generators["old-default-per-token"] = Generator(suite.variant(OLD_DEFAULT), prefill="per-token")
    by_block = {}
    for config in configs:
        by_block.setdefault(config.policy.block_size, []).append(config)
    models = {config: suite.model_for(config) for config in configs}
    # The default's own graph as a variant too: how often shared, unprepacked weights change an answer.
    shared_default = suite.variant(default)
    analysis = {config: suite.variant(config, analysis=True) for config in configs} if recall else {}
    s = suite.sidecar
    bytes_per_token = len(s.layers) * 2 * s.geometry.kv_num_heads * s.geometry.head_dim * np.dtype(s.settings.kv_dtype).itemsize
    rows, checks = [], dict(generator_agrees=0, shared_weights_agree=0, prompts=0)
    tokenizer = suite.tokenizer
    for batch in batches(prompts, bytes_per_token, memory):
        begin = time.time()
        source = suite.default.new_cache(len(batch), max(len(p.ids) for p in batch) + ANSWER_TOKENS)
        user = []
        for row, prompt in enumerate(batch):
            answers = {name: g.generate([prompt.ids], sampling)[0] for name, g in generators.items()}
            cache = generators["default"].cache
            qr.check_block_bounds(suite.default, cache)  # prompt and answer keys, as the op merged them
            qr.copy_prompt_state(cache, source, row, len(prompt.ids))
            user.append(answers)
            rows.append(_row(prompt, None, "exact", answers["dense"], tokenizer, source="Generator"))
            rows.append(_row(prompt, default, "per-token", answers["default-per-token"], tokenizer,
                             source="Generator"))
            if "old-default-per-token" in answers:
                rows.append(_row(prompt, OLD_DEFAULT, "per-token", answers["old-default-per-token"], tokenizer,
                                 source="Generator"))
        generated = time.time()
        clock.phase("pass key: Generator runs", generated - begin)
        dense_hits = sum(prompt.key in tokenizer.decode(answers["dense"]) for prompt, answers in zip(batch, user))
        first = np.array([answers["default"][0] for answers in user])
        for P, group in sorted(by_block.items()):
            cache = qr.sharing_cache(models[group[0]], source)
            qr.rebuild_bounds(models[group[0]], cache)
            snapshot = qr.Snapshot(cache)
            for config in group:
                shares = reads = [None] * len(batch)
                if recall:
                    layers = qr.analysis_step(analysis[config], snapshot.restore(), first)
                    shares = qr.attention_recall(layers, s.geometry.kv_num_heads)
                    reads = qr.tokens_read(layers, s.geometry.kv_num_heads, P, config.budget)
                answers = qr.greedy_steps(models[config], snapshot.restore(), first, ANSWER_TOKENS)
                for row, prompt in enumerate(batch):
                    extra = {}
                    if config == default:
                        if answers[row] != user[row]["default"]:
                            raise AssertionError(
                                f"{suite.name}: the evaluation's decode of the default export differs from "
                                f"Generator(model).generate on the {prompt.length}-token prompt at depth {prompt.depth} "
                                f"(key {prompt.key}): {answers[row]} against {user[row]['default']}")
                        checks["generator_agrees"] += 1
                        extra = dict(source="Generator (the evaluation's decode gives the same tokens)")
                    rows.append(_row(prompt, config, "exact", answers[row], tokenizer, recall=shares[row],
                                     reads=reads[row], **extra))
            if P == default.policy.block_size:
                answers = qr.greedy_steps(shared_default, snapshot.restore(), first, ANSWER_TOKENS)
                checks["shared_weights_agree"] += sum(a == u["default"] for a, u in zip(answers, user))
        checks["prompts"] += len(batch)
        clock.phase("pass key: policies", time.time() - generated)
        clock.log(f"{suite.name}: {len(batch)} prompts of {batch[0].length} tokens (dense retrieves {dense_hits}): "
                  f"Generators {generated - begin:.0f} s, {len(configs)} policies {time.time() - generated:.0f} s")
    return rows, checks


def run_harder_retrieval(suite: Suite, plan: Plan, clock: Clock) -> dict:
    """Multi-key prompts (one per depth at each length) and keys asked twice (one per length and
    depth), on the default export and the dense reference (benchmarks/quality_retrieval.py)."""
    begin = time.time()
    models = {"default": suite.default, "dense": suite.dense}
    lengths = sorted(plan.lengths)
    prompts = quality_retrieval.multi_key_prompts(suite.tokenizer, lengths, len(plan.depths))
    rows = quality_retrieval.run_multi_key(models, suite.tokenizer, prompts, quality_retrieval.MULTI_KEY_ANSWER_TOKENS,
                                           log=lambda message: clock.log(f"{suite.name}: {message}"))
    rows += quality_retrieval.run_asked_twice(models, suite.tokenizer, lengths, plan.depths, ANSWER_TOKENS,
                                              log=lambda message: clock.log(f"{suite.name}: {message}"))
    hits = {(task, label): sum(r["hit"] for r in rows if r["task"] == task and r["model"] == label)
            for task in ("multi-key", "asked twice") for label in models}
    clock.log(f"{suite.name}: harder retrieval (dense / default): multi-key {hits['multi-key', 'dense']} / "
              f"{hits['multi-key', 'default']}, asked twice {hits['asked twice', 'dense']} / "
              f"{hits['asked twice', 'default']} ({time.time() - begin:.0f} s)")
    clock.phase("harder retrieval", time.time() - begin)
    return dict(default=suite.default_config.name, answer_tokens=ANSWER_TOKENS,
                multi_key_answer_tokens=quality_retrieval.MULTI_KEY_ANSWER_TOKENS,
                keys_per_prompt=quality_retrieval.MULTI_KEYS, rows=rows)


def run_perplexity(suite: Suite, configs: list[qr.Config], tokens: int, continuation_from: int,
                   clock: Clock) -> list[dict]:
    """Both measures for every configuration, and dense; one session per configuration at a time
    (a session keeps the memory of its largest step, 512 positions of logits)."""
    ids = suite.tokenizer(natural_text(), add_special_tokens=False).input_ids[:tokens]
    if len(ids) < tokens:
        raise ValueError(f"the natural text has only {len(ids)} tokens, fewer than {tokens}")
    begin = time.time()
    dense_cache = suite.default.new_cache(1, tokens)
    # The prompt part as prefill(mode="exact") reads it: 512 positions per exact step.
    prefix_losses, last = qr.teacher_forced(suite.default, dense_cache, ids[:continuation_from], 0, exact=True)
    qr.check_block_bounds(suite.default, dense_cache)
    prefix = suite.default.new_cache(1, tokens)  # the exactly read prompt every continuation starts from
    qr.copy_prompt_state(dense_cache, prefix, 0, continuation_from)
    # The prompt's last logits predict token `continuation_from`: the same for every policy.
    first_target = qr.token_losses(last[None], np.array([ids[continuation_from]]))
    rest_losses, _ = qr.teacher_forced(suite.default, dense_cache, ids, continuation_from, exact=True)
    qr.check_block_bounds(suite.default, dense_cache)
    measures = {"every token sparse": np.concatenate([prefix_losses, first_target, rest_losses]),
                "continuation": np.concatenate([first_target, rest_losses])}
    rows = [dict(config="dense", measure=measure, block_size=None, group_reduce=None, sink_blocks=None,
                 recent_blocks=None, budget=None, perplexity=round(qr.perplexity(losses), 4))
            for measure, losses in measures.items()]
    clock.log(f"{suite.name}: dense perplexity {rows[0]['perplexity']:.3f} (every token), "
              f"{rows[1]['perplexity']:.3f} (tokens {continuation_from}..{tokens - 1}) in {time.time() - begin:.0f} s")
    sources = {}
    for config in configs:
        begin = time.time()
        model = suite.model_for(config)
        P = config.policy.block_size
        if P not in sources:
            continuation = qr.sharing_cache(model, prefix)
            qr.rebuild_bounds(model, continuation)
            sources[P] = (qr.Snapshot(continuation), qr.sharing_cache(model, dense_cache))
        snapshot, fresh = sources[P]
        continued, _ = qr.teacher_forced(model, snapshot.restore(), ids, continuation_from, exact=False)
        fresh.lengths[:] = 0
        every, _ = qr.teacher_forced(model, fresh, ids, 0, exact=False)
        policy = config.policy
        for measure, losses in (("every token sparse", every), ("continuation", np.concatenate([first_target, continued]))):
            rows.append(dict(config=config.name, measure=measure, block_size=P, group_reduce=policy.group_reduce,
                             sink_blocks=policy.sink_blocks, recent_blocks=policy.recent_blocks, budget=config.budget,
                             perplexity=round(qr.perplexity(losses), 4)))
        clock.log(f"{suite.name}: perplexity {config.name}: {rows[-2]['perplexity']:.3f} every token sparse, "
                  f"{rows[-1]['perplexity']:.3f} continuation ({time.time() - begin:.0f} s)")
        del model  # its session, and the memory of its 512-position steps
    return rows


# The caches compared, each otherwise the default export: label -> (kv_dtype, bounds_dtype; None: the
# default's for that cache, int8 next to int8 caches). The middle one tells the int8 bounds' share.
CACHE_VARIANTS = {"float16": ("float16", None), "int8, float16 bounds": ("int8", "float16"), "int8": ("int8", None)}


def run_cache_types(name: str, plan: Plan, args, clock: Clock, tokenizer=None) -> dict:
    """The default export with each of CACHE_VARIANTS: every pass-key prompt through the user's
    Generator (exact prefill, sparse decode) and both perplexity measures at the default budget.
    An export the exporter's own validation refuses (the cache type moves this model's logits past
    its tolerance) is recorded with the refusal under `refused` and measured all the same, exported
    without the validation: how far its answers move is the question. Rows carry the variant's label
    as `cache` and its `kv_dtype` and `bounds_dtype`."""
    from quest_ort.export.rewrite import ExportError, SparseSettings
    from quest_ort.export.weights import CHECKPOINTS, checkpoint
    from quest_ort.runtime.generate import Generator, Sampling
    from quest_ort.runtime.model import QuestModel

    shipped = CHECKPOINTS[name]
    source = checkpoint(name, WEIGHTS)
    capacity = max(max(plan.lengths), plan.perplexity_tokens) + 256
    sampling = Sampling(max_new_tokens=ANSWER_TOKENS)
    pass_key, perplexity, refused = [], [], {}
    labels = getattr(args, "caches", None) or list(CACHE_VARIANTS)
    for label, (dtype, bounds) in ((label, CACHE_VARIANTS[label]) for label in labels):
        begin = time.time()
        folder = WORK / name / f"kv-{dtype}" if bounds is None else WORK / name / f"kv-{dtype}-bounds-{bounds}"
        if not (args.reuse_exports and (folder / "quest_model.json").is_file()):
            from quest_ort.pipeline import export_sparse

            def export(validate: bool) -> None:
                export_sparse(shipped.family, output=folder,
                              settings=SparseSettings.for_budget(32, kv_dtype=dtype, bounds_dtype=bounds),
                              model=str(source), capacity=capacity, overwrite=True, validate=validate,
                              log=lambda *a, **k: None)

            try:
                export(validate=True)
            except ExportError as refusal:
                refused[label] = str(refusal)
                clock.log(f"{name}: the export with {label} caches is refused ({refusal}); measured without validation")
                export(validate=False)
        model = QuestModel(folder, threads=args.threads)
        variant = dict(cache=label, kv_dtype=dtype, bounds_dtype=model.sidecar.bounds_dtype)
        if tokenizer is None:
            import transformers

            tokenizer = transformers.AutoTokenizer.from_pretrained(folder / "tokenizer")
        generator = Generator(model)
        prompts = pass_key_prompts(tokenizer, plan.lengths, plan.depths)
        for prompt in prompts:
            answer = generator.generate([prompt.ids], sampling)[0]
            pass_key.append(dict(**variant, length=prompt.length, depth=prompt.depth, key=prompt.key,
                                 retrieved=prompt.key in tokenizer.decode(answer)))
        ids = tokenizer(natural_text(), add_special_tokens=False).input_ids[:plan.perplexity_tokens]
        every, _ = qr.teacher_forced(model, model.new_cache(1, len(ids)), ids, 0, exact=False)
        cache = model.new_cache(1, len(ids))
        _, last = qr.teacher_forced(model, cache, ids[:plan.continuation_from], 0, exact=True)
        continued, _ = qr.teacher_forced(model, cache, ids, plan.continuation_from, exact=False)
        first_target = qr.token_losses(last[None], np.array([ids[plan.continuation_from]]))
        for measure, losses in (("every token sparse", every), ("continuation", np.concatenate([first_target, continued]))):
            perplexity.append(dict(**variant, measure=measure, perplexity=round(qr.perplexity(losses), 4)))
        hits = sum(row["retrieved"] for row in pass_key if row["cache"] == label)
        clock.log(f"{name}: {label} caches: {hits} of {len(prompts)} keys, perplexity "
                  f"{perplexity[-2]['perplexity']:.3f} every token sparse, {perplexity[-1]['perplexity']:.3f} "
                  f"continuation ({time.time() - begin:.0f} s)")
        clock.phase("cache types", time.time() - begin)
        del model, generator
    return dict(caches=labels, pass_key=pass_key, perplexity=perplexity, refused=refused)


def merge_cache_types(earlier: dict | None, fresh: dict) -> dict:
    """`fresh` rows (some of CACHE_VARIANTS, --caches) over an earlier comparison's rows of the other
    variants, in CACHE_VARIANTS' order. Rows of reports written before the variants had labels take
    their cache dtype's: float16, and int8 with the float16 bounds int8 caches had then."""
    earlier = earlier or dict(pass_key=[], perplexity=[], refused={})
    old_label = {"float16": "float16", "int8": "int8, float16 bounds"}

    def label(row):
        return row.get("cache") or old_label[row["kv_dtype"]]

    kept = {part: [dict(row, cache=label(row)) for row in earlier[part] if label(row) not in fresh["caches"]]
            for part in ("pass_key", "perplexity")}
    caches = [c for c in CACHE_VARIANTS if c in fresh["caches"] or any(r["cache"] == c for r in kept["pass_key"])]
    refused = {(k if "caches" in earlier else old_label[k]): v for k, v in earlier.get("refused", {}).items()}
    refused = {k: v for k, v in refused.items() if k not in fresh["caches"]} | fresh["refused"]
    return dict(caches=caches, refused=refused,
                **{part: sorted(kept[part] + fresh[part], key=lambda r: caches.index(r["cache"]))
                   for part in ("pass_key", "perplexity")})


def evaluate(name: str, plan: Plan, args, clock: Clock) -> dict:
    from quest_ort.export.rewrite import SparseSettings
    from quest_ort.export.weights import CHECKPOINTS, checkpoint

    settings = SparseSettings.for_budget(32)  # the default export, with the defaults of this run's code
    default = qr.Config(qr.Policy.of(settings), settings.budget_tokens)
    configs = sweep(default, plan.budgets)
    perplexity_configs = [c for c in configs if c.budget in plan.perplexity_budgets or c == default]
    capacity = max(max(plan.lengths), plan.perplexity_tokens) + 256  # the longest prompt and its answer
    begin, cpu = time.time(), time.process_time()
    shipped = CHECKPOINTS[name]
    suite = Suite(name, shipped.family, checkpoint(name, WEIGHTS), capacity, settings, configs, clock,
                  threads=args.threads, reuse=args.reuse_exports)
    clock.log(f"{name}: {len(configs)} configurations; default {default.name}; exports ready")
    prompts = pass_key_prompts(suite.tokenizer, plan.lengths, plan.depths)
    pass_key, checks = run_pass_key(suite, configs, prompts, args.cache_gb * 2**30, not args.no_recall, clock)
    harder = run_harder_retrieval(suite, plan, clock)
    started = time.time()
    perplexity = run_perplexity(suite, perplexity_configs, plan.perplexity_tokens, plan.continuation_from, clock)
    clock.phase("perplexity", time.time() - started)
    cache_types = run_cache_types(name, plan, args, clock, suite.tokenizer)
    s = suite.sidecar
    return dict(
        model=shipped.title, family=shipped.family, layers=s.geometry.num_layers, heads=s.geometry.num_heads,
        kv_heads=s.geometry.kv_num_heads, head_dim=s.geometry.head_dim, dense_layers=list(s.settings.dense_layers), kv_dtype=s.settings.kv_dtype,
        bounds_dtype=s.bounds_dtype, default=default.name, default_settings=dataclasses.asdict(settings),
        old_default=OLD_DEFAULT.name, budgets=sorted({c.budget for c in configs}),
        perplexity_budgets=sorted({c.budget for c in perplexity_configs}), lengths=plan.lengths,
        depths=list(plan.depths), answer_tokens=ANSWER_TOKENS, perplexity_tokens=plan.perplexity_tokens,
        continuation_from=plan.continuation_from, checks=checks, pass_key=pass_key, perplexity=perplexity,
        cache_types=cache_types, harder_retrieval=harder,
        seconds=round(time.time() - begin), cpu_seconds=round(time.process_time() - cpu), phases=dict(clock.phases),
        threads=args.threads)


def default_suite(name: str, plan: Plan, args, clock: Clock) -> Suite:
    """The default export alone (reused with --reuse-exports) and its dense variant."""
    from quest_ort.export.rewrite import SparseSettings
    from quest_ort.export.weights import CHECKPOINTS, checkpoint

    settings = SparseSettings.for_budget(32)
    default = qr.Config(qr.Policy.of(settings), settings.budget_tokens)
    capacity = max(max(plan.lengths), plan.perplexity_tokens) + 256
    return Suite(name, CHECKPOINTS[name].family, checkpoint(name, WEIGHTS), capacity, settings, [default], clock,
                 threads=args.threads, reuse=args.reuse_exports, old_default=False)


def run_default_check(suite: Suite, plan: Plan, clock: Clock) -> dict:
    """What issue 43 asks of the default export (`export-sparse --k 32`), on the user's path: every
    pass-key prompt through `Generator(model).generate` on the default export, and the dense
    reference decoded from that Generator's own exact prefill (an exact prefill selects nothing, so
    it is the dense one: run_pass_key's method, where the default's decode from it must equal the
    Generator's, checked here too); both perplexity measures of each. No policy variant, no
    per-token prefill: the part of the whole evaluation a change of the defaults must pass, with
    every key of the plan, at one prefill per prompt."""
    from quest_ort.runtime.generate import Generator, Sampling

    begin = time.time()
    generator = Generator(suite.default)
    sampling = Sampling(max_new_tokens=ANSWER_TOKENS)
    rows = []
    prompts = pass_key_prompts(suite.tokenizer, plan.lengths, plan.depths)
    for index, prompt in enumerate(prompts):
        tokens = generator.generate([prompt.ids], sampling)[0]
        source = suite.default.new_cache(1, len(prompt.ids) + ANSWER_TOKENS)
        qr.copy_prompt_state(generator.cache, source, 0, len(prompt.ids))
        answers = {"default": tokens}
        for label, model in (("dense", suite.dense), ("default (from the prefill)", suite.default)):
            cache = qr.sharing_cache(model, source)
            qr.rebuild_bounds(model, cache)
            answers[label] = qr.greedy_steps(model, cache, [tokens[0]], ANSWER_TOKENS)[0]
        if answers.pop("default (from the prefill)") != tokens:
            raise AssertionError(f"{suite.name}: the default export's decode from its prefill differs from "
                                 f"Generator(model).generate on the {prompt.length}-token prompt at depth {prompt.depth}")
        for label, answer_tokens in answers.items():
            answer = suite.tokenizer.decode(answer_tokens, skip_special_tokens=True)
            rows.append(dict(model=label, length=prompt.length, depth=prompt.depth, key=prompt.key,
                             hit=prompt.key in answer, answer=answer.strip()))
        if (index + 1) % len(plan.depths) == 0:
            done = [r for r in rows if r["length"] == prompt.length]
            clock.log(f"{suite.name}: default check, {index + 1} of {len(prompts)} prompts; at {prompt.length} tokens "
                      f"dense {sum(r['hit'] for r in done if r['model'] == 'dense')}, default "
                      f"{sum(r['hit'] for r in done if r['model'] == 'default')} so far")
    clock.phase("default check: pass key", time.time() - begin)
    started = time.time()
    perplexity = run_perplexity(suite, [suite.default_config], plan.perplexity_tokens, plan.continuation_from, clock)
    clock.phase("default check: perplexity", time.time() - started)
    return dict(default=suite.default_config.name, settings=dataclasses.asdict(suite.settings), lengths=plan.lengths,
                depths=list(plan.depths), answer_tokens=ANSWER_TOKENS, perplexity_tokens=plan.perplexity_tokens,
                continuation_from=plan.continuation_from, pass_key=rows, perplexity=perplexity,
                seconds=round(time.time() - begin), threads=suite.threads)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), action="append",
                        help="checkpoint to evaluate (repeatable; default: both)")
    parser.add_argument("--lengths", help="pass-key prompt lengths, comma-separated; LENGTH:N gives that length N keys "
                        "per depth (default per model: " + "; ".join(f"{m} {v['lengths']}" for m, v in MODELS.items()) + ")")
    parser.add_argument("--keys", type=int, help="pass keys per (length, depth) (default per model: "
                        + "; ".join(f"{m} {v['keys']}" for m, v in MODELS.items()) + ")")
    parser.add_argument("--perplexity-budgets", type=lambda text: tuple(int(b) for b in text.split(",")),
                        help="budgets of the perplexity runs, comma-separated (default per model: "
                        + "; ".join(f"{m} {','.join(map(str, v['perplexity_budgets']))}" for m, v in MODELS.items())
                        + "); pass keys run every budget of " + ",".join(map(str, BUDGETS)))
    parser.add_argument("--perplexity-tokens", type=int, default=None,
                        help=f"tokens of text the perplexity runs score, the continuation from half of them "
                        f"(default {PERPLEXITY_TOKENS})")
    parser.add_argument("--quick", action="store_true", help="smoke run: one short prompt, one budget, short text; "
                        "writes build/eval/quick unless --output is given")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-gb", type=float, default=2.0, help="keys and values of a batch of prompts (GB)")
    parser.add_argument("--no-recall", action="store_true", help="skip the attention-mass recall (one step per policy)")
    parser.add_argument("--reuse-exports", action="store_true", help="reuse the exports under build/eval (development)")
    parser.add_argument("--output", type=pathlib.Path, default=None)
    parser.add_argument("--caches", type=lambda text: [c.strip() for c in text.split(",") if c.strip()],
                        help=f"with --only-cache-types: the variants to run again (of {list(CACHE_VARIANTS)}); the "
                        "report keeps the others' rows")
    parser.add_argument("--only-cache-types", action="store_true",
                        help="only the KV cache types' comparison (float16 against int8 caches), stored into the "
                        "output's quality.json next to the rest")
    parser.add_argument("--only-retrieval", action="store_true",
                        help="only the harder retrieval (multi-key, asked twice), stored into the output's "
                        "quality.json next to the rest")
    parser.add_argument("--only-default", action="store_true",
                        help="only the default export through Generator against dense: every pass-key prompt "
                        "(--keys per length and depth) and both perplexity measures, stored into the output's "
                        "quality.json next to the rest")
    parser.add_argument("--report-only", action="store_true",
                        help="only write quality.md and the plots again from the output's quality.json")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.caches or ()) - set(CACHE_VARIANTS))
    if unknown:
        parser.error(f"--caches: unknown {unknown}; choose from {list(CACHE_VARIANTS)}")
    from quest_ort.apps.console import configure_logging

    configure_logging()  # the exports' steps and the checkpoints' conversion, on stderr
    args.reuse_exports |= args.quick
    output = args.output or (WORK / "quick" if args.quick else DOCS)
    names = args.model or list(MODELS)
    clock = Clock()
    path = output / "quality.json"
    report = json.loads(path.read_text()) if path.is_file() else {}
    report.setdefault("models", {})
    for name in [] if args.report_only else names:
        clock.phases = {}
        if args.only_cache_types or args.only_retrieval or args.only_default:
            flag = ("--only-cache-types" if args.only_cache_types else "--only-retrieval" if args.only_retrieval
                    else "--only-default")
            if name not in report["models"]:
                raise SystemExit(f"{flag} adds to {path}'s {name} results, which it lacks: run the whole "
                                 "evaluation first")
            plan = Plan.of(name, args)
            if args.only_cache_types:
                fresh = run_cache_types(name, plan, args, clock)
                report["models"][name]["cache_types"] = merge_cache_types(report["models"][name].get("cache_types"),
                                                                          fresh)
            elif args.only_retrieval:
                report["models"][name]["harder_retrieval"] = run_harder_retrieval(
                    default_suite(name, plan, args, clock), plan, clock)
            else:
                report["models"][name]["default_check"] = run_default_check(default_suite(name, plan, args, clock),
                                                                            plan, clock)
            path.write_text(json.dumps(report, indent=1) + "\n")
            continue
        report["models"][name] = evaluate(name, Plan.of(name, args), args, clock)
        # Each model's rows are written as soon as they exist: a later failure loses nothing.
        output.mkdir(parents=True, exist_ok=True)
        RUNS.mkdir(parents=True, exist_ok=True)
        (RUNS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(report["models"][name]) + "\n")
        path.write_text(json.dumps(report, indent=1) + "\n")
        clock.log(f"{name}: done in {report['models'][name]['seconds']} s; wrote {path}")
    from .quality_report import write_report

    drew = write_report(report, output)
    clock.log(f"wrote {output / 'quality.md'}" + (" and the plots" if drew else ""))


if __name__ == "__main__":
    main()
