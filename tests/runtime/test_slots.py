"""Slots (runtime/slots.py) through TextGenerator(slots=N): replies generated at once over one cache of N
rows, each what it would be alone, whatever ran in the other rows or before."""

from __future__ import annotations

import functools
import gc

import numpy as np
import pytest

from quest_ort.runtime.chat import TextGenerator
from quest_ort.runtime.generate import GeneratorBusyError
from quest_ort.runtime.model import QuestModel
from quest_ort.runtime.slots import SlotFileError, token_logprobs
from quest_ort.export.default_tokenizer import END_OF_TURN_ID
from support.export_models import TEXT_VOCAB, text_export


@functools.cache
def _model() -> QuestModel:
    """Layer 1 sparse: a row's later layers depend on how its attention read its context."""
    return QuestModel(text_export(dense_layers=(0,)), threads=1)


def _prompts(*lengths: int, seed: int = 4) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(END_OF_TURN_ID + 1, TEXT_VOCAB, n).tolist() for n in lengths]  # no end-of-turn id


def _alone(prompt: list[int], tokens: int = 16, **options) -> tuple[list[int], list[float]]:
    stream = TextGenerator(_model(), **options).complete(prompt, max_new_tokens=tokens, logprobs=0)
    stream.read()
    return stream.tokens, [entry.logprob for entry in stream.logprobs]


def _read_in_turns(streams) -> None:
    """Each stream's next delta in turn, until all end (every round advances every slot)."""
    open_streams = list(streams)
    while open_streams:
        for stream in list(open_streams):
            if next(stream, None) is None:
                open_streams.remove(stream)


def test_a_step_on_a_row_view_is_a_batch_one_step_and_leaves_the_other_rows_alone():
    model = _model()
    prompt = np.array([_prompts(37)[0]])
    cache = model.new_cache(3)
    before = {name: array.copy() for name, array in cache.buffers.items()}
    logits = model.step(cache.row(1), prompt, exact=True)
    alone = model.new_cache(1)
    np.testing.assert_array_equal(logits, model.step(alone, prompt, exact=True))
    assert cache.lengths.tolist() == [0, 37, 0]
    for name, array in cache.buffers.items():
        np.testing.assert_array_equal(array[1:2], alone.buffers[name], err_msg=name)
        np.testing.assert_array_equal(array[[0, 2]], before[name][[0, 2]], err_msg=name)


@pytest.mark.parametrize("prefill", ["exact", "sparse"])
def test_replies_generated_at_once_are_each_the_reply_alone_bit_for_bit(prefill):
    prompts = _prompts(150, 40, 90)
    generator = TextGenerator(_model(), slots=3, prefill=prefill)
    streams = [generator.complete(prompt, max_new_tokens=16, logprobs=0) for prompt in prompts]
    _read_in_turns(streams)
    for stream, prompt in zip(streams, prompts):
        assert (stream.tokens, [e.logprob for e in stream.logprobs]) == _alone(prompt, prefill=prefill)
        assert stream.finish_reason == "length"


def test_a_request_goes_to_the_slot_holding_its_prefix_and_gets_its_reply_alone_whatever_ran():
    first, other, third = _prompts(120, 70, 60, seed=5)
    generator = TextGenerator(_model(), slots=2)
    for prompt in (other, first):  # `third` then takes the slot used least recently: other's
        generator.complete(prompt, max_new_tokens=8).read()
    block = _model().block_size  # the truncation unit: a superblock
    again = first + [7, 8, 9]
    # while another request runs in the other slot
    busy = generator.complete(third, max_new_tokens=30)
    next(busy)
    stream = generator.complete(again, max_new_tokens=16, logprobs=0)
    _read_in_turns([stream, busy])
    assert stream.usage.reused_tokens == len(first) // block * block  # the slot that held `first`
    assert (stream.tokens, [e.logprob for e in stream.logprobs]) == _alone(again)


def test_a_request_past_the_slots_is_refused_and_a_cancelled_stream_frees_its_slot():
    generator = TextGenerator(_model(), slots=2)
    a, b, c = _prompts(30, 31, 32)
    first, second = generator.complete(a, max_new_tokens=40), generator.complete(b, max_new_tokens=12)
    with pytest.raises(GeneratorBusyError, match="every slot"):
        generator.complete(c, max_new_tokens=4)
    with pytest.raises(GeneratorBusyError, match="reset"):
        generator.reset()
    next(first)
    first.cancel()
    second.read()  # the rounds go on without the cancelled reply
    assert first.read() is not None and first.finish_reason == "cancelled"
    assert second.tokens == _alone(b, 12)[0]
    third = generator.complete(c, max_new_tokens=4)
    assert third.read() is not None and third.tokens == _alone(c, 4)[0]


