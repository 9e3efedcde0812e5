"""`quest-ort chat`: replies streamed to stdout, speed and context on stderr, /reset and /exit, and a
folder without a tokenizer refused with one line; `quest-ort serve` without its extra names the extra."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.export_models import quest_export, text_export


def chat(folder, lines: str, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quest_ort.apps.cli", "chat", str(folder), "--threads", "1",
                           "--max-new-tokens", "6", *options], input=lines, capture_output=True, text=True,
                          timeout=300)


def test_a_conversation_streams_replies_and_reports_speed_and_context():
    done = chat(text_export(), "Hello there\nAnd then?\n/reset\nHello there\n/exit\nnever read\n")
    assert done.returncode == 0, done.stderr
    replies = [line for line in done.stdout.split(">>> ") if line.strip()]
    assert len(replies) == 3, done.stdout
    assert replies[0] == replies[2]  # after /reset the same question gets the same (greedy) reply
    stats = [line for line in done.stderr.splitlines() if "tokens/s" in line]
    assert len(stats) == 3 and all("of 256 tokens of context used" in line for line in stats), done.stderr
    assert "reused" in stats[1] and "(conversation reset)" in done.stderr


def test_quiet_keeps_only_the_replies_and_end_of_input_leaves():
    done = chat(text_export(), "Hello there\n", "--quiet")
    assert done.returncode == 0 and done.stderr == "" and done.stdout.count(">>> ") == 2


def test_a_folder_without_a_tokenizer_is_one_line_and_exit_code_2():
    done = chat(quest_export("qwen3", top_k=4), "Hi\n")
    assert done.returncode == 2 and "no tokenizer" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_prefill_sparse_answers_and_an_unknown_mode_is_refused_by_the_parser():
    done = chat(text_export(), "Hello there\n", "--prefill", "sparse")
    assert done.returncode == 0, done.stderr
    assert "tokens/s" in done.stderr
    refused = chat(text_export(), "Hi\n", "--prefill", "dense")
    assert refused.returncode == 2 and "invalid choice: 'dense'" in refused.stderr


@pytest.mark.parametrize("missing, names_the_extra", [("fastapi", True), ("prometheus_client", True),
                                                      ("numpy", False)])
def test_serve_without_its_extra_names_it_and_other_faults_keep_their_traceback(monkeypatch, caplog, missing,
                                                                               names_the_extra):
    """A module the serve extra brings, missing: one line naming the extra, exit code 2. Any other missing module
    (numpy: a dependency of the package itself) is a fault of its own and is raised as it is."""
    from quest_ort.apps import cli

    folder = text_export()  # exported before any import fails
    # The serve package afresh (its modules run their imports again), whatever imported it before.
    package = "quest_ort.apps.serve"
    for name in [name for name in sys.modules if name == package or name.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    real_import = __import__

    def failing_import(name, *args, **kwargs):
        if name == missing or name.startswith(missing + "."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr("builtins.__import__", failing_import)
    args = cli.build_parser().parse_args(["serve", str(folder), "--port", "1"])
    if names_the_extra:
        assert cli.serve(args) == 2
        assert "pip install 'quest-ort[serve]'" in caplog.text and missing in caplog.text
    else:
        with pytest.raises(ModuleNotFoundError):
            cli.serve(args)
