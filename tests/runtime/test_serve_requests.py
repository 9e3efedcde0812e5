"""The server's request checks as pure functions (apps/serve/requests.py), without a server: every
field read, ignored only where it changes nothing, or refused naming it."""

from __future__ import annotations

import pytest

from quest_ort.apps.serve.requests import (RequestError, chat_messages, check_text_length, logprobs_asked,
                                           parse_request)

PROMPT = list(range(10))


def _parse(chat: bool = True, **body):
    return parse_request(body, PROMPT, chat, name="m", capacity=64, stop_tokens=(2,))


def test_a_plain_request_gets_openai_defaults_and_the_model_end_of_turn():
    asked = _parse()
    assert asked.sampling.temperature == 1.0 and asked.sampling.max_new_tokens == 54
    assert asked.sampling.stop_tokens == (2,) and asked.stop == () and asked.logprobs is None


def test_every_sampling_field_reaches_the_sampling():
    asked = _parse(temperature=0.5, top_p=0.9, top_k=7, min_p=0.1, presence_penalty=0.5, frequency_penalty=-0.5,
                   repetition_penalty=1.2, seed=3, max_tokens=5, stop=["x", "y"], logprobs=True, top_logprobs=2)
    s = asked.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.presence_penalty, s.frequency_penalty, s.repetition_penalty,
            s.seed, s.max_new_tokens) == (0.5, 0.9, 7, 0.1, 0.5, -0.5, 1.2, 3, 5)
    assert asked.stop == ("x", "y") and asked.logprobs == 2


@pytest.mark.parametrize("body, param", [
    (dict(mirostat=1), "mirostat"), (dict(n=2), "n"), (dict(echo=True), "echo"), (dict(tool_choice="auto"), "tool_choice"),
    (dict(logit_bias={"1": 5}), "logit_bias"), (dict(model="other"), "model"), (dict(max_tokens=100), "max_tokens"),
    (dict(max_tokens=-1), "max_tokens"), (dict(temperature="hot"), "temperature"), (dict(top_k=1.5), "top_k"),
    (dict(min_p=2.0), "min_p"), (dict(stop=["a"] * 5), "stop"), (dict(stop=[1]), "stop"),
    (dict(top_logprobs=1), "top_logprobs"), (dict(logprobs="yes"), "logprobs"),
])
def test_a_field_it_cannot_honour_is_refused_naming_it(body, param):
    with pytest.raises(RequestError) as refused:
        _parse(**body)
    assert refused.value.param == param and refused.value.status == 400


@pytest.mark.parametrize("body", [dict(n=1), dict(echo=False), dict(tool_choice="none"), dict(user="u"),
                                  dict(response_format={"type": "text"}), dict(logit_bias={}), dict(tools=None)])
def test_a_field_at_the_value_that_asks_for_nothing_more_is_accepted(body):
    assert _parse(**body).sampling.max_new_tokens == 54


def test_completions_refuse_the_legacy_logprobs_and_chat_messages_are_checked():
    with pytest.raises(RequestError, match="completions"):
        logprobs_asked({"logprobs": 0}, chat=False)
    assert chat_messages({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                   {"type": "text", "text": "b"}]}]}) == [
        {"role": "user", "content": "ab"}]
    for messages in ([], [{"content": "x"}], [{"role": "user", "content": [{"type": "image_url"}]}]):
        with pytest.raises(RequestError):
            chat_messages({"messages": messages})


def test_text_that_cannot_fit_the_context_is_refused_before_it_is_tokenized():
    check_text_length(64 * 8, 64, 8, "prompt")
    with pytest.raises(RequestError, match="past the model's context"):
        check_text_length(64 * 8 + 1, 64, 8, "prompt")
