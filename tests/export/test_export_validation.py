"""export-sparse's option ranges, what --k counts, and its validation: an out-of-range value is an
argparse error before any work; --k is a budget in 32-token pages whatever the block size; every legal
budget validates, and the validation covers the sparse decode steps the budget covers, not only an
exact prefill."""

from __future__ import annotations

import pytest

from quest_ort.apps import export_cli as cli
from quest_ort.pipeline import export_sparse
from quest_ort.export.rewrite import ExportError, SparseSettings
from quest_ort.model_folder.settings import top_k_for_budget
from quest_ort.model_folder.sidecar import Sidecar
from quest_ort.pipeline.validate import plan
from support.export_models import tiny_model

OUT_OF_RANGE = [
    ("--k", "3000000000"), ("--k", "0"), ("--k", "-1"),
    ("--block-size", "0"), ("--block-size", "-8"), ("--block-size", "2147483648"),
    ("--sink", "-1"), ("--sink", "2147483648"),
    ("--recent", "-1"), ("--recent", "2147483648"),
    ("--importance-fraction", "-0.5"), ("--importance-fraction", "1.5"), ("--importance-fraction", "nan"),
    ("--num-probes", "0"), ("--num-probes", "-3"), ("--num-probes", "2147483648"),
    ("--capacity", "0"), ("--capacity", "-1"), ("--capacity", "3000000000"),
    ("--dense-layers", "-1"), ("--dense-layers", "0,-2"), ("--dense-layers", "3000000000"),
]


@pytest.mark.parametrize("option, value", OUT_OF_RANGE)
def test_out_of_range_options_are_refused_before_any_work(option, value, tmp_path, capsys):
    """An argparse error (exit status 2) whose message names the option and the value; the model
    named does not exist, so any work past the arguments would fail differently."""
    argv = ["onnx", "--model", str(tmp_path / "missing.onnx"), "--k", "4", f"{option}={value}", "-o", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith(f"export-sparse: error: argument {option}: ") and value in message, message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, value", [("top_k", 3_000_000_000), ("block_size", 0), ("sink_blocks", -1),
                                         ("importance_fraction", float("nan")), ("num_probes", 2**31)])
def test_sparse_settings_refuse_what_the_ops_would(name, value):
    with pytest.raises(ValueError, match=f"{name} must lie in"):
        SparseSettings(**{"top_k": 4, name: value})


@pytest.mark.parametrize("k, block_size, top_k", [
    (32, 8, 128),  # the design card's --k 32 at the default block size: 1024 tokens
    (32, 32, 32), (4, 8, 16), (1, 1, 32), (1, 32, 1),
    (3, 64, 2), (5, 12, 14),  # pages that fill no whole block: rounded up to whole blocks
])
def test_k_counts_pages_of_32_tokens_whatever_the_block_size(k, block_size, top_k):
    assert top_k_for_budget(k, block_size) == top_k
    settings = SparseSettings.for_budget(k, block_size=block_size)
    assert (settings.top_k, settings.block_size, settings.budget_tokens) == (top_k, block_size, top_k * block_size)
    assert settings.budget_tokens >= 32 * k > settings.budget_tokens - block_size


