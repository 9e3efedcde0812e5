"""The quality evaluation's own pieces (make eval): block bounds, pass-key prompts, the report."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

from quest_ort.ops.reference import quest_metadata

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import eval_quality  # noqa: E402
import harness  # noqa: E402
import quality_inputs  # noqa: E402
import quality_report  # noqa: E402


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("offset", [-31, -1, 0, 1, 35])
def test_block_bounds_match_the_metadata_reference(dtype, block_size, offset):
    """rebuilt_cache derives the P=16 state from these bounds: they must be QuestMetadata's."""
    length = max(1, 2 * block_size + offset)
    rng = np.random.default_rng(length)
    capacity = (length // block_size + 2) * block_size
    keys = np.zeros((1, 2, capacity, 8), dtype)
    keys[:, :, :length] = rng.standard_normal((1, 2, length, 8)).astype(dtype)
    high, low = eval_quality.block_bounds(keys, length, block_size)
    empty = np.zeros((1, 2, capacity // block_size, 8), dtype)
    want_max, want_min = quest_metadata(keys[:, :, :length], empty, empty, np.zeros(1, np.int64),
                                        block_size=block_size)
    blocks = -(-length // block_size)
    assert high.shape[2] == blocks
    np.testing.assert_array_equal(high, want_max[:, :, :blocks])
    np.testing.assert_array_equal(low, want_min[:, :, :blocks])


class CharTokenizer:
    """One token per character: enough to check where the prompt puts the needle."""

    def __call__(self, text, add_special_tokens=False):
        return type("Encoding", (), {"input_ids": [ord(c) for c in text]})()

    def decode(self, ids):
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return [ord(c) for c in f"<user>{messages[0]['content']}</user><assistant>"]


@pytest.mark.parametrize("depth", [0.1, 0.5, 0.9])
def test_pass_key_prompt_places_one_needle_at_its_depth_in_natural_text(depth):
    tokenizer = CharTokenizer()
    prompt = tokenizer.decode(quality_inputs.pass_key_prompt(tokenizer, "48213", 3000, depth, seed=2))
    assert abs(len(prompt) - 3000) < 10
    assert prompt.count("The pass key is 48213.") == 1 and prompt.endswith(quality_inputs.QUESTION + "</user><assistant>")
    filler_start = prompt.index(quality_inputs.INSTRUCTION) + len(quality_inputs.INSTRUCTION)
    filler_end = prompt.index(quality_inputs.QUESTION)
    position = (prompt.index("The pass key is") - filler_start) / (filler_end - filler_start)
    assert abs(position - depth) < 0.03
    sentences = [s for s in prompt[filler_start:filler_end].split(".") if len(s) > 40]
    assert len(set(sentences)) == len(sentences), "the filler repeats a sentence"


def test_report_counts_only_keys_dense_retrieves_and_keeps_the_written_text(tmp_path):
    rows = []
    for key, dense_hit, sparse_hit in [("1", True, True), ("2", True, False), ("3", False, True)]:
        common = dict(length=2048, depth=0.5, key=key, prompt_tokens=2048, answer="", recall=None)
        rows.append(dict(common, config="dense", policy="dense", block_size=None, budget=None, hit=dense_hit))
        rows.append(dict(common, config="probe@P32K8", policy="probe", block_size=32, budget=256, hit=sparse_hit,
                         recall=0.5))
    report = dict(model="m", budgets=(256,), block_sizes=(32,), policies={}, lengths=(2048,), depths=(0.5,), keys=3,
                  perplexity_tokens=100, seconds=1, pass_key=rows, perplexity=[
                      dict(config="dense", policy="dense", block_size=None, budget=None, perplexity=10.0),
                      dict(config="probe@P32K8", policy="probe", block_size=32, budget=256, perplexity=11.0)])
    (tmp_path / "quality.md").write_text(f"# Q\n\nreading\n\n{quality_report.BEGIN}\nold\n{quality_report.END}\n")
    quality_report.write_report(report, tmp_path, plots=False)  # the plots need matplotlib (make eval)
    text = (tmp_path / "quality.md").read_text()
    assert "reading" in text and "old" not in text
    assert "| probe | 32 | 1/2 (2/3) |" in text  # one of dense's two keys; two of all three
    assert "| probe | 32 | 11.000 (+10.0%) |" in text


def test_variant_makes_the_first_sparse_layers_select_every_block(tmp_path):
    import onnx
    from onnx import helper

    nodes = [helper.make_node("SparseBlockSelect", [f"q{i}"], [f"idx{i}"], domain="com.quest", top_k=32,
                              recent_blocks=1) for i in range(3)]
    graph = helper.make_graph(nodes, "g", [], [])
    onnx.save(helper.make_model(graph), str(tmp_path / "model.quest.onnx"))
    file = eval_quality.write_variant(tmp_path, "v", dense_selects=(2, 272), top_k=8, recent_blocks=4)
    saved = onnx.load(str(tmp_path / file))
    attributes = [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in saved.graph.node]
    assert attributes == [dict(top_k=272, recent_blocks=4), dict(top_k=272, recent_blocks=4),
                          dict(top_k=8, recent_blocks=4)]


def _report(lengths, dense_perplexity, rows):
    dense = [dict(config="dense", policy="dense", block_size=None, budget=None, perplexity=dense_perplexity)]
    dense_key = [dict(length=2048, depth=0.5, key="12345", config="dense", policy="dense", block_size=None,
                      budget=None, hit=True)]
    return dict(keys=1, perplexity_tokens=64, lengths=lengths, depths=(0.5,), seconds=10,
                perplexity=dense + [dict(r, perplexity=1.0) for r in rows],
                pass_key=dense_key + [dict(r, length=2048, depth=0.5, key="12345", hit=True) for r in rows])


def test_a_run_of_some_configs_replaces_their_rows_and_keeps_the_rest(tmp_path):
    """make eval --only: JSON lists against this run's tuples, other rows kept, dense rows checked."""
    import json

    mean = dict(config="bound-mean@P32K8", policy="bound-mean", block_size=32, budget=256)
    head = dict(config="bound-head@P32K8", policy="bound-head", block_size=32, budget=256)
    path = tmp_path / "quality.json"
    path.write_text(json.dumps(_report([2048], 15.0, [mean, dict(head, config="old")])))
    merged = eval_quality.merged_report(path, _report((2048,), 15.0001, [head]), {("bound-head", 32)})
    assert sorted(r["config"] for r in merged["perplexity"]) == ["bound-head@P32K8", "bound-mean@P32K8", "dense"]
    assert merged["seconds"] == 20 and len(merged["pass_key"]) == 3
    with pytest.raises(ValueError, match="dense perplexity"):
        eval_quality.merged_report(path, _report((2048,), 16.0, [head]), {("bound-head", 32)})
    with pytest.raises(ValueError, match="lengths"):
        eval_quality.merged_report(path, _report((4096,), 15.0, [head]), {("bound-head", 32)})


def test_a_kv_head_reads_the_union_of_its_query_heads_lists():
    selected = np.array([[0, 1, -1], [1, 2, -1]], np.int32)  # [R, K]
    assert [b.tolist() for b in harness.blocks_per_kv_head(selected, 1)] == [[0, 1, 2]]  # R = H = 2
    assert [b.tolist() for b in harness.blocks_per_kv_head(selected, 2)] == [[0, 1], [1, 2]]  # R = N
