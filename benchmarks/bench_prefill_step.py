"""`make bench-prefill-step`: one exact prompt step of SparseBlockAttention against GroupQueryAttention.

A prompt is prefilled in steps of 512 queries; the step that ends at depth C attends C - 512 cached
positions and its own. This times that step, the exact walk (no block list: what the runtime's
default `prefill="exact"` runs in every layer), at the Qwen3-0.6B geometry (H=16, N=8, D=128) over
int8 caches (the default export's) and float16 caches, next to ONNX Runtime's GroupQueryAttention
over float16 caches and over its own int8 cache (per-channel scales, ONNX Runtime >= 1.32), each
op's caches written in place. The ops are called in turns, round after round, so a drift of the
machine's speed slows them alike; the figure is the ratio of their median times.

    python -m benchmarks.bench_prefill_step [--depths 4096,8192] [--threads 1] [--rounds 9]

Prints a table and writes benchmarks/results/prefill_step.json. The instruction set is the
machine's (`native_kernel_isa()` for this package, MLAS's own choice for ONNX Runtime): an AVX2
figure needs an AVX2 machine, or AVX-512 hidden from both: `make bench-prefill-step-avx2` preloads
benchmarks/hide_avx512.c and writes benchmarks/results/prefill_step_avx2.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

from quest_ort.graphs import op_model
from quest_ort.ops import native_kernel_isa
from quest_ort.runtime import make_session

from .harness import gqa_decode_model, plain_session

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "prefill_step.json"
HEADS, KV_HEADS, HEAD_DIM, STEP = 16, 8, 128, 512
BLOCK_SIZE = 8  # the default export's; the exact walk does not read the blocks


def _values(arrays: dict) -> dict:
    return {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in arrays.items()}


def quest_run(depth: int, cache: str, threads: int, rng):
    """run(): SparseBlockAttention's exact step of STEP queries ending at `depth`, caches in place."""
    H, N, D, S = HEADS, KV_HEADS, HEAD_DIM, STEP
    inputs = dict(query=rng.standard_normal((1, H, S, D)).astype(np.float16),
                  key=rng.standard_normal((1, N, S, D)).astype(np.float16),
                  value=rng.standard_normal((1, N, S, D)).astype(np.float16),
                  past_lens=np.array([depth - S], np.int32))
    if cache == "int8":
        inputs.update(key_cache=rng.integers(-127, 128, (1, N, depth, D), dtype=np.int8),
                      value_cache=rng.integers(-127, 128, (1, N, depth, D), dtype=np.int8),
                      key_scale=np.full((1, N, depth), 0.02, np.float16),
                      value_scale=np.full((1, N, depth), 0.02, np.float16))
    else:
        inputs.update(key_cache=rng.standard_normal((1, N, depth, D)).astype(np.float16),
                      value_cache=rng.standard_normal((1, N, depth, D)).astype(np.float16))
    model = op_model("SparseBlockAttention", inputs, dict(num_heads=H, kv_num_heads=N, block_size=BLOCK_SIZE))
    session = make_session(model, threads=threads)
    values = _values(inputs)
    binding = session.io_binding()
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    in_place = {"key_cache_out": "key_cache", "value_cache_out": "value_cache",
                "key_scale_out": "key_scale", "value_scale_out": "value_scale"}
    for output in session.get_outputs():
        if output.name in in_place:
            binding.bind_ortvalue_output(output.name, values[in_place[output.name]])
        else:
            binding.bind_output(output.name)
    return lambda: session.run_with_iobinding(binding)


