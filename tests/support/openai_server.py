"""What the server tests share: the tiny text model's expected replies, and the official openai client
asking a server on 127.0.0.1 (tests/runtime/test_serve.py, test_replicas.py)."""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import subprocess
import threading
import time
import urllib.request

from quest_ort.runtime.chat import TextGenerator
from quest_ort.runtime.model import QuestModel
from support.export_models import text_export

NAME = "tiny-qwen3"
QUESTIONS = ["Héllo, 世界!", "Why is the sky blue?", "Name three colours.", "Hi"]


@functools.cache
def text_model() -> QuestModel:
    return QuestModel(text_export(), threads=1)


def expected_reply(question: str, max_tokens: int) -> str:
    """The greedy reply of a fresh in-process generator: what the server must answer."""
    generator = TextGenerator(text_model())
    prompt = generator.tokenizer.encode_chat([{"role": "user", "content": question}])
    return generator.complete(prompt, max_new_tokens=max_tokens).read()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, path: str = "", text: bool = False):
    """GET url + path: its JSON, or with `text` its body as text."""
    with urllib.request.urlopen(url + path, timeout=10) as response:
        body = response.read()
    return body.decode() if text else json.loads(body)


def client(url: str):
    import openai  # the test extra: installed by make

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def ask(url: str, question: str, max_tokens: int = 12, **options):
    return client(url).chat.completions.create(model=NAME, messages=[{"role": "user", "content": question}],
                                               max_tokens=max_tokens, temperature=0, **options)


def replies_at_once(url: str, questions: list[str], max_tokens: int) -> dict[str, str]:
    """Every question asked by a client of its own, all at once (every other one streaming)."""
    results = {}

    def run(question, stream):
        if stream:
            chunks = ask(url, question, max_tokens, stream=True)
            results[question] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            results[question] = ask(url, question, max_tokens).choices[0].message.content

    threads = [threading.Thread(target=run, args=(q, i % 2 == 0)) for i, q in enumerate(questions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


def wait_until_healthy(process: subprocess.Popen, url: str, timeout: float, what: str = "quest-ort serve",
                       pause: float = 0.2) -> None:
    """Returns once `url`/health says ok; fails when `process` exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, f"{what} exited:\n{process.communicate()[1]}"
        try:
            if get(f"{url}/health")["status"] == "ok":
                return
        except OSError:  # not listening yet (or, behind a proxy, its 503 while the replicas start)
            assert time.monotonic() < deadline, f"{what} did not come up"
            time.sleep(pause)


@contextlib.contextmanager
def serve_process(command: list[str], port: int, timeout: float = 60):
    """`command` (a `quest-ort serve ... --port port`) in a process of its own, up once /health says ok;
    yields its base URL and stops it at the end."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, url, timeout)
        yield url
    finally:
        process.terminate()
        process.wait(30)
