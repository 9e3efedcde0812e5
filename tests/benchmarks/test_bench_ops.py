"""bench_ops (`make bench`'s kernels) times what the default export runs: its superblocks, their
bounds fed as the exporter's graph keeps them, and the hierarchical selection's bytes."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from benchmarks import bench_ops
from quest_ort.export.rewrite import SparseSettings
from quest_ort.ops.reference import int8_bounds
from quest_ort.ops.reference.sparse_block_select import hierarchical_reads

# A small layer past its hierarchical threshold: superblocks of 2 blocks, candidate_factor 1, K = 4.
TINY = bench_ops.Setting("tiny", 8, 4, "none", "float16", "int8", superblock_size=2, candidate_factor=1)


def test_the_default_setting_is_the_exports_with_its_superblocks():
    export = SparseSettings.for_budget(32)
    default = bench_ops.Setting.export_default()
    assert (default.block_size, default.top_k, default.group_reduce) == (export.block_size, export.top_k,
                                                                          export.group_reduce)
    assert (default.superblock_size, default.candidate_factor) == (export.superblocks, export.candidate_factor)
    assert default.superblock_size > 0
    # The headline (32K tokens) selects hierarchically, so the kernel step is the hierarchical one.
    assert hierarchical_reads((32768 - 64) // default.block_size, default.top_k, default.superblock_size,
                              default.candidate_factor) is not None


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_superblock_bounds_hold_their_blocks_bounds(dtype):
    cfg = bench_ops.Config(4, 2, 64, 200, "float32", np.random.default_rng(0))
    feeds = cfg.metadata(8, np.random.default_rng(1), np.dtype(dtype), 2)[0]
    arrays = {name: value.numpy() for name, value in feeds.items()}
    blocks, supers = -(-200 // 8), -(-200 // 16)
    assert arrays["block_max"].shape == (1, 2, blocks, 64) and arrays["super_max"].shape == (1, 2, supers, 64)

    def bounds(prefix):
        if dtype == "int8":
            return (int8_bounds.dequantize(arrays[f"{prefix}_max"], arrays[f"{prefix}_exponent"]),
                    int8_bounds.dequantize(arrays[f"{prefix}_min"], arrays[f"{prefix}_exponent"]))
        return arrays[f"{prefix}_max"].astype(np.float32), arrays[f"{prefix}_min"].astype(np.float32)

    (block_max, block_min), (super_max, super_min) = bounds("block"), bounds("super")
    for u in range(supers):
        inside = slice(2 * u, min(2 * u + 2, blocks))
        if dtype == "int8":  # quantized on their own: they hold their blocks' values
            assert (super_max[:, :, u] >= block_max[:, :, inside].max(2) - 1e-6).all()
        else:  # exactly the max of the maxima and the min of the minima
            assert np.array_equal(super_max[:, :, u], block_max[:, :, inside].max(2))
            assert np.array_equal(super_min[:, :, u], block_min[:, :, inside].min(2))


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_a_hierarchical_setting_runs_and_counts_the_bytes_it_reads(dtype, monkeypatch):
    monkeypatch.setattr(bench_ops, "time_rotating", lambda run, copies, **kwargs: (run(0), 1.0)[1])
    cfg = bench_ops.Config(4, 2, 64, 256, dtype, np.random.default_rng(0))
    rows = []
    bench_ops.bench_config(cfg, TINY, 1, np.random.default_rng(2), rows)
    select = next(row for row in rows if row["kind"] == "select")
    assert select["selection"] == "hierarchical" and select["superblock_size"] == 2
    superblocks, candidate_blocks = hierarchical_reads(cfg.past // 8, 4, 2, 1)
    per_block = 2 * 64 * (1 if dtype == "int8" else 2) + (dtype == "int8")
    assert select["bytes"] == 2 * per_block * (superblocks + candidate_blocks)
    step = next(row for row in rows if row["kind"] == "sparse_step")
    attention = next(row for row in rows if row["kind"] == "sparse_attention")
    assert step["bytes"] == select["bytes"] + attention["bytes"]


def test_without_matplotlib_the_plot_is_left_out_saying_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    assert bench_ops.plot([], {1: 10.0, 2: 20.0}, tmp_path / "ops.png") is False
    assert "matplotlib is not installed: ops.png not drawn" in capsys.readouterr().out
    assert not (tmp_path / "ops.png").exists()
