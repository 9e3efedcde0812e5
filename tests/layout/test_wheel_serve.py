"""The x86_64 wheel as a user installs it for serving (make test-wheel): a fresh venv with only the wheel and its
serve extra runs `quest-ort serve` on an exported folder and answers the official openai client (which, with the
export, runs from the project's venv: neither is in that venv); the venv without the extra names the extra."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

from support.export_models import text_export
from support.openai_server import NAME, QUESTIONS, ask, expected_reply, free_port, serve_process

# make test-wheel sets them: the venv of the wheel and [serve], and the venv of the wheel alone.
SERVE_VENV = os.environ.get("QUEST_ORT_SERVE_VENV")
BARE_VENV = os.environ.get("QUEST_ORT_WHEEL_VENV")


@pytest.mark.skipif(not SERVE_VENV, reason="only under `make test-wheel` (QUEST_ORT_SERVE_VENV)")
def test_the_wheel_with_its_serve_extra_answers_the_openai_client():
    command = pathlib.Path(SERVE_VENV) / "bin" / "quest-ort"
    port = free_port()
    with serve_process([str(command), "serve", str(text_export()), "--port", str(port), "--name", NAME,
                        "--threads", "1", "--quiet"], port) as url:
        assert ask(url, QUESTIONS[1]).choices[0].message.content == expected_reply(QUESTIONS[1], 12)


@pytest.mark.skipif(not BARE_VENV, reason="only under `make test-wheel` (QUEST_ORT_WHEEL_VENV)")
def test_the_wheel_without_its_serve_extra_names_it():
    command = pathlib.Path(BARE_VENV) / "bin" / "quest-ort"
    done = subprocess.run([str(command), "serve", str(text_export()), "--port", str(free_port())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert "pip install 'quest-ort[serve]'" in done.stderr and "Traceback" not in done.stderr, done.stderr
