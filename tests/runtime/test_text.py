"""The text API: the folder's tokenizer and chat template, streamed text deltas, stop strings, the
cache kept across turns (QuestModel.truncate), Chat and generate_text."""

from __future__ import annotations

import functools
import json
import random

import numpy as np
import pytest

from quest_ort.export.default_tokenizer import CHAT_TEMPLATE, END_OF_TURN_ID, SMALLEST_VOCAB, build_tokenizer
from quest_ort.runtime.chat import Chat, TextGenerator, generate_text
from quest_ort.runtime.generate import Generator, GeneratorBusyError, Sampling
from quest_ort.runtime.model import CapacityError, QuestModel
from quest_ort.runtime.text import FolderTokenizer, StopText, TextDeltas, TokenizerMissingError
from support.export_models import TEXT_VOCAB, quest_export, text_export

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo, 世界! ✓"},
                {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "More?"}]


@functools.cache
def _model() -> QuestModel:
    return QuestModel(text_export(), threads=1)


def _tokenizer() -> FolderTokenizer:
    return FolderTokenizer.from_folder(text_export())


@pytest.mark.parametrize("vocab", [SMALLEST_VOCAB, TEXT_VOCAB, 8192, 151936])  # 151936: Qwen3's
def test_the_default_tokenizer_has_exactly_the_models_vocabulary_and_round_trips_any_text(vocab):
    tokenizer = build_tokenizer(vocab)
    assert tokenizer.get_vocab_size() == vocab
    text = "Hello, world!\n\tünïcode 日本語 🙂 <|im_start|>x<|im_end|>"
    ids = tokenizer.encode(text).ids
    assert max(ids) < vocab and tokenizer.decode(ids, skip_special_tokens=False) == text
    assert tokenizer.token_to_id("<|im_end|>") == END_OF_TURN_ID


def test_the_default_exports_tokenizer_is_in_the_folder_and_its_end_of_turn_stops_replies():
    model = _model()
    assert model.sidecar.tokenizer == "tokenizer" and model.sidecar.eos_token_ids == [END_OF_TURN_ID]
    assert _tokenizer().chat_template == CHAT_TEMPLATE


def test_a_folder_without_a_tokenizer_is_named():
    with pytest.raises(TokenizerMissingError, match="no tokenizer"):
        FolderTokenizer.from_folder(quest_export("qwen3", top_k=4))  # vocabulary 256: no room for one


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_ids_are_those_of_transformers_apply_chat_template(add_generation_prompt):
    transformers = pytest.importorskip("transformers")  # the exporter's stack: installed by make
    ours = _tokenizer()
    theirs = transformers.AutoTokenizer.from_pretrained(ours.folder)
    assert ours.encode_chat(CONVERSATION, add_generation_prompt=add_generation_prompt) == theirs.apply_chat_template(
        CONVERSATION, add_generation_prompt=add_generation_prompt)
    assert ours.encode("plain text") == theirs("plain text").input_ids


def test_a_template_sees_transformers_helpers_and_its_errors_are_raised(tmp_path):
    tokenizer = _tokenizer()
    tokenizer.chat_template = ("{{ messages | tojson }}{% if messages[0]['role'] != 'user' %}"
                               "{{ raise_exception('user first') }}{% endif %}")
    tokenizer._template = None
    assert json.loads(tokenizer.render_chat([{"role": "user", "content": "é"}])) == [{"role": "user", "content": "é"}]
    with pytest.raises(Exception, match="user first"):
        tokenizer.render_chat([{"role": "system", "content": "x"}])
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        tokenizer.render_chat([{"role": "user", "content": 3}])


@pytest.mark.parametrize("seed", range(4))
def test_streamed_deltas_join_to_the_decoded_text_and_never_split_a_character(seed):
    tokenizer = _tokenizer()
    rng = random.Random(seed)
    # Multi-byte characters are several byte tokens here: their deltas must wait for the last byte.
    text = "".join(rng.choice(["a", " b", "é", "世", "🙂", "\n", "<|im_end|>", "ok"]) for _ in range(60))
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = TextDeltas(tokenizer)
    pieces = [deltas.add(token) for token in ids]
    pieces.append(deltas.finish())
    assert "".join(pieces) == tokenizer.decode(ids) == text.replace("<|im_end|>", "")
    assert not any("\ufffd" in piece for piece in pieces)


