"""export-sparse's validation covers the sparse decode steps the budget covers, not only an exact
prefill."""

from __future__ import annotations

import pytest

from export_models import tiny_model
from quest_ort.export.pipeline import export_sparse
from quest_ort.export.rewrite import ExportError, SparseSettings
from quest_ort.export.validate import plan


def test_the_validation_plan_covers_sparse_steps_inside_the_budget_and_passes_it():
    # --k 4 --block-size 4: 16 tokens covered; an exact prefill of 8 then 8 sparse steps inside
    # the budget, a sparse prefill of 8, and a 24-token prompt past it (its 4 decode steps only finite)
    assert plan(covered=16, capacity=8192) == [(8, 8, True), (8, 0, False), (24, 4, True)]
    assert plan(covered=1, capacity=8192) == [(1, 0, True), (1, 0, False), (24, 4, True)]
    assert plan(covered=256, capacity=8192) == [(24, 8, True), (24, 0, False), (264, 4, True)]
    assert plan(covered=2048, capacity=300) == [(24, 8, True), (24, 0, False), (296, 4, True)]


def test_the_validation_catches_what_only_decode_steps_show(tmp_path, monkeypatch):
    """A rewrite whose RoPE positions forget the cached tokens is exact on a prefill from an empty
    cache (all the old validation ran) and wrong on every decode step."""
    import onnx_ir as ir

    from quest_ort.export import rewrite
    from quest_ort.export.rewrite import model_io

    def positions_without_past(graph, past_lens, input_ids):
        zero = ir.node("Sub", [past_lens, past_lens])
        graph.append(zero)
        return model_io.positions_from_past_lens(graph, zero.outputs[0], input_ids)

    monkeypatch.setattr(rewrite, "positions_from_past_lens", positions_without_past)
    with pytest.raises(ExportError, match="validation failed: .* at decode step 1 after a 8-token prompt"):
        export_sparse("qwen3", output=tmp_path / "out", settings=SparseSettings(top_k=4, block_size=4),
                      model=str(tiny_model("qwen3").checkpoint), capacity=256, log=lambda *a, **k: None)
    assert not (tmp_path / "out").exists()
