"""Decode steps at one context in a process of its own, for bench_e2e's peak memory.

    python -m benchmarks.decode_once KIND FOLDER CONTEXT [--capacity C] [--threads N] [--steps S]

Opens the model (KIND one of bench_e2e.KINDS), allocates its caches at C positions, fills them
synthetically to CONTEXT tokens (bench_e2e.fill) and decodes S tokens at that position. Prints one
JSON line: the median ms per token, the peak RSS of the whole run (VmHWM: loading, filling and
decoding), the peak RSS while decoding (VmHWM reset through /proc/self/clear_refs once the caches
are filled: what a decoding app holds, without the synthetic fill's temporaries) and the caches'
bytes, all in GiB (2**30 bytes, as prefill_once reports).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import numpy as np

from .bench_e2e import KINDS, fill, open_model
from .prefill_once import peak_rss_gb


def reset_peak_rss() -> None:
    """Start VmHWM again from the current RSS (Linux 4.0 and later)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument("context", type=int)
    parser.add_argument("--capacity", type=int, default=None, help="cache positions (default: context + 64)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    model = open_model(args.kind, args.folder, args.threads)
    cache = model.new_cache(1, args.capacity or args.context + 64)
    fill(cache, args.context, model.sidecar.settings.block_size, np.random.default_rng(0))
    loaded_gb = peak_rss_gb()
    reset_peak_rss()
    token, times = np.array([[7]], np.int64), []
    for _ in range(args.steps + 1):
        cache.lengths[:] = args.context
        begin = time.perf_counter()
        model.step(cache, token)
        times.append(time.perf_counter() - begin)
    cache_gb = sum(array.nbytes for array in cache.buffers.values()) / 2**30
    decoding_gb = peak_rss_gb()
    print(json.dumps({"ms_per_token": round(statistics.median(times[1:]) * 1e3, 2),
                      "peak_rss_gb": round(max(loaded_gb, decoding_gb), 2), "decode_peak_rss_gb": round(decoding_gb, 2),
                      "cache_gb": round(cache_gb, 2)}))


if __name__ == "__main__":
    main()
