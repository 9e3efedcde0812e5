"""One cache, one stream (a second request while a stream is open is refused; an abandoned stream frees
the cache), and every public runtime entry point refusing bad arguments before any cache is touched."""

from __future__ import annotations

import functools
import gc
import math

import numpy as np
import pytest

from quest_ort.runtime.generate import Generator, Sampling, greedy, prefill
from quest_ort.runtime.sampling import TokenHistory, choose
from quest_ort.runtime.model import CapacityError, QuestModel
from support.export_models import quest_export, tiny_model
from support.tolerances import assert_close

STEPS = Sampling(max_new_tokens=6)


@functools.cache
def _model():
    return QuestModel(quest_export("qwen3", top_k=2, importance_fraction=0.5), threads=1)


def _prompts(seed=21, lengths=(37, 20)):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, n).tolist() for n in lengths]


@functools.cache
def _expected(which: str) -> list[list[int]]:
    return Generator(_model()).generate(_prompts(22 if which == "B" else 21), STEPS)


def _steps(tokens: list[list[int]]) -> list[list[int]]:
    return [list(step) for step in zip(*tokens)]


def _snapshot(generator):
    return generator.cache.lengths.copy(), {name: array.copy() for name, array in generator.cache.buffers.items()}


def _assert_unchanged(generator, snapshot):
    lengths, buffers = snapshot
    np.testing.assert_array_equal(generator.cache.lengths, lengths)
    for name, array in generator.cache.buffers.items():
        np.testing.assert_array_equal(array, buffers[name], err_msg=f"{name} changed by a refused call")


# --- one cache, one stream ------------------------------------------------------------------------

@pytest.mark.parametrize("second", ["stream", "generate"])
def test_a_second_request_while_a_stream_is_open_is_refused_and_the_stream_continues(second):
    generator = Generator(_model())
    first = generator.stream(_prompts(), STEPS)
    got = [next(first)]
    with pytest.raises(RuntimeError, match="a stream of this Generator is open"):
        if second == "stream":
            next(generator.stream(_prompts(22), STEPS))
        else:
            generator.generate(_prompts(22), STEPS)
    got += list(first)
    assert got == _steps(_expected("A"))
    assert generator.generate(_prompts(22), STEPS) == _expected("B")  # the finished stream freed the cache


def test_two_generators_over_one_model_stream_side_by_side():
    """The way to run two requests at once: a Generator each (one session, a cache each)."""
    model = _model()
    a, b = Generator(model).stream(_prompts(), STEPS), Generator(model).stream(_prompts(22), STEPS)
    steps = [(next(a), next(b)) for _ in range(STEPS.max_new_tokens)]
    assert [x for x, _ in steps] == _steps(_expected("A"))
    assert [y for _, y in steps] == _steps(_expected("B"))


