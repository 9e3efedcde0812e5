"""The runtime: generation (greedy, seeded sampling, stop tokens, streaming, batches), cache reuse,
capacity errors, and the dense GroupQueryAttention baseline of the same model."""

from __future__ import annotations

import functools
import pathlib

import numpy as np
import onnx
import pytest

from quest_ort.pipeline import export_sparse
from quest_ort.export.rewrite import SparseSettings
from quest_ort.runtime.compare import compare
from quest_ort.runtime.generate import PREFILL_MODES, Generator, Sampling, greedy, prefill
from quest_ort.runtime.model import CapacityError, QuestModel
from support.export_models import quest_export


@functools.cache
def _quest(top_k=64):
    return QuestModel(quest_export("qwen3", top_k=top_k), threads=1)


@functools.cache
def _gqa():
    return QuestModel(quest_export("qwen3", top_k=64, attention="gqa"), threads=1)


def _prompts():
    rng = np.random.default_rng(11)
    return [rng.integers(0, 256, n).tolist() for n in (41, 17, 29)]


def test_generate_matches_greedy_and_each_row_alone():
    model = _quest()
    prompts = _prompts()
    batched = Generator(model).generate(prompts, Sampling(max_new_tokens=12))
    assert batched == greedy(model, prompts, 12)
    for row, prompt in enumerate(prompts):
        assert Generator(model).generate([prompt], Sampling(max_new_tokens=12))[0] == batched[row]


class _StepLog:
    """A model that records each step's (batch, positions) and runs it on `model`."""

    def __init__(self, model):
        self.model, self.steps = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def step(self, cache, input_ids, valid=None, **options):
        self.steps.append((cache.batch, input_ids.shape[1]))
        return self.model.step(cache, input_ids, valid, **options)


def test_a_generator_runs_its_rows_as_slots():
    """The one token loop (runtime/slots.py): a Generator prefills each prompt on its own row (steps
    of batch 1, in turns), then decodes every row in one step; `greedy` and `prefill` are that loop."""
    logged = _StepLog(_quest())
    Generator(logged).generate(_prompts(), Sampling(max_new_tokens=3))
    assert logged.steps == [(1, 41), (1, 17), (1, 29), (3, 1), (3, 1)]
    logged.steps.clear()
    greedy(logged, _prompts()[:2], 2)
    assert logged.steps == [(1, 41), (1, 17), (2, 1)]
    logged.steps.clear()
    prefill(logged, logged.new_cache(2, 64), _prompts()[:2], chunk=32)
    assert logged.steps == [(1, 32), (1, 17), (1, 9)]


def test_seeded_sampling_is_reproducible_and_cuts_behave():
    model = _quest()
    prompts = _prompts()
    warm = Sampling(max_new_tokens=16, temperature=1.5, seed=3)
    first = Generator(model).generate(prompts, warm)
    assert Generator(model).generate(prompts, warm) == first
    assert Generator(model).generate(prompts, Sampling(max_new_tokens=16, temperature=1.5, seed=4)) != first
    greedy_tokens = Generator(model).generate(prompts, Sampling(max_new_tokens=16))
    for cut in (Sampling(max_new_tokens=16, temperature=1.5, top_k=1, seed=5),
                Sampling(max_new_tokens=16, temperature=1.5, top_p=1e-6, seed=6)):
        assert Generator(model).generate(prompts, cut) == greedy_tokens


def test_each_row_samples_on_its_own():
    """Row 0 draws from the seed as a request of one row does, row r from (seed, r): the same prompt
    twice in a batch gives two samples, and a row's tokens do not depend on the other rows."""
    model = _quest()
    prompts = _prompts()
    warm = Sampling(max_new_tokens=16, temperature=1.5, seed=3)
    twice = Generator(model).generate([prompts[0], prompts[0]], warm)
    assert twice[0] != twice[1]
    assert twice[0] == Generator(model).generate([prompts[0]], warm)[0]
    assert Generator(model).generate([prompts[0], prompts[2]], warm)[0] == twice[0]
    assert Generator(model).generate([prompts[1], prompts[0]], warm)[1] == twice[1]


def test_stop_tokens_end_rows_independently_while_streaming():
    model = _quest()
    prompts = _prompts()
    reference = Generator(model).generate(prompts, Sampling(max_new_tokens=10))
    stop = reference[1][3]  # row 1's fourth token
    steps = list(Generator(model).stream(prompts, Sampling(max_new_tokens=10, stop_tokens=(stop,))))
    row1 = [step[1] for step in steps]
    first_stop = reference[1].index(stop)
    assert row1[: first_stop + 1] == reference[1][: first_stop + 1]
    assert all(token is None for token in row1[first_stop + 1 :])
    for row in (0, 2):  # rows without that token run on (unless it is theirs too)
        tokens = [step[row] for step in steps if step[row] is not None]
        cut = reference[row].index(stop) + 1 if stop in reference[row] else 10
        assert tokens == reference[row][:cut]


