"""`quest-ort serve` through the official `openai` client, on 127.0.0.1: chat and text completions,
streaming, two clients at once, requests past the capacity, a client that leaves mid-stream."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")  # the test extra: installed by make
uvicorn = pytest.importorskip("uvicorn")  # the serve extra: installed by make

from quest_ort.apps.serve import create_app  # noqa: E402
from quest_ort.apps.serve.schema import ChatCompletion  # noqa: E402
from quest_ort.runtime.chat import TextGenerator  # noqa: E402
from quest_ort.runtime.model import QuestModel  # noqa: E402
from support.export_models import text_export  # noqa: E402
from support.openai_server import (NAME, QUESTIONS, ask, client, expected_reply, free_port, get,  # noqa: E402
                                   replies_at_once, serve_process, text_model)



class SlowModel:
    """The model with a pause before every decode step: a reply long enough to leave in the middle of."""

    def __init__(self, model: QuestModel, pause: float):
        self._model, self._pause = model, pause

    def step(self, cache, input_ids, valid=None, *, exact=False, chunked=False, last_logits=None):
        if not exact and not chunked:
            time.sleep(self._pause)
        return self._model.step(cache, input_ids, valid, exact=exact, chunked=chunked, last_logits=last_logits)

    def __getattr__(self, name):
        return getattr(self._model, name)


@contextlib.contextmanager
def running(generator: TextGenerator, **options):
    """The app on uvicorn in a thread, on a free port of 127.0.0.1; yields (base URL, app)."""
    app = create_app(generator, NAME, **options)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def served():
    with running(TextGenerator(text_model())) as (url, app):
        yield url, app


def test_models_and_health(served):
    url, _ = served
    assert [m.id for m in client(url).models.list().data] == [NAME]
    health = get(f"{url}/health")
    assert health["status"] == "ok" and health["capacity"] == 256 and health["model"] == NAME


@pytest.mark.parametrize("question", QUESTIONS[:2])
def test_a_chat_completion_is_the_greedy_reply(served, question):
    url, _ = served
    reply = ask(url, question)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected_reply(question, 12)
    assert reply.choices[0].finish_reason in ("length", "stop") and reply.model == NAME
    assert reply.usage.completion_tokens <= 12 and reply.usage.total_tokens == (reply.usage.prompt_tokens
                                                                                 + reply.usage.completion_tokens)


def test_a_streamed_chat_completion_gives_the_same_text_in_deltas(served):
    url, _ = served
    chunks = list(ask(url, QUESTIONS[0], stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected_reply(QUESTIONS[0], 12)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["length"], ["stop"]) and chunks[-1].usage.completion_tokens <= 12


def test_a_text_completion_streamed_and_not(served):
    url, _ = served
    plain = client(url).completions.create(model=NAME, prompt="Once upon", max_tokens=8, temperature=0)
    streamed = client(url).completions.create(model=NAME, prompt="Once upon", max_tokens=8, temperature=0, stream=True)
    generator = TextGenerator(text_model())
    assert plain.choices[0].text == "".join(c.choices[0].text for c in streamed) == generator.generate_text(
        "Once upon", max_new_tokens=8)


def test_two_clients_at_once_each_get_their_own_reply(served):
    url, _ = served
    questions = QUESTIONS[:3]
    assert replies_at_once(url, questions, 24) == {q: expected_reply(q, 24) for q in questions}


@pytest.mark.parametrize("request_fields, named", [
    (dict(max_tokens=10_000), "max_tokens"),                          # prompt + max_tokens past the capacity
    (dict(messages=[{"role": "user", "content": "word " * 400}]), "context"),  # the prompt alone
    (dict(messages=[{"role": "user", "content": "x" * 1_000_000}]), "characters"),  # refused before tokenizing
    (dict(n=2), "'n'"),
    (dict(temperature=-1), "temperature"),
    (dict(temperature=1e6), "temperature"),
    (dict(model="gpt-4o"), "not served"),
    (dict(top_logprobs=3), "top_logprobs"),                           # without logprobs: true
    (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
    (dict(tool_choice="auto"), "tool_choice"),
    (dict(response_format={"type": "json_object"}), "response_format"),
    (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
    (dict(stop="x" * 257), "stop"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(extra_body={"top_k": -1}), "top_k"),
    (dict(extra_body={"min_p": 1.5}), "min_p"),
    (dict(extra_body={"repetition_penalty": 0}), "repetition_penalty"),
    (dict(extra_body={"mirostat": 2}), "mirostat"),                   # a field this server does not know
    (dict(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}), "stream_options"),
])
def test_a_request_the_server_cannot_honour_is_a_400_naming_why(served, request_fields, named):
    url, _ = served
    fields = {**dict(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4), **request_fields}
    with pytest.raises(openai.BadRequestError, match=named):
        client(url).chat.completions.create(**fields)
    assert ask(url, "Hi", 4).choices[0].message.content == expected_reply("Hi", 4)  # still serving


def test_logprobs_are_the_models_distribution_over_the_reply_streamed_or_not(served):
    url, _ = served
    plain = ask(url, "Hi there", 8, logprobs=True, top_logprobs=3).choices[0]
    streamed = list(client(url).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Hi there"}], max_tokens=8, temperature=0, stream=True,
        logprobs=True, top_logprobs=3))
    content = plain.logprobs.content
    assert [e.token for e in content] == [e.token for c in streamed if c.choices and c.choices[0].logprobs
                                          for e in c.choices[0].logprobs.content]
    generator = TextGenerator(text_model())
    prompt = generator.tokenizer.encode_chat([{"role": "user", "content": "Hi there"}])
    expected = generator.complete(prompt, max_new_tokens=8, logprobs=3)
    assert "".join(e.token for e in content) == expected.read() == plain.message.content
    for entry, mine in zip(content, expected.logprobs, strict=True):
        assert entry.logprob == mine.logprob <= 0.0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == entry.logprob  # greedy: the chosen token is the likeliest
        assert entry.bytes == list(entry.token.encode("utf-8"))
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client(url).completions.create(model=NAME, prompt="Once", max_tokens=2, logprobs=2)


def test_usage_timings_and_metrics_count_the_prefix_the_cache_held(served):
    url, _ = served
    question = "Tell me about caches"
    first = ask(url, question, 4)
    again = client(url).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": question}], max_tokens=4, temperature=0)
    assert first.usage.prompt_tokens == again.usage.prompt_tokens
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached < again.usage.prompt_tokens  # the prompt's whole blocks but its last token's
    timings = again.model_extra["timings"]
    assert timings["cache_n"] == cached and timings["prompt_n"] == again.usage.prompt_tokens - cached
    assert timings["predicted_n"] == again.usage.completion_tokens and timings["predicted_ms"] > 0
    metrics = get(url, "/metrics", text=True)
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line and not line.startswith("#")}
    assert values["quest_ort_prompt_cached_tokens_total"] >= cached
    assert values["quest_ort_generated_tokens_total"] >= 8 and values["quest_ort_slots_busy"] == 0
    assert values["quest_ort_requests_refused_total"] >= 0 and values["quest_ort_prefill_seconds_total"] > 0


def test_openapi_documents_the_requests_and_replies(served):
    url, _ = served
    spec = get(url, "/openapi.json")
    schemas = spec["components"]["schemas"]
    chat = spec["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    assert {"messages", "top_k", "min_p", "repetition_penalty", "top_logprobs"} <= set(
        schemas["ChatCompletionRequest"]["properties"])
    assert "Message" in schemas and "timings" in schemas["ChatCompletion"]["properties"]
    assert chat["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletion")
    assert {"400", "413", "503"} <= set(chat["responses"])
    reply = ask(url, "Hi", 4, logprobs=True, top_logprobs=1).model_dump()  # timings: an extra field to openai
    ChatCompletion.model_validate(reply)  # the reply is what the schema says


def test_fields_at_the_value_that_asks_for_nothing_more_are_accepted(served):
    url, _ = served
    reply = ask(url, "Hi", 4, logprobs=False, tool_choice="none", response_format={"type": "text"}, user="u1", n=1)
    assert reply.choices[0].message.content == expected_reply("Hi", 4)


@pytest.mark.parametrize("fields", [
    dict(temperature=1.0, seed=3, extra_body={"top_k": 1}),               # one token left: the greedy reply
    dict(temperature=1.0, seed=3, extra_body={"min_p": 1.0}),             # only the likeliest left: greedy too
    dict(temperature=1.0, seed=3, top_p=0.5, extra_body={"top_k": 5, "min_p": 0.05}),
    dict(temperature=0, presence_penalty=2.0, frequency_penalty=1.5),
    dict(temperature=0, extra_body={"repetition_penalty": 5.0}),
])
def test_every_sampling_field_reaches_the_sampler(served, fields):
    """The server's reply is the library's with the same fields (runtime/sampling.py, tested there
    against their definitions); the cuts that leave one token give the greedy reply."""
    url, _ = served
    body = dict(fields)
    extra = body.pop("extra_body", {})
    reply = client(url).chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi there"}],
                                                max_tokens=12, extra_body=extra, **body).choices[0].message.content
    generator = TextGenerator(text_model())
    prompt = generator.tokenizer.encode_chat([{"role": "user", "content": "Hi there"}])
    assert reply == generator.complete(prompt, max_new_tokens=12, **body, **extra).read()
    if extra.get("top_k") == 1 or extra.get("min_p") == 1.0:
        assert reply == expected_reply("Hi there", 12)


def test_penalties_change_a_greedy_reply_that_repeats_itself(served):
    url, _ = served
    plain = ask(url, "Hi there", 24).choices[0].message.content
    generator = TextGenerator(text_model())
    prompt = generator.tokenizer.encode_chat([{"role": "user", "content": "Hi there"}])
    tokens = generator.complete(prompt, max_new_tokens=24)
    tokens.read()
    assert len(set(tokens.tokens)) < len(tokens.tokens), "the greedy reply repeats no token: pick another question"
    assert ask(url, "Hi there", 24, frequency_penalty=2.0).choices[0].message.content != plain
    assert ask(url, "Hi there", 24, extra_body={"repetition_penalty": 10.0}).choices[0].message.content != plain


def test_clients_at_once_share_the_slots_decode_steps_and_each_gets_its_reply_alone():
    """Three slots, three streaming clients: every first token comes before any reply ends (their
    decode steps are one batch), and each reply is the one a fresh single-slot generator gives."""
    questions = QUESTIONS[:3]
    slow = SlowModel(text_model(), pause=0.02)
    with running(TextGenerator(slow, slots=3)) as (url, app):
        times: dict[str, list[float]] = {}
        texts: dict[str, str] = {}

        def run(question):
            started, chunks, stamps = time.monotonic(), [], []
            for chunk in ask(url, question, 40, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    chunks.append(chunk.choices[0].delta.content)
                    stamps.append(time.monotonic() - started)
            texts[question], times[question] = "".join(chunks), stamps

        threads = [threading.Thread(target=run, args=(q,)) for q in questions]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert get(url, "/health")["slots"] == 3
    assert texts == {q: expected_reply(q, 40) for q in questions}
    assert max(stamps[0] for stamps in times.values()) < min(stamps[-1] for stamps in times.values())


def test_a_request_past_the_slots_and_the_queue_is_a_503_with_retry_after():
    slow = SlowModel(text_model(), pause=0.05)
    with running(TextGenerator(slow), queue=0) as (url, app):
        stream = ask(url, QUESTIONS[0], 40, stream=True)
        next(iter(stream))  # the one slot is busy
        request = urllib.request.Request(f"{url}/v1/chat/completions", method="POST",
                                         headers={"Content-Type": "application/json"},
                                         data=json.dumps({"messages": [{"role": "user", "content": "Hi"}]}).encode())
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"
        assert "slots are busy" in json.loads(refused.value.read())["error"]["message"]
        with pytest.raises(openai.APIStatusError) as streamed:  # a stream too: refused before its 200
            ask(url, "Hi", 4, stream=True)
        assert streamed.value.status_code == 503
        stream.close()


def test_a_request_gets_the_same_reply_on_a_fresh_server_and_after_any_history():
    """Greedy chat turns on a model whose layer 1 is sparse: a conversation resent with its reply and
    one more turn, asked on a fresh server and after other requests in both slots, is answered alike,
    to the bits of its log-probabilities (reusing the reply's sparse-decoded keys changes them)."""
    model = QuestModel(text_export(dense_layers=(0,)), threads=1)

    def conversation(url) -> list[dict]:
        first = ask(url, "Hello there", 16).choices[0].message.content
        return [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": first},
                {"role": "user", "content": "Tell me a story about a cache"}]

    def answer(url, messages) -> tuple[str, list[float]]:
        """The reply and its tokens' log-probabilities: equal floats, not only equal text."""
        choice = client(url).chat.completions.create(model=NAME, max_tokens=24, temperature=0, logprobs=True,
                                                     messages=messages).choices[0]
        return choice.message.content, [entry.logprob for entry in choice.logprobs.content]

    with running(TextGenerator(model, slots=2)) as (url, app):
        messages = conversation(url)
    with running(TextGenerator(model, slots=2)) as (url, app):
        fresh = answer(url, messages)
    with running(TextGenerator(model, slots=2)) as (url, app):
        assert conversation(url) == messages  # its reply, then the turn: the cache holds the reply's tokens
        assert answer(url, messages) == fresh
        replies_at_once(url, QUESTIONS[:2], 12)  # unrelated requests, in both slots
        assert answer(url, messages) == fresh


def _post(url: str, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url + path, method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_slot_saved_and_restored_over_http_answers_with_the_same_logprobs(tmp_path):
    def answer(url) -> list[float]:
        choice = ask(url, "Tell me about slots", 12, logprobs=True).choices[0]
        return [entry.logprob for entry in choice.logprobs.content]

    with running(TextGenerator(text_model(), slots=2), slot_save_path=tmp_path) as (url, app):
        expected = answer(url)
        slot = next(s["id"] for s in get(url, "/slots") if s["tokens"] > 0)
        status, saved = _post(url, f"/slots/{slot}?action=save", {"filename": "chat.npz"})
        assert status == 200 and saved["n_saved"] > 0
        assert _post(url, "/slots/0?action=save", {"filename": "../escape.npz"})[0] == 400
        assert _post(url, "/slots/0?action=restore", {"filename": "missing.npz"})[0] == 404
    (tmp_path / "cut.npz").write_bytes((tmp_path / "chat.npz").read_bytes()[:500])
    with running(TextGenerator(text_model(), slots=2), slot_save_path=tmp_path) as (url, app):
        status, restored = _post(url, "/slots/1?action=restore", {"filename": "chat.npz"})
        assert status == 200 and restored["n_restored"] == saved["n_saved"]
        status, refused = _post(url, "/slots/0?action=restore", {"filename": "cut.npz"})
        assert status == 400 and "cut.npz is not a readable slot file" in refused["error"]["message"]
        again = client(url).chat.completions.create(model=NAME, max_tokens=12, temperature=0, logprobs=True,
                                                    messages=[{"role": "user", "content": "Tell me about slots"}])
        assert again.usage.prompt_tokens_details.cached_tokens > 0  # the restored slot's prefix
        assert [entry.logprob for entry in again.choices[0].logprobs.content] == expected
    with running(TextGenerator(text_model())) as (url, app):
        assert "--slot-save-path" in _post(url, "/slots/0?action=save", {"filename": "x.npz"})[1]["error"]["message"]


class SlowPrefillModel(SlowModel):
    """The model with a pause before every prefill step: a prefill long enough to watch."""

    def step(self, cache, input_ids, valid=None, *, exact=False, chunked=False, last_logits=None):
        if exact or chunked:
            time.sleep(self._pause)
        return self._model.step(cache, input_ids, valid, exact=exact, chunked=chunked, last_logits=last_logits)


def test_a_long_prefill_shows_its_progress_in_the_stream_and_in_health():
    """A streaming reply sends `: prefill DONE/TOTAL` comment lines (the openai client skips them)
    after each prefill step, and /health gives the running prefill's progress."""
    import json
    import urllib.request

    generator = TextGenerator(SlowPrefillModel(text_model(), pause=0.3), prefill_chunk=16)
    with running(generator) as (url, app):
        body = dict(model=NAME, messages=[{"role": "user", "content": QUESTIONS[1] * 3}], max_tokens=4,
                    temperature=0, stream=True)
        request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        seen = []
        watcher = threading.Thread(target=lambda: [seen.append(get(f"{url}/health")["prefill"]) or time.sleep(0.1)
                                                   for _ in range(12)])
        with urllib.request.urlopen(request, timeout=60) as response:
            watcher.start()
            lines = [line.decode().rstrip("\n") for line in response]
        watcher.join()
        comments = [line for line in lines if line.startswith(": prefill ")]
        done = [int(line.split()[2].split("/")[0]) for line in comments]
        total = {int(line.split("/")[1]) for line in comments}
        assert len(comments) >= 3 and done == sorted(done) and len(total) == 1 and done[-1] == total.pop()
        assert lines.index(comments[-1]) < next(i for i, line in enumerate(lines) if '"content": "' in line
                                                and '"content": ""' not in line)  # before the first token
        assert any(progress is not None and 0 < progress["done"] < progress["total"] for progress in seen)
        assert get(f"{url}/health")["prefill"] is None  # nothing running
        streamed = client(url).chat.completions.create(**{**body, "stream": True})  # the client skips them
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected_reply(
            QUESTIONS[1] * 3, 4)


def test_a_client_that_gives_up_on_a_plain_request_stops_its_generation_too():
    generator = TextGenerator(SlowModel(text_model(), pause=0.05))
    with running(generator) as (url, app):
        impatient = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=0.5)
        with pytest.raises(openai.APITimeoutError):  # 200 tokens would take 10 s
            impatient.chat.completions.create(model=NAME, messages=[{"role": "user", "content": QUESTIONS[1]}],
                                              max_tokens=200, temperature=0)
        deadline = time.monotonic() + 5
        while get(f"{url}/health")["busy"]:
            assert time.monotonic() < deadline, "the generation went on after the client left"
            time.sleep(0.05)
        assert ask(url, "Hi", 4).choices[0].message.content == expected_reply("Hi", 4)


def test_a_client_that_leaves_mid_stream_stops_its_generation_and_frees_the_server():
    generator = TextGenerator(SlowModel(text_model(), pause=0.05))
    with running(generator) as (url, app):
        stream = ask(url, QUESTIONS[1], max_tokens=200, stream=True)
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()  # 200 tokens would take 10 s
        deadline = time.monotonic() + 5
        while get(f"{url}/health")["busy"]:
            assert time.monotonic() < deadline, "the generation went on after the client left"
            time.sleep(0.05)
        assert generator.context_used < generator.tokenizer.encode_chat(
            [{"role": "user", "content": QUESTIONS[1]}]).__len__() + 40
        assert ask(url, "Hi", 4).choices[0].message.content == expected_reply("Hi", 4)


def test_the_serve_command_answers_the_openai_client():
    port = free_port()
    command = [sys.executable, "-m", "quest_ort.apps.cli", "serve", str(text_export()), "--port", str(port),
               "--name", NAME, "--threads", "1", "--quiet"]
    with serve_process(command, port) as url:
        assert ask(url, QUESTIONS[0]).choices[0].message.content == expected_reply(QUESTIONS[0], 12)