class _FailingModel:
    """The model, except that its fourth step fails (as a step failing inside ONNX Runtime would)."""

    def __init__(self, model):
        self.model, self.calls = model, 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def step(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 4:
            raise RuntimeError("injected failure")
        return self.model.step(*args, **kwargs)


def _abandon(generator, how: str) -> None:
    if how == "failed":
        with pytest.raises(RuntimeError, match="injected"):
            list(generator.stream(_prompts(), STEPS))
        return
    stream = generator.stream(_prompts(), STEPS)
    if how == "never started":
        del stream
        return
    next(stream)
    if how == "closed":
        stream.close()
        with pytest.raises(StopIteration):
            next(stream)
    elif how == "context manager":
        with stream:
            next(stream)
    elif how == "garbage collected":
        del stream
    elif how == "in a reference cycle":
        cycle = [stream]
        cycle.append(cycle)
        del stream, cycle
        gc.collect()
    elif how == "exhausted":
        list(stream)


@pytest.mark.parametrize("how", ["closed", "context manager", "garbage collected", "in a reference cycle",
                                 "never started", "exhausted", "failed"])
def test_an_abandoned_stream_frees_the_cache(how):
    generator = Generator(_FailingModel(_model()) if how == "failed" else _model())
    _abandon(generator, how)
    if how == "failed":
        generator.model.calls = -100
    assert generator.generate(_prompts(22), STEPS) == _expected("B")


# --- bad arguments, refused before anything is written ----------------------------------------------

@functools.cache
def _warm_generator():
    return Generator(_model())


@pytest.fixture
def warm():
    """A generator that has answered a request: its cache holds that request's rows."""
    generator = _warm_generator()
    assert generator.generate(_prompts(), STEPS) == _expected("A")
    snapshot = _snapshot(generator)
    yield generator, snapshot
    _assert_unchanged(generator, snapshot)
    assert generator.generate(_prompts(), STEPS) == _expected("A")  # still works, as before


BAD_PROMPTS = [
    ("a float token id", [[1, 2, 3.9]], "prompts[0]"),
    ("float token ids as an array", np.array([[1.0, 2.0]]), "prompts[0]"),
    ("a string prompt", ["hello"], "prompts[0]"),
    ("a string for the prompts", "hello", "prompts"),
    ("bytes", [b"\x01\x02"], "prompts[0]"),
    ("no prompt", [], "prompts"),
    ("an empty prompt", [[1, 2], []], "prompts[1]"),
    ("a flat list of ids", [1, 2, 3], "prompts[0]"),
    ("a token id past the vocabulary", [[1, 256]], "prompts[0]"),
    ("a negative token id", [[5, -1]], "prompts[0]"),
    ("booleans", [[True, False]], "prompts[0]"),
    ("nested too deep", [[[1, 2]]], "prompts[0]"),
    ("None", None, "prompts"),
]


@pytest.mark.parametrize("call", ["generate", "stream"])
@pytest.mark.parametrize("label, prompts, name", BAD_PROMPTS, ids=[case[0] for case in BAD_PROMPTS])
def test_bad_prompts_are_refused_before_the_cache_is_touched(warm, call, label, prompts, name):
    generator, _ = warm
    with pytest.raises(ValueError) as info:
        if call == "generate":
            generator.generate(prompts, STEPS)
        else:
            next(generator.stream(prompts, STEPS))
    assert str(info.value).startswith(name), str(info.value)


@pytest.mark.parametrize("sampling, name", [
    (lambda: {"max_new_tokens": 4}, "sampling"),
    (lambda: Sampling(max_new_tokens=4, stop_tokens=(300,)), "stop_tokens"),
    (lambda: Sampling(max_new_tokens=4, stop_tokens=(-2,)), "stop_tokens"),
], ids=["a dict", "a stop token past the vocabulary", "a negative stop token"])
def test_bad_sampling_is_refused_before_the_cache_is_touched(warm, sampling, name):
    generator, _ = warm
    with pytest.raises(ValueError, match=name):
        generator.generate(_prompts(), sampling())


BAD_SAMPLING = [
    ("temperature", math.nan), ("temperature", math.inf), ("temperature", -0.5), ("temperature", "0.5"),
    ("temperature", None), ("top_p", math.nan), ("top_p", 0.0), ("top_p", 1.5), ("top_k", 2.5), ("top_k", -1),
    ("top_k", "3"), ("max_new_tokens", 2.5), ("max_new_tokens", -1), ("max_new_tokens", True), ("seed", -1),
    ("seed", 1.5), ("stop_tokens", (1.5,)), ("stop_tokens", ("a",)), ("stop_tokens", 3), ("stop_tokens", "ab"),
    ("temperature", 5e-324), ("temperature", 1e6), ("min_p", -0.1), ("min_p", 1.5), ("min_p", math.nan),
    ("presence_penalty", 2.5), ("presence_penalty", math.inf), ("frequency_penalty", -3.0),
    ("repetition_penalty", 0.0), ("repetition_penalty", 11.0), ("repetition_penalty", "1.1"),
]


@pytest.mark.parametrize("field, value", BAD_SAMPLING, ids=[f"{f}={v!r}" for f, v in BAD_SAMPLING])
def test_sampling_parameters_are_checked_when_made(field, value):
    with pytest.raises(ValueError, match=field):
        Sampling(**{field: value})


def test_good_sampling_parameters_are_normalised():
    sampling = Sampling(max_new_tokens=np.int64(3), temperature=1, top_k=np.int32(2), stop_tokens=[np.int64(7), 9])
    assert sampling.stop_tokens == (7, 9) and isinstance(sampling.temperature, float)
    assert hash(sampling) == hash(Sampling(3, 1.0, 2, stop_tokens=(7, 9)))


def _one_row_logits(values) -> np.ndarray:
    return np.array([values], np.float32)


def test_penalties_change_the_logits_as_vllm_and_openai_define_them():
    history = TokenHistory([[0, 1]], 5)  # the prompt holds tokens 0 and 1
    history.add([2])
    history.add([2])  # the reply so far: token 2 twice
    logits = _one_row_logits([2.0, -2.0, 1.0, 1.0, 0.5])
    repeated = history.penalise(logits, Sampling(repetition_penalty=2.0))
    np.testing.assert_array_equal(repeated, [[1.0, -4.0, 0.5, 1.0, 0.5]])  # prompt and reply tokens
    counted = history.penalise(logits, Sampling(frequency_penalty=0.5, presence_penalty=0.25))
    np.testing.assert_array_equal(counted, [[2.0, -2.0, 1.0 - 2 * 0.5 - 0.25, 1.0, 0.5]])  # reply tokens only
    # greedy picks the argmax after the penalties
    assert choose(logits, Sampling(repetition_penalty=4.0), None, history)[0] == 3
    with pytest.raises(ValueError, match="TokenHistory"):
        choose(logits, Sampling(presence_penalty=1.0), None)


@pytest.mark.parametrize("sampling, allowed", [
    (Sampling(temperature=1.0, top_k=1), {0}),
    (Sampling(temperature=1.0, top_k=2), {0, 1}),
    (Sampling(temperature=1.0, min_p=0.5), {0, 1}),  # token 2 is e^-3 as likely as token 0
    (Sampling(temperature=1.0, min_p=0.9), {0}),  # token 1 is e^-0.5 ~ 0.61 as likely
    (Sampling(temperature=1.0), {0, 1, 2}),
])
def test_the_cuts_leave_only_the_tokens_their_definition_keeps(sampling, allowed):
    logits = np.repeat(_one_row_logits([3.0, 2.5, 0.0]), 4000, axis=0)
    drawn = set(choose(logits, sampling, np.random.default_rng(0)).tolist())
    assert drawn == allowed


def test_a_tiny_temperature_picks_the_argmax_without_overflowing():
    logits = np.repeat(_one_row_logits([1e30, -1e30, 0.0]), 50, axis=0)
    assert set(choose(logits, Sampling(temperature=1e-300), np.random.default_rng(0)).tolist()) == {0}


@pytest.mark.parametrize("kwargs, name", [
    (dict(capacity=2.5), "capacity"), (dict(capacity=-64), "capacity"), (dict(capacity="64"), "capacity"),
    (dict(prefill="dense"), "prefill"), (dict(capacity=10 ** 6), "capacity 1000000 is past"),
])
def test_generator_arguments_are_checked_when_made(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Generator(_model(), **kwargs)


# QuestModel.step on a cache holding a prompt: (label, arguments, name in the error)
BAD_STEPS = [
    ("a float token id", dict(input_ids=np.array([[3.9]])), "input_ids"),
    ("float ids as a list", dict(input_ids=[[3.0]]), "input_ids"),
    ("no position (S = 0)", dict(input_ids=np.zeros((1, 0), np.int64)), "input_ids"),
    ("strings", dict(input_ids=np.array([["a"]])), "input_ids"),
    ("a string", dict(input_ids="7"), "input_ids"),
    ("booleans", dict(input_ids=np.array([[True]])), "input_ids"),
    ("ragged rows", dict(input_ids=[[1, 2], [3]]), "input_ids"),
    ("one dim", dict(input_ids=np.array([7])), "input_ids"),
    ("past the vocabulary", dict(input_ids=np.array([[256]])), "input_ids"),
    ("unsigned past int64", dict(input_ids=np.array([[2**64 - 1]], np.uint64)), "input_ids"),
    ("a float count of valid tokens", dict(input_ids=np.array([[7, 8]]), valid=np.array([1.5])), "valid"),
    ("more valid tokens than positions", dict(input_ids=np.array([[7]]), valid=np.array([2])), "valid"),
    ("exact not a bool", dict(input_ids=np.array([[7]]), exact="no"), "exact"),
]


@pytest.mark.parametrize("label, arguments, name", BAD_STEPS, ids=[case[0] for case in BAD_STEPS])
def test_bad_step_arguments_are_refused_before_anything_runs(label, arguments, name):
    model = _model()
    prompt = np.array([_prompts()[0]])
    clean, cache = model.new_cache(1, 64), model.new_cache(1, 64)
    model.step(clean, prompt, exact=True)
    model.step(cache, prompt, exact=True)
    with pytest.raises(ValueError, match=name):
        model.step(cache, **arguments)
    assert cache.lengths.tolist() == [len(prompt[0])]
    for name_, array in cache.buffers.items():
        np.testing.assert_array_equal(array, clean.buffers[name_], err_msg=f"{name_} changed by a refused step")
    for token in (3, 1, 4):
        np.testing.assert_array_equal(model.step(cache, np.array([[token]])), model.step(clean, np.array([[token]])))


def test_a_cache_of_another_model_is_refused():
    other = QuestModel(quest_export("qwen3", top_k=4, attention="gqa"), threads=1)
    with pytest.raises(ValueError, match="cache"):
        _model().step(other.new_cache(1, 64), np.array([[1, 2]]))


@pytest.mark.parametrize("batch, capacity, name", [(0, 64, "batch"), (1.5, 64, "batch"), (1, -1, "capacity"),
                                                   (1, 8.5, "capacity"), ("2", 64, "batch")])
def test_new_cache_arguments_are_checked(batch, capacity, name):
    with pytest.raises(ValueError, match=name):
        _model().new_cache(batch, capacity)


def test_the_module_level_helpers_check_their_prompts():
    model = _model()
    cache = model.new_cache(1, 64)
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        prefill(model, cache, [[1.5, 2]])
    assert cache.lengths.tolist() == [0]
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        greedy(model, ["abc"], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy(model, [[1, 2]], -1)


def test_the_dense_reference_runner_checks_its_token_ids():
    from quest_ort.runtime.dense import OptimumModel

    model = OptimumModel(tiny_model("qwen3").optimum, threads=1)
    cache = model.new_cache(1)
    with pytest.raises(ValueError, match="input_ids"):
        model.step(cache, np.array([[3.9]]))
    with pytest.raises(ValueError, match="input_ids"):
        model.step(cache, np.array([[256]]))
    assert cache.lengths.tolist() == [0]
    assert Generator(model).generate([[1, 2, 3]], Sampling(max_new_tokens=2)) == greedy(model, [[1, 2, 3]], 2)


def test_the_dense_reference_runner_runs_rows_of_different_lengths_as_each_alone():
    """Its caches hold each row's tokens from position 0 (rows of a batch of different lengths, row
    views, truncate), so it runs in Generator's slots as QuestModel does."""
    from quest_ort.runtime.dense import OptimumModel

    model = OptimumModel(tiny_model("qwen3").optimum, threads=1)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 256, n).tolist() for n in (23, 9, 16)]
    tokens, logits = greedy(model, prompts, 4, return_logits=True)
    for row, prompt in enumerate(prompts):
        alone, alone_logits = greedy(model, [prompt], 4, return_logits=True)
        assert alone[0] == tokens[row]
        for step in range(4):
            assert_close(logits[step][row], alone_logits[step][0], np.float32, f"row {row} step {step}")
    growing = model.new_cache(1)  # no capacity: the buffers grow, and there are no row views
    model.step(growing, np.array([prompts[0]]))
    assert model.truncate(growing, 10) == 10
    again = model.step(growing, np.array([prompts[0][10:]]))[0, -1]
    assert_close(again, model.step(model.new_cache(1, 23), np.array([prompts[0]]))[0, -1], np.float32, "truncated")
    with pytest.raises(ValueError, match="row views"):
        growing.row(0)
    with pytest.raises(CapacityError):
        model.step(model.new_cache(1, 8), np.array([prompts[1]]))