def gqa_run(depth: int, int8_kv: bool, threads: int, rng):
    """run(): GroupQueryAttention's step of STEP queries ending at `depth` (float16; its own int8
    cache with `int8_kv`), present caches bound to the past ones."""
    H, N, D, S = HEADS, KV_HEADS, HEAD_DIM, STEP
    session = plain_session(gqa_decode_model(H, N, D, depth, np.float16, int8_kv=int8_kv, query_len=S), threads)
    inputs = dict(query=rng.standard_normal((1, S, H * D)).astype(np.float16),
                  key=rng.standard_normal((1, S, N * D)).astype(np.float16),
                  value=rng.standard_normal((1, S, N * D)).astype(np.float16),
                  seqlens_k=np.array([depth - 1], np.int32), total_sequence_length=np.array(depth, np.int32))
    if int8_kv:
        inputs.update(past_key=rng.integers(-127, 128, (1, N, depth, D), dtype=np.int8),
                      past_value=rng.integers(-127, 128, (1, N, depth, D), dtype=np.int8),
                      k_scale=np.full((N, 1, D), 0.02, np.float32), v_scale=np.full((N, 1, D), 0.02, np.float32))
    else:
        inputs.update(past_key=rng.standard_normal((1, N, depth, D)).astype(np.float16),
                      past_value=rng.standard_normal((1, N, depth, D)).astype(np.float16))
    values = _values(inputs)
    binding = session.io_binding()
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    binding.bind_output("output")
    binding.bind_ortvalue_output("present_key", values["past_key"])
    binding.bind_ortvalue_output("present_value", values["past_value"])
    return lambda: session.run_with_iobinding(binding)


def measure(depth: int, threads: int, rounds: int, rng) -> dict:
    """Median milliseconds of each op's step at `depth`, called in turns, and the ratios."""
    runs = {"quest-int8": quest_run(depth, "int8", threads, rng),
            "quest-float16": quest_run(depth, "float16", threads, rng),
            "gqa-float16": gqa_run(depth, False, threads, rng)}
    try:
        runs["gqa-int8"] = gqa_run(depth, True, threads, rng)
        runs["gqa-int8"]()
    except Exception as error:  # older ONNX Runtime: no int8 cache; the row says so
        runs.pop("gqa-int8")
        print(f"  GroupQueryAttention int8 cache not run: {str(error).splitlines()[0]}", flush=True)
    for run in runs.values():
        run()  # warm: allocations, first-call dispatch
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    row = dict(depth=depth, threads=threads, rounds=rounds,
               ms={name: round(statistics.median(t) * 1e3, 1) for name, t in times.items()})
    # > 1: this package's exact step is faster than GroupQueryAttention's.
    row["gqa_over_quest"] = {f"{quest} vs {gqa}": round(row["ms"][gqa] / row["ms"][quest], 3)
                             for quest in ("quest-int8", "quest-float16")
                             for gqa in ("gqa-float16", "gqa-int8") if gqa in row["ms"]}
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="4096,8192", help="comma-separated depths the step ends at")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--expect-isa", help="refuse to run unless this package's kernels are these (e.g. avx2)")
    args = parser.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    if any(d <= STEP for d in depths) or args.rounds < 1 or args.threads < 1:
        parser.error(f"--depths must exceed the step ({STEP}); --rounds and --threads must be >= 1")
    isa = native_kernel_isa()
    if args.expect_isa and isa != args.expect_isa:
        sys.exit(f"bench_prefill_step: the kernels in use are {isa}, not {args.expect_isa}; nothing measured")
    print(f"quest_ort kernels: {isa}; onnxruntime {ort.__version__}; {platform.processor() or platform.machine()}; "
          f"H={HEADS} N={KV_HEADS} D={HEAD_DIM}, {STEP} queries, {args.threads} thread(s)", flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for depth in depths:
        row = measure(depth, args.threads, args.rounds, rng)
        rows.append(row)
        print(f"depth {depth}: " + ", ".join(f"{name} {ms} ms" for name, ms in row["ms"].items()), flush=True)
        print("  GroupQueryAttention's time over this package's: "
              + ", ".join(f"{pair} {ratio}" for pair, ratio in row["gqa_over_quest"].items()), flush=True)
    report = dict(machine=dict(processor=platform.processor(), cpus=os.cpu_count(), isa=isa,
                               onnxruntime=ort.__version__, python=sys.version.split()[0]),
                  date=time.strftime("%Y-%m-%d"), geometry=dict(num_heads=HEADS, kv_num_heads=KV_HEADS,
                                                                 head_dim=HEAD_DIM, step=STEP), rows=rows)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
