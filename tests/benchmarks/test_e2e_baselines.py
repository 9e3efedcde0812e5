"""bench_e2e's own pieces on tiny exports: ONNX Runtime's int8-cache GroupQueryAttention variant decodes what its float16 twin decodes, the synthetic int8 fill bounds what the cache holds, the long-context run's rows and bound bytes, and --only-ttft merges a run into earlier rows."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench_e2e, gqa_int8
from quest_ort.pipeline import export_sparse
from quest_ort.export.rewrite import SparseSettings
from quest_ort.ops.reference import int8_bounds
from quest_ort.runtime.model import QuestModel
from support.export_models import tiny_model

CAPACITY, CONTEXT = 256, 150


@pytest.fixture(scope="module")
def gqa_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("e2e") / "gqa"
    export_sparse("llama", output=folder, settings=SparseSettings(top_k=2, block_size=16, dense_layers=(0,),
                                                                  kv_dtype="float16", attention="gqa"),
                  model=str(tiny_model("llama").checkpoint), capacity=CAPACITY, log=lambda *a, **k: None)
    return folder


def test_the_int8_cache_variant_decodes_like_the_float16_graph_and_writes_the_token_in_place(gqa_folder):
    rng = np.random.default_rng(0)
    dense = QuestModel(gqa_folder, threads=1)
    int8 = gqa_int8.Int8CacheGqa(gqa_folder, threads=1)
    dense_cache, int8_cache = dense.new_cache(1, CAPACITY), int8.new_cache(1, CAPACITY)
    for dense_layer, int8_layer in zip(dense_cache.layers, int8_cache.layers, strict=True):
        for dense_array, int8_array in ((dense_layer.key, int8_layer.key), (dense_layer.value, int8_layer.value)):
            codes = rng.integers(-127, 128, dense_array.shape, dtype=np.int8)
            int8_array[...] = codes
            dense_array[...] = codes * np.float16(gqa_int8.SCALE)  # the values the int8 cache stands for
    dense_cache.lengths[:] = int8_cache.lengths[:] = CONTEXT
    token = np.array([[5]], np.int64)
    expected, got = dense.step(dense_cache, token), int8.step(int8_cache, token)
    assert int8_cache.lengths.tolist() == [CONTEXT + 1]
    spread = float(np.std(expected))
    assert np.abs(got - expected).max() < 0.05 * spread, (np.abs(got - expected).max(), spread)
    # The new token's key went into row CONTEXT in place, quantized by the static scale.
    written = int8_cache.layers[1].key[0, :, CONTEXT].astype(np.float32) * gqa_int8.SCALE
    reference = dense_cache.layers[1].key[0, :, CONTEXT].astype(np.float32)
    assert np.abs(written - reference).max() <= gqa_int8.SCALE / 2 + 1e-3


def test_the_variant_is_refused_for_a_quest_export(tmp_path):
    folder = tmp_path / "quest"
    export_sparse("llama", output=folder, settings=SparseSettings(top_k=2, block_size=16, dense_layers=(0,)),
                  model=str(tiny_model("llama").checkpoint), capacity=CAPACITY, log=lambda *a, **k: None)
    with pytest.raises(ValueError, match="not a GroupQueryAttention baseline export"):
        gqa_int8.write_int8_variant(folder)


def _int8_export(folder, superblock_size):
    export_sparse("llama", output=folder, settings=SparseSettings(top_k=2, block_size=16, dense_layers=(0,),
                                                                  kv_dtype="int8", superblock_size=superblock_size),
                  model=str(tiny_model("llama").checkpoint), capacity=CAPACITY, log=lambda *a, **k: None)
    return folder


@pytest.fixture(scope="module")
def int8_folder(tmp_path_factory):
    return _int8_export(tmp_path_factory.mktemp("e2e") / "int8", 0)  # the flat selection


@pytest.fixture(scope="module")
def hierarchical_int8_folder(tmp_path_factory):
    return _int8_export(tmp_path_factory.mktemp("e2e") / "int8-hierarchical", 2)  # superblocks of 2 blocks


@pytest.mark.parametrize("which", ["flat", "hierarchical"])
def test_the_synthetic_int8_fill_bounds_the_keys_the_cache_holds(which, request):
    model = QuestModel(request.getfixturevalue("int8_folder" if which == "flat" else "hierarchical_int8_folder"),
                       threads=1)
    cache = model.new_cache(1, CAPACITY)
    bench_e2e.fill(cache, CONTEXT, 16, np.random.default_rng(0), model.sidecar.settings.superblocks)
    sparse = [layer for layer in cache.layers if layer.block_max is not None]
    assert sparse and cache.lengths.tolist() == [CONTEXT]
    for layer in sparse:
        keys = layer.key[0, :, :CONTEXT].astype(np.float32) * layer.key_scale[0, :, :CONTEXT, None].astype(np.float32)
        bound_sets = [(layer.block_max, layer.block_min, layer.block_exponent, 16)]
        if which == "hierarchical":
            bound_sets.append((layer.super_max, layer.super_min, layer.super_exponent, 32))
        for top, bottom, exponent, size in bound_sets:
            blocks = -(-CONTEXT // size)
            padded = np.full((keys.shape[0], blocks * size, keys.shape[-1]), np.nan, np.float32)
            padded[:, :CONTEXT] = keys
            by_block = padded.reshape(keys.shape[0], blocks, size, -1)
            # int8 caches come with int8 bounds: codes times each block's power of two
            scale = int8_bounds.scale_of(exponent[0, :, :blocks])[..., None]
            assert (top[0, :, :blocks] * scale >= np.nanmax(by_block, axis=2)).all()
            assert (bottom[0, :, :blocks] * scale <= np.nanmin(by_block, axis=2)).all()
    model.step(cache, np.array([[3]], np.int64))  # and the model decodes from it


def test_the_long_run_times_each_context_against_the_first_and_counts_every_block_bound(int8_folder, gqa_folder,
                                                                                      monkeypatch):
    contexts = (40, 150)
    monkeypatch.setattr(bench_e2e, "LONG_CONTEXTS", contexts)
    monkeypatch.setattr(bench_e2e, "LONG_CAPACITY", CAPACITY)
    monkeypatch.setattr(bench_e2e, "read_bandwidth", lambda threads: 10.0)  # GB/s
    run = bench_e2e.long_decode({"quest-int8": int8_folder, "gqa-int8": gqa_folder}, threads=1, steps=1,
                                rng=np.random.default_rng(0))
    assert [(row["model"], row["context"]) for row in run["rows"]] == [
        (kind, context) for context in contexts for kind in bench_e2e.LONG_KINDS]
    assert all(row["over_first_context"] == 1.0 for row in run["rows"] if row["context"] == contexts[0])
    assert run["capacity"] == CAPACITY and run["selection"] == "flat"
    # int8 bounds: a max and a min code per channel and an exponent per block, of every block held
    cache = QuestModel(int8_folder, threads=1).new_cache(1, CAPACITY)
    sparse = [layer for layer in cache.layers if layer.block_max is not None]
    per_block = sum(layer.block_max[0, :, 0].nbytes + layer.block_min[0, :, 0].nbytes
                    + layer.block_exponent[0, :, 0].nbytes for layer in sparse)
    assert run["bound_bytes_per_step"] == {str(c): -(-c // 16) * per_block for c in contexts}
    assert run["flat_bound_bytes_per_step"] == run["bound_bytes_per_step"]
    assert run["bound_bytes_of_flat"] == {str(c): 1.0 for c in contexts}
    # the dense layers read every int8 key and value row and its float16 scale
    dense = [layer for layer in cache.layers if layer.block_max is None]
    assert dense and run["dense_layers"] == [0]
    per_token = sum(2 * layer.key[0, :, 0].nbytes + 2 * layer.key_scale[0, :, 0].nbytes for layer in dense)
    assert run["dense_layer_bytes_per_step"] == {str(c): c * per_token for c in contexts}
    assert run["dense_layer_floor_ms"] == {str(c): round(c * per_token / 10e9 * 1e3, 2) for c in contexts}


def test_the_long_run_says_it_did_not_measure_when_the_caches_would_not_fit(int8_folder, gqa_folder, monkeypatch):
    monkeypatch.setattr(bench_e2e, "LONG_CAPACITY", CAPACITY)
    monkeypatch.setattr(bench_e2e, "available_memory", lambda: bench_e2e.LONG_HEADROOM)  # the caches do not fit
    made = []  # the Quest cache touches every page as it is made: not made before the check
    new_cache = QuestModel.new_cache
    monkeypatch.setattr(QuestModel, "new_cache", lambda self, *args: made.append(args) or new_cache(self, *args))
    run = bench_e2e.long_decode({"quest-int8": int8_folder, "gqa-int8": gqa_folder}, threads=1, steps=1,
                                rng=np.random.default_rng(0))
    assert run["rows"] == [] and "available" in run["not_measured"] and made == []


def test_a_time_to_first_token_run_replaces_what_it_measures_and_marks_what_it_keeps():
    """bench_e2e --only-ttft: a length measured again takes the new runs, keeps the runs it did not
    repeat marked as earlier (with their date), and the other lengths' rows stay as they were."""
    earlier = {4096: {"tokens": 4096, "date": "2026-12-04", "quest-int8 exact": {"seconds": 29.0},
                      "gqa-float16 exact": {"seconds": 28.5}, "sparse_times_faster": {"x": 1.0}},
               32768: {"tokens": 32768, "quest-int8 exact": {"seconds": 877.0}}}
    now = [{"tokens": 4096, "date": "2026-12-05", "quest-int8 exact": {"seconds": 27.0}, "sparse_times_faster": {}}]
    merged = bench_e2e.merge_ttft_rows(earlier, now)
    assert [row["tokens"] for row in merged] == [4096, 32768] and merged[1] == earlier[32768]
    assert merged[0]["quest-int8 exact"] == {"seconds": 27.0} and merged[0]["date"] == "2026-12-05"
    assert merged[0]["gqa-float16 exact"] == {"seconds": 28.5, "earlier_run": True, "date": "2026-12-04"}
    assert merged[0]["sparse_times_faster"] == {}


def test_a_time_to_first_token_run_keeps_earlier_marks_and_the_ratios_it_did_not_touch():
    """A run of one baseline alone: the Quest runs of the row stay with their ratio (measured together,
    neither repeated), and a run an earlier merge marked keeps its own date, not the row's."""
    earlier = {16384: {"tokens": 16384, "date": "2026-12-05", "quest-int8 exact": {"seconds": 246.5},
                       "quest-int8 sparse": {"seconds": 111.3}, "sparse_times_faster": {"quest-int8 exact": 2.21},
                       "gqa-float16 exact": {"seconds": 243.0, "earlier_run": True}}}
    now = [{"tokens": 16384, "date": "2026-12-06", "gqa-int8 exact": {"seconds": 664.6}, "sparse_times_faster": {}}]
    row = bench_e2e.merge_ttft_rows(earlier, now)[0]
    assert row["sparse_times_faster"] == {"quest-int8 exact": 2.21}
    assert row["quest-int8 sparse"] == {"seconds": 111.3, "earlier_run": True, "date": "2026-12-05"}
    assert row["gqa-float16 exact"] == {"seconds": 243.0, "earlier_run": True}