def test_for_budget_takes_the_default_block_size():
    assert SparseSettings.for_budget(32) == SparseSettings(top_k=32 * 32 // SparseSettings(top_k=1).block_size)


@pytest.mark.parametrize("k, block_size, reduce, top_k", [(1, 4, "none", 8), (1, 1, "none", 32), (1, 32, "mean", 1)])
def test_small_budgets_validate(k, block_size, reduce, top_k, tmp_path, capsys):
    """export-sparse qwen3 --k 1 --block-size 4 (a 32-token budget, the smallest --k gives) and the
    other block sizes: the sidecar holds the budget in blocks; the validation runs prompts the budget
    covers (exact) and a longer one (its sparse steps only finite), and passes."""
    argv = ["qwen3", "--model", str(tiny_model("qwen3").checkpoint), "--k", str(k), "--block-size", str(block_size),
            "--group-reduce", reduce, "--capacity", "256", "-o", str(tmp_path / "out")]
    assert cli.main(argv) == 0
    assert "validation: max |logit difference|" in capsys.readouterr().out
    assert (tmp_path / "out" / "model.quest.onnx").is_file()
    recorded = Sidecar.read(tmp_path / "out").settings
    assert (recorded.top_k, recorded.block_size, recorded.group_reduce) == (top_k, block_size, reduce)


def test_the_validation_plan_covers_sparse_steps_inside_the_budget_and_passes_it():
    # --k 4 --block-size 4: 16 tokens covered; an exact prefill of 8 then 8 sparse steps inside
    # the budget, a sparse (chunked) and a per-token prefill of 8, and a 24-token prompt past it (its 4
    # decode steps only finite)
    modes = ("exact", "sparse", "per-token", "exact")
    assert plan(covered=16, capacity=8192) == list(zip((8, 8, 8, 24), (8, 0, 0, 4), modes))
    assert plan(covered=1, capacity=8192) == list(zip((1, 1, 1, 24), (0, 0, 0, 4), modes))
    assert plan(covered=256, capacity=8192) == list(zip((24, 24, 24, 264), (8, 0, 0, 4), modes))
    assert plan(covered=2048, capacity=300) == list(zip((24, 24, 24, 296), (8, 0, 0, 4), modes))


@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
def test_the_validation_catches_what_only_decode_steps_show(tmp_path, monkeypatch, kv_dtype):
    """A rewrite whose RoPE positions forget the cached tokens is exact on a prefill from an empty
    cache (all the old validation ran) and wrong on every decode step; with int8 caches the same
    rewrite with float32 caches is validated exactly first, and fails the same way."""
    import onnx_ir as ir

    from quest_ort.export import rewrite
    from quest_ort.export.rewrite import model_io

    def positions_without_past(graph, past_lens, input_ids):
        zero = ir.node("Sub", [past_lens, past_lens])
        graph.append(zero)
        return model_io.positions_from_past_lens(graph, zero.outputs[0], input_ids)

    monkeypatch.setattr(rewrite, "positions_from_past_lens", positions_without_past)
    with pytest.raises(ExportError, match="validation failed: .* at decode step 1 after a 8-token prompt"):
        export_sparse("qwen3", output=tmp_path / "out", settings=SparseSettings(top_k=4, block_size=4, kv_dtype=kv_dtype),
                      model=str(tiny_model("qwen3").checkpoint), capacity=256, log=lambda *a, **k: None)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kv_dtype", ["float16", "int8"])
def test_narrow_caches_validate_the_rewrite_exactly_then_bound_their_drift(tmp_path, monkeypatch, kv_dtype):
    """Caches narrower than the float32 activations: the rewrite with float32 caches is held to the
    float32 tolerance, the narrow caches' relative logit error to CACHE_TOLERANCES; past it, the
    export is refused naming the cache type and the table, and nothing is written."""
    from quest_ort.pipeline import validate

    def export(output):
        return export_sparse("qwen3", output=output, settings=SparseSettings(top_k=4, block_size=4, kv_dtype=kv_dtype),
                             model=str(tiny_model("qwen3").checkpoint), capacity=256, log=lambda *a, **k: None)

    report = export(tmp_path / "out")
    assert report.validation_max_abs_diff <= validate.LOGIT_TOLERANCE["float32"]
    drift = report.cache_drift
    assert drift.what == f"{kv_dtype} caches" and drift.tolerance == validate.CACHE_TOLERANCES[kv_dtype]
    assert 0 < drift.relative_error <= drift.tolerance and report.weight_drift is None
    monkeypatch.setitem(validate.CACHE_TOLERANCES, kv_dtype, drift.relative_error / 2)
    with pytest.raises(ExportError, match=f"{kv_dtype} caches move the logits .* CACHE_TOLERANCES"):
        export(tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_quantized_weights_over_narrow_caches_are_bounded_by_both_tolerances(tmp_path, monkeypatch):
    """int8 weights over int8 caches: the cache drift is validated on the float-weight folder, then
    the quantized folder's drift against the two tolerances added in quadrature. The source graph
    runs each of the validation's token sequences once for the three folders compared with it."""
    import math

    from quest_ort.pipeline import validate

    source_steps, step = [], validate.SourceRunner.step

    def counted_step(runner, ids):
        source_steps.append(ids.shape)
        return step(runner, ids)

    monkeypatch.setattr(validate.SourceRunner, "step", counted_step)
    settings = SparseSettings(top_k=4, block_size=4, kv_dtype="int8", weights="int8")
    report = export_sparse("qwen3", output=tmp_path / "out", settings=settings,
                           model=str(tiny_model("qwen3").checkpoint), capacity=256, log=lambda *a, **k: None)
    assert report.cache_drift.what == "int8 caches"
    drift = report.weight_drift
    assert drift.what == "int8 weights and int8 caches"
    assert drift.tolerance == pytest.approx(math.hypot(validate.WEIGHT_TOLERANCES["int8"],
                                                       validate.CACHE_TOLERANCES["int8"]))
    assert drift.relative_error >= report.cache_drift.relative_error / 2
    # the calibration prompt, then the plan's prompts and decode steps once: (8, 8 steps), (8), (8), (24, 4 steps)
    assert source_steps == [(1, 256)] + [(1, 8)] + [(1, 1)] * 8 + [(1, 8)] * 2 + [(1, 24)] + [(1, 1)] * 4
