"""The runtime: generation (greedy, seeded sampling, stop tokens, streaming, batches), cache reuse,
capacity errors, and the dense GroupQueryAttention baseline of the same model."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from quest_ort.apps.pipeline import export_sparse
from quest_ort.export.rewrite import SparseSettings
from quest_ort.runtime.compare import compare
from quest_ort.runtime.generate import Generator, Sampling, greedy
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

        def run_then_fail(feeds, into=None):
            original(feeds, into)
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

    def run_recording(feeds, into=None):
        written.extend(into.values())
        return run(feeds, into)

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
    model._step.run = lambda feeds, into=None: run(feeds)  # ONNX Runtime allocates the logits
    try:
        np.testing.assert_array_equal(model.step(cache, first_ids, exact=True), kept)
    finally:
        del model._step.run


def test_chunked_prefill_matches_the_dense_baseline_past_one_chunk():
    rng = np.random.default_rng(12)
    prompts = [rng.integers(0, 256, 700).tolist(), rng.integers(0, 256, 530).tolist()]  # > 512: two chunks
    comparison = compare(_quest(), _gqa(), prompts, Sampling(max_new_tokens=16), capacity=1024)
    assert comparison.identical, f"{comparison.matching_fraction:.0%} of tokens match"


def test_default_model_agrees_with_its_dense_baseline_over_64_tokens(tmp_path):
    """The embedded default Qwen3 (as `make demo` exports it), inside its K=32 x P budget."""
    folders = {}
    for attention in ("quest", "gqa"):
        folders[attention] = tmp_path / attention
        export_sparse("qwen3", output=folders[attention], settings=SparseSettings(top_k=32, attention=attention),
                      capacity=1024, log=lambda *a, **k: None)
    quest, dense = QuestModel(folders["quest"]), QuestModel(folders["gqa"])
    assert quest.sidecar.sparse_layers == [2, 3, 4, 5, 6, 7]
    budget = quest.sidecar.settings.top_k * quest.sidecar.settings.block_size
    prompt = np.random.default_rng(13).integers(0, quest.sidecar.vocab_size, budget - 64).tolist()
    comparison = compare(quest, dense, [prompt], Sampling(max_new_tokens=64))
    assert comparison.identical, f"{comparison.matching_fraction:.0%} identical"


def test_prefill_mode_is_checked_and_an_export_without_exact_lens_is_named():
    with pytest.raises(ValueError, match="prefill must be one of"):
        Generator(_quest(), prefill="dense")
    model = QuestModel(quest_export("qwen3", top_k=2), threads=1)
    assert model.selects_per_step
    del model.sidecar.inputs["exact_lens"]  # as an export from before exact prefill reads
    with pytest.raises(ValueError, match="export it again, or prefill sparsely"):
        model.step(model.new_cache(1, 64), np.array([[1, 2, 3]]), exact=True)
    model = QuestModel(quest_export("qwen3", top_k=2), threads=1)
    exact, sparse = (Generator(model, prefill=mode).generate(_prompts(), Sampling(max_new_tokens=4))
                     for mode in ("exact", "sparse"))
    assert [len(row) for row in exact] == [len(row) for row in sparse] == [4, 4, 4]
