"""bench_prefill_step's rows at a small depth: every op timed, the ratios from the medians."""

from __future__ import annotations

import numpy as np

from benchmarks.bench_prefill_step import measure


def test_a_row_times_each_op_and_divides_the_medians():
    row = measure(1024, threads=1, rounds=1, rng=np.random.default_rng(0))
    assert {"quest-int8", "quest-float16", "gqa-float16"} <= set(row["ms"])
    assert all(ms > 0 for ms in row["ms"].values())
    ratio = row["gqa_over_quest"]["quest-int8 vs gqa-float16"]
    assert abs(ratio - row["ms"]["gqa-float16"] / row["ms"]["quest-int8"]) < 0.01
