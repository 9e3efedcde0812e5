"""SparseBlockSelect alone at 4K, 32K and 128K cached tokens: the flat selection against the hierarchical one.

The decode step's selection, one layer of Qwen3-0.6B's geometry (H=16, N=8, D=128), the default export's
settings (P=8, top_k=128, a list per query head), int8 bounds (the int8-cache model's) and float16 bounds
(the float model's); hierarchical: superblocks of 8 blocks, candidate_factor 16 (docs/ops.md, hierarchical
selection), so flat, exactly, below 16K tokens. Each call reads its bounds from memory (copies rotated past
the caches). Prints and saves the median milliseconds, the bound bytes each call reads, its GB/s and the
machine's read bandwidth on as many threads (benchmarks.harness.read_bandwidth).

Bounds here are random: the time a selection takes does not depend on which blocks win (the hierarchical one
reads every superblock bound and the candidates' blocks, whatever they score), but which blocks it keeps
does: that is measured on real models' caches by `make eval-pruning`.

    python -m benchmarks.bench_select_hierarchy [--threads 1,2] [--contexts 4096,32768,131072]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform

import numpy as np

from benchmarks.harness import copies_for, read_bandwidth, time_rotating
from quest_ort.graphs.op_graphs import op_model
from quest_ort.ops import native_kernel_isa
from quest_ort.ops.reference.sparse_block_select import hierarchical_reads
from quest_ort.runtime.binding import InPlaceStep
from quest_ort.runtime.sessions import make_session

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "select_hierarchy.json"
HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128  # Qwen3-0.6B
BLOCK_SIZE, TOP_K, SUPERBLOCK_SIZE, CANDIDATE_FACTOR = 8, 128, 16, 16  # the default export's and the op's
GROUP_REDUCE = "none"


def bounds(rng, blocks: int, dtype: str) -> dict:
    """Random bounds [1, N, blocks, D] (max above min), with exponents for int8 ones."""
    shape = (1, KV_HEADS, blocks, HEAD_DIM)
    if dtype == "int8":
        low = rng.integers(-100, 0, shape, dtype=np.int8)
        return dict(max=(low + rng.integers(0, 100, shape, dtype=np.int8)).astype(np.int8), min=low,
                    exponent=rng.integers(-12, -4, shape[:3], dtype=np.int8))
    low = rng.standard_normal(shape).astype(np.float16)
    return dict(max=(low + np.abs(rng.standard_normal(shape))).astype(np.float16), min=low, exponent=None)


def bytes_read(blocks: int, superblocks: int, candidate_blocks: int, dtype: str) -> int:
    """Bound bytes a call reads: per KV head, both bounds (and an int8 exponent) of each block it scores."""
    per_block = 2 * HEAD_DIM * (1 if dtype == "int8" else 2) + (1 if dtype == "int8" else 0)
    return KV_HEADS * per_block * (blocks if not superblocks else superblocks + candidate_blocks)


def measure(context: int, dtype: str, hierarchical: bool, threads: int, rng) -> dict:
    blocks = -(-(context + 1) // BLOCK_SIZE)
    supers = -(-blocks // SUPERBLOCK_SIZE)
    query = rng.standard_normal((1, HEADS, 1, HEAD_DIM)).astype(np.float32)
    past = np.array([context], np.int32)
    attributes = dict(num_heads=HEADS, kv_num_heads=KV_HEADS, block_size=BLOCK_SIZE, top_k=TOP_K, group_reduce=GROUP_REDUCE)
    if hierarchical:
        attributes.update(superblock_size=SUPERBLOCK_SIZE, candidate_factor=CANDIDATE_FACTOR)

    def inputs(copy_rng):
        fine = bounds(copy_rng, blocks, dtype)
        feeds = dict(query=query, block_max=fine["max"], block_min=fine["min"], past_lens=past,
                     block_exponent=fine["exponent"])
        if hierarchical:
            coarse = bounds(copy_rng, supers, dtype)
            feeds.update(super_max=coarse["max"], super_min=coarse["min"], super_exponent=coarse["exponent"])
        return {name: value for name, value in feeds.items() if value is not None}

    first = inputs(rng)
    step = InPlaceStep(make_session(op_model("SparseBlockSelect", first, attributes), threads=threads), {})
    per_copy = sum(value.nbytes for value in first.values())
    copies = copies_for(per_copy)
    bound = [step.bind(first)] + [step.bind(inputs(rng)) for _ in range(copies - 1)]
    milliseconds = time_rotating(lambda copy: step.run_bound(bound[copy]), copies)
    reads = hierarchical_reads(context // BLOCK_SIZE, TOP_K, SUPERBLOCK_SIZE, CANDIDATE_FACTOR) if hierarchical else None
    approximate = reads is not None
    read = bytes_read(blocks, *(reads or (0, 0)), dtype)
    return dict(context=context, bounds=dtype, selection="hierarchical" if hierarchical else "flat", threads=threads,
                approximate=approximate, ms=round(milliseconds, 4), bound_bytes=read,
                gb_per_s=round(read / milliseconds / 1e6, 2))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=lambda text: [int(t) for t in text.split(",")], default=[1, 2])
    parser.add_argument("--contexts", type=lambda text: [int(t) for t in text.split(",")], default=[4096, 32768, 131072])
    parser.add_argument("--bounds", type=lambda text: text.split(","), default=["int8", "float16"])
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    rows, bandwidth = [], {}
    for threads in args.threads:
        bandwidth[threads] = round(read_bandwidth(threads), 2)
        print(f"read bandwidth, {threads} thread(s): {bandwidth[threads]} GB/s", flush=True)
        for dtype in args.bounds:
            for context in args.contexts:
                pair = [measure(context, dtype, hierarchical, threads, rng) for hierarchical in (False, True)]
                flat, hierarchical = pair
                for row in pair:
                    row["of_bandwidth"] = round(row["gb_per_s"] / bandwidth[threads], 3)
                hierarchical["bytes_of_flat"] = round(hierarchical["bound_bytes"] / flat["bound_bytes"], 3)
                hierarchical["speedup"] = round(flat["ms"] / hierarchical["ms"], 2)
                rows += pair
                print(f"{dtype:>7} {context:>6} tokens, {threads} thread(s): flat {flat['ms']:.3f} ms "
                      f"({flat['gb_per_s']} GB/s), hierarchical {hierarchical['ms']:.3f} ms, "
                      f"{hierarchical['bytes_of_flat']:.2f} of the bytes, {hierarchical['speedup']}x", flush=True)
    result = dict(machine=dict(cpu=platform.processor() or platform.machine(), isa=native_kernel_isa(),
                               read_bandwidth_gb_per_s=bandwidth),
                  geometry=dict(num_heads=HEADS, kv_num_heads=KV_HEADS, head_dim=HEAD_DIM),
                  settings=dict(block_size=BLOCK_SIZE, top_k=TOP_K, group_reduce="none",
                                superblock_size=SUPERBLOCK_SIZE, candidate_factor=CANDIDATE_FACTOR),
                  rows=rows)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
