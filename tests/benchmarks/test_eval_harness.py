"""The quality evaluation's own logic (make eval) on tiny exported models: the shared exact prefill, block bounds recomputed from the keys, snapshot decodes against Generator, perplexity, the report's counts."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from benchmarks import eval_quality, harness, quality_inputs, quality_report
from benchmarks import quality_runtime as qr
from quest_ort.export.rewrite import SparseSettings
from quest_ort.ops.reference import quest_metadata
from quest_ort.runtime.generate import Generator, Sampling
from quest_ort.runtime.model import QuestModel
from support.export_models import tiny_model

ANSWER = 6
# The tiny Llama (6 query heads on 2 KV heads, 3 layers, layer 0 dense) exported at P=16 with K=2 (a
# 32-token budget) by default, and at P=8; budgets far below the prompts, so every policy selects.
SETTINGS = SparseSettings(top_k=2, block_size=16, dense_layers=(0,))
CONFIGS = sorted({qr.Config(qr.Policy(16, "mean"), 32), qr.Config(qr.Policy(16, "none"), 32),
                  qr.Config(qr.Policy(8, "mean"), 32), qr.Config(qr.Policy(8, "none", 1, 2), 48),
                  qr.Config(qr.Policy(8, "none", 2, 2), 32)})


class ByteTokenizer:
    """Text as its bytes (the tiny models' vocabulary is 256): enough for prompts, answers and text."""

    def __call__(self, text, add_special_tokens=False):
        return type("Encoding", (), {"input_ids": list(text.encode("utf-8", errors="replace"))})()

    def decode(self, ids, skip_special_tokens=False):
        return bytes(ids).decode("latin-1")


class ChatByteTokenizer(ByteTokenizer):
    """With a chat template: the messages' text, as bytes."""

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return self("".join(message["content"] for message in messages)).input_ids


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    tiny = tiny_model("llama")
    return eval_quality.Suite("tiny-llama", "llama", tiny.checkpoint, 640, SETTINGS, CONFIGS, eval_quality.Clock(),
                              threads=1, work=tmp_path_factory.mktemp("eval"), tokenizer=ByteTokenizer())


def _prompts(count=3, lengths=(150, 197, 233)) -> list[eval_quality.Prompt]:
    rng = np.random.default_rng(5)
    return [eval_quality.Prompt(length, 0.5, str(index), rng.integers(0, 256, length).tolist())
            for index, length in zip(range(count), lengths)]


@pytest.mark.parametrize("bounds_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("offset", [-31, -1, 0, 1, 35])
def test_block_bounds_match_the_metadata_reference_bit_for_bit(bounds_dtype, block_size, offset):
    """Rounded outward into float16, merged as the op merges (ties of -0 and +0 included)."""
    length = max(1, 2 * block_size + offset)
    rng = np.random.default_rng(length)
    keys = rng.standard_normal((1, 2, length, 8)).astype(np.float32)
    keys[0, 0, : length // 2, 0] = np.where(np.arange(length // 2) % 2, -0.0, 0.0)  # signed-zero ties
    high, low = qr.block_bounds(keys[0], length, block_size, bounds_dtype)
    empty = np.zeros((1, 2, -(-length // block_size), 8), bounds_dtype)
    want_max, want_min = quest_metadata(keys, empty, empty, np.zeros(1, np.int64), block_size=block_size)
    assert qr.same_bits(high, want_max[0]) and qr.same_bits(low, want_min[0])


def test_same_bits_tells_signed_zeros_apart():
    assert qr.same_bits(np.float16([1.0, 0.0]), np.float16([1.0, 0.0]))
    assert not qr.same_bits(np.float16([1.0, 0.0]), np.float16([1.0, -0.0]))


def test_recomputed_bounds_equal_the_ops_and_a_changed_bound_is_caught(suite):
    """After a Generator's exact prefill and decode, every row's recomputed bounds (float32 keys,
    float16 bounds rounded outward) are the ones QuestMetadata built."""
    generator = Generator(suite.default)
    generator.generate([_prompts()[1].ids], Sampling(max_new_tokens=ANSWER))
    qr.check_block_bounds(suite.default, generator.cache)
    bounds = next(layer.block_max for layer in generator.cache.layers if layer.block_max is not None)
    bounds[0, 1, 3, 5] = np.nextafter(bounds[0, 1, 3, 5], np.float16(np.inf))
    with pytest.raises(AssertionError, match="recomputed block bounds differ"):
        qr.check_block_bounds(suite.default, generator.cache)


def test_exact_prefill_depends_on_no_policy_and_no_block_size(suite):
    """Why one prefill serves every policy: the same logits bit for bit from every variant."""
    from quest_ort.runtime.generate import prefill

    prompt = _prompts()[2].ids
    logits = []
    for config in CONFIGS:
        model = suite.variant(config)
        logits.append(prefill(model, model.new_cache(1, 256), [prompt], mode="exact"))
    assert all(qr.same_bits(logits[0], other) for other in logits[1:])


def test_snapshot_decodes_of_every_policy_equal_generator(suite):
    """Keys and values of one prefill shared by a cache per P, bounds rebuilt, a snapshot restored
    before each policy, a batch of prompts stepped as Generator.stream steps: each policy's tokens are
    Generator(variant).generate's, prompt by prompt (every model here shares its weights, so the
    arithmetic is the same on both paths)."""
    prompts = _prompts()
    source_model = suite.variant(suite.default_config)
    source = source_model.new_cache(len(prompts), max(len(p.ids) for p in prompts) + ANSWER)
    first = []
    for row, prompt in enumerate(prompts):
        generator = Generator(source_model)
        first.append(generator.generate([prompt.ids], Sampling(max_new_tokens=1))[0][0])
        qr.copy_prompt_state(generator.cache, source, row, len(prompt.ids))
    snapshots = {}
    for config in CONFIGS:  # P=8 and P=16 interleaved: each restores its own state
        model = suite.variant(config)
        P = config.policy.block_size
        if P not in snapshots:
            cache = qr.sharing_cache(model, source)
            qr.rebuild_bounds(model, cache)
            snapshots[P] = qr.Snapshot(cache)
        answers = qr.greedy_steps(model, snapshots[P].restore(), first, ANSWER)
        for prompt, answer in zip(prompts, answers):
            assert answer == Generator(model).generate([prompt.ids], Sampling(max_new_tokens=ANSWER))[0], config.name


def test_pass_key_run_checks_the_default_against_generator(suite, monkeypatch):
    """run_pass_key decodes the default export from the shared state and stops when its tokens are
    not Generator's; its rows count every prompt, policy and Generator run."""
    prompts = _prompts(count=2)
    assert suite.default_config in CONFIGS
    rows, checks = eval_quality.run_pass_key(suite, CONFIGS, prompts, memory=2**30, recall=True,
                                             clock=eval_quality.Clock())
    assert checks["generator_agrees"] == checks["prompts"] == 2
    assert len([r for r in rows if r["prefill"] == "exact" and r["config"] != "dense"]) == 2 * len(CONFIGS)
    assert {r["config"] for r in rows if r["prefill"] == "per-token"} == {suite.default_config.name,
                                                                        eval_quality.OLD_DEFAULT.name}
    assert all(0 < r["recall"] <= 1 + 1e-6 and r["reads"] >= 1 - 1e-6 for r in rows if r.get("recall") is not None)
    steps = qr.greedy_steps

    def one_token_off(model, cache, first, tokens):
        answers = steps(model, cache, first, tokens)
        return [[(answer[0] + 1) % 256] + answer[1:] for answer in answers] if model is suite.default else answers

    monkeypatch.setattr(qr, "greedy_steps", one_token_off)
    with pytest.raises(AssertionError, match="differs from Generator"):
        eval_quality.run_pass_key(suite, [suite.default_config], prompts[:1], memory=2**30, recall=False,
                                  clock=eval_quality.Clock())


def test_teacher_forcing_scores_each_next_token_whatever_the_chunk(suite):
    """Losses of targets 1..n-1 from chunked exact steps equal a log-softmax of one whole step."""
    ids = np.random.default_rng(2).integers(0, 256, 300).tolist()
    whole = suite.default.step(suite.default.new_cache(1, 320), np.array([ids]), exact=True)[0].astype(np.float64)
    log_probs = whole - np.log(np.exp(whole - whole.max(-1, keepdims=True)).sum(-1, keepdims=True)) - whole.max(
        -1, keepdims=True)
    want = -log_probs[np.arange(len(ids) - 1), ids[1:]]
    losses, last = qr.teacher_forced(suite.default, suite.default.new_cache(1, 320), ids, 0, exact=True, chunk=128)
    np.testing.assert_allclose(losses, want, rtol=1e-4)
    np.testing.assert_allclose(last, whole[-1], rtol=1e-4, atol=1e-4)


def test_a_budget_covering_the_text_gives_dense_perplexity_on_both_measures(suite, monkeypatch):
    """Dense by contract, so both measures must come out as dense's (to rounding); a small budget
    must not."""
    monkeypatch.setattr(quality_inputs, "natural_text", lambda: "It is what it is. " * 40)
    monkeypatch.setattr(eval_quality, "natural_text", quality_inputs.natural_text)
    covering = qr.Config(qr.Policy(16, "none"), 640)
    rows = eval_quality.run_perplexity(suite, [covering, CONFIGS[0]], tokens=600, continuation_from=256,
                                       clock=eval_quality.Clock())
    values = {(r["config"], r["measure"]): r["perplexity"] for r in rows}
    for measure in quality_report.MEASURES:
        assert values[(covering.name, measure)] == pytest.approx(values[("dense", measure)], rel=1e-4)
        assert values[(CONFIGS[0].name, measure)] != pytest.approx(values[("dense", measure)], rel=1e-4)


def test_sweep_holds_every_policy_at_every_budget_and_the_default():
    default = qr.Config(qr.Policy(64, "max", 2, 3), 2048)
    configs = eval_quality.sweep(default, (128, 1024))
    policies = {c.policy for c in configs}
    assert len(policies) == 3 * 2 + 3 + 1 and default in configs
    assert qr.Policy(8, "none", 1, 4) in policies and qr.Policy(16, "mean") in policies
    assert all(c.budget in (128, 1024) for c in configs if c != default)
    assert eval_quality.lengths_option("2048,16384:1", 3) == {2048: 3, 16384: 1}


def test_batches_keep_one_length_and_fit_the_memory():
    prompts = [eval_quality.Prompt(length, 0.5, "1", [0] * (length + 3)) for length in (100, 100, 100, 200)]
    groups = eval_quality.batches(prompts, bytes_per_token=10, memory=10 * 250)
    assert [[p.length for p in group] for group in groups] == [[100, 100], [100], [200]]


def test_variant_rewrites_select_attributes_and_analysis_exposes_selection_and_mass(tmp_path):
    import onnx
    from onnx import helper

    nodes = []
    for i in range(2):
        nodes.append(helper.make_node("SparseBlockSelect", [f"q{i}"], [f"idx{i}"], domain="quest", top_k=32,
                                      recent_blocks=1))
        nodes.append(helper.make_node("SparseBlockAttention", [f"q{i}", "k", "v", "kc", "vc", "p", f"idx{i}"],
                                      [f"o{i}", "kc_out", "vc_out"], domain="quest"))
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [], [])), str(tmp_path / "model.quest.onnx"))
    plain = onnx.load(str(tmp_path / qr.write_variant(tmp_path, "v", top_k=8, recent_blocks=4)))
    selects = [n for n in plain.graph.node if n.op_type == "SparseBlockSelect"]
    assert [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in selects] == [
        dict(top_k=8, recent_blocks=4)] * 2
    analysis = onnx.load(str(tmp_path / qr.write_variant(tmp_path, "v", analysis=True, top_k=8)))
    attention = [n for n in analysis.graph.node if n.op_type == "SparseBlockAttention"]
    assert all(n.input[6] == "" and len(n.output) == 4 for n in attention)
    assert [o.name for o in analysis.graph.output] == ["idx0", "o0.block_mass", "idx1", "o1.block_mass"]


def _model_report(rows, perplexities, budgets=(256,)):
    settings = dict(SETTINGS.__dict__, block_size=32, group_reduce="mean", sink_blocks=1, recent_blocks=1, top_k=8)
    return dict(model="m", layers=3, heads=6, kv_heads=2, head_dim=16, dense_layers=[0], kv_dtype="float32",
                bounds_dtype="float16", default="P32-mean-s1r1-K8", default_settings=settings,
                old_default="P32-mean-s1r1-K32", budgets=list(budgets), perplexity_budgets=list(budgets), lengths={"2048": 3}, depths=[0.5],
                answer_tokens=12, perplexity_tokens=100, continuation_from=50, seconds=1, cpu_seconds=2,
                phases={"exports": 1.0},
                checks=dict(generator_agrees=3, shared_weights_agree=3, prompts=3), pass_key=rows,
                perplexity=perplexities)


def _pass_key_rows(outcomes, budget=256, config="P32-mean-s1r1-K8"):
    """outcomes: (dense hit, policy hit) per prompt."""
    rows = []
    policy = dict(block_size=32, group_reduce="mean", sink_blocks=1, recent_blocks=1)
    for index, (dense_hit, hit) in enumerate(outcomes):
        common = dict(length=2048, depth=0.5, key=str(index), prompt_tokens=2048, answer="")
        rows.append(dict(common, config="dense", prefill="exact", budget=None, hit=dense_hit,
                         **dict.fromkeys(policy)))
        rows.append(dict(common, config=config, prefill="exact", budget=budget, hit=hit, recall=0.5, reads=1.0,
                         **policy))
    return rows


def _perplexity_rows(dense=10.0, sparse=11.0, budget=256):
    policy = dict(block_size=32, group_reduce="mean", sink_blocks=1, recent_blocks=1)
    return [row for measure in quality_report.MEASURES for row in (
        dict(config="dense", measure=measure, budget=None, perplexity=dense, **dict.fromkeys(policy)),
        dict(config="P32-mean-s1r1-K8", measure=measure, budget=budget, perplexity=sparse, **policy))]


def test_a_key_is_lost_only_where_dense_retrieves_it():
    # dense and policy find it / dense only (lost) / the policy only (not counted) / neither
    model = _model_report(_pass_key_rows([(True, True), (True, False), (False, True), (False, False)]),
                          _perplexity_rows())
    assert dict(quality_report.keys_lost(model)) == {((32, "mean", 1, 1), 256): {2048: 1}}
    text = "\n".join(quality_report.markdown(dict(models={"m": model})))
    assert "| P32 mean s1 r1 (default) | **1 (1)** |" in text  # the lost-keys table
    assert "| P32 mean s1 r1 (default) | **1/2 (2/4)** |" in text  # one of dense's two keys, two of all four


@pytest.mark.parametrize("lost, listed", [(False, True), (True, False)])
def test_summary_names_the_policies_that_lose_no_key_at_k32(lost, listed):
    model = _model_report(_pass_key_rows([(True, not lost), (True, True)], budget=1024, config="P32-mean-s1r1-K32"),
                          _perplexity_rows(sparse=10.05, budget=1024), budgets=(1024,))
    lines = quality_report.summary(model)
    assert ("P32 mean s1 r1" in lines[0]) == listed
    assert all("P32 mean s1 r1" in line for line in lines[1:3])  # +0.5%: within 1% of dense


def test_report_replaces_only_the_generated_part(tmp_path):
    model = _model_report(_pass_key_rows([(True, True)]), _perplexity_rows())
    (tmp_path / "quality.md").write_text(f"# Q\n\nreading\n\n{quality_report.BEGIN}\nold\n{quality_report.END}\n")
    assert quality_report.write_report(dict(models={"m": model}), tmp_path, plots=False) is False
    text = (tmp_path / "quality.md").read_text()
    assert "reading" in text and "\nold\n" not in text
    assert "| P32 mean s1 r1 (default) | **11.000 (+10.0%)** |" in text


def test_without_matplotlib_the_report_is_written_and_says_the_plots_are_not(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    model = _model_report(_pass_key_rows([(True, True)]), _perplexity_rows())
    assert quality_report.write_report(dict(models={"m": model}), tmp_path) is False
    assert "matplotlib is not installed: quality_passkey.png and quality_perplexity.png not drawn" in capsys.readouterr().out
    assert (tmp_path / "quality.md").is_file() and not list(tmp_path.glob("*.png"))


def test_a_kv_head_reads_the_union_of_its_query_heads_lists():
    selected = np.array([[0, 1, -1], [1, 2, -1]], np.int32)  # [R, K]
    assert [b.tolist() for b in harness.blocks_per_kv_head(selected, 1)] == [[0, 1, 2]]  # R = H = 2
    assert [b.tolist() for b in harness.blocks_per_kv_head(selected, 2)] == [[0, 1], [1, 2]]  # R = N


class CharTokenizer:
    """One token per character: enough to check where the prompt puts the needle."""

    def __call__(self, text, add_special_tokens=False):
        return type("Encoding", (), {"input_ids": [ord(c) for c in text]})()

    def decode(self, ids):
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return [ord(c) for c in f"<user>{messages[0]['content']}</user><assistant>"]


@pytest.mark.parametrize("depth", [0.1, 0.5, 0.9])
def test_pass_key_prompt_places_one_needle_at_its_depth_in_natural_text(depth):
    tokenizer = CharTokenizer()
    prompt = tokenizer.decode(quality_inputs.pass_key_prompt(tokenizer, "48213", 3000, depth, seed=2))
    assert abs(len(prompt) - 3000) < 10
    assert prompt.count("The pass key is 48213.") == 1 and prompt.endswith(quality_inputs.QUESTION + "</user><assistant>")
    filler_start = prompt.index(quality_inputs.INSTRUCTION) + len(quality_inputs.INSTRUCTION)
    filler_end = prompt.index(quality_inputs.QUESTION)
    position = (prompt.index("The pass key is") - filler_start) / (filler_end - filler_start)
    assert abs(position - depth) < 0.03
    sentences = [s for s in prompt[filler_start:filler_end].split(".") if len(s) > 40]
    assert len(set(sentences)) == len(sentences), "the filler repeats a sentence"


def test_the_cache_type_comparison_measures_an_export_its_validation_refuses(tmp_path, monkeypatch):
    """`--only-cache-types` on a model whose int8 export the validation refuses (here: a zero
    tolerance): the refusal is recorded and named in the report, the export measured all the same."""
    import types

    from quest_ort.pipeline import validate
    from quest_ort.export import weights

    tiny = tiny_model("llama")
    monkeypatch.setitem(weights.CHECKPOINTS, "tiny-llama", types.SimpleNamespace(family="llama", title="tiny"))
    monkeypatch.setattr(weights, "checkpoint", lambda name, root: tiny.checkpoint)
    monkeypatch.setattr(eval_quality, "WORK", tmp_path)
    monkeypatch.setitem(validate.CACHE_TOLERANCES, "int8", 0.0)
    plan = eval_quality.Plan({160: 1}, depths=(0.5,), perplexity_tokens=320, continuation_from=160)
    args = types.SimpleNamespace(reuse_exports=False, threads=1)
    result = eval_quality.run_cache_types("tiny-llama", plan, args, eval_quality.Clock(), ChatByteTokenizer())
    caches = ["float16", "int8", "int8, float16 bounds"]
    assert sorted(result["refused"]) == caches[1:] and "validation failed" in result["refused"]["int8"]
    assert sorted(r["cache"] for r in result["pass_key"]) == caches
    assert {r["cache"]: r["bounds_dtype"] for r in result["pass_key"]} == dict(zip(caches, ["float16", "int8", "float16"]))
    assert sorted((r["cache"], r["measure"]) for r in result["perplexity"]) == sorted(
        (cache, measure) for cache in caches for measure in ("every token sparse", "continuation"))
    assert all(np.isfinite(r["perplexity"]) for r in result["perplexity"])
    model = dict(cache_types=result, lengths={"160": 1})
    table = "\n".join(quality_report.cache_type_table(model))
    assert "| int8† |" in table and "| float16 |" in table and "with int8 caches is refused" in table, table


def test_a_cache_variant_run_again_replaces_only_its_own_rows():
    """`--caches int8` over a report written before the variants had labels: its float16 rows stay,
    its int8 rows (int8 caches had float16 bounds then) become 'int8, float16 bounds', the fresh
    int8 rows join them, in CACHE_VARIANTS' order."""
    def rows(label, dtype, retrieved):
        return dict(pass_key=[dict(kv_dtype=dtype, length=2048, retrieved=retrieved, **label)],
                    perplexity=[dict(kv_dtype=dtype, measure="continuation", perplexity=2.0, **label)])

    earlier = dict(kv_dtypes=["float16", "int8"], refused={"int8": "too far"},
                   **{part: rows({}, "float16", True)[part] + rows({}, "int8", False)[part]
                      for part in ("pass_key", "perplexity")})
    fresh = dict(caches=["int8"], refused={}, **rows(dict(cache="int8"), "int8", True))
    merged = eval_quality.merge_cache_types(earlier, fresh)
    assert merged["caches"] == ["float16", "int8, float16 bounds", "int8"]
    assert [(r["cache"], r["retrieved"]) for r in merged["pass_key"]] == [
        ("float16", True), ("int8, float16 bounds", False), ("int8", True)]
    assert merged["refused"] == {"int8, float16 bounds": "too far"}


@pytest.mark.parametrize("index", [0, 1, 6])
def test_a_multi_key_prompt_holds_every_lock_and_asks_one(index):
    """Four lock sentences in the filler at spread depths, in an order that rotates every four
    prompts, the question naming one lock, whose depth takes every place in turn; about the length
    asked for."""
    from benchmarks import quality_retrieval as retrieval

    tokenizer = ChatByteTokenizer()
    prompt = retrieval.multi_key_prompt(tokenizer, 2000, index)
    text = tokenizer.decode(prompt.ids)
    places = [text.index(retrieval.lock_sentence(lock, key)) for lock, key in zip(retrieval.LOCKS, prompt.keys)]
    assert sorted(places) == [places[lock] for lock in np.argsort(prompt.depths)]  # the sentences sit in depth order
    assert len(set(prompt.keys)) == retrieval.MULTI_KEYS and prompt.asked == index % retrieval.MULTI_KEYS
    assert text.endswith(retrieval.lock_question(retrieval.LOCKS[prompt.asked]))
    assert 1900 <= len(prompt.ids) <= 2100
    asked_depths = {retrieval.multi_key_prompt(tokenizer, 2000, i).depths[i % retrieval.MULTI_KEYS] for i in range(4)}
    assert len(asked_depths) == retrieval.MULTI_KEYS  # the asked key at every place in turn
    assert retrieval.multi_key_prompt(tokenizer, 2000, index + 4).depths != prompt.depths


def test_the_second_turn_holds_the_first_its_reply_and_the_question_again():
    from benchmarks import quality_retrieval as retrieval

    tokenizer = ChatByteTokenizer()
    first = quality_inputs.pass_key_prompt(tokenizer, "12345", 600, 0.5, seed=1)
    messages = quality_inputs.pass_key_messages(tokenizer, "12345", 600, 0.5, seed=1)
    assert tokenizer.apply_chat_template(messages) == first
    second = tokenizer.decode(retrieval.second_turn(tokenizer, messages, "It is 12345."))
    assert second.startswith(tokenizer.decode(first)) and second.endswith("It is 12345." + retrieval.AGAIN)


def test_harder_retrieval_runs_through_generator_and_its_table_counts(suite, monkeypatch, capsys):
    """The rows of both tasks for both models (the tiny model answers at random: what is checked is
    that every prompt ran, said so as it went, and the table counts what the rows say)."""
    from benchmarks import quality_retrieval as retrieval

    monkeypatch.setattr(suite, "tokenizer", ChatByteTokenizer())
    monkeypatch.setattr(eval_quality, "ANSWER_TOKENS", 4)  # the second turn fits the tiny suite's 640 tokens
    monkeypatch.setattr(retrieval, "MULTI_KEY_ANSWER_TOKENS", 4)
    plan = eval_quality.Plan({560: 1}, depths=(0.25, 0.75))
    harder = eval_quality.run_harder_retrieval(suite, plan, eval_quality.Clock())
    rows = harder["rows"]
    assert len(rows) == 2 * (2 + 2)  # (2 multi-key prompts + 2 asked-twice conversations) x (default, dense)
    progress = capsys.readouterr().out
    for label in ("default", "dense"):
        for done in (1, 2):
            assert f"multi-key, {label}: {done} of 2 prompts (560 tokens: " in progress
            assert f"asked twice, {label}: {done} of 2 conversations (560 tokens: " in progress
    for row in rows:
        answer = row["answer"] if row["task"] == "multi-key" else row["second_answer"]
        assert row["hit"] == (row["key"] in answer)
    # a made-up outcome: dense right on both multi-key prompts, the default on one (and confused on the other)
    multi = [r for r in rows if r["task"] == "multi-key"]
    for r in multi:
        r["hit"] = r["model"] == "dense" or r["depth"] == multi[0]["depth"]
        r["confused"] = not r["hit"]
    table = retrieval.retrieval_table(dict(harder_retrieval=harder))
    assert "| multi-key | 560 | 2 of 2 | 1 of 2 | 1 | 1 |" in table


def test_default_check_runs_every_prompt_on_both_models_and_its_table_counts_what_dense_retrieves(suite, monkeypatch):
    """--only-default: each pass-key prompt through both Generators, both perplexity measures for
    each; the table's lost keys are those dense retrieves and the default does not."""
    monkeypatch.setattr(suite, "tokenizer", ChatByteTokenizer())
    monkeypatch.setattr(eval_quality, "ANSWER_TOKENS", 4)
    monkeypatch.setattr(eval_quality, "natural_text", lambda: "The sky is blue and the grass is green. " * 20)
    plan = eval_quality.Plan({300: 2}, depths=(0.25, 0.75), perplexity_tokens=256, continuation_from=128)
    check = eval_quality.run_default_check(suite, plan, eval_quality.Clock())
    rows = check["pass_key"]
    assert len(rows) == 2 * 2 * 2  # (2 depths x 2 keys) x (default, dense)
    assert {(r["model"], r["depth"]) for r in rows} == {(m, d) for m in ("default", "dense") for d in (0.25, 0.75)}
    assert check["default"] == suite.default_config.name and check["settings"]["top_k"] == SETTINGS.top_k
    assert sorted((r["config"], r["measure"]) for r in check["perplexity"]) == sorted(
        (c, m) for c in ("dense", suite.default_config.name) for m in quality_report.MEASURES)
    # a made-up outcome: dense retrieves three keys, the default two of them and the fourth
    for index, r in enumerate(sorted(rows, key=lambda r: (r["depth"], r["key"], r["model"]))):
        prompt, model = divmod(index, 2)
        r["hit"] = prompt < 3 if r["model"] == "dense" else prompt in (0, 1, 3)
    table = "\n".join(quality_report.default_check_table(dict(default_check=check)))
    assert "| 300 | 4 | 3 | 2 (all: 3) | **1** |" in table
    assert f"K={SETTINGS.top_k}" in table
