"""An exported folder run by onnxruntime-genai's own og.Model / og.Tokenizer / og.Generator, unmodified
(`make test-genai`, in the genai venv): the genai_config.json and graph variant the exporter writes
(export/genai_variant.py) give the tokens this package's runtime gives, past the selection budget."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

from quest_ort.pipeline import export_sparse
from quest_ort.export.genai_variant import GENAI_CONFIG_FILE, GENAI_MODEL_FILE, LIBRARY_FILE, genai_refusal
from quest_ort.export.rewrite import SparseSettings
from quest_ort.runtime.generate import Generator, Sampling
from quest_ort.runtime.model import QuestModel
from quest_ort.runtime.text import FolderTokenizer
from support.export_models import text_export

pytestmark = pytest.mark.genai


def og_run(folder: pathlib.Path, steps: int, request: dict) -> dict:
    python = os.environ.get("QUEST_ORT_GENAI_PYTHON")
    if not python:
        pytest.fail("QUEST_ORT_GENAI_PYTHON is not set: run these tests with `make test-genai`")
    script = pathlib.Path(__file__).with_name("genai_og_run.py")
    done = subprocess.run([python, str(script), str(folder), str(steps), json.dumps(request)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def ours(folder: pathlib.Path, prompt: list[int], steps: int) -> list[int]:
    model = QuestModel(folder)
    stop = tuple(model.sidecar.eos_token_ids)
    return Generator(model).generate([prompt], Sampling(max_new_tokens=steps, stop_tokens=stop))[0]


def test_the_export_writes_the_genai_files():
    folder = text_export()
    for name in (GENAI_CONFIG_FILE, GENAI_MODEL_FILE, LIBRARY_FILE, "tokenizer.json"):
        assert (folder / name).is_file(), name
    assert genai_refusal(QuestModel(folder).sidecar) is None


def test_og_tokenizer_and_generator_give_our_ids_and_tokens_past_the_budget():
    folder = text_export()  # blocks of 8, top_k 4: a budget of 32 tokens per query head
    messages = [{"role": "user", "content": " ".join(f"item {i}: ünï 世界" for i in range(8))}]
    ran = og_run(folder, 40, {"messages": messages})
    prompt = FolderTokenizer.from_folder(folder).encode_chat(messages)
    assert ran["prompt"] == prompt and len(prompt) > 4 * 32
    assert ran["tokens"] == ours(folder, prompt, 40)  # (random weights: their bytes need not be UTF-8)


def test_the_default_export_runs_in_genai_as_in_this_package(tmp_path):
    folder = tmp_path / "qwen3-quest"  # export-sparse qwen3 --k 32
    export_sparse("qwen3", output=folder, settings=SparseSettings.for_budget(32), log=lambda *a, **k: None)
    prompt = np.random.default_rng(0).integers(3, 8192, 1100).tolist()  # past the 1024-token budget
    assert og_run(folder, 64, {"ids": prompt})["tokens"] == ours(folder, prompt, 64)


def test_the_readmes_genai_snippet_runs_on_the_default_export(tmp_path):
    from support.readme_snippets import DEFAULT_FOLDER, python_block

    folder = tmp_path / DEFAULT_FOLDER
    export_sparse("qwen3", output=folder, settings=SparseSettings.for_budget(32), log=lambda *a, **k: None)
    code = python_block("og.Model(")
    done = subprocess.run([os.environ.get("QUEST_ORT_GENAI_PYTHON") or pytest.fail("run with `make test-genai`"),
                           "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Once upon a time") and len(done.stdout) > len("Once upon a time") + 20


def _genai_libraries(into: pathlib.Path) -> pathlib.Path:
    """A lib folder as ONNX Runtime's and genai's release archives lay theirs out, linking to the
    genai venv's wheels: libonnxruntime-genai.so and libonnxruntime.so.1 (the SONAME the wheel's
    versioned file carries, which genai finds already loaded)."""
    python = os.environ.get("QUEST_ORT_GENAI_PYTHON") or pytest.fail("run with `make test-genai`")
    found = subprocess.run([python, "-c", "import glob, os, onnxruntime, onnxruntime_genai as og; "
                            "print(os.path.join(os.path.dirname(og.__file__), 'libonnxruntime-genai.so')); "
                            "print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), 'capi', "
                            "'libonnxruntime.so.1.*'))[0])"], capture_output=True, text=True, check=True)
    genai, runtime = found.stdout.split()
    into.mkdir()
    (into / "libonnxruntime-genai.so").symlink_to(genai)
    (into / "libonnxruntime.so.1").symlink_to(runtime)
    return into


def test_a_c_app_runs_the_default_export_through_genais_c_api(tmp_path):
    folder = tmp_path / "qwen3-quest"
    export_sparse("qwen3", output=folder, settings=SparseSettings.for_budget(32), log=lambda *a, **k: None)
    lib = _genai_libraries(tmp_path / "lib")
    app = tmp_path / "genai_c_app"
    subprocess.run(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1",
                    str(pathlib.Path(__file__).with_name("genai_c_app.c")), "-o", str(app), "-Wl,--no-as-needed",
                    f"-L{lib}", "-lonnxruntime-genai", "-l:libonnxruntime.so.1", f"-Wl,-rpath,{lib}"], check=True)
    prompt = " ".join(f"line {i} of a long prompt," for i in range(160))  # past the 1024-token budget
    ids = FolderTokenizer.from_folder(folder).encode(prompt)
    done = subprocess.run([str(app), str(folder), prompt, str(len(ids) + 48)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert len(ids) > 1024 and [int(t) for t in done.stdout.splitlines()[0].split()] == ours(folder, ids, 48)