def test_a_long_near_miss_is_held_back_only_as_far_as_it_can_still_match():
    stop = StopText(["a" * 255 + "b"] * 4)  # a naive matcher's worst case: every position a near miss
    out = "".join(stop.add("a") for _ in range(2000))
    assert out == "a" * (2000 - 255) and not stop.stopped
    assert stop.add("b") == "" and stop.stopped


def test_a_reply_cut_inside_a_character_ends_with_the_replacement_character():
    tokenizer = _tokenizer()
    ids = tokenizer.encode("a世", add_special_tokens=False)[:-1]  # the last byte of 世 missing
    deltas = TextDeltas(tokenizer)
    assert "".join(deltas.add(token) for token in ids) == "a"
    assert deltas.finish() == "\ufffd"


@pytest.mark.parametrize("pieces, stops, given", [
    (["Hel", "lo ST", "OP more"], ["STOP"], "Hello "),
    (["ab", "c"], ["cd"], "abc"),                     # a held-back prefix that never completes is given out
    (["x<", "|e", "nd|>", "y"], ["<|end|>", "zz"], "x"),
    (["no stops"], [], "no stops"),
    (["aab", "aac"], ["aaab", "aac"], "aab"),         # a partial match that fails falls back, not to zero
    (["xab", "c"], ["abc", "b"], "xa"),               # the first stop string to end cuts the text
])
def test_stop_strings_cut_the_text_before_them_and_hold_back_what_may_become_one(pieces, stops, given):
    stop = StopText(stops)
    out = "".join(stop.add(piece) for piece in pieces) + stop.finish()
    assert out == given and stop.stopped == any(s in "".join(pieces) for s in stops)


def test_truncate_keeps_whole_blocks_and_then_equals_a_cache_that_never_held_the_rest():
    model = _model()
    block = model.block_size  # the truncation unit: a superblock
    rng = np.random.default_rng(3)
    head, tail, other = (rng.integers(0, TEXT_VOCAB, n)[None] for n in (2 * block, block, block))
    cut = model.new_cache(1)
    model.step(cut, head, exact=True)
    model.step(cut, tail)
    assert model.truncate(cut, 2 * block + 3) == 2 * block  # inside the third block: back to its start
    assert model.truncate(cut, 5 * block) == 2 * block      # nothing past it: unchanged
    fresh = model.new_cache(1)
    model.step(fresh, head, exact=True)
    logits_cut, logits_fresh = model.step(cut, other), model.step(fresh, other)
    np.testing.assert_array_equal(logits_cut, logits_fresh)
    for name, array in fresh.buffers.items():  # 3 superblocks: their tokens, blocks and superblocks
        held = 3 * block // model.sidecar.settings.block_size if "block" in name else 3 if "super" in name else 3 * block
        np.testing.assert_array_equal(cut.buffers[name][:, :, :held], array[:, :, :held], err_msg=name)


def test_a_request_reuses_the_cached_prefix_and_generates_what_a_fresh_generator_does():
    model = _model()
    tokenizer = _tokenizer()
    prompt = tokenizer.encode_chat(CONVERSATION[:2])
    expected = Generator(model).generate([prompt], Sampling(max_new_tokens=12))[0]
    generator = TextGenerator(model)
    first = generator.complete(prompt, max_new_tokens=12, stop_tokens=(TEXT_VOCAB - 1,))
    assert first.read() == tokenizer.decode(first.tokens) and first.tokens == expected[: len(first.tokens)]
    assert first.finish_reason in ("length", "stop") and first.usage.reused_tokens == 0
    # The cache holds the prompt and every generated token but the last; a longer prompt reuses the
    # prompt's whole blocks only: sparse decode steps computed the reply's keys and values, which a
    # fresh prefill of the longer prompt computes exactly.
    assert generator.cached == prompt + first.tokens[:-1]
    block = model.block_size  # the truncation unit: a superblock
    longer = prompt + first.tokens + tokenizer.encode("more")
    second = generator.complete(longer, max_new_tokens=4)
    second.read()
    assert second.usage.reused_tokens == len(prompt) // block * block
    assert second.tokens == Generator(model).generate([longer], Sampling(max_new_tokens=4))[0]
    # A prompt that departs inside the prompt keeps whole blocks of the shared start only.
    departing = prompt[:11] + tokenizer.encode("zz")
    third = generator.complete(departing, max_new_tokens=6)
    third.read()
    assert third.usage.reused_tokens == 11 // block * block
    assert third.tokens == Generator(model).generate([departing], Sampling(max_new_tokens=6))[0]