def test_an_idle_row_at_the_capacity_leaves_room_for_the_others_steps():
    """A prompt of the whole capacity and no new token fills its row; a decode step places a masked
    position in every row of its span, so that row gives back its last block when it lies between
    two decoding slots (a step over rows outside the span leaves them alone)."""
    generator = TextGenerator(_model(), slots=3)
    short, full, left, right = _prompts(20, 256, 50, 60)
    generator.complete(short, max_new_tokens=1).read()  # slot 0
    generator.complete(full, max_new_tokens=0).read()  # slot 1, at the capacity
    assert generator.cache.lengths.tolist() == [20, 256, 0]
    streams = [generator.complete(prompt, max_new_tokens=12) for prompt in (left, right)]  # slots 2 and 0
    _read_in_turns(streams)
    assert [s.tokens for s in streams] == [_alone(left, 12)[0], _alone(right, 12)[0]]
    block = _model().block_size  # the truncation unit: a superblock
    assert generator.cache.lengths[1] == 255 // block * block


def test_a_saved_slot_restored_gives_the_same_logits_bit_for_bit(tmp_path):
    prompt, follow = _prompts(100, 20, seed=9)
    saver = TextGenerator(_model(), slots=2)
    saver.complete(prompt, max_new_tokens=8).read()
    path = tmp_path / "slot.npz"
    assert saver.save_slot(0, path) == len(saver.cached)
    restored = TextGenerator(_model(), slots=2)
    assert restored.restore_slot(1, path) == len(saver.cached)
    request = prompt + follow
    stream = restored.complete(request, max_new_tokens=12, logprobs=0)
    stream.read()
    block = _model().block_size  # the truncation unit: a superblock
    assert stream.usage.reused_tokens == len(prompt) // block * block  # the restored slot's prefix
    expected = saver.complete(request, max_new_tokens=12, logprobs=0)
    expected.read()
    assert stream.tokens == expected.tokens
    assert [e.logprob for e in stream.logprobs] == [e.logprob for e in expected.logprobs]


def test_a_foreign_or_truncated_slot_file_is_refused_by_name_and_the_slot_is_untouched(tmp_path):
    generator = TextGenerator(_model())
    generator.complete(_prompts(60)[0], max_new_tokens=4).read()
    path = tmp_path / "mine.npz"
    generator.save_slot(0, path)
    truncated = tmp_path / "cut.npz"
    truncated.write_bytes(path.read_bytes()[:1000])
    other = TextGenerator(QuestModel(text_export(), threads=1))  # another export of the same checkpoint
    held = list(other.cached)
    with pytest.raises(SlotFileError, match="mine.npz was saved from another model folder"):
        other.restore_slot(0, path)
    with pytest.raises(SlotFileError, match="cut.npz is not a readable slot file"):
        generator.restore_slot(0, truncated)
    with pytest.raises(SlotFileError, match="mine.npz was saved by a 'exact' prefill; this one is 'sparse'"):
        TextGenerator(_model(), prefill="sparse").restore_slot(0, path)
    assert other.cached == held
    stream = generator.complete(_prompts(30)[0], max_new_tokens=40)
    next(stream)
    with pytest.raises(GeneratorBusyError, match="slot 0 runs a stream"):
        generator.save_slot(0, tmp_path / "busy.npz")
    stream.close()


def test_a_dropped_stream_frees_its_slot_without_taking_a_lock():
    """Closing (or collecting) a stream marks its reply; the next request's sweep frees the slot. A
    stream collected inside a round, on the thread that holds the slots' lock, must not wait for it."""
    generator = TextGenerator(_model())
    stream = generator.complete(_prompts(40)[0], max_new_tokens=40)
    next(stream)
    with generator.slots.lock:  # as inside a round
        del stream
        gc.collect()
    other = _prompts(30, seed=8)[0]
    follow = generator.complete(other, max_new_tokens=6)
    assert follow.read() is not None and follow.tokens == _alone(other, 6)[0]


@pytest.mark.parametrize("top", [0, 1, 5, 20])
def test_token_logprobs_are_the_log_softmax_and_its_top_by_a_full_sort(top):
    rng = np.random.default_rng(top)
    for logits in (rng.standard_normal(300).astype(np.float32), np.round(rng.standard_normal(300), 1),
                   np.repeat(np.float32(2.0), 30)):  # ties: the smaller id first, as a stable sort orders them
        expected = logits.astype(np.float64) - logits.max()
        expected -= np.log(np.exp(expected).sum())
        order = np.argsort(-expected, kind="stable")[:top]
        entry = token_logprobs(logits, 7, top)
        assert entry.logprob == expected[7]
        assert entry.top == tuple((int(t), float(expected[t])) for t in order)