def test_a_generator_is_reused_for_new_prompts():
    model = _quest()
    generator = Generator(model)
    prompts = _prompts()
    first = generator.generate(prompts, Sampling(max_new_tokens=8))
    other = generator.generate([prompts[2], prompts[0], prompts[1]], Sampling(max_new_tokens=8))
    assert other == [first[2], first[0], first[1]]
    assert generator.generate(prompts, Sampling(max_new_tokens=8)) == first


def test_a_request_past_the_capacity_fails_first_and_changes_nothing():
    model = _quest()
    generator = Generator(model, capacity=64)
    prompts = _prompts()
    kept = generator.generate(prompts, Sampling(max_new_tokens=8))
    snapshot = {name: array.copy() for name, array in generator.cache.buffers.items()}
    lengths = generator.cache.lengths.copy()
    with pytest.raises(CapacityError, match="capacity 64"):
        generator.generate(prompts, Sampling(max_new_tokens=30))  # 41 + 30 > 64
    np.testing.assert_array_equal(generator.cache.lengths, lengths)
    for name, array in generator.cache.buffers.items():
        np.testing.assert_array_equal(array, snapshot[name])
    assert generator.generate(prompts, Sampling(max_new_tokens=8)) == kept


@pytest.mark.parametrize("failure", ["after the graph ran", "bad token id", "padding past the capacity"])
def test_a_failed_step_leaves_the_caches_as_they_were(failure):
    """A step that fails (here: after every layer has written, the worst case) leaves the
    metadata and importance that later steps build on untouched; the cache continues exactly as a
    cache that never saw the failure."""
    model = QuestModel(quest_export("qwen3", top_k=4, importance_fraction=0.5), threads=1)
    prompt = _prompts()[0] + _prompts()[2]  # 70 tokens: the last block is partly filled
    clean, broken = model.new_cache(1, capacity=80), model.new_cache(1, capacity=80)
    model.step(clean, np.array([prompt]))
    model.step(broken, np.array([prompt]))
    if failure == "after the graph ran":
        step = model._step
        original = step.run

        def run_then_fail(feeds, into=None, plan=None):
            original(feeds, into, plan)
            raise RuntimeError("injected failure")

        step.run = run_then_fail
        with pytest.raises(RuntimeError, match="injected"):
            model.step(broken, np.array([[7, 8, 9]]))
        del step.run
    elif failure == "bad token id":
        with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 256\)"):
            model.step(broken, np.array([[7, 256]]))
    else:
        with pytest.raises(CapacityError, match="padding included"):
            model.step(broken, np.zeros((1, 11), np.int64), valid=np.array([1]))
    assert broken.lengths.tolist() == [70]
    for name, array in broken.buffers.items():
        valid = array[:, :, :70] if name.startswith(("past_key.", "past_value.")) else array[:, :, : -(-70 // 16)]
        reference = clean.buffers[name][:, :, : valid.shape[2]]
        np.testing.assert_array_equal(valid, reference, err_msg=f"{name} changed by the failed step")
    for token in (3, 1, 4, 1, 5):
        want = model.step(clean, np.array([[token]]))
        got = model.step(broken, np.array([[token]]))
        np.testing.assert_array_equal(got, want)


def test_dense_gqa_baseline_generates_the_same_tokens_when_the_budget_covers_the_context():
    prompts = _prompts()
    comparison = compare(_quest(), _gqa(), prompts, Sampling(max_new_tokens=64))
    assert comparison.identical, f"{comparison.matching_fraction:.0%} of tokens match"
    assert comparison.sparse.decoded == comparison.dense.decoded == 3 * 63


def test_each_step_writes_its_logits_into_an_array_of_its_own():
    # The logits are bound straight into a fresh array (a copy out of ONNX Runtime's would hold a
    # prefill chunk's logits twice): the step returns that very array, one kept from an earlier
    # step does not change, and the values are those ONNX Runtime's own output holds.
    model = _quest()
    cache = model.new_cache(1)
    rng = np.random.default_rng(13)
    first_ids, second_ids = rng.integers(0, 256, (1, 9)), rng.integers(0, 256, (1, 1))
    run, written = model._step.run, []

    def run_recording(feeds, into=None, plan=None):
        written.extend(into.values())
        return run(feeds, into, plan)

    model._step.run = run_recording
    try:
        first = model.step(cache, first_ids, exact=True)
        kept = first.copy()
        second = model.step(cache, second_ids)
    finally:
        del model._step.run
    assert len(written) == 2 and written[0] is first and written[1] is second
    assert first.shape == (1, 9, model.vocab_size) and second.shape == (1, 1, model.vocab_size)
    np.testing.assert_array_equal(first, kept)
    cache.reset()
    model._step.run = lambda feeds, into=None, plan=None: run(feeds, plan=plan)  # ONNX Runtime allocates the logits
    try:
        np.testing.assert_array_equal(model.step(cache, first_ids, exact=True), kept)
    finally:
        del model._step.run


def test_a_cache_is_bound_once_and_each_step_binds_its_own_feeds():
    """Plan, then run: a cache's buffers are bound to the session on its first step only; every
    step after binds its own feeds and logits, and gives the bits of a binding made afresh."""
    model = _quest()
    cache, fresh = model.new_cache(1, 64), model.new_cache(1, 64)
    prompt = list(range(3, 40))
    planned, original = [], model._step.plan
    model._step.plan = lambda fixed: planned.append(sorted(fixed)) or original(fixed)
    try:
        got = [model.step(cache, np.array([prompt]), exact=True)] + [model.step(cache, np.array([[t]])) for t in (5, 9)]
        assert planned == [sorted(cache.values)]
        want = []
        for ids, exact in ((np.array([prompt]), True), (np.array([[5]]), False), (np.array([[9]]), False)):
            fresh.plans.clear()  # a new binding every step: the old way
            want.append(model.step(fresh, ids, exact=exact))
    finally:
        del model._step.plan
    for step, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")


def test_chunked_prefill_matches_the_dense_baseline_past_one_chunk():
    rng = np.random.default_rng(12)
    prompts = [rng.integers(0, 256, 700).tolist(), rng.integers(0, 256, 530).tolist()]  # > 512: two chunks
    quest = QuestModel(quest_export("qwen3", top_k=64, capacity=1024), threads=1)
    dense = QuestModel(quest_export("qwen3", top_k=64, attention="gqa", capacity=1024), threads=1)
    comparison = compare(quest, dense, prompts, Sampling(max_new_tokens=16), capacity=1024)
    assert comparison.identical, f"{comparison.matching_fraction:.0%} of tokens match"


def test_default_model_agrees_with_its_dense_baseline_over_64_tokens(tmp_path):
    """The embedded default Qwen3 (as `make demo` exports it), inside its `--k 32` budget."""
    folders = {}
    for attention in ("quest", "gqa"):
        folders[attention] = tmp_path / attention
        export_sparse("qwen3", output=folders[attention], settings=SparseSettings.for_budget(32, attention=attention),
                      capacity=1024, log=lambda *a, **k: None)
    quest, dense = QuestModel(folders["quest"]), QuestModel(folders["gqa"])
    assert quest.sidecar.sparse_layers == [2, 3, 4, 5, 6, 7]
    budget = quest.sidecar.settings.top_k * quest.sidecar.settings.block_size
    prompt = np.random.default_rng(13).integers(0, quest.sidecar.vocab_size, budget - 64).tolist()
    comparison = compare(quest, dense, [prompt], Sampling(max_new_tokens=64))
    assert comparison.identical, f"{comparison.matching_fraction:.0%} identical"


def test_prefill_mode_is_checked_and_an_export_without_its_inputs_is_named():
    with pytest.raises(ValueError, match="prefill must be one of 'exact', 'sparse', 'per-token'"):
        Generator(_quest(), prefill="dense")
    model = QuestModel(quest_export("qwen3", top_k=2), threads=1)
    assert model.selects_per_step and model.selects_per_chunk
    with pytest.raises(ValueError, match="attends exactly .* or per chunk"):
        model.step(model.new_cache(1, 64), np.array([[1, 2, 3]]), exact=True, chunked=True)
    del model.sidecar.inputs["exact_lens"]  # as an export from before exact prefill reads
    with pytest.raises(ValueError, match="export it again, or prefill token by token"):
        model.step(model.new_cache(1, 64), np.array([[1, 2, 3]]), exact=True)
    model = QuestModel(quest_export("qwen3", top_k=2), threads=1)
    del model.sidecar.inputs["chunk_lens"]  # as an export from before sparse prefill reads
    with pytest.raises(ValueError, match="exported before sparse prefill .* export it again"):
        Generator(model, prefill="sparse")
    with pytest.raises(ValueError, match="exported before sparse prefill"):
        model.step(model.new_cache(1, 64), np.array([[1, 2, 3]]), chunked=True)
    model = QuestModel(quest_export("qwen3", top_k=2), threads=1)
    rows = [Generator(model, prefill=mode).generate(_prompts(), Sampling(max_new_tokens=4)) for mode in PREFILL_MODES]
    assert all([len(row) for row in tokens] == [4, 4, 4] for tokens in rows)


def _select_variant(folder: pathlib.Path, name: str, **attributes) -> str:
    """A graph next to the export with other SparseBlockSelect attributes (same I/O and weights)."""
    model = onnx.load(str(folder / "model.quest.onnx"), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "SparseBlockSelect":
            kept = [a for a in node.attribute if a.name not in attributes]
            del node.attribute[:]
            node.attribute.extend(kept + [onnx.helper.make_attribute(k, v) for k, v in attributes.items()])
    file = f"model.{name}.onnx"
    onnx.save(model, str(folder / file))
    return file


def test_a_sparse_prefill_whose_chunks_list_every_block_is_the_exact_prefill_bit_for_bit():
    """Chunk queries walk the exact walk's tiles restricted to their chunk's blocks (docs/ops.md): a
    chunk that lists every block gives the exact prefill's bits, and so does one whose chunk_floor (the
    default, 64 blocks) covers a short prompt's 19 blocks whatever its share and window. Without the
    floor a short window and share list fewer, and the logits move (the prefill is sparse), while
    decode steps after it run as usual."""
    folder = quest_export("qwen3", top_k=2)
    prompt = np.random.default_rng(5).integers(0, 256, 300).tolist()  # 19 blocks of 16 at the end
    exact = QuestModel(folder, threads=1)
    every = QuestModel(folder, threads=1, model_file=_select_variant(folder, "chunks-every", chunk_share=1.0))
    short = dict(chunk_share=0.0, chunk_window=1, chunk_sink=1)
    floored = QuestModel(folder, threads=1, model_file=_select_variant(folder, "chunks-floored", **short))
    few = QuestModel(folder, threads=1, model_file=_select_variant(folder, "chunks-few", **short, chunk_floor=0))
    reference, reference_logits = greedy(exact, [prompt], 6, return_logits=True)
    for model, same in ((every, True), (floored, True), (few, False)):
        tokens, logits = greedy(model, [prompt], 6, return_logits=True, prefill_mode="sparse")
        assert np.array_equal(logits[0], reference_logits[0]) == same
        if same:
            assert tokens == reference and all(np.array_equal(a, b) for a, b in zip(logits, reference_logits))
        else:
            assert len(tokens[0]) == 6 and np.isfinite(logits[-1]).all()


def test_a_prefill_reports_its_progress_after_each_step():
    """Generator's on_prefill(done, total): after each prefill step, the positions fed over every row
    (rows take their steps in turns; a sparse prefill's last 64 tokens are a step of their own:
    exact); a callback that is not callable is refused before anything runs."""
    model = _quest()
    prompts = [list(range(1, 200)), list(range(3, 40))]
    seen = []
    generator = Generator(model, prefill="sparse")
    with pytest.raises(ValueError, match="on_prefill must be callable"):
        generator.generate(prompts, Sampling(max_new_tokens=2), on_prefill=42)
    prefill(model, model.new_cache(2, 256), prompts, chunk=64, mode="sparse",
            on_prefill=lambda done, total: seen.append((done, total)))
    # row 0: 64 + 64 + 7 sparse, 64 exact; row 1 (37 tokens, all in its exact tail): 37
    assert seen == [(64, 236), (101, 236), (165, 236), (172, 236), (236, 236)]
    steps = []
    tokens = generator.generate(prompts, Sampling(max_new_tokens=2), on_prefill=lambda d, t: steps.append((d, t)))
    assert steps == [(135, 236), (172, 236), (236, 236)] and [len(row) for row in tokens] == [2, 2]


def test_a_sparse_prefill_of_rows_of_different_lengths_is_each_rows_own():
    """Each row of a sparse prefill is prefilled on its own (its chunks, then its last 64 tokens
    exactly): each row's logits are its own prefill's alone, bit for bit, even in a cache just long
    enough for the longest prompt."""
    model = QuestModel(quest_export("qwen3", top_k=2), threads=1)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 256, n).tolist() for n in (300, 290, 40)]
    together = prefill(model, model.new_cache(3, 300), prompts, chunk=128, mode="sparse")
    for row, prompt in enumerate(prompts):
        alone = prefill(model, model.new_cache(1, 300), [prompt], chunk=128, mode="sparse")
        assert np.array_equal(together[row], alone[0]), row