def _reply(generator: TextGenerator, prompt: list[int], tokens: int = 8) -> list[int]:
    stream = generator.complete(prompt, max_new_tokens=tokens)
    stream.read()
    return stream.tokens


@pytest.mark.parametrize("prefill", ["exact", "sparse"])
def test_a_request_gets_the_tokens_a_fresh_generator_gives_whatever_ran_before_it(prefill):
    """Greedy replies after a chat turn (whose reply the next prompt holds), after an unrelated
    request, after the same request: each the fresh generator's, token for token, and so is what
    the cache then holds. Layer 1 is sparse: the keys and values of layer 2 depend on how its
    attention read the context (a sparse decode step's reply tokens differ from their exact prefill)."""
    model = QuestModel(text_export(dense_layers=(0,)), threads=1)
    block = model.block_size  # the truncation unit: a superblock
    rng = np.random.default_rng(21)
    ids = lambda n: rng.integers(END_OF_TURN_ID + 1, TEXT_VOCAB, n).tolist()  # noqa: E731

    def same_as_fresh(served: TextGenerator, prompt: list[int]) -> None:
        """The reply's tokens, and every key, value and bound the cache holds after it, bit for bit."""
        fresh = TextGenerator(model, prefill=prefill)
        assert _reply(served, prompt) == _reply(fresh, prompt)
        held = len(fresh.cached)
        assert served.cached == fresh.cached
        P = model.sidecar.settings.block_size
        for name, array in fresh.cache.buffers.items():  # what the held tokens fill: tokens, blocks, superblocks
            length = -(-held // P) if "block" in name else -(-held // block) if "super" in name else held
            np.testing.assert_array_equal(served.cache.buffers[name][:, :, :length], array[:, :, :length],
                                          err_msg=name)

    turn = ids(150)  # past a chunk of 64 queries and the 64-token exact tail: a sparse part to reuse
    served = TextGenerator(model, prefill=prefill)
    same_as_fresh(served, turn)
    follow_up = turn + served.cached[len(turn):] + ids(9)  # the conversation again, one more turn
    same_as_fresh(served, follow_up)
    same_as_fresh(served, ids(60))  # an unrelated request in between
    same_as_fresh(served, follow_up)
    same_as_fresh(served, follow_up)  # the same request twice in a row


def test_reused_positions_are_those_a_fresh_prefill_computes_the_same_way():
    model = _model()
    block, chunk = model.block_size, model.sidecar.settings.chunk_size
    prompt = np.random.default_rng(22).integers(END_OF_TURN_ID + 1, TEXT_VOCAB, 150).tolist()
    for prefill, reused in (("exact", len(prompt) // block * block),  # every exactly prefilled block
                            ("sparse", (len(prompt) - 64) // chunk * chunk),  # whole chunks before the exact tail
                            ("per-token", 0)):  # its selections depend on how the prompt was split into steps
        generator = TextGenerator(model, prefill=prefill)
        _reply(generator, prompt, 4)
        again = generator.complete(prompt + [5, 6, 7] * 30, max_new_tokens=2)
        again.read()
        assert again.usage.reused_tokens == reused, prefill


def test_replies_stop_at_the_models_end_of_turn_by_default_and_at_given_stop_tokens():
    generator = TextGenerator(_model())
    prompt = _tokenizer().encode_chat(CONVERSATION[:2])
    greedy = generator.complete(prompt, max_new_tokens=5, stop_tokens=(TEXT_VOCAB - 1,))
    greedy.read()
    assert generator.sampling(len(prompt)).stop_tokens == (END_OF_TURN_ID,)
    stopped = generator.complete(prompt, max_new_tokens=5, stop_tokens=(greedy.tokens[2],))
    assert stopped.read() == _tokenizer().decode(greedy.tokens[:2])
    assert stopped.finish_reason == "stop" and stopped.tokens == greedy.tokens[:3]


def test_requests_are_checked_first_and_one_stream_is_served_at_a_time():
    generator = TextGenerator(_model())
    prompt = _tokenizer().encode_chat(CONVERSATION[:2])
    with pytest.raises(CapacityError, match="capacity 256"):
        generator.complete(prompt, max_new_tokens=256)
    with pytest.raises(ValueError, match="temperature"):
        generator.complete(prompt, temperature=float("nan"))
    with pytest.raises(ValueError, match="vocabulary|lie"):
        generator.complete([TEXT_VOCAB], max_new_tokens=1)
    open_stream = generator.complete(prompt, max_new_tokens=3)
    with pytest.raises(GeneratorBusyError):
        generator.complete(prompt, max_new_tokens=3)
    with pytest.raises(GeneratorBusyError, match="reset"):
        generator.reset()  # would empty the cache under the open stream
    next(open_stream, None)
    open_stream.close()
    assert open_stream.finish_reason == "cancelled"
    generator.reset()
    assert generator.complete(prompt, max_new_tokens=3).read() is not None


def test_no_cache_longer_than_the_exported_capacity_can_be_made():
    model = _model()
    for make in (lambda: model.new_cache(1, 257), lambda: TextGenerator(model, capacity=257),
                 lambda: Generator(model, capacity=257)):
        with pytest.raises(CapacityError, match="past the 256 tokens|past the model's 256 tokens"):
            make()
    assert model.new_cache(1, 256).capacity == 256


def test_a_cancelled_stream_stops_before_its_next_token_and_keeps_the_cache_consistent():
    generator = TextGenerator(_model())
    prompt = _tokenizer().encode_chat(CONVERSATION[:2])
    stream = generator.complete(prompt, max_new_tokens=50, stop_tokens=(TEXT_VOCAB - 1,))
    seen = 0
    for _ in stream:
        seen += 1
        if seen == 2:
            stream.cancel()
    assert stream.finish_reason == "cancelled" and stream.usage.completion_tokens < 50
    assert len(generator.cached) == int(generator.cache.lengths[0])


def test_a_chat_remembers_its_turns_and_prefills_only_the_new_ones():
    chat = Chat(text_export(), system="Be brief.", max_new_tokens=8)
    first = chat.send("Héllo, 世界! ✓", stream=True)
    text = "".join(first)
    assert chat.messages[-1] == {"role": "assistant", "content": text}
    second = chat.send("More?", stream=True)
    second.read()
    history = chat.generator.tokenizer.encode_chat(chat.messages[:3], add_generation_prompt=False)
    # Everything up to the reply's own retokenisation is reused (the whole first turn, for most replies).
    assert second.usage.reused_tokens >= (first.usage.prompt_tokens // 8) * 8
    assert second.usage.prompt_tokens == len(chat.generator.tokenizer.encode_chat(chat.messages[:4]))
    assert len(history) < second.usage.prompt_tokens
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "user", "assistant"]
    chat.reset()
    assert chat.messages == [{"role": "system", "content": "Be brief."}]


def test_a_chat_reply_stops_where_the_cache_is_full():
    chat = Chat(text_export(), max_new_tokens=10_000)
    reply = chat.send("Hi", stream=True)
    reply.read()
    assert reply.finish_reason in ("length", "stop")
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= chat.generator.capacity


def test_generate_text_continues_a_plain_prompt():
    text = generate_text(text_export(), "Once upon", max_new_tokens=6)
    tokens = Generator(_model()).generate([_tokenizer().encode("Once upon")], Sampling(max_new_tokens=6,
                                                                                       stop_tokens=(2,)))[0]
    assert text == _tokenizer().decode(tokens)


def test_the_readmes_chat_snippet_runs_on_the_default_export(tmp_path):
    from quest_ort.pipeline import export_sparse
    from quest_ort.export.rewrite import SparseSettings
    from support.readme_snippets import run_chat_snippet

    folder = tmp_path / "qwen3-quest"  # what `export-sparse qwen3 --k 32 -o qwen3-quest` writes
    export_sparse("qwen3", output=folder, settings=SparseSettings.for_budget(32), log=lambda *a, **k: None)
    printed = run_chat_snippet(folder)
    assert printed.count("\n") >= 2 and printed.strip()  # three replies of random weights: text, whatever it says
