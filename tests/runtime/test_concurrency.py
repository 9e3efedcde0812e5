"""Concurrency: sessions and generators running in threads at once give exactly what they give one
after another (shared sessions, own caches; logits compared bit for bit)."""

from __future__ import annotations

import concurrent.futures
import functools

import numpy as np

from quest_ort.runtime.generate import Generator, Sampling, greedy
from quest_ort.runtime.model import QuestModel
from support.export_models import quest_export


@functools.cache
def _models() -> dict[str, QuestModel]:
    """Two sessions of the sparse export (1 and 2 intra-op threads) and the dense GQA baseline."""
    gqa = quest_export("qwen3", top_k=64, attention="gqa")
    sparse = quest_export("qwen3", top_k=2)
    return {"sparse-1t": QuestModel(sparse, threads=1), "sparse-2t": QuestModel(sparse, threads=2),
            "gqa": QuestModel(gqa, threads=1)}


def _jobs():
    """(name, callable) pairs: greedy with logits, seeded sampling, and streaming, on every model."""
    rng = np.random.default_rng(21)
    prompts = [rng.integers(0, 256, n).tolist() for n in (70, 33, 51, 8)]
    jobs = []
    for name, model in _models().items():
        for index, prompt in enumerate(prompts):
            jobs.append((f"{name} greedy {index}", functools.partial(greedy, model, [prompt], 10, return_logits=True)))
        sampling = Sampling(max_new_tokens=12, temperature=1.2, top_p=0.9, seed=5)
        jobs.append((f"{name} sampled batch", functools.partial(Generator(model).generate, prompts[:3], sampling)))
        jobs.append((f"{name} streamed", functools.partial(lambda m: list(Generator(m).stream(prompts[1:], Sampling(8))),
                                                           model)))
    return jobs


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_threads_running_at_once_match_running_one_after_another():
    jobs = _jobs()
    one_by_one = {name: job() for name, job in jobs}
    for _ in range(2):  # two rounds, so the interleavings differ
        with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
            futures = {name: pool.submit(job) for name, job in reversed(jobs)}
            at_once = {name: future.result() for name, future in futures.items()}
        for name, _ in jobs:
            assert _same(at_once[name], one_by_one[name]), f"{name}: differs when run alongside the others"
