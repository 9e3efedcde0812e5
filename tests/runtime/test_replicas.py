"""`quest-ort serve --replicas 2` (apps/replicas.py: the app of apps/serve/ as Ray Serve replicas) on
127.0.0.1 through the official `openai` client: two replica processes, each with its own session and
cache, answer as the single-process server does. Run by `make test-replicas`, which installs ray[serve]."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from quest_ort.runtime.chat import TextGenerator
from support.export_models import text_export
from support.openai_server import (NAME, QUESTIONS, ask, client, expected_reply, free_port, get, replies_at_once,
                                   text_model, wait_until_healthy)

pytestmark = pytest.mark.replicas

openai = pytest.importorskip("openai")  # the test extra: installed by make

REPLICAS = 2
# Ray's start, then each replica opening its model: seconds here, far longer on a loaded machine.
START_TIMEOUT = 180


def _session_processes(session: int) -> list[int]:
    """The processes of a session (the server started in a session of its own, and everything Ray
    started for it), found through /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == session:
                    found.append(int(entry))
            except ProcessLookupError:  # exited meanwhile
                pass
    return found


@pytest.fixture(scope="module")
def replicas():
    """`quest-ort serve FOLDER --replicas 2` on a free port of 127.0.0.1; yields (base URL, its process).
    Stopped with SIGTERM, as a service manager would, and checked to leave no process behind."""
    if importlib.util.find_spec("ray") is None:
        pytest.fail("ray[serve] is not installed in this environment: `make test-replicas` installs it")
    port = free_port()
    command = [sys.executable, "-m", "quest_ort.apps.cli", "serve", str(text_export()), "--replicas", str(REPLICAS),
               "--port", str(port), "--name", NAME, "--threads", "1", "--quiet"]
    # A session of its own: what Ray starts for it can be found (and, should it hang, stopped) by session.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, url, START_TIMEOUT, "quest-ort serve --replicas", pause=0.5)
        yield url, process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            _, stderr = process.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            stderr = None
        left = _session_processes(process.pid)
        for pid in left:  # only when the shutdown failed: the test stops what it started, then fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert stderr is not None, "quest-ort serve --replicas did not stop within 90 s of SIGTERM"
        assert process.returncode == 0, f"exit status {process.returncode}:\n{stderr}"
        assert not left, f"processes left after the shutdown: {left}"


def test_two_replica_processes_answer_health_each_with_its_own_model(replicas):
    url, process = replicas
    answers = []
    # The proxy answers once the first replica is up, while the other may still be opening its model
    # (60 requests in a row once all went to the first); then it picks at random between idle ones.
    deadline = time.monotonic() + START_TIMEOUT
    while len({a["pid"] for a in answers}) < REPLICAS and time.monotonic() < deadline:
        answers.append(get(f"{url}/health"))
        time.sleep(0.1)
    pids = {a["pid"] for a in answers}
    assert len(pids) == REPLICAS, f"{len(answers)} requests in {START_TIMEOUT} s were all answered by {pids}"
    assert process.pid not in pids  # the replicas are processes of their own, not the command's
    assert all(a["status"] == "ok" and a["model"] == NAME and a["capacity"] == 256 for a in answers)
    assert [m.id for m in client(url).models.list().data] == [NAME]


@pytest.mark.parametrize("question", QUESTIONS[:3])
def test_a_chat_completion_is_the_greedy_reply(replicas, question):
    url, _ = replicas
    reply = ask(url, question)
    assert reply.choices[0].message.role == "assistant" and reply.model == NAME
    assert reply.choices[0].message.content == expected_reply(question, 12)
    assert reply.choices[0].finish_reason in ("length", "stop") and reply.usage.completion_tokens <= 12


def test_a_streamed_chat_completion_gives_the_same_text_in_deltas(replicas):
    url, _ = replicas
    for question in QUESTIONS[:2]:
        chunks = list(ask(url, question, stream=True, stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected_reply(question, 12)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes in (["length"], ["stop"]) and chunks[-1].usage.completion_tokens <= 12


def test_clients_at_once_each_get_their_own_reply(replicas):
    url, _ = replicas
    assert replies_at_once(url, QUESTIONS, 24) == {q: expected_reply(q, 24) for q in QUESTIONS}


def test_a_text_completion(replicas):
    url, _ = replicas
    plain = client(url).completions.create(model=NAME, prompt="Once upon", max_tokens=8, temperature=0)
    assert plain.choices[0].text == TextGenerator(text_model()).generate_text("Once upon", max_new_tokens=8)


def test_a_request_the_server_cannot_honour_is_still_a_400_naming_why(replicas):
    url, _ = replicas
    with pytest.raises(openai.BadRequestError, match="'n'"):
        client(url).chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], n=2)


def test_replicas_that_cannot_open_the_folder_stop_the_command_with_their_error(tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(text_export(), folder)
    data = next(folder.glob("*.onnx.data"))  # the sidecar and tokenizer read fine; the session does not
    data.write_bytes(data.read_bytes()[:1000])
    command = [sys.executable, "-m", "quest_ort.apps.cli", "serve", str(folder), "--replicas", str(REPLICAS),
               "--port", str(free_port()), "--quiet"]
    process = subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT, start_new_session=True)
    assert process.returncode == 2, process.stderr
    # The replica's own error (ONNX Runtime's), not only Ray Serve's "failed to update the deployments"
    assert "the replicas did not start: " in process.stderr and "ONNXRuntimeError" in process.stderr, process.stderr
