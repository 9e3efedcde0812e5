"""The sparse-prefill measurements' own pieces: eval_prefill's summary, report and policies, bench_llamacpp's
summary, and the time-to-first-token run of a tiny export in a process of its own."""

from __future__ import annotations

import pytest

from benchmarks import bench_e2e, bench_llamacpp, eval_prefill
from quest_ort.pipeline import export_sparse
from quest_ort.export.rewrite import SparseSettings
from support.export_models import tiny_model


def _row(length, dense, **hits):
    return dict(length=length, dense=dict(hit=dense), **{name: dict(hit=hit, seconds=2.0) for name, hit in hits.items()})


def test_a_key_counts_as_lost_only_where_dense_retrieves_it():
    rows = [_row(8192, True, exact=True, sparse=False), _row(8192, False, exact=False, sparse=False),
            _row(8192, False, exact=False, sparse=True), _row(2048, True, exact=True, sparse=True)]
    summary = eval_prefill.summary(rows, ["exact", "sparse"])
    assert summary["8192"] == dict(prompts=3, dense=1, exact=dict(retrieved=1, lost=0, seconds=6.0),
                                   sparse=dict(retrieved=1, lost=1, seconds=6.0))
    assert summary["2048"]["sparse"]["lost"] == 0


def test_the_report_replaces_only_its_generated_part(tmp_path):
    export = dict(top_k=32, block_size=8, kv_dtype="float32", bounds_dtype="float16", chunk_size=64, chunk_top_k=1024,
                  chunk_share=0.0625, chunk_window=64, chunk_sink=16, chunk_pool=16)
    perplexity = [dict(prefill="exact", tokens=8192, prompt_tokens=4096, prompt=6.0, continuation=5.0,
                       prefill_seconds=20.0),
                  dict(prefill="sparse", tokens=8192, prompt_tokens=4096, prompt=6.1, continuation=5.05,
                       prefill_seconds=10.0)]
    rows = [_row(8192, True, exact=True, sparse=True)]
    report = {"m": dict(model="A model", export=export, threads=2, summary=eval_prefill.summary(rows, ["exact", "sparse"]),
                        perplexity=perplexity, policies={})}
    path = tmp_path / "quality.md"
    path.write_text(f"before\n{eval_prefill.BEGIN}\nold\n{eval_prefill.END}\nafter\n")
    eval_prefill.write_markdown(report, path)
    text = path.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    assert "| 8192 | 1 | 1 | 1 (0) | 2 | 1 (0) | 2 |" in text and "| sparse | 6.100 | 5.050 | +1.00% | 10 |" in text


def test_a_policy_is_parsed_into_chunk_attributes():
    assert eval_prefill.parse_policy("s16:share=0.0625,window=32,pool=4") == (
        "s16", dict(chunk_share=0.0625, chunk_window=32, chunk_pool=4))


def test_time_to_first_token_runs_are_chosen_by_name_and_unknown_ones_refused():
    assert bench_e2e.ttft_runs("quest-int8 sparse, gqa-float16 exact") == (("quest-int8", "sparse"),
                                                                           ("gqa-float16", "exact"))
    with pytest.raises(Exception, match="unknown runs.*quest-int8 fast"):
        bench_e2e.ttft_runs("quest-int8 fast")


def test_llama_cpp_and_this_package_are_compared_per_kind_and_depth():
    rows = [dict(system="llama.cpp", cache="f16", depth=16384, kind="prompt", seconds=12.0),
            dict(system="llama.cpp", cache="q8_0", depth=16384, kind="prompt", seconds=40.0),
            dict(system="quest_ort", cache="int8", prefill="exact", depth=16384, kind="prompt", seconds=6.0),
            dict(system="quest_ort", cache="int8", prefill="sparse", depth=16384, kind="prompt", seconds=2.0),
            dict(system="quest_ort", cache="int8", prefill="sparse", depth=16384, kind="prompt", seconds=4.0),
            dict(system="llama.cpp", cache="f16", depth=32768, kind="decode", seconds=0.5),
            dict(system="quest_ort", cache="int8", depth=32768, kind="decode", seconds=0.05)]
    summary = bench_llamacpp.summarize(rows)
    prompt = summary["prompt @ 16384"]
    assert prompt["seconds"]["quest_ort sparse"] == 3.0  # the median of its two runs
    assert prompt["times_faster"]["llama.cpp f16 / quest_ort sparse"] == 4.0
    assert prompt["times_faster"]["llama.cpp q8_0 / quest_ort exact"] == pytest.approx(6.67)
    assert summary["decode @ 32768"]["times_faster"] == {"llama.cpp f16 / quest_ort decode": 10.0}


def test_time_to_first_token_runs_each_prefill_in_a_process_of_its_own(tmp_path):
    folder = tmp_path / "quest"
    export_sparse("qwen3", output=folder, settings=SparseSettings(top_k=2, block_size=16, dense_layers=(0,),
                                                                  kv_dtype="int8"),
                  model=str(tiny_model("qwen3").checkpoint), capacity=512, log=lambda *a, **k: None)
    runs = {mode: bench_e2e.prefill_run(folder, 300, threads=1, mode=mode) for mode in ("exact", "sparse")}
    for run in runs.values():
        assert run["seconds"] > 0 and run["peak_rss_gb"] > 0, run


def test_the_int8_cache_baseline_prefills_through_the_runtime_in_a_process_of_its_own(tmp_path):
    folder = tmp_path / "gqa"
    export_sparse("llama", output=folder, settings=SparseSettings(top_k=2, block_size=16, dense_layers=(0,),
                                                                  kv_dtype="float16", attention="gqa"),
                  model=str(tiny_model("llama").checkpoint), capacity=512, log=lambda *a, **k: None)
    run = bench_e2e.prefill_run(folder, 300, threads=1, kind="gqa-int8")
    assert run.get("seconds", 0) > 0, run
