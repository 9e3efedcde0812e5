"""quest-ort-demo's flags reach the part they name: --ops with --context and --threads runs the ops
demo at that context (it once read them and ran its own default)."""

from __future__ import annotations

from quest_ort.apps.demo import main


def test_the_ops_demo_takes_the_context_and_threads_given(capsys):
    assert main(["--ops", "--context", "2048", "--threads", "1", "--top-k", "4"]) == 0
    printed = capsys.readouterr().out
    assert "float16 KV cache of 2048 tokens" in printed and "K=4" in printed
